//! The World's agent Secret, kept healable: the operator holds the token in
//! memory (the hub) and in an owner-referenced copy, so a deleted Secret
//! comes back with the token the running agents hold.
//!
//! Invariants:
//! 1. The Secret `<world>-agent` is what host pods take their
//!    `HOSTMESH_SECRET` from; its token is the
//!    World's. When it exists, it wins.
//! 2. A missing Secret is recreated with the token the agents hold: the
//!    hub's (what this operator dials with), else the copy
//!    `<world>-agent-recovery`. Only when neither exists (both deleted while
//!    no operator held the token) is a new token made, and the caller
//!    replaces the hosts deliberately ([`SecretOutcome::replaced`]); a World
//!    that has no pods yet just starts with it.
//! 3. Nothing here lists or watches Secrets: the operator needs only `get`,
//!    `create` and `update` on them (a watch would need list and watch on
//!    every Secret of the watched namespaces). A deletion is noticed at the next
//!    reconcile (at most a minute in steady state).
//! 4. The Secret `<world>-runtime` holds the World's runtime key (hex,
//!    key `key`; agent `keys.rs`): the credential of clients of the
//!    runtime-aware procs' actors, which opens no agent. It is derived from
//!    the token, so a deleted one comes back the same; one that holds an
//!    earlier token's key (the agent Secret and its copy were lost and a
//!    new token made) is rewritten with the current one.

use hostmesh_agent::contract;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, ResourceExt as _};

use super::desired;
use crate::OperatorError;
use crate::controllers::shared::ControllerContext;
use hostmesh_crds::World;

/// The Secret's token, and why the hosts must be replaced if they must.
#[derive(Debug)]
pub struct SecretOutcome {
    /// The key the agents derive from the token.
    pub key: Vec<u8>,
    /// Set when a new token replaced a lost one (invariant 2).
    pub replaced: Option<String>,
}

/// Name of the recovery copy of `world`'s Secret.
pub fn recovery_name(world: &str) -> String {
    format!("{world}-agent-recovery")
}

/// The key exactly as the agent derives it from the Secret's token.
fn key_of(s: &Secret) -> Option<Vec<u8>> {
    s.data
        .as_ref()
        .and_then(|d| d.get(contract::SECRET_KEY))
        .map(|b| hostmesh_agent::secret_key(&b.0).to_vec())
        .filter(|k| !k.is_empty())
}

/// A Secret named `name` owned by `world` holding `token`.
fn with_token(world: &World, name: String, token: &[u8]) -> Result<Secret, OperatorError> {
    let mut s = desired::secret(world, [0; 32])?;
    s.metadata.name = Some(name);
    s.data = Some(
        [(contract::SECRET_KEY.to_string(), ByteString(token.to_vec()))]
            .into_iter()
            .collect(),
    );
    Ok(s)
}

/// Creates `secret`; one that exists already (another pass made it) is
/// left as it is: Secrets are never rewritten (invariant 3).
pub(super) async fn create(api: &Api<Secret>, secret: &Secret) -> Result<(), OperatorError> {
    match api.create(&PostParams::default(), secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Makes sure the World's Secret, its copy and its runtime Secret exist
/// (invariants 1, 2 and 4).
pub async fn ensure(
    world: &World,
    ctx: &ControllerContext,
    ns: &str,
    hub_key: Option<Vec<u8>>,
) -> Result<SecretOutcome, OperatorError> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let outcome = ensure_agent(world, ctx, &api, hub_key).await?;
    ensure_runtime(&api, ctx, world, &outcome.key).await?;
    Ok(outcome)
}

async fn ensure_agent(
    world: &World,
    ctx: &ControllerContext,
    api: &Api<Secret>,
    hub_key: Option<Vec<u8>>,
) -> Result<SecretOutcome, OperatorError> {
    let api = api.clone();
    let name = desired::secret_name(&world.name_any());
    let copy_name = recovery_name(&world.name_any());
    let primary = api.get_opt(&name).await?;
    let copy = api.get_opt(&copy_name).await?;
    if let Some(s) = &primary {
        let key = key_of(s).ok_or(OperatorError::MissingField("agent Secret data.token"))?;
        if copy.is_none() {
            create(&api, &with_token(world, copy_name, &key)?).await?;
        }
        return Ok(SecretOutcome {
            key,
            replaced: None,
        });
    }
    let recovered = hub_key
        .map(|k| (k, "the token this operator dials the agents with"))
        .or_else(|| {
            copy.as_ref()
                .and_then(key_of)
                .map(|k| (k, "its recovery copy"))
        });
    if let Some((key, from)) = recovered {
        create(&api, &with_token(world, name.clone(), &key)?).await?;
        if copy.is_none() {
            create(&api, &with_token(world, copy_name, &key)?).await?;
        }
        ctx.event(
            world,
            true,
            "AgentSecretRestored",
            format!(
                "Secret {name} was missing; recreated it from {from}, the token the running agents hold"
            ),
        )
        .await;
        return Ok(SecretOutcome {
            key,
            replaced: None,
        });
    }
    // Neither exists and no operator holds the token: a new one.
    let fresh = desired::secret(world, rand::random())?;
    let key = key_of(&fresh).ok_or(OperatorError::MissingField("agent Secret data.token"))?;
    match api.create(&PostParams::default(), &fresh).await {
        Ok(_) => {}
        // Lost a race with ourselves (a previous reconcile): read it back.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            return Err(crate::Pending::SecretCreating(world.name_any()).into());
        }
        Err(e) => return Err(e.into()),
    }
    create(&api, &with_token(world, copy_name.clone(), &key)?).await?;
    // A World that was never up has nothing to replace.
    let had_hosts = world
        .status
        .as_ref()
        .is_some_and(|s| !s.hosts.is_empty() && s.observed_generation.is_some());
    Ok(SecretOutcome {
        key,
        replaced: had_hosts.then(|| {
            format!(
                "Secret {name} and its copy {copy_name} were deleted and no operator held the token: made a new one; the hosts are replaced so their agents get it"
            )
        }),
    })
}

/// Name of `world`'s runtime credential Secret.
pub fn runtime_name(world: &str) -> String {
    format!("{world}-runtime")
}

/// The key in the runtime Secret holding the runtime key (hex).
pub const RUNTIME_KEY: &str = "key";

/// Makes sure `<world>-runtime` exists (invariant 4): the World's runtime
/// key, derived from `key`, in hex, owned by the World. One that holds
/// another key (the agent Secret and its copy were deleted and a new
/// token made) is rewritten with the current key, and an Event says so.
async fn ensure_runtime(
    api: &Api<Secret>,
    ctx: &ControllerContext,
    world: &World,
    key: &[u8],
) -> Result<(), OperatorError> {
    let name = runtime_name(&world.name_any());
    let hex = hostmesh_agent::keys::to_hex(hostmesh_agent::keys::runtime_key(key).bytes());
    if let Some(found) = api.get_opt(&name).await? {
        let held = found
            .data
            .as_ref()
            .and_then(|d| d.get(RUNTIME_KEY))
            .map(|b| b.0.trim_ascii().to_vec());
        if held.as_deref() != Some(hex.as_bytes()) {
            let mut s = found;
            s.data
                .get_or_insert_with(Default::default)
                .insert(RUNTIME_KEY.to_string(), ByteString(hex.into_bytes()));
            match api.replace(&name, &PostParams::default(), &s).await {
                Ok(_) => {}
                // Changed or deleted since it was read: the next pass.
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                    return Err(crate::Pending::SecretChanged(name).into());
                }
                Err(e) => return Err(e.into()),
            }
            ctx.event(
                world,
                false,
                "RuntimeSecretRewritten",
                format!(
                    "Secret {name} held the runtime key of an earlier agent token: rewritten with the current one (clients of the procs' actors must read it again)"
                ),
            )
            .await;
        }
        return Ok(());
    }
    let mut s = desired::secret(world, [0; 32])?;
    s.metadata.name = Some(name);
    s.data = Some(
        [(RUNTIME_KEY.to_string(), ByteString(hex.into_bytes()))]
            .into_iter()
            .collect(),
    );
    create(api, &s).await
}
