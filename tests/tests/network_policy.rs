//! e2e: with `--network-policy` every World has its NetworkPolicy
//! (`<world>-hosts`, docs/operations.md "Network policy"): the selectors and
//! ports the spec asks for, accepted by the API server, following a spec
//! change, going with its World, and removed by an operator started
//! without the flag. Runs unchanged on the embedded cluster and with
//! `KUBECONFIG` at a real one (which stores policies whether or not its
//! CNI enforces them). And an operator that may not write policies (the
//! chart's RBAC without them, the flag on) keeps running Worlds and says
//! why on each World.

use std::collections::BTreeMap;

use hostmesh_e2e::chart::{SELECTOR, image_values, install, uninstall};
use hostmesh_e2e::{Env, WAIT, condition_true, world_yaml};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyIngressRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams, Patch, PatchParams};

/// Where the policies say the operator runs (what the chart passes).
const OPERATOR_NAMESPACE: &str = "hostmesh-system";
const OPERATOR_LABELS: &str =
    "app.kubernetes.io/name=hostmesh,app.kubernetes.io/component=operator";

fn labels(sel: Option<&LabelSelector>) -> BTreeMap<String, String> {
    sel.and_then(|s| s.match_labels.clone()).unwrap_or_default()
}

fn ports(rule: &NetworkPolicyIngressRule) -> Vec<(i32, String)> {
    rule.ports
        .iter()
        .flatten()
        .map(|p| {
            let n = match &p.port {
                Some(IntOrString::Int(n)) => *n,
                other => panic!("a numbered port, not {other:?}"),
            };
            (n, p.protocol.clone().unwrap_or_default())
        })
        .collect()
}

/// Polls until `name` exists and `pred` holds on it; the error shows the
/// last policy seen.
async fn policy_until(
    api: &Api<NetworkPolicy>,
    name: &str,
    what: &str,
    pred: impl Fn(&NetworkPolicy) -> bool,
) -> anyhow::Result<NetworkPolicy> {
    hostmesh_testkit::wait::poll(WAIT, async || match api.get_opt(name).await {
        Ok(Some(np)) if pred(&np) => Ok(np),
        other => Err(format!("{other:?}")),
    })
    .await
    .map_err(|last| {
        anyhow::anyhow!("NetworkPolicy {name}: {what}: not after {WAIT:?}; last seen: {last}")
    })
}

/// Polls until `name` is gone.
async fn policy_gone(api: &Api<NetworkPolicy>, name: &str, why: &str) -> anyhow::Result<()> {
    hostmesh_testkit::wait::poll(WAIT, async || match api.get_opt(name).await {
        Ok(None) => Ok(()),
        other => Err(format!("{other:?}")),
    })
    .await
    .map_err(|last| {
        anyhow::anyhow!("NetworkPolicy {name} not gone ({why}) after {WAIT:?}; last seen: {last}")
    })
}

fn tcp(ports: &[i32]) -> Vec<(i32, String)> {
    ports.iter().map(|p| (*p, "TCP".to_string())).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn with_network_policy_each_world_has_its_policy() -> anyhow::Result<()> {
    let mut env = Env::start_without_operator("netpol").await?;
    env.start_operator_with(&[
        "--network-policy",
        "--operator-namespace",
        OPERATOR_NAMESPACE,
        "--operator-pod-labels",
        OPERATOR_LABELS,
    ])?;
    let ns = env.namespace.clone();
    let api: Api<NetworkPolicy> = Api::namespaced(env.client.clone(), &ns);

    // A plain World: the policy exists, with the spec's selectors and ports,
    // and the World runs as without it.
    env.apply(&world_yaml("np", &[("host", 2)], "")).await?;
    let np = policy_until(&api, "np-hosts", "exists", |_| true).await?;
    let world_uid = env
        .hostmesh_api("World")
        .get("np")
        .await?
        .metadata
        .uid
        .expect("uid");
    let owner = &np.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("World", "np", world_uid.as_str())
    );
    let spec = np.spec.clone().expect("spec");
    let own = BTreeMap::from([("hostmesh.dev/world".to_string(), "np".to_string())]);
    assert_eq!(labels(spec.pod_selector.as_ref()), own);
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    assert!(spec.egress.is_none(), "egress is left alone: {spec:?}");
    let ingress = spec.ingress.clone().expect("ingress");
    assert_eq!(ingress.len(), 2, "{ingress:?}");
    let operator = &ingress[0].from.as_ref().expect("from")[0];
    assert_eq!(
        labels(operator.namespace_selector.as_ref()),
        BTreeMap::from([(
            "kubernetes.io/metadata.name".to_string(),
            OPERATOR_NAMESPACE.to_string()
        )])
    );
    assert_eq!(
        labels(operator.pod_selector.as_ref()),
        BTreeMap::from([
            ("app.kubernetes.io/name".to_string(), "hostmesh".to_string()),
            (
                "app.kubernetes.io/component".to_string(),
                "operator".to_string()
            ),
        ])
    );
    // The default agent port (the agent contract's) and the health port.
    assert_eq!(ports(&ingress[0]), tcp(&[26602, 26601]));
    let peers = ingress[1].from.as_ref().expect("from");
    assert_eq!(peers.len(), 1);
    assert!(peers[0].namespace_selector.is_none());
    assert_eq!(labels(peers[0].pod_selector.as_ref()), own);
    assert!(
        ingress[1].ports.is_none(),
        "every port between the World's pods"
    );
    env.wait_for("World", "np", "Ready", |s| condition_true(s, "Ready"))
        .await?;

    // It follows a spec change (the agent port).
    env.hostmesh_api("World")
        .patch(
            "np",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"port": 27000}})),
        )
        .await?;
    policy_until(
        &api,
        "np-hosts",
        "admits the operator on port 27000",
        |np| {
            np.spec
                .as_ref()
                .and_then(|s| s.ingress.as_ref())
                .is_some_and(|i| ports(&i[0]) == tcp(&[27000, 26601]))
        },
    )
    .await?;

    // A Monarch World (suspended: its policy, not its workers, is under
    // test) admits its clients on the Monarch port only, and follows a
    // change of spec.monarch.clientSelector.
    env.apply(&world_yaml(
        "npm",
        &[("host", 1)],
        "  suspend: true\n  monarch:\n    port: 26650\n    clientSelector: {matchLabels: {role: client}}\n",
    ))
    .await?;
    let np = policy_until(&api, "npm-hosts", "admits the clients", |np| {
        np.spec
            .as_ref()
            .and_then(|s| s.ingress.as_ref())
            .is_some_and(|i| i.len() == 3)
    })
    .await?;
    let ingress = np.spec.and_then(|s| s.ingress).expect("ingress");
    let clients = &ingress[2].from.as_ref().expect("from")[0];
    assert!(clients.namespace_selector.is_none());
    assert_eq!(
        labels(clients.pod_selector.as_ref()),
        BTreeMap::from([("role".to_string(), "client".to_string())])
    );
    assert_eq!(ports(&ingress[2]), tcp(&[26650]));
    env.hostmesh_api("World")
        .patch(
            "npm",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"monarch": {"clientSelector": {
                "matchLabels": null,
                "matchExpressions": [{"key": "role", "operator": "In", "values": ["client", "notebook"]}],
            }}}})),
        )
        .await?;
    policy_until(
        &api,
        "npm-hosts",
        "selects the clients by expression",
        |np| {
            np.spec
                .as_ref()
                .and_then(|s| s.ingress.as_ref())
                .and_then(|i| i.get(2))
                .and_then(|r| r.from.as_ref())
                .and_then(|f| f[0].pod_selector.as_ref())
                .is_some_and(|s| {
                    s.match_labels.as_ref().is_none_or(|l| l.is_empty())
                        && s.match_expressions
                            .as_ref()
                            .is_some_and(|e| e.len() == 1 && e[0].operator == "In")
                })
        },
    )
    .await?;

    // The policy goes with its World.
    env.delete("World", "np").await?;
    policy_gone(&api, "np-hosts", "with its World").await?;

    // An operator without --network-policy removes the policies it made,
    // and only those.
    let foreign: NetworkPolicy = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "users-own", "labels": {"hostmesh.dev/world": "npm", "app.kubernetes.io/managed-by": "hostmesh"}},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }))?;
    api.create(&Default::default(), &foreign).await?;
    env.kill_operator();
    env.start_operator()?;
    policy_gone(&api, "npm-hosts", "an operator without --network-policy").await?;
    assert!(
        api.get_opt("users-own").await?.is_some(),
        "a policy no World owns is not the operator's to delete"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_that_may_not_write_policies_keeps_running_worlds() -> anyhow::Result<()> {
    // The chart installed with networkPolicy.enabled=false (its RBAC lists
    // and deletes policies, nothing more) and the flag forced on: every
    // write of a policy is refused with 403. The chart's operator runs on
    // its ServiceAccount, so RBAC is the API server's.
    let env = Env::start_without_operator("netpol-403").await?;
    let ns = env.namespace.clone();
    let mut values = serde_json::json!({
        "replicas": 1,
        "logFormat": "text",
        "watchNamespaces": [ns],
        "networkPolicy": {"enabled": false},
        "extraEnv": [
            {"name": "HOSTMESH_NETWORK_POLICY", "value": "true"},
            {"name": "HOSTMESH_OPERATOR_POD_LABELS", "value": "app.kubernetes.io/instance=hm-e2e"},
        ],
    });
    if let Some(image) = image_values(&env) {
        values["image"] = image;
    }
    install(&env, &values)?;

    env.apply(&world_yaml("np403", &[("host", 2)], "")).await?;
    let status = env
        .wait_for("World", "np403", "Ready, the policy refused", |s| {
            condition_true(s, "Ready") && condition_true(s, "NetworkPolicyFailure")
        })
        .await?;
    let failure = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "NetworkPolicyFailure")
        .cloned()
        .unwrap_or_default();
    assert_eq!(failure["reason"], "NetworkPolicyForbidden", "{failure:#}");
    let message = failure["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("np403-hosts") && message.contains("networkPolicy.enabled=true"),
        "the message names the policy and the fix: {message}"
    );
    let api: Api<NetworkPolicy> = Api::namespaced(env.client.clone(), &ns);
    assert!(api.get_opt("np403-hosts").await?.is_none());
    // A Warning Event on the World says it too.
    let events: Api<Event> = Api::namespaced(env.client.clone(), &ns);
    let forbidden: Vec<Event> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("NetworkPolicyForbidden"))
        .collect();
    assert!(
        forbidden
            .iter()
            .any(|e| e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("np403")),
        "{forbidden:#?}"
    );
    // Never a crash loop: the operator's container never restarted.
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &ns);
    for p in pods
        .list(&ListParams::default().labels(SELECTOR))
        .await?
        .items
    {
        let restarts: i32 = p
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .map(|c| c.restart_count)
            .sum();
        assert_eq!(restarts, 0, "operator pod {:?} restarted", p.metadata.name);
    }
    // The chart's operator finalizes its World before it goes, so the
    // namespace leaves nothing stuck (on a real cluster it did).
    env.delete_and_wait("World", "np403").await?;
    uninstall(&env)?;
    Ok(())
}
