//! The hub against a real `hostmesh agent` process over loopback, through
//! the runtime's agent client: authenticated dial, heartbeats, a real proc
//! created, reported Running, stopped; a wrong secret gets nothing done.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hostmesh_crds::procmesh::ProcState;
use hostmesh_operator::hub::Liveness;
use hostmesh_operator::hub::protocol::{Dim, ProcSpec};
use hostmesh_operator::hub::{
    CreateOrUpdate, Hub, WorldAgents, WorldKey, default_connector, proc_name,
};
use hostmesh_testkit::{eventually_async, eventually_ok};
use tokio::sync::mpsc;

struct Agent {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback IP of its own for this test process and `n`.
fn ip(n: u8) -> String {
    let pid = std::process::id();
    format!("127.{}.{}.{n}", 100 + (pid % 100), (pid / 100) % 250)
}

fn start_agent(secret: &[u8], n: u8) -> Agent {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("token");
    std::fs::write(&secret_file, secret).unwrap();
    let addr: SocketAddr = format!("{}:26600", ip(n)).parse().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_hostmesh"))
        .args([
            "agent",
            "--world",
            "w",
            "--host-rank",
            "0",
            "--health-port",
            "0",
            "--heartbeat-interval",
            "200ms",
        ])
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--secret-file")
        .arg(&secret_file)
        .env_remove("HOSTMESH_SUPERVISOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("hostmesh agent starts");
    Agent {
        child,
        addr,
        _dir: dir,
    }
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
        health_timeout: Duration::from_secs(5),
        hosts: BTreeMap::from([(0, ("pod-0".to_string(), addr))]),
        epochs: BTreeMap::new(),
    }
}

fn sleeper(rank: u64) -> CreateOrUpdate {
    let mut spec = ProcSpec::command("sleep", &["300"]);
    spec.proc_mesh = "pm".into();
    spec.extent = vec![Dim::new("host", 1), Dim::new("gpu", 1)];
    spec.per_host_dims = 1;
    CreateOrUpdate {
        name: proc_name("pm.abc", rank),
        rank: rank as usize,
        spec,
        incarnation: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_drives_a_real_agent() {
    let secret = b"0123456789abcdef0123456789abcdef";
    let agent = start_agent(secret, 1);
    let (hub, _stop) = running_hub();
    // The agent may still be starting: dial until it heartbeats.
    eventually_async("agent heartbeats", async || {
        let h = hub.clone();
        let a = agents(secret, agent.addr);
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
        agents(b"not-the-world-secret-at-all-0000", agent.addr),
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
