//! A Monarch host's agent (monarch invariants 2-4, docs/monarch.md): it
//! starts the worker at start-up as a supervised proc, reports it Starting
//! with its pid until it listens (read from the socket tables, no probe),
//! is Ready on `/readyz` only while it listens, and reports its exit with
//! the signal and stderr tail. The worker is a real process that listens
//! once the test opens a gate file.

use std::time::Duration;

use hostmesh_agent::contract::MONARCH_WORKER_PROC;
use hostmesh_agent::protocol::ProcPhase;
use hostmesh_agent::{Agent, AgentConfig, MonarchWorker};
use hostmesh_testkit::{eventually_async, http};

const SECRET: &str = "0123456789abcdef0123456789abcdef";

async fn readyz(agent: &Agent) -> u16 {
    http::get(agent.health_addr(), "/readyz")
        .await
        .map_or(0, |(code, _)| code)
}

/// An agent on loopback for a Monarch host whose worker runs `command` and
/// listens on `port`.
async fn monarch_agent(secret_file: std::path::PathBuf, command: Vec<String>, port: u16) -> Agent {
    let config = AgentConfig {
        heartbeat_interval: Duration::from_millis(200),
        monarch: Some(MonarchWorker { command, port }),
        ..AgentConfig::loopback("mw", secret_file)
    };
    Agent::start(config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_gates_readiness_and_its_exit_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("token");
    std::fs::write(&secret_file, SECRET).unwrap();
    let gate = dir.path().join("gate");
    let port = http::free_port();
    let script = format!(
        "echo worker starting >&2; while [ ! -e {gate} ]; do sleep 0.05; done; \
         exec python3 -c 'import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((\"127.0.0.1\", {port})); s.listen(); print(\"listening\", flush=True); time.sleep(3600)'",
        gate = gate.display()
    );
    let agent = monarch_agent(secret_file, vec!["sh".into(), "-c".into(), script], port).await;
    let m = agent.manager().clone();
    let mut events = m.subscribe();

    // Invariant 2: Starting, with its pid, while it does not listen.
    let pid = eventually_async("the worker to have a pid", async || {
        m.state(MONARCH_WORKER_PROC).ok()?.pid
    })
    .await;
    let s = m.state(MONARCH_WORKER_PROC).unwrap();
    assert_eq!(s.status, ProcPhase::Starting, "not listening yet");
    assert_eq!(s.command[0], "sh");
    assert_eq!(
        readyz(&agent).await,
        503,
        "not ready before the worker listens"
    );

    std::fs::write(&gate, b"").unwrap();
    let want = format!("tcp://127.0.0.1:{port}");
    eventually_async("the worker to be Ready once it listens", async || {
        matches!(m.state(MONARCH_WORKER_PROC).ok()?.status,
            ProcPhase::Ready { addr: Some(ref a), .. } if *a == want)
        .then_some(())
    })
    .await;
    eventually_async("/readyz to answer 200", async || {
        (readyz(&agent).await == 200).then_some(())
    })
    .await;

    // Invariant 3: an exit is reported at once, and the host is not ready.
    // SAFETY: kill has no memory effects; pid is our worker.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let ended = eventually_async("the worker's exit to be pushed", async || {
        loop {
            let ev = tokio::time::timeout(Duration::from_secs(1), events.recv())
                .await
                .ok()?
                .ok()?;
            if ev.state.name == MONARCH_WORKER_PROC && ev.state.status.is_terminal() {
                return Some(ev.state);
            }
        }
    })
    .await;
    match &ended.status {
        ProcPhase::Killed {
            signal,
            stderr_tail,
            ..
        } => {
            assert_eq!(*signal, libc::SIGKILL);
            assert!(
                stderr_tail.iter().any(|l| l.contains("worker starting")),
                "{stderr_tail:?}"
            );
        }
        other => panic!("expected Killed, got {other:?}"),
    }
    eventually_async("an exited worker to leave the host not ready", async || {
        (readyz(&agent).await == 503).then_some(())
    })
    .await;
}

/// Invariant 4: a worker that closes its socket but runs on takes the host
/// out of Ready until it listens again; the proc itself stays Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_stops_listening_leaves_the_host_not_ready_until_it_listens_again() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("token");
    std::fs::write(&secret_file, SECRET).unwrap();
    let (close, reopen) = (dir.path().join("close"), dir.path().join("reopen"));
    let port = http::free_port();
    // Listens, closes its socket once `close` exists, listens again once
    // `reopen` exists; never exits by itself.
    let program = format!(
        "import os,socket,time\n\
         def listen():\n    s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', {port})); s.listen(); return s\n\
         def wait(p):\n    while not os.path.exists(p): time.sleep(0.05)\n\
         s=listen(); wait({close:?}); s.close(); wait({reopen:?}); s=listen(); time.sleep(3600)\n",
        close = close.display().to_string(),
        reopen = reopen.display().to_string(),
    );
    let agent = monarch_agent(
        secret_file,
        vec!["python3".into(), "-c".into(), program],
        port,
    )
    .await;
    let m = agent.manager().clone();
    let ready = async |want: u16, what: &str| {
        eventually_async(what, async || (readyz(&agent).await == want).then_some(())).await;
    };
    ready(200, "/readyz 200 once the worker listens").await;

    std::fs::write(&close, b"").unwrap();
    ready(503, "/readyz 503 once the worker stops listening").await;
    let s = m.state(MONARCH_WORKER_PROC).unwrap();
    assert!(
        matches!(s.status, ProcPhase::Ready { .. }),
        "the worker runs on and stays Ready: {s:?}"
    );

    std::fs::write(&reopen, b"").unwrap();
    ready(200, "/readyz 200 once the worker listens again").await;
}
