//! e2e: the operator killed in the middle of a ProcMesh spawn converges after
//! a restart with no duplicate procs and no lost status.

use hostmesh_e2e::{Env, condition_true, world_yaml};

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
