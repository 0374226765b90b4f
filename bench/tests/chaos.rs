//! CI's share of the chaos suite: one run each of the fast scenarios
//! (proc_kill, agent_kill, pod_delete, secret_delete), through the same code
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

// Fails on the current operator: the restarted operator writes the World
// `Degraded` (hosts `Starting`, `AwaitingHeartbeat`, or `Expired` with
// `Unreachable: no heartbeat ... since the pod became Ready` when the pods
// are older than `healthTimeout`) before its first heartbeats arrive; the
// World is Running again within seconds, no host replaced. Issue 17 wants
// the World to stay Running through the restart. Run it with `--ignored`;
// drop the `ignore` once the takeover keeps the hosts' last known state.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a restarted operator shows the World Degraded until its first heartbeats (issue 17)"]
async fn a_deleted_secret_comes_back_with_its_token() {
    passes(Scenario::SecretDelete).await;
}
