//! A NetworkPolicy per World (`networking.k8s.io/v1`, docs/operations.md,
//! "Network policy"): with `--network-policy` (the chart's
//! `networkPolicy.enabled`) the host pods admit only the traffic hostmesh
//! needs; without it the operator removes the policies it made.
//!
//! Invariants:
//! 1. The policy `<world>-hosts` selects the World's host pods
//!    (`hostmesh.dev/world=<world>`), governs ingress only (egress is left
//!    alone) and carries a controller owner reference to its World, so it
//!    goes with it. It is server-side applied under
//!    [`crate::FIELD_MANAGER`] when it differs from what this operator last
//!    applied for the World (a spec change: the agent port, `spec.monarch`)
//!    and at least every [`REAPPLY_EVERY`], so an edit by hand is brought
//!    back in line, without a write on every reconcile of a busy World.
//! 2. It admits: the agent port and the health port from the operator's
//!    pods (their namespace by `kubernetes.io/metadata.name` and their
//!    labels, both given to the operator, [`NetworkPolicyArgs`]); every
//!    port from the World's own pods (procs and Monarch workers talk to each
//!    other on ports chosen at run time); and, on a Monarch World, the
//!    Monarch port from the pods `spec.monarch.clientSelector` selects in
//!    the World's namespace. Nothing else: policies are additive, so a user
//!    admits more with a policy of their own.
//! 3. A policy that cannot be written (403 where the chart granted no
//!    permission, a refusal, an API that is not served) never stops the
//!    World: the reconcile goes on, the World's `NetworkPolicyFailure`
//!    condition says why, and a Warning Event and a log line go out when
//!    the reason is new.
//! 4. Without `--network-policy`, the operator deletes, once at start-up,
//!    the policies an earlier run made (label `hostmesh.dev/world` and an
//!    owner reference to a World); it never deletes another policy.
//!    Reconciles then touch no NetworkPolicy.

use std::collections::BTreeMap;
use std::time::Duration;

use hostmesh_agent::contract::HEALTH_PORT;
use hostmesh_crds::World;
use hostmesh_crds::conditions;
use hostmesh_crds::world::WorldStatus;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use tracing::{info, warn};

use super::desired;
use crate::controllers::shared::ControllerContext;
use crate::{FIELD_MANAGER, OperatorError};

/// How often an unchanged policy is applied again (invariant 1).
pub const REAPPLY_EVERY: Duration = Duration::from_secs(300);

/// What this operator last applied per World (by uid): a hash of the
/// policy and when (invariant 1).
#[derive(Default)]
pub struct Applied(std::sync::Mutex<std::collections::HashMap<String, (u64, std::time::Instant)>>);

impl Applied {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, (u64, std::time::Instant)>>
    {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `hash` was applied for World `uid` less than
    /// [`REAPPLY_EVERY`] ago.
    fn fresh(&self, uid: &str, hash: u64) -> bool {
        self.lock()
            .get(uid)
            .is_some_and(|(h, at)| *h == hash && at.elapsed() < REAPPLY_EVERY)
    }

    fn record(&self, uid: &str, hash: u64) {
        self.lock()
            .insert(uid.to_string(), (hash, std::time::Instant::now()));
    }

    /// Forgets a deleted World.
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }
}

/// The label every namespace carries with its own name (Kubernetes sets it
/// since 1.21), by which the policy names the operator's namespace.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// `--network-policy` and what the policies need to know of the operator
/// (flatten into the operator's `clap::Args`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NetworkPolicyArgs {
    /// Write a NetworkPolicy per World that admits to its host pods only
    /// the operator's pods, the World's own pods and its Monarch clients
    /// (docs/operations.md, "Network policy"). Off: delete the ones an
    /// earlier run made. Needs `--operator-namespace` and
    /// `--operator-pod-labels`.
    #[arg(
        long = "network-policy",
        env = "HOSTMESH_NETWORK_POLICY",
        default_value_t = false
    )]
    pub enabled: bool,
    /// Namespace of the operator's pods, which the policies admit to the
    /// agent and health ports (downward API `metadata.namespace`).
    #[arg(long, env = "POD_NAMESPACE")]
    pub operator_namespace: Option<String>,
    /// Labels that select the operator's pods, `key=value` comma-separated
    /// (the chart passes its selector labels).
    #[arg(long, env = "HOSTMESH_OPERATOR_POD_LABELS", value_delimiter = ',')]
    pub operator_pod_labels: Vec<String>,
}

/// A bad `--network-policy` setting; the message names the flag and the fix.
#[derive(Debug, thiserror::Error)]
pub enum NetworkPolicyConfigError {
    /// A setting the policies need is missing.
    #[error("--network-policy needs {flag}: {fix}")]
    Missing {
        /// The flag.
        flag: &'static str,
        /// How to give it.
        fix: &'static str,
    },
    /// An entry of `--operator-pod-labels` is not `key=value` with a valid
    /// label key and value.
    #[error("--operator-pod-labels entry {entry:?}: {why}")]
    BadLabel {
        /// The entry as given.
        entry: String,
        /// What is wrong with it.
        why: String,
    },
}

/// Who the operator is, as a NetworkPolicy peer: its namespace and the
/// labels of its pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorPeer {
    /// The operator's namespace.
    pub namespace: String,
    /// Labels every operator pod carries.
    pub labels: BTreeMap<String, String>,
}

impl NetworkPolicyArgs {
    /// The operator as a peer when policies are on; `Ok(None)` when off.
    pub fn peer(&self) -> Result<Option<OperatorPeer>, NetworkPolicyConfigError> {
        if !self.enabled {
            return Ok(None);
        }
        let namespace = self
            .operator_namespace
            .clone()
            .filter(|n| !n.trim().is_empty())
            .ok_or(NetworkPolicyConfigError::Missing {
                flag: "--operator-namespace",
                fix: "set it, or POD_NAMESPACE through the downward API (metadata.namespace)",
            })?;
        let mut labels = BTreeMap::new();
        for entry in self
            .operator_pod_labels
            .iter()
            .map(|e| e.trim())
            .filter(|e| !e.is_empty())
        {
            let bad = |why: String| NetworkPolicyConfigError::BadLabel {
                entry: entry.to_string(),
                why,
            };
            let (k, v) = entry.split_once('=').ok_or_else(|| {
                bad("give key=value, e.g. app.kubernetes.io/name=hostmesh".into())
            })?;
            if let Some(why) = hostmesh_crds::selector::label_key_problem(k) {
                return Err(bad(why));
            }
            if let Some(why) = hostmesh_crds::selector::label_value_problem(v) {
                return Err(bad(why));
            }
            labels.insert(k.to_string(), v.to_string());
        }
        if labels.is_empty() {
            // An empty podSelector would admit every pod of the namespace.
            return Err(NetworkPolicyConfigError::Missing {
                flag: "--operator-pod-labels",
                fix: "give the labels of the operator's pods, e.g. app.kubernetes.io/name=hostmesh,app.kubernetes.io/component=operator (HOSTMESH_OPERATOR_POD_LABELS)",
            });
        }
        Ok(Some(OperatorPeer { namespace, labels }))
    }
}

/// Name of the World's NetworkPolicy.
pub fn policy_name(world: &str) -> String {
    format!("{world}-hosts")
}

fn match_labels(labels: BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels),
        match_expressions: None,
    }
}

fn tcp(port: u16) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(i32::from(port))),
        protocol: Some("TCP".to_string()),
        end_port: None,
    }
}

/// The World's NetworkPolicy (invariants 1 and 2), as plain data.
pub fn policy(world: &World, operator: &OperatorPeer) -> Result<NetworkPolicy, OperatorError> {
    let name = world.name_any();
    let own_pods = match_labels(BTreeMap::from([(
        desired::LABEL_WORLD.to_string(),
        name.clone(),
    )]));
    let mut ingress = vec![
        NetworkPolicyIngressRule {
            from: Some(vec![NetworkPolicyPeer {
                namespace_selector: Some(match_labels(BTreeMap::from([(
                    NAMESPACE_NAME_LABEL.to_string(),
                    operator.namespace.clone(),
                )]))),
                pod_selector: Some(match_labels(operator.labels.clone())),
                ip_block: None,
            }]),
            ports: Some(vec![tcp(world.spec.port), tcp(HEALTH_PORT)]),
        },
        NetworkPolicyIngressRule {
            from: Some(vec![NetworkPolicyPeer {
                pod_selector: Some(own_pods.clone()),
                ..Default::default()
            }]),
            ports: None,
        },
    ];
    if let Some(m) = &world.spec.monarch
        && let Some(clients) = &m.client_selector
    {
        ingress.push(NetworkPolicyIngressRule {
            from: Some(vec![NetworkPolicyPeer {
                pod_selector: Some(clients.clone()),
                ..Default::default()
            }]),
            ports: Some(vec![tcp(m.port())]),
        });
    }
    Ok(NetworkPolicy {
        metadata: desired::owned_meta(world, policy_name(&name))?,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(own_pods),
            policy_types: Some(vec!["Ingress".to_string()]),
            ingress: Some(ingress),
            egress: None,
        }),
    })
}

/// Why the World's policy could not be written: the condition's reason
/// and message (invariant 3).
pub type Problem = (&'static str, String);

/// Applies the World's policy when policies are on (invariant 1); returns
/// the problem that kept it from being written (invariant 3). Errors that
/// are not the API server's answer about this object (the connection) fail
/// the reconcile as any other write does.
pub(super) async fn ensure(
    world: &World,
    ctx: &ControllerContext,
) -> Result<Option<Problem>, OperatorError> {
    let operator = match ctx.args.network_policy.peer() {
        Ok(None) => return Ok(None),
        Ok(Some(p)) => p,
        Err(e) => return Ok(Some(("NetworkPolicyMisconfigured", e.to_string()))),
    };
    let name = policy_name(&world.name_any());
    let np = policy(world, &operator)?;
    let api: Api<NetworkPolicy> =
        Api::namespaced(ctx.client.clone(), &world.namespace().unwrap_or_default());
    let uid = world.uid().unwrap_or_default();
    let hash = {
        use std::hash::{Hash as _, Hasher as _};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        serde_json::to_vec(&np)?.hash(&mut h);
        h.finish()
    };
    if ctx.applied_policies.fresh(&uid, hash) {
        return Ok(None);
    }
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    match api.patch(&name, &pp, &Patch::Apply(&np)).await {
        Ok(_) => {
            ctx.applied_policies.record(&uid, hash);
            Ok(None)
        }
        Err(kube::Error::Api(e)) if e.code == 403 => Ok(Some((
            "NetworkPolicyForbidden",
            format!(
                "the operator may not write NetworkPolicy {name} ({}): install the hostmesh chart with networkPolicy.enabled=true, which grants it, or run the operator without --network-policy; the World runs without the policy",
                e.message
            ),
        ))),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Some((
            "NetworkPolicyNotServed",
            format!(
                "the API server does not serve networking.k8s.io/v1 NetworkPolicies ({}); the World runs without a policy",
                e.message
            ),
        ))),
        Err(kube::Error::Api(e)) if matches!(e.code, 400 | 422) => Ok(Some((
            "NetworkPolicyRefused",
            format!(
                "the API server refused NetworkPolicy {name}: {}; the World runs without the policy",
                e.message
            ),
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Sets or clears the World's `NetworkPolicyFailure` condition from
/// [`ensure`]'s answer; a new problem also goes out as a Warning Event and
/// a log line (invariant 3).
pub(super) async fn report(
    world: &World,
    ctx: &ControllerContext,
    status: &mut WorldStatus,
    problem: Option<Problem>,
) {
    let generation = world.metadata.generation;
    let now = Time(Timestamp::now());
    let was = conditions::get(&status.conditions, conditions::NETWORK_POLICY_FAILURE)
        .filter(|c| c.status == "True")
        .map(|c| c.message.clone());
    match problem {
        Some((reason, msg)) => {
            if was.as_deref() != Some(msg.as_str()) {
                warn!(world = %world.name_any(), reason, message = %msg, "cannot write the World's NetworkPolicy");
                ctx.event(world, true, reason, msg.clone()).await;
            }
            conditions::set(
                &mut status.conditions,
                conditions::NETWORK_POLICY_FAILURE,
                true,
                reason,
                &msg,
                generation,
                &now,
            );
        }
        None if was.is_some() => {
            let (reason, msg) = if ctx.args.network_policy.enabled {
                ("NetworkPolicyApplied", "the NetworkPolicy is written")
            } else {
                (
                    "NetworkPolicyDisabled",
                    "the operator runs without --network-policy",
                )
            };
            conditions::set(
                &mut status.conditions,
                conditions::NETWORK_POLICY_FAILURE,
                false,
                reason,
                msg,
                generation,
                &now,
            );
        }
        None => {}
    }
}

/// Whether `np` is one this operator made for a World (invariant 4).
fn made_by_us(np: &NetworkPolicy) -> bool {
    np.labels().contains_key(desired::LABEL_WORLD)
        && np.owner_references().iter().any(|o| {
            o.kind == "World"
                && o.api_version
                    .starts_with(&format!("{}/", hostmesh_crds::GROUP))
        })
}

/// How often [`remove_all`] tries before it gives up on a transient error.
const REMOVE_TRIES: u32 = 5;

/// Without `--network-policy`: deletes the policies an earlier run made in
/// `namespace` (`None`: every namespace), once (invariant 4). A 403 (no
/// permission on NetworkPolicies) is said once and ends it; other errors
/// are tried again a few times. Returns how many it deleted.
pub async fn remove_all(ctx: &ControllerContext, namespace: Option<&str>) -> usize {
    let api: Api<NetworkPolicy> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let lp = ListParams::default().labels(&format!(
        "{},{}=hostmesh",
        desired::LABEL_WORLD,
        desired::LABEL_MANAGED_BY
    ));
    let mut removed = 0;
    for attempt in 1..=REMOVE_TRIES {
        match remove_listed(&api, &lp, ctx, &mut removed).await {
            Ok(()) => return removed,
            Err(kube::Error::Api(e)) if e.code == 403 || e.code == 404 => {
                info!(namespace = namespace.unwrap_or("(all)"), code = e.code, message = %e.message, "cannot list NetworkPolicies to remove the ones an earlier run made with --network-policy; leaving them");
                return removed;
            }
            Err(e) => {
                warn!(namespace = namespace.unwrap_or("(all)"), attempt, error = %e, "removing the NetworkPolicies of an earlier run failed");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
    removed
}

async fn remove_listed(
    all: &Api<NetworkPolicy>,
    lp: &ListParams,
    ctx: &ControllerContext,
    removed: &mut usize,
) -> Result<(), kube::Error> {
    for np in all.list(lp).await?.items {
        if !made_by_us(&np) {
            continue;
        }
        let ns = np.namespace().unwrap_or_default();
        let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &ns);
        match api.delete(&np.name_any(), &DeleteParams::default()).await {
            Ok(_) => {
                info!(namespace = %ns, policy = %np.name_any(), "deleted a World's NetworkPolicy: the operator runs without --network-policy");
                *removed += 1;
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Invariant 1: an unchanged policy is not written again until
    /// [`REAPPLY_EVERY`] has passed; a changed one, or one of a World
    /// forgotten, is.
    #[test]
    fn an_unchanged_policy_is_not_written_on_every_reconcile() {
        let applied = Applied::default();
        assert!(!applied.fresh("u1", 7), "never applied");
        applied.record("u1", 7);
        assert!(applied.fresh("u1", 7));
        assert!(!applied.fresh("u1", 8), "the policy changed");
        assert!(!applied.fresh("u2", 7), "another World");
        applied
            .lock()
            .insert("u1".into(), (7, std::time::Instant::now() - REAPPLY_EVERY));
        assert!(!applied.fresh("u1", 7), "due again");
        applied.record("u1", 7);
        applied.forget("u1");
        assert!(!applied.fresh("u1", 7), "forgotten");
    }

    fn mk_world(yaml: &str) -> World {
        let mut w: World = serde_saphyr::from_str(yaml).unwrap();
        w.metadata.namespace = Some("team".into());
        w.metadata.uid = Some("uid-1".into());
        w
    }

    const WORLD: &str = r#"
apiVersion: hostmesh.dev/v1alpha1
kind: World
metadata: {name: trainer}
spec:
  hosts: 2
  port: 27000
  template: {spec: {containers: [{name: host, image: trainer:1.4}]}}
"#;

    fn operator() -> OperatorPeer {
        OperatorPeer {
            namespace: "hostmesh-system".into(),
            labels: BTreeMap::from([
                ("app.kubernetes.io/name".into(), "hostmesh".into()),
                ("app.kubernetes.io/component".into(), "operator".into()),
            ]),
        }
    }

    fn ports(rule: &NetworkPolicyIngressRule) -> Option<Vec<(i32, &str)>> {
        rule.ports.as_ref().map(|ps| {
            ps.iter()
                .map(|p| match (&p.port, p.protocol.as_deref()) {
                    (Some(IntOrString::Int(n)), Some(proto)) => (*n, proto),
                    other => panic!("unexpected port {other:?}"),
                })
                .collect()
        })
    }

    fn labels(sel: &Option<LabelSelector>) -> BTreeMap<String, String> {
        sel.as_ref()
            .and_then(|s| s.match_labels.clone())
            .unwrap_or_default()
    }

    #[test]
    fn a_plain_world_admits_the_operator_on_its_ports_and_its_own_pods_everywhere() {
        let np = policy(&mk_world(WORLD), &operator()).unwrap();
        assert_eq!(np.metadata.name.as_deref(), Some("trainer-hosts"));
        assert_eq!(np.metadata.namespace.as_deref(), Some("team"));
        let owner = &np.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("World", Some(true))
        );
        assert!(made_by_us(&np));
        let spec = np.spec.unwrap();
        let own = BTreeMap::from([("hostmesh.dev/world".to_string(), "trainer".to_string())]);
        assert_eq!(labels(&spec.pod_selector), own);
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        assert!(spec.egress.is_none());
        let ingress = spec.ingress.unwrap();
        assert_eq!(ingress.len(), 2);
        // The operator: its namespace and pods together (one peer: AND).
        let from = ingress[0].from.as_ref().unwrap();
        assert_eq!(from.len(), 1);
        assert_eq!(
            labels(&from[0].namespace_selector),
            BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_string(),
                "hostmesh-system".to_string()
            )])
        );
        assert_eq!(labels(&from[0].pod_selector), operator().labels);
        assert_eq!(
            ports(&ingress[0]),
            Some(vec![(27000, "TCP"), (i32::from(HEALTH_PORT), "TCP")])
        );
        // The World's own pods, every port, this namespace only.
        let from = ingress[1].from.as_ref().unwrap();
        assert_eq!(from.len(), 1);
        assert!(from[0].namespace_selector.is_none());
        assert_eq!(labels(&from[0].pod_selector), own);
        assert_eq!(ports(&ingress[1]), None);
    }

    #[test]
    fn monarch_clients_reach_only_the_monarch_port() {
        let mut w = mk_world(WORLD);
        w.spec.monarch = Some(Default::default());
        // No clientSelector: the World's own pods (every port) only.
        assert_eq!(
            policy(&w, &operator())
                .unwrap()
                .spec
                .unwrap()
                .ingress
                .unwrap()
                .len(),
            2
        );
        let m = w.spec.monarch.as_mut().unwrap();
        m.port = Some(26650);
        m.client_selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("role".into(), "client".into())])),
            match_expressions: None,
        });
        let ingress = policy(&w, &operator())
            .unwrap()
            .spec
            .unwrap()
            .ingress
            .unwrap();
        assert_eq!(ingress.len(), 3);
        let from = ingress[2].from.as_ref().unwrap();
        assert!(from[0].namespace_selector.is_none());
        assert_eq!(
            labels(&from[0].pod_selector),
            BTreeMap::from([("role".to_string(), "client".to_string())])
        );
        assert_eq!(ports(&ingress[2]), Some(vec![(26650, "TCP")]));
        // The agent port follows the spec.
        assert_eq!(ports(&ingress[0]).unwrap()[0], (27000, "TCP"));
    }

    #[test]
    fn the_policy_serializes_as_the_api_expects() {
        let np = policy(&mk_world(WORLD), &operator()).unwrap();
        let v = serde_json::to_value(&np).unwrap();
        // podSelector is required by API servers before 1.31.
        assert_eq!(
            v["spec"]["podSelector"]["matchLabels"]["hostmesh.dev/world"],
            "trainer"
        );
        assert_eq!(v["spec"]["ingress"][0]["ports"][0]["port"], 27000);
        assert_eq!(v["spec"]["ingress"][0]["ports"][0]["protocol"], "TCP");
        assert!(v["spec"].get("egress").is_none());
    }

    #[test]
    fn a_world_without_a_uid_has_no_policy() {
        let mut w = mk_world(WORLD);
        w.metadata.uid = None;
        assert!(policy(&w, &operator()).is_err());
    }

    fn args(enabled: bool, ns: Option<&str>, labels: &[&str]) -> NetworkPolicyArgs {
        NetworkPolicyArgs {
            enabled,
            operator_namespace: ns.map(str::to_string),
            operator_pod_labels: labels.iter().map(|l| l.to_string()).collect(),
        }
    }

    #[test]
    fn the_flags_name_what_is_missing_or_wrong() {
        assert_eq!(args(false, None, &[]).peer().unwrap(), None);
        let peer = args(true, Some("ops"), &["a=b", " c.io/d=e "])
            .peer()
            .unwrap()
            .unwrap();
        assert_eq!(peer.namespace, "ops");
        assert_eq!(
            peer.labels,
            BTreeMap::from([("a".into(), "b".into()), ("c.io/d".into(), "e".into())])
        );
        let e = args(true, None, &["a=b"]).peer().unwrap_err().to_string();
        assert!(
            e.contains("--operator-namespace") && e.contains("POD_NAMESPACE"),
            "{e}"
        );
        let e = args(true, Some("ops"), &[]).peer().unwrap_err().to_string();
        assert!(
            e.contains("--operator-pod-labels") && e.contains("e.g."),
            "{e}"
        );
        let e = args(true, Some("ops"), &["novalue"])
            .peer()
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"novalue\"") && e.contains("key=value"), "{e}");
        let e = args(true, Some("ops"), &["a=b c"])
            .peer()
            .unwrap_err()
            .to_string();
        assert!(e.contains("label value"), "{e}");
    }

    #[test]
    fn only_world_owned_policies_are_ours() {
        let mut np = policy(&mk_world(WORLD), &operator()).unwrap();
        assert!(made_by_us(&np));
        np.metadata.owner_references.as_mut().unwrap()[0].kind = "Deployment".into();
        assert!(!made_by_us(&np));
        let mut np = policy(&mk_world(WORLD), &operator()).unwrap();
        np.metadata.labels = None;
        assert!(!made_by_us(&np));
    }
}
