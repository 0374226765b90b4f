//! Hub tests with simulated agents (in memory).

use hostmesh_crds::Rank;
use std::time::{Duration, Instant};

use hostmesh_agent::protocol::{ProcPhase, ProcSpec};
use hostmesh_crds::procmesh::ProcState;

use super::sim::{SimConnector, SimRequest, connector};
use super::*;

fn wk() -> WorldKey {
    WorldKey {
        namespace: "ns".into(),
        name: "w".into(),
    }
}

fn host(rank: Rank) -> HostKey {
    HostKey { world: wk(), rank }
}

fn agents(n: Rank, uid: &str) -> WorldAgents {
    WorldAgents {
        secret: Arc::from(&b"secret"[..]),
        previous: None,
        trust: None,
        health_timeout: Duration::from_secs(10),
        heartbeat_interval: hostmesh_crds::validate::DEFAULT_HEARTBEAT_INTERVAL,
        epochs: BTreeMap::new(),
        hosts: (0..n)
            .map(|r| {
                (
                    r,
                    (
                        format!("{uid}-{r}"),
                        SocketAddr::from(([127, 0, 1, r as u8], 26602)),
                    ),
                )
            })
            .collect(),
    }
}

fn req(rank: Rank, incarnation: u32) -> CreateOrUpdate {
    CreateOrUpdate {
        name: proc_name("pm.abc", rank),
        rank,
        spec: ProcSpec::command("sh", &[]),
        incarnation,
    }
}

fn drain(hub: &Hub, rx: &mut mpsc::Receiver<HostReport>) {
    while let Ok(p) = rx.try_recv() {
        hub.handle_push(p, Instant::now());
    }
}

fn mk_on(sim: &Arc<SimConnector>) -> (Arc<Hub>, mpsc::Receiver<HostReport>) {
    let hub = Hub::new(connector(sim));
    let rx = hub.push_rx.lock().unwrap().take().unwrap();
    (hub, rx)
}

fn mk() -> (Arc<SimConnector>, Arc<Hub>, mpsc::Receiver<HostReport>) {
    let sim = Arc::new(SimConnector::default());
    let (hub, rx) = mk_on(&sim);
    (sim, hub, rx)
}

const GRACE: Duration = Duration::from_secs(1);

#[tokio::test]
async fn liveness_follows_heartbeats_and_expiry() {
    let (_sim, hub, mut rx) = mk();
    hub.sync_world(&wk(), agents(2, "a")).await;
    drain(&hub, &mut rx); // snapshots count as heartbeats
    assert_eq!(hub.liveness(&wk(), 0, "a-0"), Liveness::Alive);
    assert_eq!(hub.liveness(&wk(), 0, "other-pod"), Liveness::Unknown);
    let (tw, mut rw) = mpsc::unbounded_channel();
    let (tm, _rm) = mpsc::unbounded_channel();
    let later = Instant::now() + Duration::from_secs(11);
    hub.tick(later, &tw, &tm);
    assert_eq!(hub.liveness(&wk(), 1, "a-1"), Liveness::Expired);
    assert_eq!(
        rw.try_recv().unwrap(),
        wk(),
        "expiry triggers the World at once"
    );
    hub.handle_push(
        HostReport::Heartbeat {
            host: host(1),
            pod_uid: "a-1".into(),
            clock: None,
            digest: None,
        },
        later,
    );
    assert_eq!(hub.liveness(&wk(), 1, "a-1"), Liveness::Alive);
}

/// An address book the agent refused (its actor not registered yet) is
/// sent again: without it the agent starts no proc but rank 0's.
#[tokio::test]
async fn a_refused_address_book_is_sent_again() {
    let (sim, hub, _rx) = mk();
    sim.refuse_book.lock().unwrap().extend([host(1), host(1)]);
    hub.sync_world(&wk(), agents(2, "a")).await;
    hostmesh_testkit::eventually_async("host 1 got the book after two refusals", || async {
        sim.requests_of(&host(1))
            .iter()
            .any(|r| matches!(r, SimRequest::Book(b) if b.len() == 2))
            .then_some(())
    })
    .await;
    assert!(sim.refuse_book.lock().unwrap().is_empty());
}

/// A hung agent holds up neither the sync (so neither the reconcile nor
/// its eviction decision) nor the address book of the other hosts.
#[tokio::test]
async fn a_hung_agent_blocks_no_sync_and_no_other_host() {
    let (sim, hub, _rx) = mk();
    sim.hung.lock().unwrap().push(host(0));
    let quick = Duration::from_secs(5);
    tokio::time::timeout(quick, hub.sync_world(&wk(), agents(2, "a")))
        .await
        .expect("the first sync does not wait on the hung agent");
    hostmesh_testkit::eventually_async("host 1 got the book", || async {
        sim.requests_of(&host(1))
            .iter()
            .any(|r| matches!(r, SimRequest::Book(b) if b.len() == 2))
            .then_some(())
    })
    .await;
    // A third host joins: the book changes; again no wait.
    tokio::time::timeout(quick, hub.sync_world(&wk(), agents(3, "a")))
        .await
        .expect("a changed book does not wait on the hung agent");
    hostmesh_testkit::eventually_async("host 1 got the new book", || async {
        sim.requests_of(&host(1))
            .iter()
            .any(|r| matches!(r, SimRequest::Book(b) if b.len() == 3))
            .then_some(())
    })
    .await;
    assert!(
        sim.requests_of(&host(0)).is_empty(),
        "the hung agent answered nothing"
    );
}

/// A host that leaves (its pod deleted, say while the World is suspended)
/// takes its procs' reports with it: a later pod of that rank starts from
/// nothing, not from a stale Succeeded.
#[tokio::test]
async fn a_host_that_leaves_takes_its_proc_reports_with_it() {
    let (_sim, hub, mut rx) = mk();
    hub.sync_world(&wk(), agents(2, "a")).await;
    hub.ensure_procs(&wk(), 0, vec![req(0, 0), req(1, 0)], GRACE)
        .await
        .unwrap();
    drain(&hub, &mut rx);
    assert_eq!(hub.proc_states(&wk(), "pm.abc").len(), 2);
    hub.sync_world(&wk(), agents(0, "a")).await;
    assert!(hub.proc_states(&wk(), "pm.abc").is_empty());
}

/// A host whose pod left the view (terminating: no address to dial) keeps
/// when it was last heard and watched (invariant 10), for the pod's uid
/// only, until a new pod of its rank comes.
#[tokio::test]
async fn a_departed_host_keeps_when_it_was_last_heard() {
    let (_sim, hub, mut rx) = mk();
    hub.sync_world(&wk(), agents(2, "a")).await;
    drain(&hub, &mut rx); // snapshots count as heartbeats
    let heard = hub.last_heard(&wk(), 1, Some("a-1")).expect("heard");
    let watched = hub.watching_since(&wk(), 1, "a-1").expect("watched");
    let mut without_1 = agents(2, "a");
    without_1.hosts.remove(&1);
    hub.sync_world(&wk(), without_1.clone()).await;
    assert_eq!(hub.liveness(&wk(), 1, "a-1"), Liveness::Unknown);
    assert_eq!(hub.last_heard(&wk(), 1, Some("a-1")), Some(heard));
    assert_eq!(hub.last_heard(&wk(), 1, None), Some(heard));
    assert_eq!(hub.watching_since(&wk(), 1, "a-1"), Some(watched));
    assert_eq!(hub.last_heard(&wk(), 1, Some("b-1")), None);
    assert_eq!(hub.watching_since(&wk(), 1, "b-1"), None);
    // A new pod of rank 1: the departed one is forgotten.
    hub.sync_world(&wk(), agents(2, "b")).await;
    assert_eq!(hub.last_heard(&wk(), 1, Some("a-1")), None);
    assert_eq!(hub.watching_since(&wk(), 1, "a-1"), None);
}

/// A report its agent sends after its pod left (the World suspended, the
/// agent still stopping its procs) or was replaced counts for nothing: it
/// would stand for procs no pod of that rank runs now.
#[tokio::test]
async fn a_late_report_of_a_gone_or_replaced_pod_counts_for_nothing() {
    let (sim, hub, mut rx) = mk();
    hub.sync_world(&wk(), agents(1, "a")).await;
    hub.ensure_procs(&wk(), 0, vec![req(0, 0)], GRACE)
        .await
        .unwrap();
    drain(&hub, &mut rx);
    let name = proc_name("pm.abc", 0);
    let late = sim
        .set_status(&host(0), &name, ProcPhase::Stopping { pid: 7 })
        .unwrap();
    hub.sync_world(&wk(), agents(0, "a")).await;
    hub.handle_push(late.clone(), Instant::now());
    assert!(hub.proc_states(&wk(), "pm.abc").is_empty(), "pod gone");

    sim.procs.lock().unwrap().clear();
    hub.sync_world(&wk(), agents(1, "b")).await;
    drain(&hub, &mut rx);
    hub.handle_push(late, Instant::now());
    assert!(hub.proc_states(&wk(), "pm.abc").is_empty(), "pod replaced");
    // The current pod's reports count.
    hub.ensure_procs(&wk(), 0, vec![req(0, 0)], GRACE)
        .await
        .unwrap();
    drain(&hub, &mut rx);
    let now = sim
        .set_status(&host(0), &name, ProcPhase::Stopping { pid: 8 })
        .unwrap();
    hub.handle_push(now, Instant::now());
    assert_eq!(
        hub.proc_states(&wk(), "pm.abc")[&0].state,
        ProcState::Stopping
    );
}

#[tokio::test]
async fn address_book_and_no_duplicate_creates() {
    let (sim, hub, mut rx) = mk();
    hub.sync_world(&wk(), agents(2, "a")).await;
    // The book goes from the link's own task (invariant 5).
    hostmesh_testkit::eventually_async("the address book sent", || async {
        matches!(&sim.requests_of(&host(0))[..], [SimRequest::Book(b)] if b.len() == 2)
            .then_some(())
    })
    .await;
    assert!(hub.connected(&wk(), 2));
    assert_eq!(
        hub.ensure_procs(&wk(), 0, vec![req(0, 0), req(1, 0)], GRACE)
            .await
            .ok(),
        Some(2)
    );
    assert_eq!(
        hub.ensure_procs(&wk(), 0, vec![req(0, 0), req(1, 0)], GRACE)
            .await
            .ok(),
        Some(0)
    );
    drain(&hub, &mut rx);
    let states = hub.proc_states(&wk(), "pm.abc");
    assert_eq!(states[&1].state, ProcState::Running);
    // Re-sync with the same pods: no new dial, no resend.
    hub.sync_world(&wk(), agents(2, "a")).await;
    assert_eq!(sim.requests_of(&host(0)).len(), 3);
    hub.stop_procs(&wk(), "pm.abc", GRACE).await.unwrap();
    let stops = sim
        .requests_of(&host(0))
        .into_iter()
        .filter(|r| matches!(r, SimRequest::Stop(_)))
        .count();
    assert_eq!(stops, 2);
    drain(&hub, &mut rx);
    assert!(!hub.procs_running(&wk(), "pm.abc"));
    assert_eq!(
        hub.proc_states(&wk(), "pm.abc")[&0].state,
        ProcState::Stopped
    );
}

#[tokio::test]
async fn restart_of_a_running_proc_stops_it_first() {
    let (sim, hub, mut rx) = mk();
    hub.sync_world(&wk(), agents(1, "a")).await;
    hub.ensure_procs(&wk(), 0, vec![req(0, 0)], GRACE)
        .await
        .unwrap();
    drain(&hub, &mut rx);
    // Gang restart: incarnation 1 while incarnation 0 still runs.
    assert_eq!(
        hub.ensure_procs(&wk(), 0, vec![req(0, 1)], GRACE)
            .await
            .ok(),
        Some(0)
    );
    assert_eq!(
        sim.requests_of(&host(0)).last(),
        Some(&SimRequest::Stop(proc_name("pm.abc", 0)))
    );
    drain(&hub, &mut rx);
    assert_eq!(
        hub.ensure_procs(&wk(), 0, vec![req(0, 1)], GRACE)
            .await
            .ok(),
        Some(1)
    );
    drain(&hub, &mut rx);
    let s = &hub.proc_states(&wk(), "pm.abc")[&0];
    assert_eq!((s.state, s.incarnation), (ProcState::Running, 1));
}

#[tokio::test]
async fn restarted_operator_rebuilds_from_snapshots_without_duplicates() {
    let (sim, hub, mut rx) = mk();
    hub.sync_world(&wk(), agents(1, "a")).await;
    hub.ensure_procs(&wk(), 0, vec![req(0, 0)], GRACE)
        .await
        .unwrap();
    drain(&hub, &mut rx);
    drop(hub);
    // A new hub (operator restart) against the same agents.
    let (hub2, mut rx2) = mk_on(&sim);
    hub2.sync_world(&wk(), agents(1, "a")).await;
    drain(&hub2, &mut rx2);
    assert_eq!(
        hub2.proc_states(&wk(), "pm.abc")[&0].state,
        ProcState::Running
    );
    hub2.ensure_procs(&wk(), 0, vec![req(0, 0)], GRACE)
        .await
        .unwrap();
    let procs = sim.procs.lock().unwrap();
    assert_eq!(
        procs[&host(0)].len(),
        1,
        "the agent still has exactly one proc"
    );
}

#[tokio::test]
async fn replaced_pod_is_a_new_agent_and_refusals_retry() {
    let (sim, hub, mut rx) = mk();
    sim.refuse
        .lock()
        .unwrap()
        .push(SocketAddr::from(([127, 0, 1, 0], 26602)));
    hub.sync_world(&wk(), agents(1, "a")).await;
    assert!(!hub.connected(&wk(), 1));
    assert!(matches!(
        hub.ensure_procs(&wk(), 0, vec![req(0, 0)], GRACE).await,
        Err(LinkError::NotConnected(0))
    ));
    sim.refuse.lock().unwrap().clear();
    hub.sync_world(&wk(), agents(1, "a")).await;
    assert!(hub.connected(&wk(), 1));
    drain(&hub, &mut rx);
    assert_eq!(hub.liveness(&wk(), 0, "a-0"), Liveness::Alive);
    hub.sync_world(&wk(), agents(1, "b")).await;
    assert_eq!(hub.liveness(&wk(), 0, "a-0"), Liveness::Unknown);
    drain(&hub, &mut rx);
    assert_eq!(hub.liveness(&wk(), 0, "b-0"), Liveness::Alive);
}

#[tokio::test]
async fn proc_failures_trigger_at_once_and_storms_coalesce() {
    let (sim, hub, mut rx) = mk();
    hub.sync_world(&wk(), agents(4, "a")).await;
    for h in 0..4 {
        hub.ensure_procs(&wk(), h, vec![req(h, 0)], GRACE)
            .await
            .unwrap();
    }
    drain(&hub, &mut rx);
    let (tw, _rw) = mpsc::unbounded_channel();
    let (tm, mut rm) = mpsc::unbounded_channel();
    let t0 = Instant::now();
    hub.tick(t0, &tw, &tm);
    while rm.try_recv().is_ok() {}
    let failed = ProcPhase::Stopped {
        exit_code: 1,
        stderr_tail: vec!["boom".into()],
    };
    for h in 0..4 {
        let push = sim
            .set_status(&host(h), &proc_name("pm.abc", h), failed.clone())
            .unwrap();
        hub.handle_push(push, t0);
    }
    hub.tick(t0, &tw, &tm);
    assert_eq!(rm.try_recv().unwrap().name, "pm");
    assert!(rm.try_recv().is_err(), "one write for the burst");
    let s = &hub.proc_states(&wk(), "pm.abc")[&2];
    assert_eq!(
        (s.state, s.exit_code, s.stderr_tail.as_deref()),
        (ProcState::Failed, Some(1), Some("boom"))
    );
    let t1 = t0 + Duration::from_millis(100);
    let push = sim
        .set_status(&host(0), &proc_name("pm.abc", 0), ProcPhase::Starting)
        .unwrap();
    hub.handle_push(push, t1);
    hub.tick(t1, &tw, &tm);
    assert!(
        rm.try_recv().is_err(),
        "later changes wait for the interval"
    );
    hub.tick(t0 + COALESCE_INTERVAL, &tw, &tm);
    assert_eq!(rm.try_recv().unwrap().name, "pm");
}

#[tokio::test]
async fn failure_times_are_the_agents_corrected_by_their_clock_offset() {
    let (sim, hub, mut rx) = mk();
    sim.clock_skew_ms
        .lock()
        .unwrap()
        .extend([(host(0), -30_000), (host(1), 20_000)]);
    hub.sync_world(&wk(), agents(2, "a")).await;
    hub.ensure_procs(&wk(), 0, vec![req(0, 0)], GRACE)
        .await
        .unwrap();
    hub.ensure_procs(&wk(), 1, vec![req(1, 0)], GRACE)
        .await
        .unwrap();
    drain(&hub, &mut rx);
    let now = Timestamp::now().as_millisecond();
    // Host 0's clock is 30 s behind the hub's, host 1's 20 s ahead; the
    // heartbeats took 2 ms and 5 ms at best.
    for (rank, skew, delays) in [(0, -30_000i64, [40, 2, 300]), (1, 20_000, [5, 90, 7])] {
        for (i, d) in delays.into_iter().enumerate() {
            let sent = now - 10_000 + i as i64 * 1000;
            hub.handle_push(
                HostReport::Heartbeat {
                    host: host(rank),
                    pod_uid: format!("a-{rank}"),
                    clock: Some(clock::ClockSample {
                        agent_ms: (sent + skew) as u64,
                        hub: Timestamp::from_millisecond(sent + d).unwrap(),
                    }),
                    digest: None,
                },
                Instant::now(),
            );
        }
    }
    // Rank 0 died at hub time now-1000 (its clock: -30 s); rank 1 at
    // now-950 (its clock: +20 s). Rank 1's report arrives first.
    let kill = |rank: Rank, skew: i64, at: i64| {
        sim.set_status_at(
            &host(rank),
            &proc_name("pm.abc", rank),
            ProcPhase::Killed {
                signal: 9,
                core_dumped: false,
                stderr_tail: vec![],
            },
            (at + skew) as u64,
        )
        .unwrap()
    };
    hub.handle_push(kill(1, 20_000, now - 950), Instant::now());
    hub.handle_push(kill(0, -30_000, now - 1000), Instant::now());
    let states = hub.proc_states(&wk(), "pm.abc");
    let at = |r: Rank| states[&r].failed_at.unwrap().as_millisecond();
    // Offset by the best sample (the snapshot's, in memory, or the
    // heartbeats' 2 ms and 5 ms).
    assert!((now - 1000..=now - 998).contains(&at(0)), "{}", at(0) - now);
    assert!((now - 950..=now - 945).contains(&at(1)), "{}", at(1) - now);
    assert!(at(0) < at(1), "the true order, not the arrival order");
    assert!(states[&0].detected_at.unwrap() >= states[&0].failed_at.unwrap());
    // The same report again (a snapshot after a reconnect) keeps its times.
    let before = states[&0].clone();
    hub.handle_push(kill(0, -30_000, now - 1000), Instant::now());
    assert_eq!(hub.proc_states(&wk(), "pm.abc")[&0], before);
}

/// Hub invariant 7: a refused agent's pushes count as no heartbeat, its
/// reason is the host's link error, and epochs given for a rank are kept
/// after its pod goes.
#[tokio::test]
async fn a_refused_agent_is_not_heard_and_epochs_are_remembered() {
    let (_sim, hub, mut rx) = mk();
    let mut a = agents(1, "a");
    a.epochs = BTreeMap::from([(0, 7)]);
    hub.sync_world(&wk(), a.clone()).await;
    assert_eq!(hub.highest_epoch(&wk(), 0), 7);
    assert_eq!(hub.last_heard(&wk(), 0, Some("a-0")), None);
    // Heard once (its snapshot), so Alive until healthTimeout (10 s) passes.
    let t0 = Instant::now();
    while let Ok(p) = rx.try_recv() {
        hub.handle_push(p, t0);
    }
    assert_eq!(hub.liveness(&wk(), 0, "a-0"), Liveness::Alive);
    let (tw, _rw) = mpsc::unbounded_channel();
    let (tm, _rm) = mpsc::unbounded_channel();
    // From then on the hub refuses its pushes, one per second for 11 s.
    let refused = || HostReport::Refused {
        host: host(0),
        pod_uid: "a-0".into(),
        reason: "a stale agent answers".into(),
    };
    for s in 1..=11 {
        hub.handle_push(refused(), t0 + Duration::from_secs(s));
    }
    assert_eq!(
        hub.link_error(&wk(), 0, "a-0").as_deref(),
        Some("a stale agent answers")
    );
    // Refused pushes do not keep it Alive: it expires as if silent.
    hub.tick(t0 + Duration::from_secs(11), &tw, &tm);
    assert_eq!(hub.liveness(&wk(), 0, "a-0"), Liveness::Expired);
    // A heartbeat that counts clears it and is remembered.
    hub.handle_push(
        HostReport::Heartbeat {
            host: host(0),
            pod_uid: "a-0".into(),
            clock: None,
            digest: None,
        },
        t0 + Duration::from_secs(12),
    );
    assert_eq!(hub.liveness(&wk(), 0, "a-0"), Liveness::Alive);
    assert!(hub.last_heard(&wk(), 0, Some("a-0")).is_some());
    assert_eq!(hub.link_error(&wk(), 0, "a-0"), None);
    // The pod goes: its epoch stays known for the next one.
    a.hosts.clear();
    a.epochs.clear();
    hub.sync_world(&wk(), a).await;
    assert_eq!(hub.highest_epoch(&wk(), 0), 7);
}

/// Hub invariant 8: a lost push heals. Heartbeats whose digest matches
/// the hub's picture ask for nothing; once a change is lost on its way,
/// the second heartbeat in a row with a different digest gets a fresh
/// Snapshot, which brings the change, and then the digests agree again.
#[tokio::test]
async fn a_lost_push_is_healed_by_the_heartbeat_digest() {
    let (sim, hub, mut rx) = mk();
    hub.sync_world(&wk(), agents(1, "a")).await;
    hub.ensure_procs(&wk(), 0, vec![req(0, 0), req(1, 0)], GRACE)
        .await
        .unwrap();
    drain(&hub, &mut rx);
    let beat = || HostReport::Heartbeat {
        host: host(0),
        pod_uid: "a-0".into(),
        clock: None,
        digest: Some(sim.digest_of(&host(0))),
    };
    for _ in 0..3 {
        hub.handle_push(beat(), Instant::now());
    }
    assert_eq!(hub.stats().resyncs, 0, "the pictures agree: nothing asked");
    assert!(sim.resyncs.lock().unwrap().is_empty());

    // Rank 1 exits 3, and the push saying so is lost.
    let name = proc_name("pm.abc", 1);
    let exited = ProcPhase::Stopped {
        exit_code: 3,
        stderr_tail: vec!["boom".into()],
    };
    let lost = sim.set_status(&host(0), &name, exited);
    assert!(lost.is_some(), "the proc exists on the simulated agent");
    drop(lost);
    hub.handle_push(beat(), Instant::now());
    assert_eq!(
        hub.stats().resyncs,
        0,
        "one differing heartbeat may be a race"
    );
    hub.handle_push(beat(), Instant::now());
    assert_eq!(hub.stats().resyncs, 1, "two in a row ask for a snapshot");
    assert_eq!(*sim.resyncs.lock().unwrap(), vec![host(0)]);
    // The snapshot comes as a push (from the simulated agent's task).
    let snap = tokio::time::timeout(hostmesh_testkit::PATIENCE, rx.recv())
        .await
        .expect("a push within the patience bound")
        .expect("push channel open");
    assert!(matches!(snap, HostReport::Snapshot { .. }), "{snap:?}");
    hub.handle_push(snap, Instant::now());
    let states = hub.proc_states(&wk(), "pm.abc");
    assert_eq!(states[&1].exit_code, Some(3));
    assert_eq!(states[&0].state, ProcState::Running, "rank 0 untouched");
    for _ in 0..3 {
        hub.handle_push(beat(), Instant::now());
    }
    assert_eq!(hub.stats().resyncs, 1, "healed: the digests agree again");
}

/// Issue 30, item 4: a stall of the operator's own process (forgiven by
/// the hub's loop as it wakes) expires no host; a host still silent a
/// `healthTimeout` after it expires as before.
#[tokio::test]
async fn the_operators_own_stall_expires_no_host() {
    let (_sim, hub, mut rx) = mk();
    hub.sync_world(&wk(), agents(2, "a")).await;
    drain(&hub, &mut rx);
    let (tw, _rw) = mpsc::unbounded_channel();
    let (tm, _rm) = mpsc::unbounded_channel();
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    hub.tick(t0, &tw, &tm);
    // Stopped for 30 s, three healthTimeouts.
    hub.forgive_stall(Some(30 * s));
    hub.tick(t0 + 31 * s, &tw, &tm);
    assert_eq!(hub.liveness(&wk(), 0, "a-0"), Liveness::Alive);
    assert_eq!(hub.liveness(&wk(), 1, "a-1"), Liveness::Alive);
    // Host 0's heartbeats arrive; host 1 stays silent.
    hub.handle_push(
        HostReport::Heartbeat {
            host: host(0),
            pod_uid: "a-0".into(),
            clock: None,
            digest: None,
        },
        t0 + 32 * s,
    );
    hub.tick(t0 + 41 * s, &tw, &tm);
    assert_eq!(hub.liveness(&wk(), 0, "a-0"), Liveness::Alive);
    assert_eq!(hub.liveness(&wk(), 1, "a-1"), Liveness::Expired);
}

/// Whether every host in `0..n` holds a book of `n` entries in which
/// `check` holds.
fn books_settled(
    sim: &SimConnector,
    n: Rank,
    check: impl Fn(&std::collections::BTreeMap<Rank, (SocketAddr, u64)>) -> bool,
) -> bool {
    let books = sim.books.lock().unwrap();
    (0..n).all(|r| {
        books
            .get(&host(r))
            .is_some_and(|(_, b)| b.len() == n && check(b))
    })
}

/// Hub invariant 5 ([`book`]): a host that joins costs each agent already
/// there one book entry and the new agent the whole book once, O(hosts)
/// messages and entries per change; a replaced host likewise. Sending the
/// whole book to every agent on every change would be O(hosts²) per
/// change (here up to 64 × 64 entries).
#[tokio::test]
async fn address_book_fan_out_grows_with_the_change_not_the_world_squared() {
    const N: Rank = 64;
    let (sim, hub, _rx) = mk();
    let traffic = || *sim.book_traffic.lock().unwrap();
    let mut last = traffic();
    for k in 1..=N {
        hub.sync_world(&wk(), agents(k, "a")).await;
        hostmesh_testkit::eventually_async("every agent holds the new book", || async {
            books_settled(&sim, k, |_| true).then_some(())
        })
        .await;
        let now = traffic();
        let (messages, entries) = (now.0 - last.0, now.1 - last.1);
        assert!(
            messages <= k as u64,
            "host {k} joining sent {messages} book messages to {k} agents"
        );
        assert!(
            entries <= 2 * k as u64,
            "host {k} joining sent {entries} book entries to {k} agents (whole books: {})",
            k * k
        );
        last = now;
    }
    // Host 7 is replaced: a new pod, address and epoch.
    let mut replaced = agents(N, "a");
    replaced
        .hosts
        .insert(7, ("b-7".into(), SocketAddr::from(([127, 0, 2, 7], 26602))));
    replaced.epochs.insert(7, 5);
    hub.sync_world(&wk(), replaced).await;
    hostmesh_testkit::eventually_async("every agent holds host 7's new entry", || async {
        books_settled(&sim, N, |b| b.get(&7).is_some_and(|(_, e)| *e == 5)).then_some(())
    })
    .await;
    let now = traffic();
    let (messages, entries) = (now.0 - last.0, now.1 - last.1);
    assert!(
        messages <= N as u64,
        "{messages} messages for one replacement"
    );
    assert!(
        entries <= 2 * N as u64,
        "{entries} entries for one replacement (whole books: {})",
        N * N
    );
}

/// Invariant 11: an agent that comes back without a proc it ran (a
/// container or kubelet restart) makes it Lost, timed at when the agent was
/// last heard before; one that had ended is simply no longer reported.
#[tokio::test]
async fn a_snapshot_without_a_live_proc_makes_it_lost_when_last_heard() {
    let (sim, hub, mut rx) = mk();
    hub.sync_world(&wk(), agents(1, "a")).await;
    hub.ensure_procs(&wk(), 0, vec![req(0, 0), req(1, 0)], GRACE)
        .await
        .unwrap();
    drain(&hub, &mut rx);
    let ended = sim
        .set_status(
            &host(0),
            &proc_name("pm.abc", 1),
            ProcPhase::Stopped {
                exit_code: 0,
                stderr_tail: Vec::new(),
            },
        )
        .unwrap();
    hub.handle_push(ended, Instant::now());
    let heard = hub.last_heard(&wk(), 0, None).expect("heard");
    // The agent restarted: its Snapshot holds nothing.
    sim.procs.lock().unwrap().remove(&host(0));
    hub.handle_push(
        HostReport::Snapshot {
            host: host(0),
            pod_uid: "a-0".into(),
            procs: Vec::new(),
            clock: None,
        },
        Instant::now(),
    );
    let states = hub.proc_states(&wk(), "pm.abc");
    let lost = &states[&0];
    assert_eq!(lost.state, ProcState::Lost);
    assert!(
        lost.reason
            .as_deref()
            .unwrap_or_default()
            .contains("no longer has"),
        "{lost:?}"
    );
    assert_eq!(lost.failed_at, Some(heard), "timed at the last word before");
    assert!(lost.detected_at >= lost.failed_at);
    assert!(
        !states.contains_key(&1),
        "an ended proc the agent no longer has is no failure: {states:?}"
    );
}
