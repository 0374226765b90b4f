//! Subscriptions: snapshot first, then every change in order, then
//! heartbeats whose digest matches the state (host::subscription
//! invariants 1-2).

mod agent_common;

use std::time::Duration;

use agent_common::{harness, req};
use hostmesh_agent::protocol::{AgentPush, ProcPhase};
use hostmesh_agent::{Subscription, digest};
use hostmesh_testkit::PATIENCE;

async fn next(sub: &mut Subscription) -> AgentPush {
    tokio::time::timeout(PATIENCE, sub.next())
        .await
        .expect("a push within the patience bound")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_then_changes_then_heartbeat() {
    let h = harness();
    h.manager
        .create_or_update(req("early", 0, "sleep", &["60"]))
        .unwrap();
    let mut sub = Subscription::new(h.manager.clone(), Duration::from_millis(100));
    let AgentPush::Snapshot {
        host_rank,
        seq,
        procs,
        ..
    } = next(&mut sub).await
    else {
        panic!("first push must be a snapshot");
    };
    assert_eq!(host_rank, 0);
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].name, "early");
    let mut last = seq;

    h.manager
        .create_or_update(req("late", 1, "sh", &["-c", "exit 4"]))
        .unwrap();
    let mut late_final = None;
    while late_final.is_none() {
        match next(&mut sub).await {
            AgentPush::Changed(c) => {
                assert!(c.state.seq > last, "changes arrive in sequence order");
                last = c.state.seq;
                if c.state.name == "late" && c.state.status.is_terminal() {
                    late_final = Some(c.state.status);
                }
            }
            AgentPush::Heartbeat { .. } => {}
            AgentPush::Snapshot { .. } => panic!("no snapshot without falling behind"),
        }
    }
    assert!(matches!(
        late_final,
        Some(ProcPhase::Stopped { exit_code: 4, .. })
    ));
    // Heartbeats carry the digest of the current state.
    let mut matched = false;
    for _ in 0..300 {
        if let AgentPush::Heartbeat {
            digest: d, procs, ..
        } = next(&mut sub).await
        {
            let (_, states) = h.manager.snapshot();
            if procs == 2 && d == digest(&states) {
                matched = true;
                break;
            }
        }
    }
    assert!(matched, "no heartbeat matched the state digest");
    h.manager.shutdown(Duration::from_secs(10), 2).await;
}
