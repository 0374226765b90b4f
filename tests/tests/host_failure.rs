//! e2e: a host whose agent dies is Expired within healthTimeout (plus the
//! detection slack) and replaced per failurePolicy; with RecreateGang the
//! whole World is recreated.

use hostmesh_e2e::{Env, condition_true, host_state, signal, world_yaml};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

async fn pod_uid(env: &Env, name: &str) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    Ok(pods.get(name).await?.metadata.uid.unwrap_or_default())
}

/// Applies World `w` of two hosts with these timeouts and failure policy
/// (World spec lines) and waits until it is Ready.
async fn ready_world(env: &Env, spec: &str) -> anyhow::Result<()> {
    env.apply(&world_yaml("w", &[("host", 2)], spec)).await?;
    env.wait_for("World", "w", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    Ok(())
}

/// Waits until World `w` has restarted at least once and is Ready again.
async fn restarted_and_ready(env: &Env) -> anyhow::Result<()> {
    env.wait_for("World", "w", "restarted and Ready again", |s| {
        s["restarts"].as_u64().unwrap_or(0) >= 1 && condition_true(s, "Ready")
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_agent_s_host_is_replaced_and_the_others_left_alone() -> anyhow::Result<()> {
    let env = Env::start("host-replace").await?;
    ready_world(
        &env,
        "  healthTimeout: 3s\n  evictionTimeout: 1s\n  failurePolicy: {action: ReplaceHost, maxRestarts: 3, backoff: 1s}\n",
    )
    .await?;
    let old_uid = pod_uid(&env, "w-host-1").await?;
    let untouched = pod_uid(&env, "w-host-0").await?;
    let pids = env.agent_pids("w", 1);
    assert_eq!(pids.len(), 1);
    // The agent is the host container's process: its death fails the pod,
    // which the operator sees at once (no need to wait for heartbeats).
    signal(pids[0], "KILL")?;
    // The root cause without logs: which host, the container's exit code
    // and the signal it means.
    let status = env
        .wait_for("World", "w", "firstFailure names host 1", |s| {
            !s["firstFailure"].is_null()
        })
        .await?;
    let f = &status["firstFailure"];
    assert_eq!(
        (f["rank"].as_u64(), f["pod"].as_str()),
        (Some(1), Some("w-host-1")),
        "{f:#}"
    );
    assert_eq!(
        (f["exitCode"].as_i64(), f["signal"].as_i64()),
        (Some(137), Some(9)),
        "{f:#}"
    );
    assert!(
        f["reason"]
            .as_str()
            .is_some_and(|r| r.contains("container host exited with code 137 (SIGKILL)")),
        "{f:#}"
    );
    restarted_and_ready(&env).await?;
    assert_ne!(
        pod_uid(&env, "w-host-1").await?,
        old_uid,
        "host 1 was recreated"
    );
    assert_eq!(
        pod_uid(&env, "w-host-0").await?,
        untouched,
        "host 0 was left alone"
    );
    assert_eq!(env.agent_pids("w", 1).len(), 1, "a new agent serves host 1");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_agent_expires_degrades_the_world_and_is_replaced() -> anyhow::Result<()> {
    let env = Env::start("host-expire").await?;
    ready_world(
        &env,
        "  healthTimeout: 2s\n  evictionTimeout: 2s\n  failurePolicy: {action: ReplaceHost, maxRestarts: 3, backoff: 1s}\n",
    )
    .await?;
    let old_uid = pod_uid(&env, "w-host-1").await?;
    let pids = env.agent_pids("w", 1);
    assert_eq!(pids.len(), 1);
    // Frozen, not dead: the pod stays Running but the heartbeats stop, so
    // only the supervision hub can tell (detection time is measured by the
    // operator benchmark, not asserted here).
    signal(pids[0], "STOP")?;
    let status = env
        .wait_for("World", "w", "host 1 Expired, World Degraded", |s| {
            host_state(s, 1) == "Expired" && condition_true(s, "Degraded")
        })
        .await;
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            let _ = signal(pids[0], "CONT");
            return Err(e);
        }
    };
    assert!(!status["degradedSince"].is_null(), "{status:#}");
    // Degraded past evictionTimeout: the failure policy replaces the host.
    restarted_and_ready(&env).await?;
    assert_ne!(
        pod_uid(&env, "w-host-1").await?,
        old_uid,
        "host 1 was recreated"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn with_recreate_gang_every_host_is_recreated() -> anyhow::Result<()> {
    let env = Env::start("host-gang").await?;
    ready_world(
        &env,
        "  healthTimeout: 3s\n  evictionTimeout: 1s\n  failurePolicy: {action: RecreateGang, maxRestarts: 3, backoff: 1s}\n",
    )
    .await?;
    let uids = [
        pod_uid(&env, "w-host-0").await?,
        pod_uid(&env, "w-host-1").await?,
    ];
    let pids = env.agent_pids("w", 0);
    assert_eq!(pids.len(), 1);
    signal(pids[0], "KILL")?;
    restarted_and_ready(&env).await?;
    assert_ne!(pod_uid(&env, "w-host-0").await?, uids[0]);
    assert_ne!(
        pod_uid(&env, "w-host-1").await?,
        uids[1],
        "the whole gang is recreated"
    );
    Ok(())
}
