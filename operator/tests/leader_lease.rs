//! Leader election against the embedded API server (real HTTPS, real
//! resourceVersions): one leader among racing candidates, graceful release
//! and hand-over, takeover after a crashed leader's lease expires, and a
//! leader stepping down when it loses the lease (leader.rs invariants 1-4).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hostmesh_operator::leader::{LeaderElector, LeaderHandle, LeaseConfig, Role};
use hostmesh_testkit::cluster::api_server;
use hostmesh_testkit::{PATIENCE, eventually, eventually_async};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const NS: &str = "default";
const LEASE: &str = "hostmesh-operator";

fn config(identity: &str) -> LeaseConfig {
    LeaseConfig {
        name: LEASE.into(),
        namespace: NS.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(200),
    }
}

struct Candidate {
    handle: LeaderHandle,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Candidate {
    fn start(client: kube::Client, identity: &str) -> Self {
        let (elector, handle) = LeaderElector::new(client, config(identity));
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(elector.run(async {
            let _ = rx.await;
        }));
        Self {
            handle,
            stop: Some(tx),
            task,
        }
    }

    /// Graceful stop: releases the lease if held.
    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(PATIENCE, &mut self.task)
            .await
            .expect("elector stops in time")
            .expect("elector task");
    }

    /// Crash: the task is aborted, nothing is released.
    async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

async fn holder(client: &kube::Client) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), NS);
    api.get_opt(LEASE)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

/// Fails the test if both candidates ever publish `is_leader` at once.
fn watch_for_split_brain(a: &LeaderHandle, b: &LeaderHandle) -> Arc<AtomicBool> {
    let split = Arc::new(AtomicBool::new(false));
    for (mine, other) in [(a, b), (b, a)] {
        let mut rx = mine.is_leader_channel();
        let other = other.clone();
        let split = split.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                if *rx.borrow() && other.is_leader() {
                    split.store(true, Ordering::SeqCst);
                }
            }
        });
    }
    split
}

#[tokio::test]
async fn racing_candidates_elect_one_leader_and_hand_over_on_release() {
    let (_server, client) = api_server().await;
    let a = Candidate::start(client.clone(), "replica-a");
    let b = Candidate::start(client.clone(), "replica-b");
    let split = watch_for_split_brain(&a.handle, &b.handle);

    eventually("one candidate leads and the other stands by", || {
        let roles = (
            a.handle.role_channel().borrow().clone(),
            b.handle.role_channel().borrow().clone(),
        );
        matches!(
            roles,
            (Role::Leader, Role::Standby { holder: Some(_) })
                | (Role::Standby { holder: Some(_) }, Role::Leader)
        )
    })
    .await;
    let (leader, standby, standby_id) = if a.handle.is_leader() {
        (a, b, "replica-b")
    } else {
        (b, a, "replica-a")
    };
    let leader_id = holder(&client).await.expect("lease has a holder");
    assert_ne!(leader_id, standby_id);
    assert_eq!(
        *standby.handle.role_channel().borrow(),
        Role::Standby {
            holder: Some(leader_id.clone())
        }
    );

    // Graceful stop releases the lease; the standby takes over.
    leader.stop().await;
    eventually("the standby leads after the release", || {
        standby.handle.is_leader()
    })
    .await;
    assert_eq!(holder(&client).await.as_deref(), Some(standby_id));
    let api: Api<Lease> = Api::namespaced(client.clone(), NS);
    let spec = api.get(LEASE).await.expect("lease").spec.expect("spec");
    assert_eq!(spec.lease_transitions, Some(1), "{spec:?}");
    assert!(!split.load(Ordering::SeqCst), "two leaders at once");
    standby.stop().await;
}

#[tokio::test]
async fn a_standby_takes_over_after_a_crashed_leaders_lease_expires() {
    let (_server, client) = api_server().await;
    let a = Candidate::start(client.clone(), "replica-a");
    eventually("a leads", || a.handle.is_leader()).await;
    let b = Candidate::start(client.clone(), "replica-b");
    eventually("b stands by behind a", || {
        *b.handle.role_channel().borrow()
            == Role::Standby {
                holder: Some("replica-a".into()),
            }
    })
    .await;
    a.crash().await;
    // The lease still names a: b waits for it to expire on its own clock.
    assert_eq!(holder(&client).await.as_deref(), Some("replica-a"));
    eventually("b leads after a's lease expired", || b.handle.is_leader()).await;
    assert_eq!(holder(&client).await.as_deref(), Some("replica-b"));
    b.stop().await;
    eventually_async("b released the lease", async || {
        holder(&client).await.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_steps_down() {
    let (_server, client) = api_server().await;
    let a = Candidate::start(client.clone(), "replica-a");
    eventually("a leads", || a.handle.is_leader()).await;
    let mut leader_rx = a.handle.is_leader_channel();

    // Someone else writes the lease (an operator of an older version, or a
    // manual edit): a must notice at its next renewal and stop leading.
    let api: Api<Lease> = Api::namespaced(client.clone(), NS);
    eventually_async("the lease is overwritten", async || {
        let mut lease = api.get(LEASE).await.ok()?;
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some("intruder".into());
        spec.lease_duration_seconds = Some(3600);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        // A 409 (a renewed in between) retries with the fresh version.
        api.replace(LEASE, &PostParams::default(), &lease)
            .await
            .ok()
    })
    .await;
    tokio::time::timeout(PATIENCE, leader_rx.wait_for(|leader| !*leader))
        .await
        .expect("a steps down in time")
        .expect("elector alive");
    assert_eq!(
        *a.handle.role_channel().borrow(),
        Role::Standby {
            holder: Some("intruder".into())
        }
    );
    // A standby never releases a lease it does not hold.
    a.stop().await;
    assert_eq!(holder(&client).await.as_deref(), Some("intruder"));
}

#[tokio::test]
async fn a_leader_that_cannot_reach_the_api_server_steps_down() {
    let (server, client) = api_server().await;
    let a = Candidate::start(client.clone(), "replica-a");
    eventually("a leads", || a.handle.is_leader()).await;
    let mut leader_rx = a.handle.is_leader_channel();
    server.shutdown().await;
    tokio::time::timeout(PATIENCE, leader_rx.wait_for(|leader| !*leader))
        .await
        .expect("a steps down within its renew deadline")
        .expect("elector alive");
    a.crash().await;
}
