//! e2e: the Helm chart installs with real Helm (Helm v4's library through
//! `helm-python-sdk`, waiting like `helm --wait`), the operator Deployment it
//! describes is rolled out by the embedded cluster's controller-manager and
//! runs as a pod (as the chart's non-root user), that operator makes a World
//! Ready, and uninstall removes the operator process and the chart's objects.
//!
//! Credentials: the embedded API server issues no service account tokens
//! yet (no TokenRequest, no `kube-api-access` volume; see
//! `docs/controllers.md`), so on the embedded cluster the test hands the
//! operator a kubeconfig through the chart's `extraEnv`. On a real cluster
//! the operator uses the chart's ServiceAccount and RBAC as deployed.

use std::process::Command;

use hostmesh_e2e::{Env, condition_true, eventually, find_pids, tail, world_yaml};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{Api, ListParams};

const RELEASE_NAME: &str = "hostmesh-operator";
const SELECTOR: &str = "app.kubernetes.io/instance=hm-e2e";

fn helm(env: &Env, args: &[&str]) -> anyhow::Result<String> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("helm_install.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(args)
        .env("KUBECONFIG", &env.kubeconfig)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    anyhow::ensure!(
        out.status.success(),
        "helm_install.py {} failed:\n{text}\n--- controller-manager log ---\n{}\n--- kubelet log ---\n{}",
        args.first().copied().unwrap_or_default(),
        tail(&env.log("controller-manager"), 30),
        tail(&env.log("kubelet"), 40)
    );
    Ok(text)
}

/// A copy of the cluster's kubeconfig the operator's non-root user can read,
/// outside `/tmp` (the chart mounts an emptyDir there).
fn operator_kubeconfig(env: &Env) -> anyhow::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::Builder::new()
        .prefix("helm-kubeconfig-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let path = dir.path().join("kubeconfig");
    std::fs::copy(&env.kubeconfig, &path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    Ok(dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn helm_chart_runs_the_operator_which_runs_a_world() -> anyhow::Result<()> {
    let env = Env::start_without_operator("helm").await?;
    let ns = env.namespace.clone();
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/hostmesh");
    let kc_dir = operator_kubeconfig(&env)?;
    let mut extra_env = vec![
        // Bind the metrics port on the pod's own loopback IP, so operators of
        // parallel tests on this machine never collide on 0.0.0.0:8080.
        serde_json::json!({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}),
        serde_json::json!({"name": "HOSTMESH_HTTP_ADDR", "value": "$(POD_IP):8080"}),
    ];
    if !env.real_cluster {
        let kc = kc_dir.path().join("kubeconfig");
        extra_env.push(serde_json::json!({"name": "KUBECONFIG", "value": kc}));
    }
    let values = serde_json::json!({
        "replicas": 1,
        "fullnameOverride": RELEASE_NAME,
        "watchNamespaces": [ns],
        "logFormat": "text",
        "extraEnv": extra_env,
    });
    let out = helm(
        &env,
        &[
            "install",
            chart.to_str().unwrap_or_default(),
            &ns,
            &values.to_string(),
        ],
    )?;
    assert!(out.contains("installed"), "{out}");

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
    if !env.real_cluster {
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
    }

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
    // ... and finalizes its deletion (so uninstall leaves nothing stuck).
    env.delete("World", "helm-world").await?;
    let worlds = env.hostmesh_api("World");
    let start = std::time::Instant::now();
    while worlds.get_opt("helm-world").await?.is_some() {
        anyhow::ensure!(start.elapsed() < hostmesh_e2e::WAIT, "World not deleted");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

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
        Ok(d + p + sa + r == 0)
    };
    let start = std::time::Instant::now();
    while !gone().await? {
        anyhow::ensure!(
            start.elapsed() < hostmesh_e2e::WAIT,
            "chart objects still present after uninstall"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    if !env.real_cluster {
        eventually("the operator process exits", || {
            find_pids(|e| e.get("POD_NAME") == Some(&pod_name)).is_empty()
        })
        .await?;
    }
    Ok(())
}
