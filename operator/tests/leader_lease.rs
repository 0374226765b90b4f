//! Leader election against the embedded API server (real HTTPS, real
//! resourceVersions): one leader among racing candidates, graceful release
//! and hand-over, takeover after a crashed leader's lease expires, a
//! leader stepping down when it loses the lease, and the Lease owned by
//! its holder's Pod, collected with it (leader invariants 1-5).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hostmesh_operator::leader::{LeaderElector, LeaderHandle, LeaseConfig, OwnerPod, Role};
use hostmesh_testkit::cluster::api_server;
use hostmesh_testkit::{PATIENCE, eventually, eventually_async};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
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
        owner: None,
    }
}

/// A replica in Pod `pod` whose Lease would not expire within the test
/// ([`PATIENCE`]): a hand-over the test sees is the garbage collector's
/// doing or a release, never an expiry.
fn in_pod(pod: &OwnerPod) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(3600),
        renew_deadline: Duration::from_secs(1800),
        owner: Some(pod.clone()),
        ..config(&pod.name)
    }
}

/// Creates Pod `name` (unscheduled: deleting it removes it at once, as a
/// real API server does) and returns it as an owner.
async fn pod(client: &kube::Client, name: &str) -> OwnerPod {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "operator", "image": "ghcr.io/hostmesh/hostmesh:test"}]},
    }))
    .expect("a pod");
    let made = Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    OwnerPod {
        name: name.into(),
        uid: made.metadata.uid.expect("a uid"),
    }
}

async fn delete_pod(client: &kube::Client, name: &str) {
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete pod");
}

/// The Lease's owner references, `None` when it has none; panics when the
/// Lease is gone.
async fn owners(client: &kube::Client) -> Option<Vec<OwnerReference>> {
    Api::<Lease>::namespaced(client.clone(), NS)
        .get(LEASE)
        .await
        .expect("the lease exists")
        .metadata
        .owner_references
}

fn owned_by(pod: &OwnerPod) -> Option<Vec<OwnerReference>> {
    Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        ..OwnerReference::default()
    }])
}

struct Candidate {
    handle: LeaderHandle,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Candidate {
    fn start(client: kube::Client, identity: &str) -> Self {
        Self::start_with(client, config(identity))
    }

    fn start_with(client: kube::Client, config: LeaseConfig) -> Self {
        let (elector, handle) = LeaderElector::new(client, config);
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
    let lease = api.get(LEASE).await.expect("lease");
    // Outside a Pod nothing owns the Lease (invariant 5).
    assert_eq!(lease.metadata.owner_references, None);
    let spec = lease.spec.expect("spec");
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

/// Invariant 5, as on `helm uninstall`: the chart's RBAC goes with the
/// operator, so the leader cannot release its Lease; its Pod goes, and the
/// garbage collector takes the Lease with it. A standby (a reinstalled
/// operator) then leads at its next retry, not after the hour the Lease
/// would take to expire.
#[tokio::test]
async fn the_lease_goes_with_its_holders_pod_when_it_could_not_be_released() {
    let (_server, client) = api_server().await;
    let (pod_a, pod_b) = (pod(&client, "op-a").await, pod(&client, "op-b").await);
    let a = Candidate::start_with(client.clone(), in_pod(&pod_a));
    eventually("a leads", || a.handle.is_leader()).await;
    assert_eq!(owners(&client).await, owned_by(&pod_a));
    let b = Candidate::start_with(client.clone(), in_pod(&pod_b));
    eventually("b stands by behind a", || {
        *b.handle.role_channel().borrow()
            == Role::Standby {
                holder: Some("op-a".into()),
            }
    })
    .await;

    // a ends without a release, then its Pod is deleted.
    a.crash().await;
    delete_pod(&client, "op-a").await;
    eventually("b leads once a's Lease is collected", || {
        b.handle.is_leader()
    })
    .await;
    assert_eq!(holder(&client).await.as_deref(), Some("op-b"));
    assert_eq!(owners(&client).await, owned_by(&pod_b));

    // A released Lease goes with its Pod too: nothing is left behind.
    b.stop().await;
    delete_pod(&client, "op-b").await;
    let api: Api<Lease> = Api::namespaced(client.clone(), NS);
    eventually_async("the released Lease is collected with op-b", async || {
        matches!(api.get_opt(LEASE).await, Ok(None)).then_some(())
    })
    .await;
}

/// Invariant 5, as in a rolling upgrade: the new leader re-points the
/// Lease to its own Pod in the write that takes it, so the old Pod's end
/// leaves the Lease (and the new leader) alone.
#[tokio::test]
async fn a_new_leader_re_points_the_lease_so_the_old_pods_end_keeps_it() {
    let (_server, client) = api_server().await;
    let (old, new) = (pod(&client, "op-old").await, pod(&client, "op-new").await);
    let a = Candidate::start_with(client.clone(), in_pod(&old));
    eventually("the old operator leads", || a.handle.is_leader()).await;
    let b = Candidate::start_with(client.clone(), in_pod(&new));
    eventually("the new operator stands by", || {
        matches!(*b.handle.role_channel().borrow(), Role::Standby { .. })
    })
    .await;
    // SIGTERM: the old leader releases; the new one takes over.
    a.stop().await;
    eventually("the new operator leads", || b.handle.is_leader()).await;
    assert_eq!(owners(&client).await, owned_by(&new));

    // The old Pod goes. A witness owned by it shows the collector has
    // judged its dependents; the Lease was not among them.
    let witnesses: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let mut witness = ConfigMap::default();
    witness.metadata.name = Some("witness".into());
    witness.metadata.owner_references = owned_by(&old);
    witnesses
        .create(&PostParams::default(), &witness)
        .await
        .expect("create the witness");
    delete_pod(&client, "op-old").await;
    eventually_async("the old Pod's witness is collected", async || {
        matches!(witnesses.get_opt("witness").await, Ok(None)).then_some(())
    })
    .await;
    assert_eq!(holder(&client).await.as_deref(), Some("op-new"));
    assert_eq!(owners(&client).await, owned_by(&new));
    assert!(b.handle.is_leader());
    b.stop().await;
}
