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
//!    new token made, or the token was rotated) is rewritten with the
//!    current one. It also holds the current issuer's lineage (key
//!    `lineage`), so clients of actors admit procs issued before a
//!    rotation and after it.
//! 5. Rotation in place: a token written into `<world>-agent` that differs
//!    from the copy's (the token the agents hold) is rotated to without
//!    replacing a host. The copy is the journal: it first takes the new
//!    token, keeps the old one as `previous`, the lineage in which the old
//!    key's proc issuer endorses the new one's, when the rotation began
//!    (`rotated-at`) and the old token's hash (`rotated-from`). The hub
//!    then dials with both tokens and hands every agent the new one
//!    (`Rekey`) on each of its links; once every host's agent took it,
//!    `previous` is dropped ([`advance`]) and the old token opens
//!    nothing. A restarted operator reads the journal and goes on. A token
//!    shorter than an agent accepts is not rotated to (a Warning says so).
//! 6. The lineage is kept while a ProcMesh of the World made before the
//!    last rotation exists (its procs hold credentials of the old issuer),
//!    and then dropped ([`advance`]): procs issued from then on
//!    trust the new issuer only.

use hostmesh_agent::contract;
use hostmesh_runtime::Issuer;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, ResourceExt as _};

use super::desired;
use crate::OperatorError;
use crate::controllers::shared::ControllerContext;
use hostmesh_crds::World;

/// The Secret's token, and why the hosts must be replaced if they must.
#[derive(Debug, Default)]
pub struct SecretOutcome {
    /// The key the agents derive from the token.
    pub key: Vec<u8>,
    /// Set when a new token replaced a lost one (invariant 2).
    pub replaced: Option<String>,
    /// While a rotation is handed to the agents: the key before it
    /// (invariant 5).
    pub previous: Option<Vec<u8>>,
    /// The lineage of the current key's proc issuer, as text (invariant 6).
    pub lineage: String,
    /// When the last rotation began (`None`: the World's token was never
    /// rotated in place).
    pub rotated_at: Option<Timestamp>,
    /// Hashes of the tokens rotated away in place (plan invariant 8).
    pub rotated_hashes: Vec<String>,
}

impl SecretOutcome {
    /// The World's token was ever rotated in place: each new link to an
    /// agent gets the current key and lineage.
    pub fn rotated(&self) -> bool {
        self.rotated_at.is_some()
    }
}

/// Keys of the copy besides the token (invariant 5).
const PREVIOUS: &str = "previous";
const LINEAGE: &str = "lineage";
const ROTATED_AT: &str = "rotated-at";
const ROTATED_FROM: &str = "rotated-from";
/// Most rotated-away token hashes the copy keeps.
const MAX_ROTATED_FROM: usize = 16;

/// What the copy records (invariant 5).
#[derive(Debug, Default, Clone)]
struct Journal {
    key: Vec<u8>,
    previous: Option<Vec<u8>>,
    lineage: String,
    rotated_at: Option<String>,
    rotated_from: Vec<String>,
}

impl Journal {
    fn of(s: &Secret) -> Option<Journal> {
        let key = key_of(s)?;
        let text = |k: &str| {
            s.data
                .as_ref()
                .and_then(|d| d.get(k))
                .map(|b| String::from_utf8_lossy(b.0.trim_ascii()).into_owned())
                .filter(|t| !t.is_empty())
        };
        Some(Journal {
            key,
            previous: s
                .data
                .as_ref()
                .and_then(|d| d.get(PREVIOUS))
                .map(|b| hostmesh_agent::secret_key(&b.0).to_vec())
                .filter(|k| !k.is_empty()),
            lineage: text(LINEAGE).unwrap_or_default(),
            rotated_at: text(ROTATED_AT),
            rotated_from: text(ROTATED_FROM)
                .map(|t| t.split(',').map(str::to_owned).collect())
                .unwrap_or_default(),
        })
    }

    /// The copy's data holding this journal.
    fn write(&self, s: &mut Secret) {
        let mut data = std::collections::BTreeMap::new();
        data.insert(
            contract::SECRET_KEY.to_string(),
            ByteString(self.key.clone()),
        );
        if let Some(p) = &self.previous {
            data.insert(PREVIOUS.to_string(), ByteString(p.clone()));
        }
        for (k, v) in [
            (
                LINEAGE,
                Some(self.lineage.clone()).filter(|l| !l.is_empty()),
            ),
            (ROTATED_AT, self.rotated_at.clone()),
            (
                ROTATED_FROM,
                Some(self.rotated_from.join(",")).filter(|l| !l.is_empty()),
            ),
        ] {
            if let Some(v) = v {
                data.insert(k.to_string(), ByteString(v.into_bytes()));
            }
        }
        s.data = Some(data);
    }

    fn outcome(self) -> SecretOutcome {
        SecretOutcome {
            // A time edited into something else: long ago.
            rotated_at: self
                .rotated_at
                .map(|t| t.parse().unwrap_or(Timestamp::UNIX_EPOCH)),
            key: self.key,
            replaced: None,
            previous: self.previous,
            lineage: self.lineage,
            rotated_hashes: self.rotated_from,
        }
    }

    /// The journal of a rotation from this one's key to `key` (invariant
    /// 5): the old issuer endorses the new one.
    fn rotated_to(&self, key: Vec<u8>) -> Journal {
        let issuer =
            |k: &[u8]| Issuer::from_runtime_key(hostmesh_agent::keys::runtime_key(k).bytes());
        // A lineage that does not lead to the old issuer (edited by hand)
        // is left out: the old issuer's endorsement alone still links them.
        let from = issuer(&self.key)
            .with_lineage_text(&self.lineage)
            .unwrap_or_else(|_| issuer(&self.key));
        let mut rotated_from = self.rotated_from.clone();
        rotated_from.push(desired::secret_hash(&self.key));
        let drop = rotated_from.len().saturating_sub(MAX_ROTATED_FROM);
        rotated_from.drain(..drop);
        Journal {
            lineage: from.endorse(&issuer(&key)).to_text(),
            key,
            previous: Some(self.key.clone()),
            rotated_at: Some(Timestamp::now().to_string()),
            rotated_from,
        }
    }
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
/// left as it is.
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
    ensure_runtime(&api, ctx, world, &outcome.key, &outcome.lineage).await?;
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
        let Some(copy) = copy else {
            create(&api, &with_token(world, copy_name, &key)?).await?;
            return Ok(SecretOutcome {
                key,
                ..Default::default()
            });
        };
        let Some(held) = Journal::of(&copy) else {
            return Err(OperatorError::MissingField("agent Secret copy data.token"));
        };
        if held.key == key {
            return Ok(held.outcome());
        }
        return rotate(world, ctx, &api, copy, held, key).await;
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
        let journal = match copy.as_ref().and_then(Journal::of) {
            Some(j) if j.key == key => j,
            _ => {
                create(&api, &with_token(world, copy_name, &key)?).await?;
                Journal {
                    key: key.clone(),
                    ..Default::default()
                }
            }
        };
        ctx.event(
            world,
            true,
            "AgentSecretRestored",
            format!(
                "Secret {name} was missing; recreated it from {from}, the token the running agents hold"
            ),
        )
        .await;
        return Ok(journal.outcome());
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
        ..Default::default()
    })
}

/// Begins a rotation from the copy's token to the Secret's `key`
/// (invariant 5): the copy records it first, then the hub hands it out.
async fn rotate(
    world: &World,
    ctx: &ControllerContext,
    api: &Api<Secret>,
    copy: Secret,
    held: Journal,
    key: Vec<u8>,
) -> Result<SecretOutcome, OperatorError> {
    let name = desired::secret_name(&world.name_any());
    if key.len() < hostmesh_agent::keys::MIN_SECRET_LEN {
        ctx.event(
            world,
            true,
            "SecretTooShort",
            format!(
                "Secret {name}: its token holds {} bytes, an agent token needs at least {} (the operator writes 64 random hex digits): still using the current token; write a longer one to rotate",
                key.len(),
                hostmesh_agent::keys::MIN_SECRET_LEN
            ),
        )
        .await;
        return Ok(held.outcome());
    }
    let next = held.rotated_to(key);
    update_copy(api, copy, &next).await?;
    ctx.event(
        world,
        false,
        "SecretRotating",
        format!(
            "the agent token in Secret {name} changed: handing it to the running agents in place (no host is replaced; established connections keep running)"
        ),
    )
    .await;
    Ok(next.outcome())
}

/// Writes `journal` into the copy `copy` (as read: a copy changed since
/// is the next pass's).
async fn update_copy(
    api: &Api<Secret>,
    mut copy: Secret,
    journal: &Journal,
) -> Result<(), OperatorError> {
    let name = copy.name_any();
    journal.write(&mut copy);
    match api.replace(&name, &PostParams::default(), &copy).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
            Err(crate::Pending::SecretChanged(name).into())
        }
        Err(e) => Err(e.into()),
    }
}

/// Reads the copy and applies `change` to its journal; when it changed
/// something, writes it back and records Event `reason` with `message`.
async fn change_journal(
    world: &World,
    ctx: &ControllerContext,
    ns: &str,
    change: impl FnOnce(&mut Journal) -> bool,
    (reason, message): (&str, String),
) -> Result<(), OperatorError> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let Some(copy) = api.get_opt(&recovery_name(&world.name_any())).await? else {
        return Ok(());
    };
    let Some(mut journal) = Journal::of(&copy) else {
        return Ok(());
    };
    if !change(&mut journal) {
        return Ok(());
    }
    update_copy(&api, copy, &journal).await?;
    ctx.event(world, false, reason, message).await;
    Ok(())
}

/// Carries a rotation through (invariants 5 and 6): ends it once the agent
/// of every host in `pods` (rank to pod UID; pods being deleted left out)
/// took it over its current link (`rekeyed`): the copy drops the previous
/// token, and the hub dials with the new one only. Drops the lineage once
/// no ProcMesh older than the last rotation (`oldest_mesh`) is left.
pub async fn advance(
    world: &World,
    ctx: &ControllerContext,
    ns: &str,
    outcome: &SecretOutcome,
    pods: &[(hostmesh_crds::Rank, String)],
    rekeyed: impl Fn(hostmesh_crds::Rank, &str) -> bool,
    oldest_mesh: Option<Timestamp>,
) -> Result<(), OperatorError> {
    let key = &outcome.key;
    if outcome.previous.is_some() {
        if pods.iter().all(|(r, uid)| rekeyed(*r, uid)) {
            let message = format!(
                "every host's agent holds the new agent token of Secret {}: the previous token opens nothing any more",
                desired::secret_name(&world.name_any())
            );
            let change = |j: &mut Journal| j.key == *key && j.previous.take().is_some();
            change_journal(world, ctx, ns, change, ("SecretRotated", message)).await?;
        }
        return Ok(());
    }
    let from_before = match (oldest_mesh, outcome.rotated_at) {
        (Some(mesh), Some(rotated)) => mesh < rotated,
        _ => false,
    };
    if !outcome.lineage.is_empty() && !from_before {
        let message = "no ProcMesh from before the last agent token rotation is left: procs issued from now on trust the new proc issuer only".to_string();
        let change = |j: &mut Journal| {
            j.key == *key && j.previous.is_none() && !std::mem::take(&mut j.lineage).is_empty()
        };
        change_journal(world, ctx, ns, change, ("IssuerLineageDropped", message)).await?;
    }
    Ok(())
}

/// Name of `world`'s runtime credential Secret.
pub fn runtime_name(world: &str) -> String {
    format!("{world}-runtime")
}

/// The key in the runtime Secret holding the runtime key (hex).
pub const RUNTIME_KEY: &str = "key";
/// The key in the runtime Secret holding the proc issuer's lineage
/// (absent: none).
pub const RUNTIME_LINEAGE: &str = "lineage";

/// The runtime Secret's data: the runtime key of `key` in hex and the
/// lineage, when there is one.
fn runtime_data(key: &[u8], lineage: &str) -> std::collections::BTreeMap<String, ByteString> {
    let hex = hostmesh_agent::keys::to_hex(hostmesh_agent::keys::runtime_key(key).bytes());
    let mut data = std::collections::BTreeMap::new();
    data.insert(RUNTIME_KEY.to_string(), ByteString(hex.into_bytes()));
    if !lineage.is_empty() {
        data.insert(
            RUNTIME_LINEAGE.to_string(),
            ByteString(lineage.as_bytes().to_vec()),
        );
    }
    data
}

/// Makes sure `<world>-runtime` exists (invariant 4): the World's runtime
/// key, derived from `key`, in hex, and the issuer's `lineage`, owned by
/// the World. One that holds another key or lineage (the token was
/// rotated, or the agent Secret and its copy were deleted and a new token
/// made) is rewritten, and an Event says so when the key changed.
async fn ensure_runtime(
    api: &Api<Secret>,
    ctx: &ControllerContext,
    world: &World,
    key: &[u8],
    lineage: &str,
) -> Result<(), OperatorError> {
    let name = runtime_name(&world.name_any());
    let want = runtime_data(key, lineage);
    if let Some(found) = api.get_opt(&name).await? {
        let trimmed = |d: &std::collections::BTreeMap<String, ByteString>, k: &str| {
            d.get(k).map(|b| b.0.trim_ascii().to_vec())
        };
        let empty = Default::default();
        let held = found.data.as_ref().unwrap_or(&empty);
        let key_changed = trimmed(held, RUNTIME_KEY) != trimmed(&want, RUNTIME_KEY);
        if key_changed || trimmed(held, RUNTIME_LINEAGE) != trimmed(&want, RUNTIME_LINEAGE) {
            let mut s = found;
            s.data = Some(want);
            match api.replace(&name, &PostParams::default(), &s).await {
                Ok(_) => {}
                // Changed or deleted since it was read: the next pass.
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                    return Err(crate::Pending::SecretChanged(name).into());
                }
                Err(e) => return Err(e.into()),
            }
            if !key_changed {
                return Ok(());
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
    s.data = Some(want);
    create(api, &s).await
}
