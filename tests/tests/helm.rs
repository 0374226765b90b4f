//! e2e: the Helm chart installs with real Helm (Helm v4's library through
//! `helm-python-sdk`, waiting like `helm --wait`), the operator Deployment it
//! describes is rolled out by the embedded cluster's controller-manager and
//! runs as a pod (as the chart's non-root user), that operator makes a World
//! Ready, a `helm upgrade` that changes the pod template rolls the operator
//! to a new pod (maxSurge 1, maxUnavailable 0) whose operator takes over the
//! Lease and makes a second World Ready, and uninstall removes the operator process, the chart's
//! objects and the leader's Lease.
//!
//! Credentials: the operator runs with the chart's ServiceAccount and RBAC
//! only: the API server's ServiceAccount admission mounts a token for it,
//! kube-rs finds it in-cluster (`KUBERNETES_SERVICE_HOST`, the token and
//! CA files), and RBAC enforces the chart's Roles. The World becoming Ready
//! proves the chart grants enough; a token of the same ServiceAccount is
//! refused what the chart does not grant.

use anyhow::Context as _;
use hostmesh_e2e::chart::{SELECTOR, chart_dir, helm, image_values, install};
use hostmesh_e2e::{
    Env, client_with_token, condition_true, eventually, find_pids, service_account_token,
    world_yaml,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};

const RELEASE_NAME: &str = "hostmesh-operator";
/// The chart's default `leaderElection.leaseName`.
const LEASE_NAME: &str = "hostmesh-operator";

/// The chart values of these tests: one replica, text logs, watching
/// `namespace` only (a Role) or every namespace (a ClusterRole), and the
/// image the cluster's nodes have ([`image_values`]).
fn chart_values(env: &Env, namespace: Option<&str>) -> serde_json::Value {
    let mut values = serde_json::json!({
        "replicas": 1,
        "fullnameOverride": RELEASE_NAME,
        "logFormat": "text",
        // The chart's default binds the metrics port on the pod's own IP, so
        // operators of parallel tests on this machine (and a surge pod on a
        // real node) never collide on one port.
    });
    if let Some(ns) = namespace {
        values["watchNamespaces"] = serde_json::json!([ns]);
    }
    if let Some(image) = image_values(env) {
        values["image"] = image;
    }
    values
}

#[tokio::test(flavor = "multi_thread")]
async fn helm_chart_runs_the_operator_which_runs_a_world() -> anyhow::Result<()> {
    let env = Env::start_without_operator("helm").await?;
    let ns = env.namespace.clone();
    let chart = chart_dir();
    let values = chart_values(&env, Some(&ns));
    install(&env, &values)?;

    // Helm waited for the rollout; the Deployment says so in Kubernetes' terms.
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &ns);
    let d = deployments.get(RELEASE_NAME).await?;
    let st = d.status.clone().unwrap_or_default();
    assert_eq!(st.available_replicas, Some(1), "{st:?}");
    assert_eq!(st.observed_generation, d.metadata.generation);
    // The operator pod is Ready, runs the hostmesh binary as the chart's user.
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &ns);
    let operator_pods = pods
        .list(&ListParams::default().labels(SELECTOR))
        .await?
        .items;
    assert_eq!(operator_pods.len(), 1, "{operator_pods:#?}");
    let pod = &operator_pods[0];
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    assert!(ready, "operator pod not Ready: {:#?}", pod.status);
    {
        let pids = find_pids(|e| e.get("POD_NAME") == Some(&pod_name));
        assert_eq!(pids.len(), 1, "operator processes of {pod_name}: {pids:?}");
        let status = std::fs::read_to_string(format!("/proc/{}/status", pids[0]))?;
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|u| u.split_whitespace().next())
            .unwrap_or_default()
            .to_owned();
        assert_eq!(uid, "65532", "the operator runs as the chart's runAsUser");
        let environ = std::fs::read(format!("/proc/{}/environ", pids[0]))?;
        assert!(
            !environ
                .split(|b| *b == 0)
                .any(|kv| kv.starts_with(b"KUBECONFIG=")),
            "the operator must find its credentials in-cluster, not in a kubeconfig"
        );
    }
    // Its credentials are the ServiceAccount's, mounted by the API server.
    let spec = pod.spec.clone().unwrap_or_default();
    assert_eq!(
        spec.service_account_name.as_deref(),
        Some(RELEASE_NAME),
        "the chart's ServiceAccount"
    );
    let mounted = spec.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path == "/var/run/secrets/kubernetes.io/serviceaccount");
    assert!(mounted, "no service account token mounted: {spec:#?}");

    // The operator from the chart reconciles a World to Ready.
    env.apply(&world_yaml("helm-world", &[("host", 2)], ""))
        .await?;
    env.wait_for("World", "helm-world", "Ready", |s| {
        condition_true(s, "Ready")
    })
    .await
    .map_err(|e| {
        let logs = env
            .kubectl(&[
                "logs",
                "-n",
                &ns,
                &format!("deploy/{RELEASE_NAME}"),
                "--tail=40",
            ])
            .unwrap_or_default();
        anyhow::anyhow!("{e}\n--- chart operator log ---\n{logs}")
    })?;

    // The chart's RBAC is least privilege: the operator's ServiceAccount may
    // do what the World above needed, and nothing outside its Roles.
    let sa_token = service_account_token(&env.client, &ns, RELEASE_NAME).await?;
    let as_operator = client_with_token(&env.kubeconfig, &sa_token).await?;
    let user = format!("system:serviceaccount:{ns}:{RELEASE_NAME}");
    let world_resource = kube::discovery::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("hostmesh.dev", "v1alpha1", "World"),
        "worlds",
    );
    let worlds_as_operator: Api<DynamicObject> =
        Api::namespaced_with(as_operator.clone(), &ns, &world_resource);
    worlds_as_operator
        .get("helm-world")
        .await
        .context("the operator's ServiceAccount reads Worlds in its namespace")?;
    let denied = |r: Result<(), kube::Error>, want: &str| match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {
            assert_eq!(s.message, want);
            Ok(())
        }
        other => Err(anyhow::anyhow!("expected 403 `{want}`, got {other:?}")),
    };
    let nodes: Api<Node> = Api::all(as_operator.clone());
    denied(
        nodes
            .delete(&env.node, &DeleteParams::default())
            .await
            .map(|_| ()),
        &format!(
            r#"nodes "{}" is forbidden: User "{user}" cannot delete resource "nodes" in API group "" at the cluster scope"#,
            env.node
        ),
    )?;
    let system_secrets: Api<Secret> = Api::namespaced(as_operator.clone(), "kube-system");
    denied(
        system_secrets
            .list(&ListParams::default())
            .await
            .map(|_| ()),
        &format!(
            r#"secrets is forbidden: User "{user}" cannot list resource "secrets" in API group "" in the namespace "kube-system""#
        ),
    )?;
    // Even in its own namespace it reads Secrets by name only, never lists.
    let own_secrets: Api<Secret> = Api::namespaced(as_operator.clone(), &ns);
    denied(
        own_secrets.list(&ListParams::default()).await.map(|_| ()),
        &format!(
            r#"secrets is forbidden: User "{user}" cannot list resource "secrets" in API group "" in the namespace "{ns}""#
        ),
    )?;
    assert!(
        nodes.get_opt(&env.node).await.is_err(),
        "nodes are not the operator's business"
    );

    // An upgrade that changes the pod template rolls the operator.
    let mut upgraded = values.clone();
    upgraded["logLevel"] = serde_json::json!("debug");
    let out = helm(
        &env,
        &[
            "upgrade",
            chart.to_str().unwrap_or_default(),
            &ns,
            &upgraded.to_string(),
        ],
    )?;
    assert!(out.contains("upgraded"), "{out}");
    let d = deployments.get(RELEASE_NAME).await?;
    let st = d.status.clone().unwrap_or_default();
    assert_eq!(
        (
            st.updated_replicas,
            st.available_replicas,
            st.observed_generation
        ),
        (Some(1), Some(1), d.metadata.generation),
        "{st:?}"
    );
    let start = std::time::Instant::now();
    let new_pod = loop {
        let live: Vec<Pod> = pods
            .list(&ListParams::default().labels(SELECTOR))
            .await?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        if let [p] = live.as_slice()
            && p.metadata.name.as_deref() != Some(pod_name.as_str())
        {
            break p.metadata.name.clone().unwrap_or_default();
        }
        anyhow::ensure!(
            start.elapsed() < hostmesh_e2e::WAIT,
            "the operator did not roll to one new pod: {:?}",
            live.iter()
                .map(|p| p.metadata.name.clone())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    {
        eventually("the old operator process exits", || {
            find_pids(|e| e.get("POD_NAME") == Some(&pod_name)).is_empty()
        })
        .await?;
    }
    // The new operator took over: it makes a second World Ready.
    env.apply(&world_yaml("helm-world-2", &[("host", 1)], ""))
        .await?;
    env.wait_for("World", "helm-world-2", "Ready", |s| {
        condition_true(s, "Ready")
    })
    .await?;

    // Nothing the operator attempted was refused (a missing grant for a
    // side path such as Events would not stop the World from getting Ready).
    let logs = env.kubectl(&["logs", "-n", &ns, &format!("deploy/{RELEASE_NAME}")])?;
    assert!(
        refusals(&logs).is_empty(),
        "the chart's RBAC refused the operator something:\n{}",
        refusals(&logs).join("\n")
    );

    // ... and finalizes deletions (so uninstall leaves nothing stuck).
    for w in ["helm-world", "helm-world-2"] {
        env.delete_and_wait("World", w).await?;
    }
    let pod_name = new_pod;

    let out = helm(&env, &["uninstall", &ns])?;
    assert!(out.contains("uninstalled"), "{out}");
    // Every object of the release is gone, and so is the operator process.
    let gone = async || -> anyhow::Result<bool> {
        let lp = ListParams::default().labels(SELECTOR);
        let d = deployments.list(&lp).await?.items.len();
        let p = pods.list(&lp).await?.items.len();
        let sa = Api::<ServiceAccount>::namespaced(env.client.clone(), &ns)
            .list(&lp)
            .await?
            .items
            .len();
        let r = Api::<Role>::namespaced(env.client.clone(), &ns)
            .list(&lp)
            .await?
            .items
            .len();
        // The leader's Lease goes with its Pod (it owns the Lease), though
        // the release on SIGTERM was refused: the chart's RBAC went first.
        let lease = Api::<Lease>::namespaced(env.client.clone(), &ns)
            .get_opt(LEASE_NAME)
            .await?
            .is_some();
        Ok(d + p + sa + r == 0 && !lease)
    };
    let start = std::time::Instant::now();
    while !gone().await? {
        anyhow::ensure!(
            start.elapsed() < hostmesh_e2e::WAIT,
            "chart objects or the leader's Lease still present after uninstall"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    {
        eventually("the operator process exits", || {
            find_pids(|e| e.get("POD_NAME") == Some(&pod_name)).is_empty()
        })
        .await?;
    }
    Ok(())
}

/// The chart's default, every namespace: a ClusterRole and its binding grant
/// enough for the operator (on its own ServiceAccount token) to make a World
/// Ready and, with `monarch.serveMonarchMesh`, a MonarchMesh's World;
/// nothing it attempts is refused, and uninstall removes them.
#[tokio::test(flavor = "multi_thread")]
async fn helm_chart_cluster_wide_rbac_is_enough_and_uninstalls() -> anyhow::Result<()> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};

    let env = Env::start_without_operator("helm-cluster").await?;
    if env.real_cluster {
        // Skipped on a shared cluster: a cluster-wide operator would also
        // reconcile other tests' (and users') Worlds.
        return Ok(());
    }
    let ns = env.namespace.clone();
    let mut values = chart_values(&env, None);
    values["monarch"] = serde_json::json!({"serveMonarchMesh": true});
    install(&env, &values)?;
    let name = format!("{RELEASE_NAME}-manager");
    let cluster_roles: Api<ClusterRole> = Api::all(env.client.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(env.client.clone());
    cluster_roles.get(&name).await.context("the ClusterRole")?;
    bindings
        .get(&name)
        .await
        .context("the ClusterRoleBinding")?;

    env.apply(&world_yaml("cw", &[("host", 2)], "")).await?;
    env.wait_for("World", "cw", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    // monarch.serveMonarchMesh installed the MonarchMesh CRD and granted
    // its controller enough to make a mesh's World and write its status.
    monarch_mesh_gets_its_world(&env).await?;
    let logs = env.kubectl(&["logs", "-n", &ns, &format!("deploy/{RELEASE_NAME}")])?;
    assert!(
        refusals(&logs).is_empty(),
        "the chart's RBAC refused the operator something:\n{}",
        refusals(&logs).join("\n")
    );
    // Cluster-wide, still least privilege: no Node writes, no Secret lists.
    let sa_token = service_account_token(&env.client, &ns, RELEASE_NAME).await?;
    let as_operator = client_with_token(&env.kubeconfig, &sa_token).await?;
    let nodes: Api<Node> = Api::all(as_operator.clone());
    let refused = nodes.delete(&env.node, &DeleteParams::default()).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
        "{refused:?}"
    );
    let secrets: Api<Secret> = Api::all(as_operator);
    let refused = secrets.list(&ListParams::default()).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
        "{refused:?}"
    );

    env.delete("World", "cw").await?;
    let worlds = env.hostmesh_api("World");
    let start = std::time::Instant::now();
    while worlds.get_opt("cw").await?.is_some() {
        anyhow::ensure!(start.elapsed() < hostmesh_e2e::WAIT, "World cw not deleted");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let out = helm(&env, &["uninstall", &ns])?;
    assert!(out.contains("uninstalled"), "{out}");
    let start = std::time::Instant::now();
    while cluster_roles.get_opt(&name).await?.is_some() || bindings.get_opt(&name).await?.is_some()
    {
        anyhow::ensure!(
            start.elapsed() < hostmesh_e2e::WAIT,
            "the ClusterRole or its binding survived uninstall"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    Ok(())
}

/// A MonarchMesh (as Monarch's client makes it; its worker only sleeps)
/// gets an owned World and a status naming it, and takes the World along
/// when deleted: what the chart's MonarchMesh RBAC must allow.
async fn monarch_mesh_gets_its_world(env: &Env) -> anyhow::Result<()> {
    let ar = kube::discovery::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("monarch.pytorch.org", "v1alpha1", "MonarchMesh"),
        "monarchmeshes",
    );
    let meshes: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.namespace, &ar);
    let mesh: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "monarch.pytorch.org/v1alpha1",
        "kind": "MonarchMesh",
        "metadata": {"name": "cwmesh"},
        "spec": {"replicas": 1, "port": 26600, "podTemplate": {"spec": {"containers": [
            {"name": "worker", "image": "monarch:e2e", "command": ["sleep", "600"]},
        ]}}},
    }))?;
    meshes
        .create(&kube::api::PostParams::default(), &mesh)
        .await
        .context("the MonarchMesh CRD serves")?;
    let worlds = env.hostmesh_api("World");
    let start = std::time::Instant::now();
    loop {
        let status = meshes.get("cwmesh").await?.data["status"].clone();
        if status["world"] == "cwmesh" && worlds.get_opt("cwmesh").await?.is_some() {
            break;
        }
        anyhow::ensure!(
            start.elapsed() < hostmesh_e2e::WAIT,
            "MonarchMesh cwmesh got no World; last status {status}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    meshes.delete("cwmesh", &DeleteParams::default()).await?;
    let start = std::time::Instant::now();
    while worlds.get_opt("cwmesh").await?.is_some() {
        anyhow::ensure!(
            start.elapsed() < hostmesh_e2e::WAIT,
            "World cwmesh outlived its MonarchMesh"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    Ok(())
}

/// The log lines where the API server refused the operator something,
/// but the Kueue Workloads watch: with the chart's `kueue.enabled` off (its
/// default) that refusal is the documented behaviour, once, when another
/// test of the cluster has installed Kueue's CRDs (Worlds naming a queue
/// are held with reason KueueForbidden).
fn refusals(logs: &str) -> Vec<&str> {
    logs.lines()
        .filter(|l| {
            l.contains("is forbidden") && !l.contains("workloads.kueue.x-k8s.io is forbidden")
        })
        .collect()
}
