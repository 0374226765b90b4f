//! The agent as a child process of a test: the test binary re-run with
//! `--ignored --exact child_agent` and `HOSTMESH_TEST_CHILD_AGENT=1`.
//! [`child_agent_main`] runs the real `Agent` from `AgentArgs` parsed from
//! the environment, creates the procs listed in `HOSTMESH_TEST_PROCS` (one
//! shell script per line), prints `ADDR`, `HEALTH` and `PIDS` lines, and
//! serves until it is stopped. [`ChildAgent`] starts and watches it.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser as _;
use hostmesh_agent::protocol::{CreateOrUpdate, Dim, ProcSpec};
use hostmesh_agent::{Agent, AgentArgs};
use hostmesh_testkit::PATIENCE;
use hostmesh_testkit::process::gone;

/// The World secret every child agent uses.
pub const SECRET: &str = "0123456789abcdef0123456789abcdef";

#[derive(clap::Parser)]
struct ChildCli {
    #[command(flatten)]
    args: AgentArgs,
}

/// Body of the `child_agent` entry point; returns at once unless
/// `HOSTMESH_TEST_CHILD_AGENT` is set, else exits the process.
#[expect(
    clippy::print_stderr,
    reason = "a process entry point reports start-up errors on stderr, like the binary"
)]
pub fn child_agent_main() {
    if std::env::var_os("HOSTMESH_TEST_CHILD_AGENT").is_none() {
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    // As `hostmesh agent` does (`run_blocking`): the secret leaves the
    // environment before any thread starts, and the process is not
    // dumpable.
    let secret = match hostmesh_agent::keys::take_env_secret() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    hostmesh_agent::keys::become_undumpable().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let code = rt.block_on(async {
        // As `hostmesh agent` does (`run_agent`).
        hostmesh_agent::become_subreaper().unwrap();
        let mut args = ChildCli::parse_from(["agent"]).args;
        args.secret = secret;
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
        let n = u32::try_from(scripts.lines().count()).expect("a few test procs");
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
        writeln!(out, "ADDR {}", agent.addr()).unwrap();
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

/// A child agent process and its captured output lines.
pub struct ChildAgent {
    pub child: Child,
    pub stdout: Arc<Mutex<Vec<String>>>,
    pub stderr: Arc<Mutex<Vec<String>>>,
    pub secret_file: PathBuf,
}

fn collect(r: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            l.lock().unwrap().push(line);
        }
    });
    lines
}

impl ChildAgent {
    /// Starts a child agent for host 0 on 127.0.0.1 (ports picked by the
    /// system); `env` entries override (an empty value removes the
    /// variable); `procs` are shell scripts created at start.
    pub fn start(env: &[(&str, &str)], procs: &[&str]) -> ChildAgent {
        let dir = tempfile::tempdir().unwrap().keep();
        let secret_file = dir.join("token");
        std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--ignored", "--exact", "child_agent", "--nocapture"])
            .env("HOSTMESH_TEST_CHILD_AGENT", "1")
            .env("HOSTMESH_WORLD", "w")
            .env("HOSTMESH_HOST_RANK", "0")
            .env("HOSTMESH_POD_IP", "127.0.0.1")
            .env("HOSTMESH_PORT", "0")
            .env("HOSTMESH_HEALTH_PORT", "0")
            .env("HOSTMESH_SECRET_FILE", &secret_file)
            .env("HOSTMESH_STOP_GRACE", "20s")
            .env("HOSTMESH_TEST_PROCS", procs.join("\n"))
            .env_remove("HOSTMESH_SUPERVISOR")
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
        let stdout = collect(child.stdout.take().unwrap());
        let stderr = collect(child.stderr.take().unwrap());
        ChildAgent {
            child,
            stdout,
            stderr,
            secret_file,
        }
    }

    /// Waits for a stdout line starting with `prefix` and returns the rest.
    pub fn line(&self, prefix: &str) -> String {
        wait_line(&self.stdout, prefix, "stdout")
    }

    /// Waits for a stderr line containing `needle` and returns it.
    pub fn err_line(&self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            if let Some(l) = self
                .stderr
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return l.clone();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "agent never logged {needle:?}; stderr so far: {:?}",
                self.stderr.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The agent's runtime address.
    pub fn addr(&self) -> SocketAddr {
        self.line("ADDR ").parse().unwrap()
    }

    /// Pids of the procs created at start.
    pub fn pids(&self) -> Vec<u32> {
        self.line("PIDS ")
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect()
    }

    /// Sends `sig` to the agent.
    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling the child this test started.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    /// Waits (bounded) for the agent to exit.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(std::time::Instant::now() < deadline, "agent never exited");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// All stderr so far.
    pub fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }
}

fn wait_line(lines: &Mutex<Vec<String>>, prefix: &str, what: &str) -> String {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        if let Some(l) = lines
            .lock()
            .unwrap()
            .iter()
            .find_map(|l| l.strip_prefix(prefix))
        {
            return l.trim().to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "agent never printed {prefix:?} on {what}; so far: {:?}",
            lines.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for ChildAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (bounded) until every pid is gone.
pub fn wait_all_gone(pids: &[u32]) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while !pids.iter().all(|p| gone(*p)) {
        let alive: Vec<_> = pids.iter().filter(|p| !gone(**p)).collect();
        assert!(
            std::time::Instant::now() < deadline,
            "procs outlived the agent: {alive:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
