//! e2e: Monarch's provisioning mode with the real client (PyPI
//! torchmonarch 0.7.0, unmodified, in a venv under target/) against a
//! hostmesh operator serving `MonarchMesh` (`--serve-monarch-mesh`, no
//! Monarch operator), from outside the cluster (`KubeConfig.from_path`, so
//! Monarch port-forwards to a worker itself): `add_mesh` with an
//! `ImageSpec` creates the MonarchMesh, hostmesh runs it as a World whose
//! agents run Monarch's worker bootstrap, the client spawns procs on every
//! host, an actor on every proc, calls an endpoint on all and on one slice,
//! `kubectl get monarchmeshes` shows it Ready meanwhile, and `job.kill()`
//! deletes the MonarchMesh, its World and the host pods.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hostmesh_e2e::{Env, EnvOptions, WAIT, condition_true, tail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};

const MESH: &str = "trainer";
const HOSTS: usize = 2;
/// Bound on the whole client run (venv import, pods, connect, calls, kill).
const CLIENT_WAIT: Duration = Duration::from_secs(300);

fn meshes(env: &Env) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monarch.pytorch.org", "v1alpha1", "MonarchMesh"),
        "monarchmeshes",
    );
    Api::namespaced_with(env.client.clone(), &env.namespace, &ar)
}

/// The `RESULT {...}` line of `step` in the client's output.
fn result(out: &str, step: &str) -> anyhow::Result<serde_json::Value> {
    out.lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["step"] == step)
        .with_context(|| format!("the client printed no {step:?} result"))
}

#[tokio::test(flavor = "multi_thread")]
async fn monarch_provisioning_runs_on_a_world_and_kill_deletes_it() -> anyhow::Result<()> {
    if hostmesh_e2e::Placement::from_env()? == hostmesh_e2e::Placement::ProcessKubelet {
        // Skipped with a process kubelet joined to a cluster: Monarch's
        // client writes the pod template, so its pods cannot be pinned to
        // the process kubelet's node (docs/testing.md).
        return Ok(());
    }
    let python = hostmesh_testkit::monarch::python();
    let venv_bin = python
        .parent()
        .context("the venv's python lives in bin/")?
        .to_path_buf();
    let env = Env::start_with_options(
        "monarch-mesh",
        EnvOptions {
            serve_monarch_mesh: true,
            // The worker command is Monarch's `python -u -c ...`: the
            // venv's python, through the kubelet's PATH.
            kubelet_path: vec![venv_bin],
        },
    )
    .await?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("monarch_provision.py");
    let workdir = tempfile::tempdir()?;
    let mut client = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(&env.kubeconfig)
        .arg(&env.namespace)
        .arg(MESH)
        .arg(env.image("monarch:e2e")?)
        .arg(HOSTS.to_string())
        // The user's shell, not the client: this machine's hostname
        // resolves only to loopback, which Monarch refuses for its
        // hostname transport; an explicit client address is Monarch's own
        // remedy. Pods never dial it: everything flows over the
        // port-forward to rank 0.
        .env("HYPERACTOR_MESH_DEFAULT_TRANSPORT", "tcp://127.0.0.1:0")
        .current_dir(workdir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting the Monarch client")?;

    // While the client works, the MonarchMesh becomes Ready and kubectl
    // shows it so.
    let api = meshes(&env);
    let start = Instant::now();
    let mut table = None;
    while table.is_none() && start.elapsed() < CLIENT_WAIT {
        if client.try_wait()?.is_some() {
            break;
        }
        if let Some(m) = api.get_opt(MESH).await? {
            let status = &m.data["status"];
            if condition_true(status, "Ready") && status["readyReplicas"] == HOSTS {
                table = Some(env.kubectl(&["get", "monarchmeshes", "-n", &env.namespace])?);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = tokio::time::timeout(CLIENT_WAIT, client.wait_with_output())
        .await
        .context("the Monarch client did not finish in time")??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let context = || {
        format!(
            "--- client stdout ---\n{stdout}\n--- client stderr (tail) ---\n{}\n--- operator log (tail) ---\n{}\n--- kubelet log (tail) ---\n{}",
            tail(&stderr, 60),
            tail(&env.log("operator"), 40),
            tail(&env.log("kubelet"), 40)
        )
    };
    anyhow::ensure!(
        out.status.success(),
        "the Monarch client failed ({}):\n{}",
        out.status,
        context()
    );
    let table =
        table.with_context(|| format!("the MonarchMesh was never Ready 2/2\n{}", context()))?;
    let row = table
        .lines()
        .find(|l| l.starts_with(MESH))
        .with_context(|| format!("no {MESH} row in:\n{table}"))?;
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols.get(1..3), Some(&["2/2", "Running"][..]), "{table}");

    // Every proc answered, on both hosts; the slice is the last host's.
    let all = result(&stdout, "all").with_context(context)?;
    let ranks: Vec<u64> = (0..(HOSTS as u64) * 2).collect();
    assert_eq!(all["ranks"], serde_json::json!(ranks), "{}", context());
    let hosts: Vec<String> = (0..HOSTS).map(|r| format!("{MESH}-host-{r}")).collect();
    assert_eq!(all["hosts"], serde_json::json!(hosts), "{}", context());
    let slice = result(&stdout, "slice").with_context(context)?;
    // Ranks are the slice's own (one host's two procs).
    assert_eq!(slice["ranks"], serde_json::json!([0, 1]), "{}", context());
    assert_eq!(
        slice["hosts"],
        serde_json::json!([format!("{MESH}-host-{}", HOSTS - 1)]),
        "{}",
        context()
    );
    result(&stdout, "killed").with_context(context)?;

    // job.kill() deleted the MonarchMesh; its World and host pods follow.
    let worlds = env.hostmesh_api("World");
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let all_gone = async || -> Option<bool> {
        let pods = pods
            .list(&ListParams::default().labels(&format!("hostmesh.dev/world={MESH}")))
            .await
            .ok()?;
        Some(
            api.get_opt(MESH).await.ok()?.is_none()
                && worlds.get_opt(MESH).await.ok()?.is_none()
                && pods.items.is_empty(),
        )
    };
    hostmesh_testkit::wait::poll(WAIT, async || {
        if all_gone().await == Some(true) {
            Ok(())
        } else {
            Err(())
        }
    })
    .await
    .map_err(|()| {
        anyhow::anyhow!(
            "the MonarchMesh, World or host pods outlived job.kill()\n{}",
            context()
        )
    })?;
    Ok(())
}
