//! Suite `agent`: how fast the host agent turns `CreateOrUpdate` into Ready
//! procs, against bare fork/exec of the same commands in the same run, and
//! how fast a proc's death reaches a subscriber.
//!
//! Figures (median of several rounds):
//! - `spawn_ready_8_plain`, `spawn_ready_64_plain` (ms, baseline: bare
//!   spawn of the same `sleep` commands);
//! - `exit_to_status_ms` (ms from SIGKILL of a proc to its Killed state
//!   change arriving at a subscriber).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hostmesh_runtime::host::protocol::{CreateOrUpdate, Dim, ProcSpec, ProcStatus};
use hostmesh_runtime::host::{AgentIdentity, Limits, LogHub, ProcManager};

use crate::report::emit;

const ROUNDS: usize = 5;

/// Runs the suite.
pub(crate) fn run() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(suite())
}

async fn suite() -> anyhow::Result<()> {
    let manager = manager()?;
    let mut round = 0usize;
    for n in [8usize, 64] {
        let mut agent = Vec::new();
        let mut bare = Vec::new();
        for _ in 0..ROUNDS {
            bare.push(bare_spawn(n)?);
            round += 1;
            agent.push(agent_spawn(&manager, n, round).await?);
        }
        emit(
            &format!("spawn_ready_{n}_plain"),
            median(&mut agent),
            "ms",
            Some(median(&mut bare)),
        );
    }
    let mut exits = Vec::new();
    for i in 0..10 {
        exits.push(exit_to_status(&manager, i).await?);
    }
    emit("exit_to_status_ms", median(&mut exits), "ms", None);
    manager.shutdown(Duration::from_secs(5), 64).await;
    Ok(())
}

fn manager() -> anyhow::Result<ProcManager> {
    let limits = Limits::default();
    let out = LogHub::start("bench-out", 1024, Box::new(std::io::sink()))?;
    let err = LogHub::start("bench-err", 1024, Box::new(std::io::sink()))?;
    let identity = AgentIdentity {
        world: "bench".into(),
        host_rank: 0,
        addr: "127.0.0.1:26600".parse()?,
        secret_file: "/dev/null".into(),
    };
    Ok(ProcManager::new(identity, limits, out, err)?)
}

fn spec(n: usize) -> ProcSpec {
    let mut spec = ProcSpec::command("sleep", &["60"]);
    spec.proc_mesh = "bench".into();
    spec.extent = vec![Dim::new("host", 1), Dim::new("proc", n)];
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

/// `CreateOrUpdate` of `n` procs until all are Ready, then stops them.
async fn agent_spawn(m: &ProcManager, n: usize, round: usize) -> anyhow::Result<f64> {
    let mut events = m.subscribe();
    let names: Vec<String> = (0..n).map(|r| format!("b{round}-{r}")).collect();
    let t0 = Instant::now();
    for (rank, name) in names.iter().enumerate() {
        m.create_or_update(CreateOrUpdate {
            name: name.clone(),
            rank,
            spec: spec(n),
            incarnation: 0,
        })?;
    }
    let mut ready = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while ready < n {
        let ev = tokio::time::timeout_at(deadline, events.recv())
            .await
            .context("procs never became Ready")??;
        if names.contains(&ev.state.name) {
            match ev.state.status {
                ProcStatus::Ready { .. } => ready += 1,
                s if s.is_terminal() => anyhow::bail!("proc {} ended: {s:?}", ev.state.name),
                _ => {}
            }
        }
    }
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    futures_join_stop(m, &names).await;
    Ok(ms)
}

async fn futures_join_stop(m: &ProcManager, names: &[String]) {
    let mut tasks = tokio::task::JoinSet::new();
    for name in names {
        let m = m.clone();
        let name = name.clone();
        tasks.spawn(async move { m.stop(&name, Duration::from_secs(5)).await });
    }
    while tasks.join_next().await.is_some() {}
}

/// SIGKILL of a running proc until its Killed change reaches a subscriber.
async fn exit_to_status(m: &ProcManager, i: usize) -> anyhow::Result<f64> {
    let name = format!("exit-{i}");
    let mut events = m.subscribe();
    m.create_or_update(CreateOrUpdate {
        name: name.clone(),
        rank: 0,
        spec: spec(1),
        incarnation: 0,
    })?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let pid = loop {
        let ev = tokio::time::timeout_at(deadline, events.recv())
            .await
            .context("proc never became Ready")??;
        if let (true, ProcStatus::Ready { pid, .. }) = (ev.state.name == name, &ev.state.status) {
            break *pid;
        }
    };
    let t0 = Instant::now();
    let pid = i32::try_from(pid)?;
    // SAFETY: signalling a process this benchmark started.
    if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
        anyhow::bail!("kill: {}", std::io::Error::last_os_error());
    }
    loop {
        let ev = tokio::time::timeout_at(deadline, events.recv())
            .await
            .context("no state change after SIGKILL")??;
        if ev.state.name == name && matches!(ev.state.status, ProcStatus::Killed { .. }) {
            return Ok(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
