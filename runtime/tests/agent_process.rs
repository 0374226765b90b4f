//! The agent as a real OS process: its configuration from the environment,
//! its health endpoint, its graceful stop on SIGTERM, and no orphans when it
//! is killed with SIGKILL (host::spawn invariants 1-2, host::agent
//! invariant 2).
//!
//! The agent process is this test binary re-run with `--ignored --exact
//! child_agent` and `HOSTMESH_TEST_CHILD_AGENT=1`: `child_agent` runs the
//! real `Agent` from `AgentArgs` parsed from the environment, creates the
//! procs listed in `HOSTMESH_TEST_PROCS` (one shell script per line), prints
//! their pids, and serves until it is stopped.

mod agent_common;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_common::{PATIENCE, process_gone};
use clap::Parser as _;
use hostmesh_runtime::host::protocol::{CreateOrUpdate, Dim, ProcSpec};
use hostmesh_runtime::host::{Agent, AgentArgs};

#[derive(clap::Parser)]
struct ChildCli {
    #[command(flatten)]
    args: AgentArgs,
}

/// Entry point of the child agent process (see the module doc).
#[test]
#[ignore = "entry point of the child agent process that the other tests start"]
#[expect(
    clippy::print_stderr,
    reason = "a process entry point reports start-up errors on stderr, like the binary"
)]
fn child_agent() {
    if std::env::var_os("HOSTMESH_TEST_CHILD_AGENT").is_none() {
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .try_init();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let code = rt.block_on(async {
        let args = ChildCli::parse_from(["agent"]).args;
        let config = match args.validate() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: {e}");
                return 2;
            }
        };
        let agent = match Agent::start(config).await {
            Ok(a) => a,
            Err(e) => {
                eprintln!("error: {e}");
                return 2;
            }
        };
        let scripts = std::env::var("HOSTMESH_TEST_PROCS").unwrap_or_default();
        let mut pids = Vec::new();
        let n = scripts.lines().count();
        for (rank, script) in scripts.lines().enumerate() {
            let mut spec = ProcSpec::command("sh", &["-c", script]);
            spec.proc_mesh = "mesh".into();
            spec.extent = vec![Dim::new("host", 1), Dim::new("proc", n)];
            let name = format!("p{rank}");
            agent
                .manager()
                .create_or_update(CreateOrUpdate {
                    name: name.clone(),
                    rank,
                    spec,
                    incarnation: 0,
                })
                .unwrap();
            let deadline = tokio::time::Instant::now() + PATIENCE;
            loop {
                if let Some(pid) = agent.manager().state(&name).unwrap().pid {
                    pids.push(pid.to_string());
                    break;
                }
                assert!(tokio::time::Instant::now() < deadline);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let mut out = std::io::stdout().lock();
        writeln!(out, "HEALTH {}", agent.health_addr()).unwrap();
        writeln!(out, "PIDS {}", pids.join(" ")).unwrap();
        out.flush().unwrap();
        drop(out);
        match agent.run_until_stopped().await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        }
    });
    std::process::exit(code);
}

struct ChildAgent {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl ChildAgent {
    fn start(env: &[(&str, &str)], procs: &[&str]) -> ChildAgent {
        let dir = tempfile::tempdir().unwrap().keep();
        let secret = dir.join("token");
        std::fs::write(&secret, "0123456789abcdef0123456789abcdef\n").unwrap();
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--ignored", "--exact", "child_agent", "--nocapture"])
            .env("HOSTMESH_TEST_CHILD_AGENT", "1")
            .env("HOSTMESH_WORLD", "w")
            .env("HOSTMESH_HOST_RANK", "0")
            .env("HOSTMESH_POD_IP", "127.0.0.1")
            .env("HOSTMESH_HEALTH_PORT", "0")
            .env("HOSTMESH_SECRET_FILE", &secret)
            .env("HOSTMESH_STOP_GRACE", "20s")
            .env("HOSTMESH_TEST_PROCS", procs.join("\n"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            if v.is_empty() {
                cmd.env_remove(k);
            } else {
                cmd.env(k, v);
            }
        }
        let mut child = cmd.spawn().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                l.lock().unwrap().push(line);
            }
        });
        ChildAgent { child, lines }
    }

    /// Waits for a stdout line starting with `prefix` and returns the rest.
    fn line(&self, prefix: &str) -> String {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            if let Some(l) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find_map(|l| l.strip_prefix(prefix))
            {
                return l.trim().to_owned();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "agent never printed {prefix:?}; output so far: {:?}",
                self.lines.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pids(&self) -> Vec<u32> {
        self.line("PIDS ")
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect()
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling the child this test started.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(std::time::Instant::now() < deadline, "agent never exited");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ChildAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_all_gone(pids: &[u32]) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while !pids.iter().all(|p| process_gone(*p)) {
        let alive: Vec<_> = pids.iter().filter(|p| !process_gone(**p)).collect();
        assert!(
            std::time::Instant::now() < deadline,
            "procs outlived the agent: {alive:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
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
    assert!(pids.iter().all(|p| !process_gone(*p)), "procs are running");
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
        let mut err = String::new();
        agent
            .child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(err.contains(expect), "{env:?}: {err}");
    }
}
