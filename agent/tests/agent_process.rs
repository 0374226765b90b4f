//! The agent as a real OS process: its configuration from the environment,
//! its health endpoint, its graceful stop on SIGTERM, and no orphans when it
//! is killed with SIGKILL (host::spawn invariants 1-2, host::agent
//! invariant 2). The agent is this test binary re-run as `child_agent`
//! (agent_common/child.rs).

mod agent_common;

use std::io::{Read as _, Write as _};

use agent_common::child::{ChildAgent, child_agent_main, wait_all_gone};
use hostmesh_testkit::PATIENCE;
use hostmesh_testkit::process::gone;

/// Entry point of the child agent process (agent_common/child.rs).
#[test]
#[ignore = "entry point of the child agent process that the other tests start"]
fn child_agent() {
    child_agent_main();
}

#[test]
fn agent_sigkill_leaves_no_child_alive() {
    let mut agent = ChildAgent::start(
        &[],
        &[
            "exec sleep 300",
            "trap '' TERM; while :; do sleep 1; done",
            "exec sleep 301",
        ],
    );
    let pids = agent.pids();
    assert_eq!(pids.len(), 3);
    assert!(pids.iter().all(|p| !gone(*p)), "procs are running");
    agent.signal(libc::SIGKILL);
    let st = agent.wait();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&st),
        Some(libc::SIGKILL)
    );
    wait_all_gone(&pids);
}

#[test]
fn agent_sigterm_stops_procs_gracefully() {
    let mut agent = ChildAgent::start(
        &[],
        &[
            "trap 'echo term-received; exit 0' TERM; echo armed; while :; do sleep 1; done",
            "exec sleep 300",
        ],
    );
    let pids = agent.pids();
    agent.line("[mesh/0] armed");
    agent.signal(libc::SIGTERM);
    let st = agent.wait();
    assert!(
        st.success(),
        "agent exits cleanly after stopping its procs: {st:?}"
    );
    agent.line("[mesh/0] term-received");
    wait_all_gone(&pids);
}

#[test]
fn health_endpoints_answer() {
    let agent = ChildAgent::start(&[], &[]);
    let addr = agent.line("HEALTH ");
    let get = |path: &str| {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        resp
    };
    assert!(get("/healthz").starts_with("HTTP/1.1 200"));
    assert!(get("/readyz").starts_with("HTTP/1.1 200"));
    assert!(get("/secrets").starts_with("HTTP/1.1 404"));
}

#[test]
fn bad_configuration_fails_at_start_naming_the_setting() {
    for (env, expect) in [
        (vec![("HOSTMESH_WORLD", "")], "HOSTMESH_WORLD"),
        (vec![("HOSTMESH_HOST_RANK", "minus-one")], "--host-rank"),
        (vec![("HOSTMESH_POD_IP", "not-an-ip")], "--pod-ip"),
        (
            vec![("HOSTMESH_SECRET_FILE", "/nonexistent/token")],
            "secret file",
        ),
        (
            vec![("HOSTMESH_HEARTBEAT_INTERVAL", "often")],
            "HOSTMESH_HEARTBEAT_INTERVAL",
        ),
    ] {
        let mut agent = ChildAgent::start(&env, &[]);
        let st = agent.wait();
        assert_eq!(st.code(), Some(2), "{env:?}");
        agent.err_line(expect);
    }
}

#[test]
fn agent_settings_do_not_leak_into_procs() {
    let agent = ChildAgent::start(
        &[],
        &[
            "echo \"leak=${HOSTMESH_HOST_RANK:-none}/${HOSTMESH_TEST_CHILD_AGENT:-none} world=$HOSTMESH_WORLD rank=$RANK\"",
        ],
    );
    agent.line("[mesh/0] leak=none/none world=w rank=0");
}

/// Fence invariant 5 over real sockets: a peer claiming an older epoch of a
/// rank is refused by the agent process once the address book told it of a
/// newer one; the current epoch and unclaimed peers are not; procs learn
/// their host's epoch.
#[test]
fn a_replaced_ranks_older_copy_cannot_connect() {
    use hostmesh_agent::{AgentClient, ClientConfig};
    use hostmesh_runtime::channel::epoch::EpochClaim;
    use hostmesh_runtime::{ChannelAddr, Proc};

    let agent = ChildAgent::start(
        &[("HOSTMESH_EPOCH", "3")],
        &["echo \"claim=$HOSTMESH_RANK_EPOCH known=$HOSTMESH_RANK_EPOCHS\""],
    );
    agent.line("[mesh/0] claim=0:3 known=0=3");
    let addr = agent.addr();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let secret = agent_common::child::SECRET.as_bytes();
        let peer = |epoch: Option<u64>| async move {
            let mut b = Proc::builder("peer").secret(secret.to_vec());
            if let Some(epoch) = epoch {
                b = b.epoch(EpochClaim { rank: 1, epoch });
            }
            let p = b.build().await.unwrap();
            let res = p.connect(&ChannelAddr::Tcp(addr)).await;
            p.shutdown();
            res.map(|_| ()).map_err(|e| e.to_string())
        };
        assert!(peer(Some(5)).await.is_ok(), "no newer epoch known yet");
        let (tx, _rx) = tokio::sync::mpsc::channel(16);
        let c = AgentClient::new("operator", secret, ClientConfig::default(), tx)
            .await
            .unwrap();
        c.set_address_book(
            addr,
            vec![addr.to_string(), "127.0.0.1:1".into()],
            vec![3, 6],
            1,
        )
        .await
        .unwrap();
        let refused = peer(Some(5)).await.unwrap_err();
        assert!(refused.contains("stale peer"), "{refused}");
        assert!(peer(Some(6)).await.is_ok(), "the current epoch");
        assert!(peer(None).await.is_ok(), "an unclaimed peer");
    });
}

/// Whether `pid` is gone and reaped (no zombie left either).
fn reaped(pid: u32) -> bool {
    !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

fn wait_reaped(pids: &[u32]) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while !pids.iter().all(|p| reaped(*p)) {
        assert!(
            std::time::Instant::now() < deadline,
            "still there (or zombies): {:?}",
            pids.iter().filter(|p| !reaped(**p)).collect::<Vec<_>>()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Issue 30: a proc's daemons go with it, whether they left its session
/// (`setsid`) while it runs or were orphaned by a parent that exited (then
/// the agent, their subreaper, adopted them), and they are reaped.
#[test]
fn a_procs_setsid_daemons_die_with_it() {
    let agent = ChildAgent::start(
        &[],
        &[concat!(
            "setsid sleep 311 </dev/null >/dev/null 2>&1 & echo daemon-a $!; ",
            "sh -c 'setsid sleep 312 </dev/null >/dev/null 2>&1 & echo daemon-b $!'; ",
            "exec sleep 300"
        )],
    );
    let main = agent.pids()[0];
    let daemons: Vec<u32> = ["[mesh/0] daemon-a ", "[mesh/0] daemon-b "]
        .iter()
        .map(|p| agent.line(p).parse().unwrap())
        .collect();
    assert!(daemons.iter().all(|p| !gone(*p)), "the daemons run");
    // The main process ends (killed from outside): its daemons go too.
    // SAFETY: signalling the proc this test's agent started.
    assert_eq!(unsafe { libc::kill(main as i32, libc::SIGKILL) }, 0);
    wait_reaped(&daemons);
    agent.err_line("killed what the proc left running");
}

/// Issue 30: when the agent stops, nothing its procs started survives it,
/// not even a daemon that cleared its environment (so no proc can be told
/// from it) and changed its session.
#[test]
fn agent_stop_kills_daemons_it_cannot_attribute() {
    let mut agent = ChildAgent::start(
        &[],
        &[concat!(
            "sh -c 'env -i setsid sleep 313 </dev/null >/dev/null 2>&1 & echo daemon $!'; ",
            "exec sleep 300"
        )],
    );
    let pids = agent.pids();
    let daemon: u32 = agent.line("[mesh/0] daemon ").parse().unwrap();
    assert!(!gone(daemon), "the daemon runs");
    agent.signal(libc::SIGTERM);
    assert!(agent.wait().success());
    wait_all_gone(&pids);
    wait_all_gone(&[daemon]);
}
