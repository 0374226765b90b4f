//! e2e: `spec.suspend` on a World, with Job semantics. Suspending deletes
//! the host pods (their agents stop the procs), keeps the status and sets
//! `Suspended`; the ProcMesh waits without counting a failure. Resuming
//! recreates the hosts as a new attempt, and the procs come back with
//! `HOSTMESH_ATTEMPT` telling them which one. The procs trap SIGTERM, so the
//! test also shows they were stopped gracefully, not killed with their pods.

use hostmesh_e2e::{Env, condition_true, world_yaml};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};

fn mesh_yaml(dir: &std::path::Path) -> String {
    let cmd = format!(
        "trap 'touch {d}/rank-$RANK-term-$HOSTMESH_ATTEMPT; exit 0' TERM; echo $HOSTMESH_ATTEMPT > {d}/rank-$RANK.tmp && mv {d}/rank-$RANK.tmp {d}/rank-$RANK-attempt-$HOSTMESH_ATTEMPT; sleep 300 & wait",
        d = dir.display()
    );
    format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: pm}}\nspec:\n  world: w\n  perHost: [{{name: gpu, size: 2}}]\n  command: [sh, -c, {cmd:?}]\n  restartPolicy: {{policy: OnFailure, maxRestarts: 0}}\n"
    )
}

async fn set_suspend(env: &Env, suspend: bool) -> anyhow::Result<()> {
    env.hostmesh_api("World")
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"suspend": suspend}})),
        )
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn suspend_stops_the_world_without_failures_and_resume_is_a_new_attempt() -> anyhow::Result<()>
{
    let env = Env::start("suspend").await?;
    let out = env.shared_dir()?;
    env.apply(&world_yaml("w", &[("host", 2)], "")).await?;
    env.apply(&mesh_yaml(&out)).await?;
    env.wait_for("ProcMesh", "pm", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    for rank in 0..4 {
        let first = out.join(format!("rank-{rank}-attempt-0"));
        hostmesh_e2e::eventually(&format!("rank {rank} started as attempt 0"), || {
            first.exists()
        })
        .await?;
    }

    set_suspend(&env, true).await?;
    let world = env
        .wait_for("World", "w", "Suspended with no host pods", |s| {
            s["phase"] == "Suspended"
                && condition_true(s, "Suspended")
                && s["conditions"].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c["type"] == "Suspended"
                            && c["message"] == "spec.suspend is true; no host pods"
                    })
                })
        })
        .await?;
    assert_eq!(world["restarts"], 0, "{world:#}");
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    assert!(
        pods.list(&ListParams::default()).await?.items.is_empty(),
        "the host pods are gone"
    );
    hostmesh_e2e::eventually("the procs are gone", || env.proc_pids("w", "pm").is_empty()).await?;
    for rank in 0..4 {
        let term = out.join(format!("rank-{rank}-term-0"));
        assert!(term.exists(), "rank {rank} saw SIGTERM before its pod went");
    }
    // The mesh waits, and says why; the stopped procs are no failure.
    let pm = env
        .wait_for("ProcMesh", "pm", "waiting on the suspended World", |s| {
            s["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["reason"] == "WorldSuspended")
            })
        })
        .await?;
    assert_eq!(pm["phase"], "Pending", "{pm:#}");
    assert_eq!(pm["failed"], 0, "{pm:#}");
    assert_eq!(pm["restarts"], 0, "{pm:#}");
    assert!(!condition_true(&pm, "Failed"), "{pm:#}");
    assert!(pm.get("firstFailure").is_none(), "{pm:#}");

    set_suspend(&env, false).await?;
    let pm = env
        .wait_for("ProcMesh", "pm", "Ready again", |s| {
            condition_true(s, "Ready")
        })
        .await?;
    assert_eq!(pm["restarts"], 0, "{pm:#}");
    let world = env
        .wait_for("World", "w", "Running again", |s| s["phase"] == "Running")
        .await?;
    assert_eq!(world["attempt"], 1, "{world:#}");
    assert_eq!(world["restarts"], 0, "{world:#}");
    assert!(!condition_true(&world, "Suspended"), "{world:#}");
    for rank in 0..4 {
        let again = out.join(format!("rank-{rank}-attempt-1"));
        hostmesh_e2e::eventually(&format!("rank {rank} started as attempt 1"), || {
            again.exists()
        })
        .await?;
    }
    Ok(())
}
