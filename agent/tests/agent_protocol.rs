//! The agent protocol over real loopback sockets between real processes:
//! authentication (host::agent invariant 3), requests and pushes through
//! `AgentClient` (host::client invariants 1-3, host::server invariants 1-3),
//! outages of the supervisor, `ShutdownHost`, and runtime-aware procs
//! (host::proc_agent invariants 1-3).

mod agent_common;

use std::net::SocketAddr;
use std::time::Duration;

use agent_common::child::{ChildAgent, SECRET, child_agent_main, wait_all_gone};
use hostmesh_agent::echo::{Echo, echo_type_name};
use hostmesh_agent::protocol::{
    AgentPush, CreateOrUpdate, CreateOutcome, Dim, ProcPhase, ProcReport, ProcSpec,
};
use hostmesh_agent::{
    ActorState, AgentClient, AgentEvent, AgentEventKind, ClientConfig, ClientError, GetActorState,
    Keepalive, SpawnFor, mesh_ref,
};
use hostmesh_runtime::{ActorRef, ActorStatus, ChannelAddr, Proc, ProcId};
use hostmesh_testkit::{PATIENCE, eventually_async, eventually_ok};
use tokio::sync::mpsc;

/// Entry point of the child agent process (agent_common/child.rs).
#[test]
#[ignore = "entry point of the child agent process that the other tests start"]
fn child_agent() {
    child_agent_main();
}

/// Entry point of a runtime-aware proc the agent starts: the example echo
/// proc, which joins the host with `Echo` registered and runs until SIGTERM
/// (then exits 0).
#[test]
#[ignore = "entry point of the runtime-aware proc that the agent starts"]
fn child_echo_proc() {
    if std::env::var_os("HOSTMESH_TEST_CHILD_ECHO").is_none() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(hostmesh_agent::echo::run()).unwrap();
    std::process::exit(0);
}

fn config() -> ClientConfig {
    ClientConfig {
        call_timeout: Duration::from_secs(10),
        heartbeat_timeout: Duration::from_secs(2),
        backoff_initial: Duration::from_millis(50),
        backoff_max: Duration::from_millis(500),
        listen: None,
    }
}

/// The World's proc issuer, as the agents and clients of actors derive it.
fn issuer() -> hostmesh_runtime::Issuer {
    hostmesh_runtime::Issuer::from_runtime_key(
        hostmesh_agent::keys::runtime_key(SECRET.as_bytes()).bytes(),
    )
}

/// A client of actors: a proc with a credential it issued itself.
async fn runtime_client(name: &str) -> Proc {
    Proc::builder(name)
        .issued_by(issuer())
        .build()
        .await
        .unwrap()
}

async fn client(name: &str, secret: &[u8]) -> (AgentClient, mpsc::Receiver<AgentEvent>) {
    let (tx, rx) = mpsc::channel(4096);
    (
        AgentClient::new(name, secret, config(), tx).await.unwrap(),
        rx,
    )
}

fn sh(name: &str, rank: usize, script: &str) -> CreateOrUpdate {
    let mut spec = ProcSpec::command("sh", &["-c", script]);
    spec.proc_mesh = "mesh".into();
    spec.extent = vec![Dim::new("host", 1), Dim::new("proc", 16)];
    CreateOrUpdate {
        name: name.into(),
        rank,
        spec,
        incarnation: 0,
    }
}

/// Next event, bounded by [`PATIENCE`].
async fn next(rx: &mut mpsc::Receiver<AgentEvent>) -> AgentEvent {
    tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .expect("an agent event within the patience bound")
        .expect("event channel open")
}

/// Skips events until a `Snapshot`; returns its procs.
async fn snapshot(rx: &mut mpsc::Receiver<AgentEvent>) -> Vec<ProcReport> {
    for _ in 0..1000 {
        if let AgentEventKind::Push(AgentPush::Snapshot { procs, .. }) = next(rx).await.kind {
            return procs;
        }
    }
    panic!("no snapshot");
}

/// Skips events until proc `name` changes to a state matching `pred`.
async fn change(
    rx: &mut mpsc::Receiver<AgentEvent>,
    name: &str,
    pred: impl Fn(&ProcReport) -> bool,
) -> ProcReport {
    for _ in 0..10_000 {
        if let AgentEventKind::Push(AgentPush::Changed(c)) = next(rx).await.kind
            && c.state.name == name
            && pred(&c.state)
        {
            return c.state;
        }
    }
    panic!("no matching change for {name}");
}

/// Polls the agent for proc `name` until its state matches `pred`.
async fn poll_state(
    c: &AgentClient,
    addr: SocketAddr,
    name: &str,
    pred: impl Fn(&ProcReport) -> bool,
) -> ProcReport {
    eventually_ok(&format!("{name} to match"), async || {
        let st = c.get_state(addr, name).await.unwrap();
        if pred(&st) { Ok(st) } else { Err(st) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secret_is_refused_and_can_do_nothing() {
    let agent = ChildAgent::start(&[], &[]);
    let addr = agent.addr();
    let (intruder, _ev) = client("intruder", b"not-the-world-secret-not-the-world").await;
    let e = intruder
        .create_or_update(addr, sh("evil", 0, "touch /tmp/hostmesh-pwned"))
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Call { .. }), "{e}");
    assert!(intruder.get_state(addr, "evil").await.is_err());
    let logged = agent.err_line("handshake failed");
    assert!(
        !logged.contains(SECRET),
        "the secret never appears in logs: {logged}"
    );

    let (operator, _ev) = client("operator", SECRET.as_bytes()).await;
    let e = operator.get_state(addr, "evil").await.unwrap_err();
    assert!(
        matches!(&e, ClientError::Refused { message, .. } if message.contains("no proc")),
        "{e}"
    );
    assert!(!agent.stderr_text().contains(SECRET));
}

/// `AgentClient::resync` (client invariant 1): a watched agent sends a
/// fresh Snapshot holding what it has now, with no `Disconnected` in
/// between, and heartbeats keep coming on the same watch, with a digest
/// equal to the digest of that snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resync_brings_a_fresh_snapshot_over_the_same_watch() {
    let agent = ChildAgent::start(
        &[("HOSTMESH_HEARTBEAT_INTERVAL", "100ms")],
        &["exec sleep 60"],
    );
    let addr = agent.addr();
    let (c, mut rx) = client("operator", SECRET.as_bytes()).await;
    c.watch(0, addr);
    assert_eq!(snapshot(&mut rx).await.len(), 1);
    // A second proc whose change the test reads past, as if it were lost.
    c.create_or_update(addr, sh("later", 1, "exec sleep 61"))
        .await
        .unwrap();
    poll_state(&c, addr, "later", |s| {
        matches!(s.status, ProcPhase::Ready { .. })
    })
    .await;
    c.resync(0);
    let mut snap = None;
    for _ in 0..1000 {
        match next(&mut rx).await.kind {
            AgentEventKind::Push(AgentPush::Snapshot { procs, .. }) => {
                snap = Some(procs);
                break;
            }
            AgentEventKind::Disconnected { reason } => panic!("resync dropped the watch: {reason}"),
            _ => {}
        }
    }
    let procs = snap.expect("a fresh snapshot");
    let mut names: Vec<&str> = procs.iter().map(|p| p.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["later", "p0"], "{procs:?}");
    let want = hostmesh_agent::digest(&procs);
    for _ in 0..1000 {
        match next(&mut rx).await.kind {
            AgentEventKind::Push(AgentPush::Heartbeat { digest, .. }) => {
                assert_eq!(digest, want, "the heartbeat's digest is the snapshot's");
                return;
            }
            AgentEventKind::Disconnected { reason } => panic!("resync dropped the watch: {reason}"),
            _ => {}
        }
    }
    panic!("no heartbeat after the resync");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_drives_procs_and_receives_every_change() {
    let agent = ChildAgent::start(&[("HOSTMESH_HEARTBEAT_INTERVAL", "100ms")], &[]);
    let addr = agent.addr();
    let (c, mut rx) = client("operator", SECRET.as_bytes()).await;
    c.watch(0, addr);
    let ev = next(&mut rx).await;
    assert_eq!(ev.host.addr, addr);
    assert!(matches!(ev.kind, AgentEventKind::Connected), "{ev:?}");
    assert!(snapshot(&mut rx).await.is_empty());

    let boom = sh("boom", 0, "echo boom >&2; exit 3");
    assert_eq!(
        c.create_or_update(addr, boom.clone()).await.unwrap(),
        CreateOutcome::Created
    );
    assert_eq!(
        c.create_or_update(addr, boom.clone()).await.unwrap(),
        CreateOutcome::Unchanged
    );
    let st = change(&mut rx, "boom", |s| s.status.is_terminal()).await;
    assert_eq!(
        st.status,
        ProcPhase::Stopped {
            exit_code: 3,
            stderr_tail: vec!["boom".into()]
        }
    );

    let mut conflict = boom.clone();
    conflict.spec.args = vec!["-c".into(), "exit 0".into()];
    let e = c.create_or_update(addr, conflict).await.unwrap_err();
    assert!(
        matches!(&e, ClientError::Refused { message, .. } if message.contains("different spec")),
        "{e}"
    );

    c.create_or_update(addr, sh("sleeper", 1, "exec sleep 60"))
        .await
        .unwrap();
    change(&mut rx, "sleeper", |s| {
        matches!(s.status, ProcPhase::Ready { .. })
    })
    .await;
    let rs = c.get_rank_status(addr, "sleeper").await.unwrap();
    assert_eq!(rs.rank, 1);
    c.stop(addr, "sleeper", Duration::from_secs(10))
        .await
        .unwrap();
    let st = change(&mut rx, "sleeper", |s| s.status.is_terminal()).await;
    assert!(
        matches!(st.status, ProcPhase::Killed { signal: 15, .. }),
        "{st:?}"
    );
    assert!(st.stop_requested);
    assert_eq!(
        c.get_state(addr, "sleeper").await.unwrap().status,
        st.status
    );

    let mut beats = 0;
    for _ in 0..1000 {
        if let AgentEventKind::Push(AgentPush::Heartbeat { procs, .. }) = next(&mut rx).await.kind {
            assert_eq!(procs, 2);
            beats += 1;
            if beats == 3 {
                break;
            }
        }
    }
    assert_eq!(beats, 3, "heartbeats keep coming");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisor_back_after_outage_receives_full_state() {
    let agent = ChildAgent::start(&[("HOSTMESH_HEARTBEAT_INTERVAL", "100ms")], &[]);
    let addr = agent.addr();
    {
        let (first, mut rx) = client("operator", SECRET.as_bytes()).await;
        first.watch(0, addr);
        assert!(snapshot(&mut rx).await.is_empty());
    } // The supervisor goes away.

    // Meanwhile another party changes things on the host.
    let (other, _ev) = client("other", SECRET.as_bytes()).await;
    other
        .create_or_update(addr, sh("done", 0, "exit 0"))
        .await
        .unwrap();
    other
        .create_or_update(addr, sh("running", 1, "exec sleep 60"))
        .await
        .unwrap();
    poll_state(&other, addr, "done", |s| s.status.is_terminal()).await;
    poll_state(&other, addr, "running", |s| {
        matches!(s.status, ProcPhase::Ready { .. })
    })
    .await;

    // The supervisor comes back: its first push is the full state.
    let (back, mut rx) = client("operator", SECRET.as_bytes()).await;
    back.watch(0, addr);
    let mut procs = snapshot(&mut rx).await;
    procs.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(procs.len(), 2, "{procs:?}");
    assert!(matches!(
        procs[0].status,
        ProcPhase::Stopped { exit_code: 0, .. }
    ));
    assert!(matches!(procs[1].status, ProcPhase::Ready { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dialed_supervisor_restarted_receives_full_state() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sup: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let listening = |name: &'static str| async move {
        let (tx, rx) = mpsc::channel(4096);
        let cfg = ClientConfig {
            listen: Some(sup),
            ..config()
        };
        (
            AgentClient::new(name, SECRET.as_bytes(), cfg, tx)
                .await
                .unwrap(),
            rx,
        )
    };
    let (first, mut rx) = listening("supervisor").await;
    let agent = ChildAgent::start(
        &[
            ("HOSTMESH_HEARTBEAT_INTERVAL", "100ms"),
            ("HOSTMESH_SUPERVISOR", &sup.to_string()),
        ],
        &["exec sleep 60"],
    );
    let addr = agent.addr();
    // The agent dialed us and sent its state (the start-up proc may come
    // just before or just after it).
    snapshot(&mut rx).await;
    assert_eq!(agent.pids().len(), 1);
    drop(first);
    drop(rx);

    let (other, _ev) = client("other", SECRET.as_bytes()).await;
    other
        .create_or_update(addr, sh("during-outage", 1, "exit 7"))
        .await
        .unwrap();
    poll_state(&other, addr, "during-outage", |s| s.status.is_terminal()).await;

    let (_second, mut rx) = listening("supervisor").await;
    let mut procs = snapshot(&mut rx).await;
    procs.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(procs.len(), 2, "{procs:?}");
    assert_eq!(procs[0].name, "during-outage");
    assert!(matches!(
        procs[0].status,
        ProcPhase::Stopped { exit_code: 7, .. }
    ));
    assert!(matches!(procs[1].status, ProcPhase::Ready { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_host_stops_procs_then_the_agent_exits() {
    let agent = ChildAgent::start(&[], &["exec sleep 60", "exec sleep 61"]);
    shut_down(agent, Duration::from_secs(10), 1).await;
}

/// Sends `ShutdownHost {grace, max_concurrency}` to `agent`, then waits
/// until the agent exits 0 and every proc it had is gone.
async fn shut_down(mut agent: ChildAgent, grace: Duration, max_concurrency: usize) {
    let addr = agent.addr();
    let pids = agent.pids();
    let (c, _ev) = client("operator", SECRET.as_bytes()).await;
    c.shutdown_host(addr, grace, max_concurrency).await.unwrap();
    let st = tokio::task::spawn_blocking(move || {
        let st = agent.wait();
        (st, agent)
    })
    .await
    .unwrap()
    .0;
    assert!(st.success(), "{st:?}");
    wait_all_gone(&pids);
}

/// `ShutdownHost {max_concurrency: 2}` over six procs that, on TERM, log
/// `start`, linger, log `end` and exit: the log never shows more than two
/// stops under way, and does show two at once (the bound is a bound, not a
/// serial stop). Only the order of the lines is read, never a clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_host_stops_at_most_max_concurrency_procs_at_once() {
    const PROCS: usize = 6;
    const BOUND: usize = 2;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("term.log");
    // The TERM trap is installed before the ready mark; `wait` returns on
    // the signal, and the trap lingers a second with its stop under way.
    let script = format!(
        "trap 'echo start >> {log}; sleep 1; echo end >> {log}; kill $p 2>/dev/null; exit 0' TERM; \
         sleep 300 & p=$!; touch {dir}/ready.$RANK; wait $p",
        log = log.display(),
        dir = dir.path().display()
    );
    let scripts = vec![script.as_str(); PROCS];
    let agent = ChildAgent::start(&[], &scripts);
    hostmesh_testkit::eventually("every proc installed its TERM trap", || {
        (0..PROCS).all(|r| dir.path().join(format!("ready.{r}")).exists())
    })
    .await;
    shut_down(agent, Duration::from_secs(20), BOUND).await;

    let text = std::fs::read_to_string(&log).unwrap();
    let (mut under_way, mut most, mut stopped) = (0usize, 0usize, 0usize);
    for line in text.lines() {
        match line {
            "start" => {
                under_way += 1;
                most = most.max(under_way);
            }
            "end" => {
                under_way -= 1;
                stopped += 1;
            }
            other => panic!("unexpected line {other:?} in {text}"),
        }
    }
    assert_eq!(stopped, PROCS, "every proc got TERM and ended: {text}");
    assert!(
        most <= BOUND,
        "{most} stops under way at once, above max_concurrency {BOUND}: {text}"
    );
    assert_eq!(
        most, BOUND,
        "stops ran concurrently up to the bound: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_aware_proc_checks_in_hosts_actors_and_obeys_keepalive() {
    let agent = ChildAgent::start(&[], &[]);
    let addr = agent.addr();
    let (c, _ev) = client("operator", SECRET.as_bytes()).await;
    let exe = std::env::current_exe().unwrap();
    let mut spec = ProcSpec::command(
        exe.to_string_lossy(),
        &["--ignored", "--exact", "child_echo_proc", "--nocapture"],
    );
    spec.env = vec![("HOSTMESH_TEST_CHILD_ECHO".into(), "1".into())];
    spec.runtime_aware = true;
    spec.extent = vec![Dim::new("host", 1), Dim::new("gpu", 4)];
    let req = CreateOrUpdate {
        name: "echo-2".into(),
        rank: 2,
        spec,
        incarnation: 0,
    };
    c.create_or_update(addr, req).await.unwrap();
    let st = poll_state(&c, addr, "echo-2", |s| {
        s.status.is_terminal() || matches!(s.status, ProcPhase::Ready { .. })
    })
    .await;
    let ProcPhase::Ready {
        addr: Some(proc_addr),
        ..
    } = st.status
    else {
        panic!("a runtime-aware proc is Ready with its address after check-in: {st:?}");
    };
    let proc_id = ProcId::new(proc_addr.parse::<ChannelAddr>().unwrap(), "echo-2").unwrap();
    let mesh = mesh_ref(&proc_id).unwrap();
    // The proc admits peers with a credential of the World's issuer only:
    // the World secret (the operator's) is not what its runtime takes.
    let rt = runtime_client("operator-rt").await;
    let timeout = Duration::from_secs(10);
    let spawn = SpawnFor {
        type_name: echo_type_name().into(),
        name: "echo".into(),
        params: postcard::to_allocvec(&()).unwrap(),
        client: "operator-1".into(),
        keepalive_ms: 1500,
        owner: None,
    };
    let id = mesh.call(&rt, &spawn, timeout).await.unwrap().unwrap();
    let echo: ActorRef<Echo> = ActorRef::attest(id.clone());
    let reply = echo.call(&rt, &"hi".to_string(), timeout).await.unwrap();
    assert_eq!(reply, "2:hi", "the actor runs in the proc with RANK=2");

    let state = |m: ActorState| m.status;
    let query = GetActorState {
        name: "echo".into(),
    };
    // Keepalives keep it running...
    for _ in 0..5 {
        mesh.send(
            &rt,
            &Keepalive {
                client: "operator-1".into(),
            },
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let st = mesh.call(&rt, &query, timeout).await.unwrap().unwrap();
    assert_eq!(st.actor, id);
    assert_eq!(state(st), ActorStatus::Running);
    // ...and without them the actor stops.
    let reason = eventually_ok("the actor to stop", async || {
        let st = mesh.call(&rt, &query, timeout).await.unwrap().unwrap();
        match st.status {
            ActorStatus::Stopped(reason) => Ok(reason),
            other => Err(other),
        }
    })
    .await;
    assert!(reason.contains("keepalive"), "{reason}");

    // Stopping the proc: it exits 0 on TERM.
    c.stop(addr, "echo-2", Duration::from_secs(10))
        .await
        .unwrap();
    let st = poll_state(&c, addr, "echo-2", |s| s.status.is_terminal()).await;
    assert!(
        matches!(st.status, ProcPhase::Stopped { exit_code: 0, .. }),
        "{st:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_resubscribes_after_the_agent_restarts() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let env = [
        ("HOSTMESH_PORT", port.as_str()),
        ("HOSTMESH_HEARTBEAT_INTERVAL", "100ms"),
    ];
    let mut first = ChildAgent::start(&env, &["exec sleep 60"]);
    let addr = first.addr();
    let (c, mut rx) = client("operator", SECRET.as_bytes()).await;
    c.watch(0, addr);
    assert!(matches!(
        next(&mut rx).await.kind,
        AgentEventKind::Connected
    ));

    first.signal(libc::SIGKILL);
    first.wait();
    let mut down = false;
    for _ in 0..10_000 {
        if let AgentEventKind::Disconnected { reason } = next(&mut rx).await.kind {
            assert!(!reason.is_empty());
            down = true;
            break;
        }
    }
    assert!(down, "the client reports the lost agent");

    let second = ChildAgent::start(&env, &["exec sleep 61"]);
    assert_eq!(second.addr(), addr);
    second.pids();
    // The client comes back by itself, and the snapshot shows the new
    // agent's state.
    eventually_ok("a snapshot of the new agent", async || {
        let procs = snapshot(&mut rx).await;
        if procs.len() == 1 && procs[0].command.last().is_some_and(|c| c.contains("61")) {
            Ok(())
        } else {
            Err(procs)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn address_book_gives_master_addr_off_host_zero() {
    let agent = ChildAgent::start(&[("HOSTMESH_HOST_RANK", "1")], &[]);
    let addr = agent.addr();
    let (c, _ev) = client("operator", SECRET.as_bytes()).await;
    let mut req = sh(
        "m",
        17,
        "echo master=$MASTER_ADDR:$MASTER_PORT group=$GROUP_RANK",
    );
    req.spec.extent = vec![Dim::new("host", 2), Dim::new("proc", 16)];
    let e = c.create_or_update(addr, req.clone()).await.unwrap_err();
    assert!(
        matches!(&e, ClientError::Refused { message, .. } if message.contains("SetAddressBook")),
        "{e}"
    );
    c.set_address_book(
        addr,
        vec!["127.0.0.9:26602".into(), addr.to_string()],
        vec![],
        0,
    )
    .await
    .unwrap();
    req.spec.master_port = Some(1234);
    c.create_or_update(addr, req).await.unwrap();
    agent.line("[mesh/17] master=127.0.0.9:1234 group=1");
}

/// `PatchAddressBook` applies only on top of the version the agent holds
/// (an unnumbered book takes none); a patch that changes host 0 changes
/// the `MASTER_ADDR` of procs started after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn address_book_patches_apply_on_their_base_only() {
    use hostmesh_agent::protocol::{BookEntry, PatchAddressBook};
    let agent = ChildAgent::start(&[("HOSTMESH_HOST_RANK", "1")], &[]);
    let addr = agent.addr();
    let (c, _ev) = client("operator", SECRET.as_bytes()).await;
    let patch = |base, version, host0: &str| PatchAddressBook {
        base,
        version,
        len: 2,
        changes: vec![BookEntry {
            rank: 0,
            addr: host0.to_owned(),
            epoch: 0,
        }],
    };
    assert_eq!(
        c.patch_address_book(addr, patch(0, 1, "127.0.0.7:1"))
            .await
            .unwrap(),
        Err(0),
        "no book yet: a patch does not apply"
    );
    let whole = vec!["127.0.0.9:26602".into(), addr.to_string()];
    c.set_address_book(addr, whole.clone(), vec![], 0)
        .await
        .unwrap();
    assert_eq!(
        c.patch_address_book(addr, patch(0, 1, "127.0.0.7:1"))
            .await
            .unwrap(),
        Err(0),
        "an unnumbered book takes no patch"
    );
    c.set_address_book(addr, whole, vec![], 4).await.unwrap();
    assert_eq!(
        c.patch_address_book(addr, patch(3, 5, "127.0.0.7:1"))
            .await
            .unwrap(),
        Err(4),
        "another base: refused with the version held"
    );
    c.patch_address_book(addr, patch(4, 5, "127.0.0.8:1"))
        .await
        .unwrap()
        .unwrap();
    let mut req = sh("m", 3, "echo master=$MASTER_ADDR");
    req.spec.extent = vec![Dim::new("host", 2), Dim::new("proc", 2)];
    c.create_or_update(addr, req).await.unwrap();
    agent.line("[mesh/3] master=127.0.0.8");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_watches_many_agents() {
    const HOSTS: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("token");
    std::fs::write(&secret_file, SECRET).unwrap();
    let mut agents = Vec::new();
    for rank in 0..HOSTS {
        let config = hostmesh_agent::AgentConfig {
            host_rank: rank,
            heartbeat_interval: Duration::from_millis(200),
            ..hostmesh_agent::AgentConfig::loopback("many", secret_file.clone())
        };
        agents.push(hostmesh_agent::Agent::start(config).await.unwrap());
    }
    let (c, mut rx) = client("operator", SECRET.as_bytes()).await;
    let book: Vec<String> = agents.iter().map(|a| a.addr().to_string()).collect();
    for (rank, a) in agents.iter().enumerate() {
        c.watch(rank, a.addr());
        c.set_address_book(a.addr(), book.clone(), vec![], 0)
            .await
            .unwrap();
    }
    let mut snapshots = std::collections::HashSet::new();
    for _ in 0..100_000 {
        if snapshots.len() == HOSTS {
            break;
        }
        let ev = next(&mut rx).await;
        if let AgentEventKind::Push(AgentPush::Snapshot { host_rank, .. }) = ev.kind {
            assert_eq!(host_rank, ev.host.rank);
            assert_eq!(agents[host_rank].addr(), ev.host.addr);
            snapshots.insert(host_rank);
        }
    }
    assert_eq!(snapshots.len(), HOSTS);
    for (rank, a) in agents.iter().enumerate() {
        let mut req = sh(&format!("p{rank}"), rank, "exit 0");
        req.spec.extent = vec![Dim::new("host", HOSTS as u32), Dim::new("proc", 1)];
        c.create_or_update(a.addr(), req).await.unwrap();
    }
    let mut done = std::collections::HashSet::new();
    for _ in 0..100_000 {
        if done.len() == HOSTS {
            break;
        }
        let ev = next(&mut rx).await;
        if let AgentEventKind::Push(AgentPush::Changed(ch)) = ev.kind
            && ch.state.status.is_terminal()
        {
            assert_eq!(ch.host_rank, ev.host.rank);
            assert_eq!(ch.state.name, format!("p{}", ev.host.rank));
            assert!(matches!(
                ch.state.status,
                ProcPhase::Stopped { exit_code: 0, .. }
            ));
            done.insert(ev.host.rank);
        }
    }
    assert_eq!(done.len(), HOSTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_stacks_returns_the_kernel_view_bounded() {
    let agent = ChildAgent::start(&[], &["echo start; sleep 600"]);
    let addr = agent.addr();
    let (c, _ev) = client("operator", SECRET.as_bytes()).await;
    let stacks = c
        .capture_stacks(
            addr,
            vec!["p0".into(), "missing".into()],
            2048,
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(stacks.len(), 2, "{stacks:?}");
    let p0 = &stacks[0];
    assert_eq!(p0.name, "p0");
    // No py-spy on this PATH: the kernel's view of the shell and its sleep.
    assert!(matches!(p0.method.as_str(), "kernel" | "wchan"), "{p0:?}");
    assert!(p0.text.contains("(sh)"), "{}", p0.text);
    assert!(p0.text.contains("(sleep)"), "descendants too: {}", p0.text);
    assert!(p0.text.len() <= 2048);
    assert_eq!(stacks[1].method, "none");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_stacks_uses_py_spy_on_the_procs_path() {
    // PyPI's py-spy, installed into a virtualenv under target/ when the
    // machine has none; the proc finds it on its PATH, as in an image.
    let py_spy = hostmesh_testkit::pyspy::py_spy();
    let mut path = std::env::var("PATH").unwrap_or_default();
    if let Some(dir) = py_spy.parent().filter(|d| !d.as_os_str().is_empty()) {
        path = format!("{}:{path}", dir.display());
    }
    let agent = ChildAgent::start(&[], &[]);
    let addr = agent.addr();
    let (c, _ev) = client("operator", SECRET.as_bytes()).await;
    let script = "import sys, time\nprint('ready', flush=True)\ndef hang_in_collective():\n    time.sleep(600)\nhang_in_collective()\n";
    let mut spec = ProcSpec::command("python3", &["-c", script]);
    spec.env = vec![("PATH".into(), path)];
    spec.proc_mesh = "mesh".into();
    spec.extent = vec![Dim::new("host", 1), Dim::new("proc", 1)];
    let req = CreateOrUpdate {
        name: "py".into(),
        rank: 0,
        spec,
        incarnation: 0,
    };
    c.create_or_update(addr, req).await.unwrap();
    let stacks = eventually_ok("py-spy sees the hung function", async || {
        let s = c
            .capture_stacks(addr, vec!["py".into()], 8192, Duration::from_secs(30))
            .await
            .map_err(|e| e.to_string())?;
        match s.first() {
            Some(p) if p.method == "py-spy" && p.text.contains("hang_in_collective") => {
                Ok(p.clone())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(stacks.text.len() <= 8192);
    c.stop(addr, "py", Duration::from_secs(5)).await.unwrap();
}

/// Least privilege (agent `keys.rs`, `desk.rs`): an agent given the World
/// secret through `HOSTMESH_SECRET` passes it to no proc; a runtime-aware
/// proc gets a credential for its own name (not the runtime key) and a
/// plain one nothing; the credential opens the agent's proc desk (check-in
/// of itself only) but not the agent itself, it serves no other proc
/// name, and another World's credential opens neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn procs_hold_no_world_secret_and_a_proc_credential_cannot_command_the_agent() {
    let agent = ChildAgent::start(
        &[("HOSTMESH_SECRET_FILE", ""), ("HOSTMESH_SECRET", SECRET)],
        &[],
    );
    let addr = agent.addr();
    let (c, _ev) = client("operator", SECRET.as_bytes()).await;
    let dir = tempfile::tempdir().unwrap();
    let dump = |name: &str| dir.path().join(format!("{name}.env"));
    for (name, rank, aware) in [("plain", 0, false), ("aware", 1, true)] {
        let script = format!(
            "env > {p}.tmp && mv {p}.tmp {p}; exec sleep 60",
            p = dump(name).display()
        );
        let mut req = sh(name, rank, &script);
        req.spec.runtime_aware = aware;
        c.create_or_update(addr, req).await.unwrap();
    }
    async fn read(
        path: std::path::PathBuf,
    ) -> (String, std::collections::BTreeMap<String, String>) {
        let text = eventually_async(&format!("{} written", path.display()), async || {
            std::fs::read_to_string(&path).ok()
        })
        .await;
        let vars = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        (text, vars)
    }
    let key = hostmesh_agent::keys::runtime_key(SECRET.as_bytes());
    let hex = hostmesh_agent::keys::to_hex(key.bytes());
    let (plain_text, plain) = read(dump("plain")).await;
    let (aware_text, aware) = read(dump("aware")).await;
    for (name, text) in [("plain", &plain_text), ("aware", &aware_text)] {
        assert!(
            !text.contains(SECRET),
            "{name} holds the World secret:\n{text}"
        );
        assert!(!text.contains("HOSTMESH_SECRET"), "{name}:\n{text}");
        assert!(
            !text.contains(&hex),
            "{name} holds the runtime key:\n{text}"
        );
    }
    assert_eq!(plain["HOSTMESH_PROC_NAME"], "plain", "a real dump");
    assert!(
        !plain.contains_key(hostmesh_agent::PROC_CREDENTIAL_VAR),
        "{plain_text}"
    );
    let credential =
        hostmesh_runtime::Credential::from_text(&aware[hostmesh_agent::PROC_CREDENTIAL_VAR])
            .unwrap();
    assert_eq!(credential.certificate().name, "aware", "its own name");
    credential.certificate().verify(&issuer().public()).unwrap();
    let desk: SocketAddr = aware["HOSTMESH_AGENT_ADDR"].parse().unwrap();
    assert_ne!(desk, addr, "procs are sent to the desk, not the agent");

    let timeout = Duration::from_secs(10);
    // The proc's credential, in a proc named as it is.
    let as_aware = |name: &str| {
        Proc::builder(name)
            .listen("tcp:127.0.0.1:0".parse().unwrap())
            .credential(credential.clone())
            .build()
    };
    let e = as_aware("plain")
        .await
        .err()
        .expect("another name is refused");
    assert!(
        e.to_string().contains("valid only for the proc name"),
        "{e}"
    );
    let rt = as_aware("aware").await.unwrap();
    // It cannot command the agent: the handshake refuses it.
    let refused = hostmesh_agent::agent_ref(addr)
        .unwrap()
        .call(
            &rt,
            &hostmesh_agent::protocol::GetState {
                name: "plain".into(),
            },
            timeout,
        )
        .await;
    assert!(refused.is_err(), "the agent answered a proc credential");
    agent.err_line("handshake failed");
    // It does open the desk, for itself only: a check-in of "aware" at
    // another proc's address is refused, as is one by another proc...
    let other_proc = Proc::builder("someone")
        .listen("tcp:127.0.0.1:0".parse().unwrap())
        .issued_by(issuer())
        .build()
        .await
        .unwrap();
    let desk_ref = hostmesh_agent::desk_ref(desk).unwrap();
    let posing = hostmesh_agent::protocol::CheckIn {
        name: "aware".into(),
        addr: other_proc.id().addr().to_string(),
    };
    let why = desk_ref
        .call(&rt, &posing, timeout)
        .await
        .unwrap()
        .unwrap_err();
    assert!(why.contains("checks in only itself"), "{why}");
    let why = desk_ref
        .call(&other_proc, &posing, timeout)
        .await
        .unwrap()
        .unwrap_err();
    assert!(why.contains("reports only for itself"), "{why}");
    let failed = hostmesh_agent::protocol::ActorFailed {
        name: "aware".into(),
        actor: format!("{}/mesh[0]", rt.id()),
        reason: "a forged failure".into(),
    };
    let why = desk_ref
        .call(&other_proc, &failed, timeout)
        .await
        .unwrap()
        .unwrap_err();
    assert!(why.contains("reports only for itself"), "{why}");
    // ...and its own check-in makes it Ready at its own address.
    let check_in = hostmesh_agent::protocol::CheckIn {
        name: "aware".into(),
        addr: rt.id().addr().to_string(),
    };
    desk_ref
        .call(&rt, &check_in, timeout)
        .await
        .unwrap()
        .unwrap();
    let st = poll_state(&c, addr, "aware", |s| {
        matches!(s.status, ProcPhase::Ready { .. })
    })
    .await;
    assert!(
        matches!(&st.status, ProcPhase::Ready { addr: Some(a), .. } if *a == check_in.addr),
        "{st:?}"
    );
    // Another World's credential opens neither.
    let other = Proc::builder("other-world")
        .issued_by(hostmesh_runtime::Issuer::from_runtime_key(
            hostmesh_agent::keys::runtime_key(b"another-world-secret-0123456789").bytes(),
        ))
        .build()
        .await
        .unwrap();
    let at_desk = desk_ref.call(&other, &check_in, timeout).await;
    assert!(
        at_desk.is_err(),
        "the desk admitted another World's credential"
    );
}

/// Agent keys invariant 5: a rotated World secret reaches a running agent
/// over its operator's link. The link it came over keeps working; from
/// then on the agent admits only the new secret (a dialer that holds both
/// reaches it); procs spawned before and after the rotation admit each
/// other through the lineage, and the desk admits both. A short secret or
/// a lineage that does not lead to the new issuer is refused, and changes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_world_secret_reaches_a_running_agent_in_place() {
    const NEW: &str = "the-rotated-world-secret-0123456789abcdef";
    let agent = ChildAgent::start(
        &[("HOSTMESH_SECRET_FILE", ""), ("HOSTMESH_SECRET", SECRET)],
        &[],
    );
    let addr = agent.addr();
    let (c, _ev) = client("operator", SECRET.as_bytes()).await;
    let dir = tempfile::tempdir().unwrap();
    let dump = |name: &str| dir.path().join(format!("{name}.env"));
    let spawn = |name: &'static str, rank: usize| {
        let script = format!(
            "env > {p}.tmp && mv {p}.tmp {p}; exec sleep 60",
            p = dump(name).display()
        );
        let mut req = sh(name, rank, &script);
        req.spec.runtime_aware = true;
        req
    };
    let credential_of = async |name: &str| {
        let path = dump(name);
        let text = eventually_async(&format!("{} written", path.display()), async || {
            std::fs::read_to_string(&path).ok()
        })
        .await;
        assert!(!text.contains(NEW) && !text.contains(SECRET), "{text}");
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("HOSTMESH_PROC_CREDENTIAL="))
            .expect("a credential");
        hostmesh_runtime::Credential::from_text(line).unwrap()
    };
    c.create_or_update(addr, spawn("before", 0)).await.unwrap();
    let before = credential_of("before").await;

    let next = hostmesh_runtime::Issuer::from_runtime_key(
        hostmesh_agent::keys::runtime_key(NEW.as_bytes()).bytes(),
    );
    let lineage = issuer().endorse(&next).to_text();
    // Refusals change nothing.
    let short = c.rekey(addr, b"too-short", &lineage).await.unwrap_err();
    assert!(short.to_string().contains("at least 16"), "{short}");
    let elsewhere = issuer()
        .endorse(&hostmesh_runtime::Issuer::from_runtime_key(
            b"another runtime key.....",
        ))
        .to_text();
    let bad = c.rekey(addr, NEW.as_bytes(), &elsewhere).await.unwrap_err();
    assert!(bad.to_string().contains("lineage"), "{bad}");
    let (still, _e) = client("still-old", SECRET.as_bytes()).await;
    still.get_state(addr, "before").await.unwrap();

    c.rekey(addr, NEW.as_bytes(), &lineage).await.unwrap();
    // The link the rotation came over keeps its session.
    c.create_or_update(addr, spawn("after", 1)).await.unwrap();
    let after = credential_of("after").await;
    assert_eq!(after.issuer(), &next.public(), "issued by the new issuer");

    // New connections: the old secret alone is refused, the new one or
    // both (a rotating operator) are admitted.
    let (old, _e) = client("old-only", SECRET.as_bytes()).await;
    assert!(old.get_state(addr, "before").await.is_err());
    let (new, _e) = client("new-only", NEW.as_bytes()).await;
    new.get_state(addr, "before").await.unwrap();
    let (tx, _rx) = mpsc::channel(16);
    let both = AgentClient::rotating(
        "rotating",
        NEW.as_bytes(),
        Some(SECRET.as_bytes()),
        config(),
        tx,
    )
    .await
    .unwrap();
    both.get_state(addr, "after").await.unwrap();

    // Procs of both issuers admit each other, and the desk admits both.
    let as_proc = async |name: &str, credential: &hostmesh_runtime::Credential| {
        Proc::builder(name)
            .listen("tcp:127.0.0.1:0".parse().unwrap())
            .credential(credential.clone())
            .build()
            .await
            .unwrap()
    };
    let (p_before, p_after) = (
        as_proc("before", &before).await,
        as_proc("after", &after).await,
    );
    p_before.connect(p_after.id().addr()).await.unwrap();
    p_after.connect(p_before.id().addr()).await.unwrap();
    let desk: SocketAddr = {
        let text = std::fs::read_to_string(dump("after")).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("HOSTMESH_AGENT_ADDR="))
            .unwrap()
            .parse()
            .unwrap()
    };
    let desk_ref = hostmesh_agent::desk_ref(desk).unwrap();
    let timeout = Duration::from_secs(10);
    for (p, name) in [(&p_before, "before"), (&p_after, "after")] {
        let check_in = hostmesh_agent::protocol::CheckIn {
            name: name.into(),
            addr: p.id().addr().to_string(),
        };
        desk_ref.call(p, &check_in, timeout).await.unwrap().unwrap();
        poll_state(&new, addr, name, |s| {
            matches!(s.status, ProcPhase::Ready { .. })
        })
        .await;
    }
}
