//! Suite `agent`: a real agent (in this process, serving on loopback) driven
//! by an `AgentClient` over the authenticated runtime transport, against
//! bare fork/exec of the same commands in the same run.
//!
//! Figures (median of several rounds):
//! - `spawn_ready_8_plain`, `spawn_ready_64_plain` (ms): from sending the
//!   `CreateOrUpdate`s (concurrently) until every proc's Ready push arrived
//!   at the client; baseline: bare spawn of the same `sleep` commands;
//! - `spawn_ready_8_runtime` (ms): the same for 8 runtime-aware procs (the
//!   echo example; Ready is their check-in); no baseline;
//! - `exit_to_status_ms` (ms): from SIGKILL of a proc until its Killed push
//!   arrived at the client (target at most 100 ms).
//!
//! The runtime-aware proc is this executable re-run with
//! `HOSTMESH_BENCH_ECHO_PROC=1`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hostmesh_agent::protocol::{AgentPush, CreateOrUpdate, Dim, ProcPhase, ProcSpec};
use hostmesh_agent::{Agent, AgentClient, AgentConfig, AgentEvent, AgentEventKind, ClientConfig};
use tokio::sync::mpsc;

use crate::report::emit;

const ROUNDS: usize = 5;
const ECHO_ENV: &str = "HOSTMESH_BENCH_ECHO_PROC";
const SECRET: &[u8] = b"hostmesh-bench-agent-secret-0123";
const PATIENCE: Duration = Duration::from_secs(60);

/// Runs the suite (or, re-run as a proc, the echo example).
pub(crate) fn run() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    if std::env::var_os(ECHO_ENV).is_some() {
        return Ok(rt.block_on(hostmesh_agent::echo::run())?);
    }
    rt.block_on(suite())
}

struct Bench {
    _agent: Agent,
    _dir: tempfile::TempDir,
    addr: SocketAddr,
    client: AgentClient,
    events: mpsc::Receiver<AgentEvent>,
    round: usize,
}

async fn suite() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let secret_file = dir.path().join("token");
    std::fs::write(&secret_file, SECRET)?;
    let agent = Agent::start(AgentConfig::loopback("bench", secret_file)).await?;
    let addr = agent.addr();
    let (tx, events) = mpsc::channel(65536);
    let client = AgentClient::new("bench", SECRET, ClientConfig::default(), tx).await?;
    client.watch(0, addr);
    let mut b = Bench {
        _agent: agent,
        _dir: dir,
        addr,
        client,
        events,
        round: 0,
    };

    for n in [8usize, 64] {
        let mut agent = Vec::new();
        let mut bare = Vec::new();
        for _ in 0..ROUNDS {
            bare.push(bare_spawn(n)?);
            agent.push(b.spawn_ready(n, plain(n)).await?);
        }
        emit(
            &format!("spawn_ready_{n}_plain"),
            median(&mut agent),
            "ms",
            Some(median(&mut bare)),
        );
    }
    let exe = std::env::current_exe()?;
    let mut runtime = Vec::new();
    for _ in 0..ROUNDS {
        runtime.push(b.spawn_ready(8, echo(&exe, 8)).await?);
    }
    emit("spawn_ready_8_runtime", median(&mut runtime), "ms", None);

    let mut exits = Vec::new();
    for _ in 0..10 {
        exits.push(b.exit_to_status().await?);
    }
    emit("exit_to_status_ms", median(&mut exits), "ms", None);
    Ok(())
}

fn plain(n: usize) -> ProcSpec {
    let mut spec = ProcSpec::command("sleep", &["60"]);
    spec.proc_mesh = "bench".into();
    spec.extent = vec![Dim::new("host", 1), Dim::new("proc", n as u32)];
    spec
}

fn echo(exe: &std::path::Path, n: usize) -> ProcSpec {
    let mut spec = ProcSpec::command(exe.to_string_lossy(), &["agent"]);
    spec.proc_mesh = "bench-echo".into();
    spec.extent = vec![Dim::new("host", 1), Dim::new("proc", n as u32)];
    spec.runtime_aware = true;
    spec.env = vec![(ECHO_ENV.into(), "1".into())];
    spec
}

/// Bare fork/exec of `n` `sleep 60`: time until every spawn returned.
fn bare_spawn(n: usize) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let mut children = Vec::with_capacity(n);
    for _ in 0..n {
        children.push(
            Command::new("sleep")
                .arg("60")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()?,
        );
    }
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    Ok(ms)
}

impl Bench {
    /// Next push for proc `names`, skipping everything else.
    async fn next_change(
        &mut self,
        names: &HashSet<String>,
    ) -> anyhow::Result<(String, ProcPhase)> {
        loop {
            let ev = tokio::time::timeout(PATIENCE, self.events.recv())
                .await
                .context("no push from the agent")?
                .context("event channel closed")?;
            if let AgentEventKind::Push(AgentPush::Changed(c)) = ev.kind
                && names.contains(&c.state.name)
            {
                return Ok((c.state.name, c.state.status));
            }
        }
    }

    /// `CreateOrUpdate` of `n` procs (concurrently) until every Ready push
    /// arrived; then stops them (not timed).
    async fn spawn_ready(&mut self, n: usize, spec: ProcSpec) -> anyhow::Result<f64> {
        self.round += 1;
        let names: Vec<String> = (0..n).map(|r| format!("r{}-{r}", self.round)).collect();
        let set: HashSet<String> = names.iter().cloned().collect();
        let t0 = Instant::now();
        let mut calls = tokio::task::JoinSet::new();
        for (rank, name) in names.iter().enumerate() {
            let (client, addr) = (self.client.clone(), self.addr);
            let req = CreateOrUpdate {
                name: name.clone(),
                rank,
                spec: spec.clone(),
                incarnation: 0,
            };
            calls.spawn(async move { client.create_or_update(addr, req).await });
        }
        while let Some(r) = calls.join_next().await {
            r??;
        }
        let mut ready = HashSet::new();
        while ready.len() < n {
            match self.next_change(&set).await? {
                (name, ProcPhase::Ready { .. }) => {
                    ready.insert(name);
                }
                (name, s) if s.is_terminal() => anyhow::bail!("proc {name} ended: {s:?}"),
                _ => {}
            }
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        for name in &names {
            self.client
                .stop(self.addr, name, Duration::from_secs(5))
                .await?;
        }
        let mut ended = HashSet::new();
        while ended.len() < n {
            if let (name, s) = self.next_change(&set).await?
                && s.is_terminal()
            {
                ended.insert(name);
            }
        }
        Ok(ms)
    }

    /// SIGKILL of a running proc until its Killed push arrives.
    async fn exit_to_status(&mut self) -> anyhow::Result<f64> {
        self.round += 1;
        let name = format!("exit-{}", self.round);
        let set: HashSet<String> = [name.clone()].into();
        self.client
            .create_or_update(
                self.addr,
                CreateOrUpdate {
                    name: name.clone(),
                    rank: 0,
                    spec: plain(1),
                    incarnation: 0,
                },
            )
            .await?;
        let pid = loop {
            if let (_, ProcPhase::Ready { pid, .. }) = self.next_change(&set).await? {
                break pid;
            }
        };
        let pid = i32::try_from(pid)?;
        let t0 = Instant::now();
        // SAFETY: signalling a process this benchmark's agent started.
        if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
            anyhow::bail!("kill: {}", std::io::Error::last_os_error());
        }
        loop {
            if let (_, ProcPhase::Killed { .. }) = self.next_change(&set).await? {
                return Ok(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
