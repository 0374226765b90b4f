//! e2e: whose fault a failure was, in status (`firstFailure.cause` and
//! `evidence`, on the World and the ProcMesh): a proc that exits 1 after
//! printing a traceback is the user's; a host pod deleted from outside, a
//! killed agent and a device its kubelet reports Unhealthy are the
//! infrastructure's.

use hostmesh_e2e::{Env, EnvOptions, condition_true, signal, world_yaml};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};

fn mesh_yaml(world: &str, command: &str, extra: &str) -> String {
    format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: pm}}\nspec:\n  world: {world}\n  perHost: [{{name: gpu, size: 1}}]\n  command: [sh, -c, {command:?}]\n{extra}"
    )
}

/// A command that prints a Python traceback on stderr and exits 1 once
/// `file` exists (at once when `file` is empty).
fn traceback_after(file: &str) -> String {
    let wait = if file.is_empty() {
        String::new()
    } else {
        format!("while [ ! -e {file} ]; do sleep 0.2; done; ")
    };
    format!(
        "{wait}echo 'Traceback (most recent call last):' >&2; echo '  File \"train.py\", line 7, in <module>' >&2; echo 'ValueError: shard 3 is corrupt' >&2; exit 1"
    )
}

fn cause_of(status: &serde_json::Value) -> (&str, &str) {
    let f = &status["firstFailure"];
    (
        f["cause"].as_str().unwrap_or_default(),
        f["evidence"]["reason"].as_str().unwrap_or_default(),
    )
}

/// Waits until `kind/name`'s `firstFailure` has `cause`, and returns its
/// status.
async fn first_failure_with_cause(
    env: &Env,
    kind: &str,
    name: &str,
    cause: &str,
) -> anyhow::Result<serde_json::Value> {
    env.wait_for(kind, name, &format!("firstFailure.cause {cause}"), |s| {
        s["firstFailure"]["cause"] == cause
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_proc_that_exits_1_after_a_traceback_is_a_user_failure() -> anyhow::Result<()> {
    let env = Env::start("cause-user").await?;
    env.apply(&world_yaml("w", &[("host", 1)], "")).await?;
    env.apply(&mesh_yaml(
        "w",
        &traceback_after(""),
        "  restartPolicy: {policy: Never}\n",
    ))
    .await?;
    let s = first_failure_with_cause(&env, "ProcMesh", "pm", "User").await?;
    assert_eq!(cause_of(&s), ("User", "PythonTraceback"), "{s:#}");
    assert_eq!(
        s["firstFailure"]["evidence"]["message"],
        "Python traceback: ValueError: shard 3 is corrupt",
        "{s:#}"
    );
    assert_eq!(s["incidents"][0]["cause"], "User", "{s:#}");
    // The failed rank carries it too (what failure rules match on).
    let ranks = s["ranks"].as_array().cloned().unwrap_or_default();
    assert!(
        ranks
            .iter()
            .any(|r| r["state"] == "Failed" && r["cause"] == "User"),
        "{s:#}"
    );
    // The World's hosts are fine: no failure there.
    let w = env
        .wait_for("World", "w", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    assert!(w["firstFailure"].is_null(), "{w:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_pod_deleted_from_outside_is_an_infrastructure_failure() -> anyhow::Result<()> {
    let env = Env::start("cause-deleted").await?;
    env.apply(&world_yaml("w", &[("host", 2)], "")).await?;
    env.apply(&mesh_yaml(
        "w",
        "exec sleep 600",
        "  restartPolicy: {policy: OnFailure, maxRestarts: 3}\n",
    ))
    .await?;
    env.wait_for("ProcMesh", "pm", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    env.wait_for("World", "w", "Running", |s| s["phase"] == "Running")
        .await?;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    pods.delete("w-host-1", &DeleteParams::default()).await?;
    let w = first_failure_with_cause(&env, "World", "w", "Infrastructure").await?;
    assert_eq!(cause_of(&w), ("Infrastructure", "PodDeleted"), "{w:#}");
    assert_eq!(w["firstFailure"]["rank"], 1, "{w:#}");
    let pm = first_failure_with_cause(&env, "ProcMesh", "pm", "Infrastructure").await?;
    assert_eq!(pm["firstFailure"]["host"], 1, "{pm:#}");
    assert_eq!(pm["incidents"][0]["cause"], "Infrastructure", "{pm:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_agent_is_an_infrastructure_failure() -> anyhow::Result<()> {
    let env = Env::start("cause-agent").await?;
    env.apply(&world_yaml(
        "w",
        &[("host", 2)],
        "  healthTimeout: 3s\n  evictionTimeout: 1s\n  failurePolicy: {action: ReplaceHost, maxRestarts: 3, backoff: 1s}\n",
    ))
    .await?;
    env.apply(&mesh_yaml(
        "w",
        "exec sleep 600",
        "  restartPolicy: {policy: OnFailure, maxRestarts: 3}\n",
    ))
    .await?;
    env.wait_for("ProcMesh", "pm", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    let pids = env.agent_pids("w", 1);
    assert_eq!(pids.len(), 1, "host 1's agent");
    signal(pids[0], "KILL")?;
    let w = env
        .wait_for("World", "w", "firstFailure names the agent's end", |s| {
            cause_of(s) == ("Infrastructure", "AgentExited")
        })
        .await?;
    let msg = w["firstFailure"]["evidence"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(msg.contains("SIGKILL"), "{w:#}");
    let pm = first_failure_with_cause(&env, "ProcMesh", "pm", "Infrastructure").await?;
    assert_eq!(pm["firstFailure"]["host"], 1, "{pm:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_traceback_on_an_unhealthy_device_is_an_infrastructure_failure() -> anyhow::Result<()> {
    let env = Env::start_with_options(
        "cause-device",
        EnvOptions {
            gpu_capacity: 2,
            ..Default::default()
        },
    )
    .await?;
    if !env.has_process_kubelet() {
        // Skipped on a cluster's own nodes: a real node's devices report
        // their own health, and this test needs the process kubelet's hook
        // to make one Unhealthy (docs/testing.md).
        return Ok(());
    }
    let marks = env.shared_dir()?;
    let crash = marks.join("crash");
    let world = world_yaml("w", &[("host", 1)], "").replace(
        "        image: busybox\n",
        "        image: busybox\n        resources: {limits: {nvidia.com/gpu: 1}}\n",
    );
    assert!(world.contains("nvidia.com/gpu"), "{world}");
    env.apply(&world).await?;
    env.apply(&mesh_yaml(
        "w",
        &traceback_after(&crash.display().to_string()),
        "  restartPolicy: {policy: Never}\n",
    ))
    .await?;
    env.wait_for("ProcMesh", "pm", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let pod = pods.get("w-host-0").await?;
    let held = serde_json::to_value(&pod.status)?["containerStatuses"][0]
        ["allocatedResourcesStatus"][0]["resources"][0]["resourceID"]
        .as_str()
        .map(str::to_string);
    let Some(device) = held else {
        anyhow::bail!("the host container holds no device: {:#?}", pod.status);
    };
    env.set_device_health(&[&format!("nvidia.com/gpu {device} Unhealthy")])?;
    let w = env
        .wait_for("World", "w", "host 0 marked by its device", |s| {
            s["hosts"][0]["evidence"]["reason"] == "DeviceUnhealthy"
        })
        .await?;
    assert_eq!(w["hosts"][0]["cause"], "Infrastructure", "{w:#}");
    assert_eq!(w["hosts"][0]["state"], "Ready", "{w:#}");
    // The proc then fails as a CUDA program on a broken GPU does: a
    // traceback and exit 1. The device's evidence wins.
    std::fs::write(&crash, "")?;
    let pm = first_failure_with_cause(&env, "ProcMesh", "pm", "Infrastructure").await?;
    assert_eq!(
        cause_of(&pm),
        ("Infrastructure", "DeviceUnhealthy"),
        "{pm:#}"
    );
    let msg = pm["firstFailure"]["evidence"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(msg.contains(&format!("nvidia.com/gpu {device}")), "{pm:#}");
    assert_eq!(pm["firstFailure"]["exitCode"], 1, "{pm:#}");
    Ok(())
}
