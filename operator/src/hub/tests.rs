//! Hub tests with simulated agents (in memory).

use std::time::{Duration, Instant};

use hostmesh_crds::procmesh::ProcState;

use super::sim::{SimConnector, SimRequest, connector};
use super::*;

fn wk() -> WorldKey {
    WorldKey {
        namespace: "ns".into(),
        name: "w".into(),
    }
}

fn agents(n: u64, uid: &str) -> WorldAgents {
    WorldAgents {
        secret: Arc::from(&b"secret"[..]),
        health_timeout: Duration::from_secs(10),
        hosts: (0..n)
            .map(|r| {
                (
                    r,
                    (
                        format!("{uid}-{r}"),
                        SocketAddr::from(([127, 0, 1, r as u8], 26600)),
                    ),
                )
            })
            .collect(),
    }
}

fn req(mesh: &str, local: u64, incarnation: u32) -> ProcRequest {
    ProcRequest {
        proc_mesh: mesh.into(),
        local_rank: local,
        rank: local,
        spec: ProcSpec {
            argv: vec!["sh".into()],
            env: vec![],
            working_dir: None,
            incarnation,
        },
    }
}

async fn drain(hub: &Hub, rx: &mut mpsc::Receiver<AgentPush>) {
    while let Ok(p) = rx.try_recv() {
        hub.handle_push(p, Instant::now());
    }
}

fn mk() -> (Arc<SimConnector>, Arc<Hub>, mpsc::Receiver<AgentPush>) {
    let sim = Arc::new(SimConnector::default());
    let hub = Hub::new(connector(&sim));
    let rx = hub.push_rx.lock().unwrap().take().unwrap();
    (sim, hub, rx)
}

#[tokio::test]
async fn liveness_follows_heartbeats_and_expiry() {
    let (_sim, hub, mut rx) = mk();
    hub.sync_world(&wk(), agents(2, "a")).await;
    drain(&hub, &mut rx).await; // snapshots count as heartbeats
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
        AgentPush::Heartbeat {
            host: HostKey {
                world: wk(),
                rank: 1,
            },
            pod_uid: "a-1".into(),
        },
        later,
    );
    assert_eq!(hub.liveness(&wk(), 1, "a-1"), Liveness::Alive);
}

#[tokio::test]
async fn address_book_and_no_duplicate_creates() {
    let (sim, hub, mut rx) = mk();
    hub.sync_world(&wk(), agents(2, "a")).await;
    let h0 = HostKey {
        world: wk(),
        rank: 0,
    };
    assert!(matches!(&sim.requests_of(&h0)[..], [SimRequest::Book(b)] if b.len() == 2));
    assert!(hub.connected(&wk(), 2));
    assert_eq!(
        hub.ensure_procs(&wk(), 0, vec![req("pm", 0, 0), req("pm", 1, 0)])
            .await,
        Ok(2)
    );
    assert_eq!(
        hub.ensure_procs(&wk(), 0, vec![req("pm", 0, 0), req("pm", 1, 0)])
            .await,
        Ok(0)
    );
    assert_eq!(
        hub.ensure_procs(&wk(), 0, vec![req("pm", 0, 1)]).await,
        Ok(1),
        "restart bumps incarnation"
    );
    drain(&hub, &mut rx).await;
    let states = hub.proc_states(&wk(), "pm");
    assert_eq!(states[&(0, 1)].state, ProcState::Running);
    // Re-sync with the same pods: no new dial, no resend.
    hub.sync_world(&wk(), agents(2, "a")).await;
    assert_eq!(sim.requests_of(&h0).len(), 4);
    hub.stop_procs(&wk(), "pm", Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(
        sim.requests_of(&h0).last(),
        Some(&SimRequest::Stop("pm".into()))
    );
}

#[tokio::test]
async fn restarted_operator_rebuilds_from_snapshots() {
    let (sim, hub, mut rx) = mk();
    hub.sync_world(&wk(), agents(1, "a")).await;
    hub.ensure_procs(&wk(), 0, vec![req("pm", 0, 0)])
        .await
        .unwrap();
    drain(&hub, &mut rx).await;
    // A new hub (operator restart) against the same agents.
    let hub2 = Hub::new(connector(&sim));
    let mut rx2 = hub2.push_rx.lock().unwrap().take().unwrap();
    hub2.sync_world(&wk(), agents(1, "a")).await;
    drain(&hub2, &mut rx2).await;
    assert_eq!(
        hub2.proc_states(&wk(), "pm")[&(0, 0)].state,
        ProcState::Running
    );
}

#[tokio::test]
async fn replaced_pod_is_a_new_agent_and_refusals_retry() {
    let (sim, hub, mut rx) = mk();
    sim.refuse
        .lock()
        .unwrap()
        .push(SocketAddr::from(([127, 0, 1, 0], 26600)));
    hub.sync_world(&wk(), agents(1, "a")).await;
    assert!(!hub.connected(&wk(), 1));
    sim.refuse.lock().unwrap().clear();
    hub.sync_world(&wk(), agents(1, "a")).await;
    assert!(hub.connected(&wk(), 1));
    drain(&hub, &mut rx).await;
    assert_eq!(hub.liveness(&wk(), 0, "a-0"), Liveness::Alive);
    hub.sync_world(&wk(), agents(1, "b")).await;
    assert_eq!(hub.liveness(&wk(), 0, "a-0"), Liveness::Unknown);
    drain(&hub, &mut rx).await;
    assert_eq!(hub.liveness(&wk(), 0, "b-0"), Liveness::Alive);
}

#[tokio::test]
async fn proc_failures_trigger_at_once_and_storms_coalesce() {
    let (_sim, hub, mut rx) = mk();
    hub.sync_world(&wk(), agents(4, "a")).await;
    drain(&hub, &mut rx).await;
    let (tw, _rw) = mpsc::unbounded_channel();
    let (tm, mut rm) = mpsc::unbounded_channel();
    let t0 = Instant::now();
    hub.tick(t0, &tw, &tm);
    while rm.try_recv().is_ok() {}
    let obs = |state| ProcObs {
        state,
        exit_code: Some(1),
        signal: None,
        reason: None,
        stderr_tail: None,
        incarnation: 0,
    };
    for r in 0..4 {
        hub.handle_push(
            AgentPush::ProcState {
                host: HostKey {
                    world: wk(),
                    rank: r,
                },
                proc_mesh: "pm".into(),
                local_rank: 0,
                obs: obs(ProcState::Failed),
            },
            t0,
        );
    }
    hub.tick(t0, &tw, &tm);
    assert_eq!(rm.try_recv().unwrap().name, "pm");
    assert!(rm.try_recv().is_err(), "one write for the burst");
    let t1 = t0 + Duration::from_millis(100);
    hub.handle_push(
        AgentPush::ProcState {
            host: HostKey {
                world: wk(),
                rank: 0,
            },
            proc_mesh: "pm".into(),
            local_rank: 0,
            obs: obs(ProcState::Running),
        },
        t1,
    );
    hub.tick(t1, &tw, &tm);
    assert!(
        rm.try_recv().is_err(),
        "later changes wait for the interval"
    );
    hub.tick(t0 + COALESCE_INTERVAL, &tw, &tm);
    assert_eq!(rm.try_recv().unwrap().name, "pm");
}
