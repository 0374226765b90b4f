//! CI's share of the chaos suite: one run each of the fast scenarios
//! (proc_kill, agent_kill, pod_delete, secret_delete, up_kill), through the same code
//! as `hostmesh-bench chaos`. Fails with the reason when a run's final state
//! or status trail is wrong. Needs the `hostmesh` binary built beside the
//! test (`cargo build --bin hostmesh`) or `HOSTMESH_BIN`, as the e2e suite.

use hostmesh_bench::chaos::{Scenario, run_scenario};

async fn passes(scenario: Scenario) {
    let o = run_scenario(scenario, 1).await;
    assert!(
        o.failures.is_empty(),
        "{}: {:#?}",
        scenario.name(),
        o.failures
    );
    let t = &o.timings[0];
    assert!(t.detect.is_some() && t.recover.is_some(), "{t:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_proc_is_restarted_once_and_named() {
    passes(Scenario::ProcKill).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_agent_s_host_is_replaced() {
    passes(Scenario::AgentKill).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_host_pod_is_replaced() {
    passes(Scenario::PodDelete).await;
}

// The Secret comes back with the agents' token, and the restarted operator
// keeps the World Running through the takeover (no Degraded flap).
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_secret_comes_back_with_its_token() {
    passes(Scenario::SecretDelete).await;
}

// kill -9 of `hostmesh up`: its processes die with it and its reaper
// removes every file and token (up_kill has no recovery to time).
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_hostmesh_up_leaves_no_process_file_or_token() {
    let o = run_scenario(Scenario::UpKill, 1).await;
    assert!(o.failures.is_empty(), "up_kill: {:#?}", o.failures);
    let t = &o.timings[0];
    assert!(t.detect.is_some(), "{t:?}");
    assert!(
        t.extra.iter().all(|(_, v, _)| *v == 0.0),
        "files or tokens left: {t:?}"
    );
}
