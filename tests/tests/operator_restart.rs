//! e2e: operator restarts and leader changes. Killed in the middle of a
//! ProcMesh spawn, the operator converges with no duplicate procs and no lost
//! status; restarted, or replaced by a new leader as in a rolling upgrade,
//! long after the spawn (past `spawnTimeout`), it leaves healthy ProcMeshes
//! Running with the same processes.

use std::time::Duration;

use hostmesh_e2e::{Env, always_for, condition_true, world_yaml};

#[tokio::test(flavor = "multi_thread")]
async fn operator_restart_mid_spawn_converges_without_duplicates() -> anyhow::Result<()> {
    let mut env = Env::start("operator-restart").await?;
    env.apply(&world_yaml("w", &[("host", 2)], "")).await?;
    env.wait_for("World", "w", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    env.apply(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {name: pm}\nspec:\n  world: w\n  perHost: [{name: gpu, size: 4}]\n  command: [sleep, '300']\n",
    )
    .await?;
    // Kill the operator as soon as the first proc exists: mid-spawn.
    hostmesh_e2e::eventually("the first proc started", || {
        !env.proc_pids("w", "pm").is_empty()
    })
    .await?;
    env.kill_operator();
    env.start_operator()?;
    let status = env
        .wait_for("ProcMesh", "pm", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    assert_eq!(status["running"], 8, "{status:#}");
    // Exactly one process per rank.
    let pids = env.proc_pids("w", "pm");
    assert_eq!(pids.len(), 8, "no duplicate procs: {pids:?}");
    Ok(())
}

/// The spawn timeout of the meshes below: short, so that "long after the
/// spawn" is a few seconds.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(2);

/// A Running ProcMesh `pm` of 2 hosts x 2 procs on World `w`, with its proc
/// pids, once `SPAWN_TIMEOUT` has passed since it spawned.
async fn running_past_spawn_timeout(env: &Env) -> anyhow::Result<Vec<i32>> {
    env.apply(&world_yaml("w", &[("host", 2)], "")).await?;
    env.wait_for("World", "w", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    env.apply(&format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: pm}}\nspec:\n  world: w\n  perHost: [{{name: gpu, size: 2}}]\n  command: [sleep, '300']\n  spawnTimeout: {}s\n  restartPolicy: {{policy: OnFailure, maxRestarts: 3}}\n",
        SPAWN_TIMEOUT.as_secs()
    ))
    .await?;
    env.wait_for("ProcMesh", "pm", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    // The fault needs time to pass: the takeover must come after the
    // spawn timeout has run out.
    tokio::time::sleep(SPAWN_TIMEOUT * 2).await;
    let mut pids = env.proc_pids("w", "pm");
    pids.sort();
    anyhow::ensure!(pids.len() == 4, "4 procs before the takeover: {pids:?}");
    Ok(pids)
}

/// For a while after a takeover, the ProcMesh stays Running with no failure
/// and no restart, on the same processes.
async fn stays_healthy(env: &Env, pids: &[i32]) -> anyhow::Result<()> {
    let api = env.hostmesh_api("ProcMesh");
    always_for(
        "the ProcMesh stays Running through the takeover",
        Duration::from_secs(12),
        async || {
            let pm = api.get("pm").await?;
            let s = &pm.data["status"];
            let bad = s["phase"] != "Running"
                || s["restarts"].as_u64().unwrap_or(0) != 0
                || !s["firstFailure"].is_null()
                || !condition_true(s, "Ready");
            Ok(bad.then(|| format!("{s:#}")))
        },
    )
    .await?;
    let mut now = env.proc_pids("w", "pm");
    now.sort();
    assert_eq!(now, pids, "the same procs run after the takeover");
    Ok(())
}

/// The new leader is in charge: a proc killed now is restarted by it.
async fn new_leader_acts(env: &Env, pids: &[i32]) -> anyhow::Result<()> {
    hostmesh_e2e::signal(pids[0], "KILL")?;
    let status = env
        .wait_for("ProcMesh", "pm", "restarted once and Ready", |s| {
            s["restarts"].as_u64() == Some(1) && condition_true(s, "Ready")
        })
        .await?;
    assert_eq!(status["running"], 4, "{status:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn operator_restart_long_after_spawn_keeps_procs_running() -> anyhow::Result<()> {
    let mut env = Env::start("operator-restart-late").await?;
    let pids = running_past_spawn_timeout(&env).await?;
    env.kill_operator();
    env.start_operator()?;
    stays_healthy(&env, &pids).await?;
    new_leader_acts(&env, &pids).await
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_handover_in_an_upgrade_keeps_procs_running() -> anyhow::Result<()> {
    let mut env = Env::start_without_operator("operator-upgrade").await?;
    let lease_name = env.start_elected_operator("old")?;
    let pids = running_past_spawn_timeout(&env).await?;
    // A rolling upgrade: the new replica starts as a standby, then the old
    // one is stopped and hands the Lease over.
    env.start_elected_operator("new")?;
    env.terminate_oldest_operator().await?;
    stays_healthy(&env, &pids).await?;
    let lease: k8s_openapi::api::coordination::v1::Lease =
        kube::Api::namespaced(env.client.clone(), hostmesh_e2e::LEASE_NAMESPACE)
            .get(&lease_name)
            .await?;
    let holder = lease.spec.and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("new"), "the new replica leads");
    new_leader_acts(&env, &pids).await
}
