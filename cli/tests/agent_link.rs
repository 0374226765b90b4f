//! The hub against a real `hostmesh agent` process over loopback, through
//! the runtime's agent client: authenticated dial, heartbeats, a real proc
//! created, reported Running, stopped; a wrong secret gets nothing done; an
//! agent of an older rank epoch is refused and fences itself; an agent cut
//! off from the hub fences itself after its fence timeout, not before, and
//! says why when a hub reaches it again.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hostmesh_agent::protocol::{ProcPhase, ProcReport};
use hostmesh_agent::{AgentClient, ClientConfig};
use hostmesh_crds::procmesh::ProcState;
use hostmesh_operator::hub::Liveness;
use hostmesh_operator::hub::protocol::{Dim, ProcSpec};
use hostmesh_operator::hub::{
    CreateOrUpdate, Hub, WorldAgents, WorldKey, default_connector, proc_name,
};
use hostmesh_testkit::agent::{AgentProcess, AgentSecret, loopback_ip};
use hostmesh_testkit::{eventually_async, eventually_ok};
use tokio::sync::mpsc;

fn start_agent(secret: &[u8], n: u8) -> AgentProcess {
    start_agent_with(secret, n, &[])
}

/// [`start_agent`] with more `hostmesh agent` flags.
fn start_agent_with(secret: &[u8], n: u8, extra: &[&str]) -> AgentProcess {
    AgentProcess::builder(
        env!("CARGO_BIN_EXE_hostmesh"),
        SocketAddr::new(loopback_ip(n), 26602),
        AgentSecret::Bytes(secret.to_vec()),
    )
    .args(extra)
    .spawn()
    .expect("hostmesh agent starts")
}

fn wk() -> WorldKey {
    WorldKey {
        namespace: "ns".into(),
        name: "w".into(),
    }
}

fn running_hub() -> (Arc<Hub>, tokio::sync::oneshot::Sender<()>) {
    let hub = Hub::new(default_connector());
    let (tw, _rw) = mpsc::unbounded_channel();
    let (tm, _rm) = mpsc::unbounded_channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(hub.clone().run(tw, tm, async move {
        let _ = stopped.await;
    }));
    // The receivers are dropped: triggers are not needed here.
    (hub, stop)
}

fn agents(secret: &[u8], addr: SocketAddr) -> WorldAgents {
    WorldAgents {
        secret: Arc::from(secret),
        previous: None,
        trust: None,
        health_timeout: Duration::from_secs(5),
        heartbeat_interval: hostmesh_crds::validate::DEFAULT_HEARTBEAT_INTERVAL,
        hosts: BTreeMap::from([(0, ("pod-0".to_string(), addr))]),
        epochs: BTreeMap::new(),
    }
}

fn sleeper(rank: hostmesh_crds::Rank) -> CreateOrUpdate {
    let mut spec = ProcSpec::command("sleep", &["300"]);
    spec.proc_mesh = "pm".into();
    spec.extent = vec![Dim::new("host", 1), Dim::new("gpu", 1)];
    spec.per_host_dims = 1;
    CreateOrUpdate {
        name: proc_name("pm.abc", rank),
        rank,
        spec,
        incarnation: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_drives_a_real_agent() {
    let secret = b"0123456789abcdef0123456789abcdef";
    let agent = start_agent(secret, 1);
    let (hub, _stop) = running_hub();
    // The agent may still be starting: running_sleeper dials until it
    // heartbeats.
    running_sleeper(&hub, &agents(secret, agent.addr())).await;
    hub.stop_procs(&wk(), "pm.abc", Duration::from_secs(2))
        .await
        .expect("stop reaches the agent");
    let obs = eventually_async("proc stopped", async || {
        let s = hub.proc_states(&wk(), "pm.abc");
        let o = s.get(&0)?.clone();
        (o.state == ProcState::Stopped).then_some(o)
    })
    .await;
    assert_eq!(obs.signal, Some(15), "{obs:?}");
    assert!(!hub.procs_running(&wk(), "pm.abc"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_gets_nothing_done() {
    let agent = start_agent(b"0123456789abcdef0123456789abcdef", 2);
    let (hub, _stop) = running_hub();
    hub.sync_world(
        &wk(),
        agents(b"not-the-world-secret-at-all-0000", agent.addr()),
    )
    .await;
    let err = hub
        .ensure_procs(&wk(), 0, vec![sleeper(0)], Duration::from_secs(1))
        .await
        .expect_err("an unauthenticated CreateOrUpdate must fail");
    assert!(
        matches!(
            err,
            hostmesh_operator::hub::LinkError::NotConnected(0)
                | hostmesh_operator::hub::LinkError::Client(_)
        ),
        "{err}"
    );
    assert!(hub.proc_states(&wk(), "pm.abc").is_empty());
    assert_ne!(hub.liveness(&wk(), 0, "pod-0"), Liveness::Alive);
}

/// A client of the test's own, asking the agent directly (it is no
/// operator: its calls renew nothing).
async fn observer(secret: &[u8]) -> AgentClient {
    let (tx, _rx) = mpsc::channel(16);
    AgentClient::new("observer", secret, ClientConfig::default(), tx)
        .await
        .expect("client starts")
}

fn with_epoch(mut a: WorldAgents, epoch: u64) -> WorldAgents {
    a.epochs = BTreeMap::from([(0, epoch)]);
    a
}

/// Dials until the agent heartbeats to `hub`, then runs the sleeper.
async fn running_sleeper(hub: &Arc<Hub>, a: &WorldAgents) {
    eventually_async("agent heartbeats", async || {
        let (h, a) = (hub.clone(), a.clone());
        tokio::spawn(async move { h.sync_world(&wk(), a).await });
        (hub.liveness(&wk(), 0, "pod-0") == Liveness::Alive).then_some(())
    })
    .await;
    eventually_ok("the proc created", async || {
        hub.ensure_procs(&wk(), 0, vec![sleeper(0)], Duration::from_secs(1))
            .await
    })
    .await;
    eventually_async("proc Running", async || {
        let s = hub.proc_states(&wk(), "pm.abc");
        (s.get(&0)?.state == ProcState::Running).then_some(())
    })
    .await;
}

/// The sleeper's state, asked of the agent itself.
async fn sleeper_state(c: &AgentClient, addr: SocketAddr) -> ProcReport {
    eventually_ok("the agent answers", async || {
        c.get_state(addr, &proc_name("pm.abc", 0)).await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_agent_is_refused_and_fences_itself() {
    let secret = b"0123456789abcdef0123456789abcdef";
    let agent = start_agent_with(secret, 3, &["--epoch", "5"]);
    let (hub, _stop) = running_hub();
    running_sleeper(&hub, &with_epoch(agents(secret, agent.addr()), 5)).await;
    // The rank was replaced: its pod is of epoch 6 now, and the old agent
    // still answers at the address.
    let newer = with_epoch(agents(secret, agent.addr()), 6);
    let why = eventually_async("the stale agent refused", async || {
        let (h, a) = (hub.clone(), newer.clone());
        tokio::spawn(async move { h.sync_world(&wk(), a).await });
        hub.link_error(&wk(), 0, "pod-0")
            .filter(|e| e.contains("fenced itself: replaced"))
    })
    .await;
    assert!(why.contains("epoch 6"), "{why}");
    assert_ne!(hub.liveness(&wk(), 0, "pod-0"), Liveness::Alive);
    // It stopped its proc as a failure, and takes no new one.
    let c = observer(secret).await;
    let st = eventually_async("the stale agent's proc ended", async || {
        let st = sleeper_state(&c, agent.addr()).await;
        st.status.is_terminal().then_some(st)
    })
    .await;
    assert!(
        !st.stop_requested,
        "a fenced proc's end is a failure: {st:?}"
    );
    assert!(
        hostmesh_testkit::process::gone(st.pid.expect("it had a pid")),
        "{st:?}"
    );
    let mut again = sleeper(1);
    again.name = proc_name("pm.abc", 1);
    let refused = c.create_or_update(agent.addr(), again).await;
    assert!(
        matches!(&refused, Err(e) if e.to_string().contains("fenced")),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_agent_fences_after_its_timeout_and_says_why() {
    let secret = b"0123456789abcdef0123456789abcdef";
    let timeout = Duration::from_secs(3);
    let agent = start_agent_with(
        secret,
        4,
        &[
            "--epoch",
            "1",
            "--fence-timeout",
            "3s",
            "--fence-grace",
            "1s",
        ],
    );
    let a = with_epoch(agents(secret, agent.addr()), 1);
    let (hub, stop) = running_hub();
    running_sleeper(&hub, &a).await;
    let c = observer(secret).await;
    // While the hub hears the agent, renewals keep it unfenced well past
    // its timeout.
    let connected = std::time::Instant::now();
    for _ in 0..100 {
        if connected.elapsed() > timeout + Duration::from_secs(1) {
            break;
        }
        let st = sleeper_state(&c, agent.addr()).await;
        assert!(
            matches!(st.status, ProcPhase::Ready { .. }),
            "fenced while connected: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(connected.elapsed() > timeout + Duration::from_secs(1));
    // Cut the operator off: its client and connections go.
    hub.forget_world(&wk());
    let _ = stop.send(());
    drop(hub);
    let cut = std::time::Instant::now();
    let st = eventually_async("the cut-off agent fenced its proc", async || {
        let st = sleeper_state(&c, agent.addr()).await;
        st.status.is_terminal().then_some(st)
    })
    .await;
    // Not before its timeout: the last renewal came at most a renewal
    // period and a heartbeat interval before the cut.
    let slack = hostmesh_operator::hub::fence::RENEW_EVERY + Duration::from_millis(500);
    assert!(
        cut.elapsed() + slack >= timeout,
        "fenced {:?} after the cut, timeout {timeout:?}",
        cut.elapsed()
    );
    assert!(!st.stop_requested, "{st:?}");
    // An operator that comes back learns why.
    let (hub, _stop) = running_hub();
    let why = eventually_async("the fence reported", async || {
        let (h, a) = (hub.clone(), a.clone());
        tokio::spawn(async move { h.sync_world(&wk(), a).await });
        hub.link_error(&wk(), 0, "pod-0")
            .filter(|e| e.contains("fenced itself"))
    })
    .await;
    assert!(why.contains("no contact from the operator"), "{why}");
    assert_ne!(hub.liveness(&wk(), 0, "pod-0"), Liveness::Alive);
}
