//! The `--simulate` mode's simulated kubelets as a fleet of shards: shard
//! 0 in the benchmark's own process, the others child processes (this
//! binary again, with [`SHARD_ENV`] set), each serving the host ranks of
//! its shard ([`Shard`]). One process holds two file descriptors per
//! agent, so 10,000 agents do not fit one process's limit on a machine
//! that caps it at 20,000.
//!
//! A child reads the API server's kubeconfig, serves its shard, answers
//! kill commands on stdin one line each (`agent <rank>`, `proc <host>
//! <rank>`; `ok` or `error <why>` back) and stops when its stdin closes.

use std::io::{BufRead as _, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;

use super::sim::{Shard, SimKubelet};
use super::sim_agent::SimCounters;

/// Set in a shard's process: `<index>/<count> <namespace> <kubeconfig>`.
pub(crate) const SHARD_ENV: &str = "HOSTMESH_BENCH_SIM_SHARD";

/// Hosts one process serves at most (2 descriptors each, under 20,000).
pub(crate) const HOSTS_PER_PROCESS: usize = 4_000;

/// A child process serving one shard.
struct ShardChild {
    child: Child,
    io: Mutex<(ChildStdin, std::io::BufReader<ChildStdout>)>,
}

impl Drop for ShardChild {
    fn drop(&mut self) {
        // Closing stdin stops it; wait so its agents are gone.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ShardChild {
    /// Sends one command and reads its answer.
    fn ask(&self, line: &str) -> anyhow::Result<()> {
        let mut io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        writeln!(io.0, "{line}")?;
        io.0.flush()?;
        let mut answer = String::new();
        io.1.read_line(&mut answer)?;
        match answer.trim() {
            "ok" => Ok(()),
            other => anyhow::bail!("shard: {line}: {other}"),
        }
    }
}

/// Every shard of the simulated fleet.
pub(crate) struct SimFleet {
    local: SimKubelet,
    children: Vec<ShardChild>,
}

impl SimFleet {
    /// Starts `shards` shards (default: enough for `hosts` hosts): this
    /// process's, then the children, each once its kubelet runs.
    pub(crate) async fn start(
        client: kube::Client,
        kubeconfig: &Path,
        namespace: &str,
        counters: Arc<SimCounters>,
        hosts: usize,
        shards: Option<usize>,
    ) -> anyhow::Result<SimFleet> {
        let count = shards.unwrap_or(hosts.div_ceil(HOSTS_PER_PROCESS)).max(1);
        let local =
            SimKubelet::start(client, namespace, counters, Shard { index: 0, count }).await?;
        let mut children = Vec::new();
        for index in 1..count {
            let mut child = Command::new(std::env::current_exe()?)
                .arg("scale")
                .env(
                    SHARD_ENV,
                    format!("{index}/{count} {namespace} {}", kubeconfig.display()),
                )
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .context("starting a simulated kubelet shard")?;
            let stdin = child.stdin.take().context("shard stdin")?;
            let mut stdout = std::io::BufReader::new(child.stdout.take().context("shard stdout")?);
            let mut line = String::new();
            stdout.read_line(&mut line)?;
            anyhow::ensure!(
                line.trim() == "READY",
                "shard {index} did not start: {line:?}"
            );
            children.push(ShardChild {
                child,
                io: Mutex::new((stdin, stdout)),
            });
        }
        Ok(SimFleet { local, children })
    }

    /// Agents this process's shard runs (its counters count theirs).
    pub(crate) fn local_agents(&self) -> usize {
        self.local.agents()
    }

    fn shard_of(&self, rank: usize) -> Option<&ShardChild> {
        match rank % (self.children.len() + 1) {
            0 => None,
            i => self.children.get(i - 1),
        }
    }

    /// [`SimKubelet::kill_agent`] on the shard of host `rank`.
    pub(crate) async fn kill_agent(&self, rank: usize) -> anyhow::Result<()> {
        match self.shard_of(rank) {
            None => self.local.kill_agent(rank).await,
            Some(c) => c.ask(&format!("agent {rank}")),
        }
    }

    /// [`SimKubelet::kill_proc`] on the shard of `host`.
    pub(crate) fn kill_proc(&self, host: usize, rank: usize) -> anyhow::Result<()> {
        match self.shard_of(host) {
            None => self.local.kill_proc(host, rank),
            Some(c) => c.ask(&format!("proc {host} {rank}")),
        }
    }
}

/// One line to the parent (stdout carries only the protocol).
fn say(line: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}

/// A shard's process: serves the shard [`SHARD_ENV`] names until stdin
/// closes.
pub(crate) fn serve(spec: &str) -> anyhow::Result<()> {
    let mut words = spec.split_whitespace();
    let (index, count) = words
        .next()
        .and_then(|s| s.split_once('/'))
        .context("shard spec: no <index>/<count>")?;
    let shard = Shard {
        index: index.parse()?,
        count: count.parse()?,
    };
    let namespace = words
        .next()
        .context("shard spec: no namespace")?
        .to_string();
    let kubeconfig = words
        .next()
        .context("shard spec: no kubeconfig")?
        .to_string();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let client = hostmesh_e2e::client_for(Path::new(&kubeconfig)).await?;
        let sim = SimKubelet::start(client, &namespace, Arc::default(), shard).await?;
        say("READY")?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(16);
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.blocking_send(line).is_err() {
                    break;
                }
            }
        });
        while let Some(line) = rx.recv().await {
            let words: Vec<&str> = line.split_whitespace().collect();
            let done = match words.as_slice() {
                ["agent", rank] => match rank.parse() {
                    Ok(r) => sim.kill_agent(r).await,
                    Err(e) => Err(anyhow::anyhow!("rank {rank}: {e}")),
                },
                ["proc", host, rank] => match (host.parse(), rank.parse()) {
                    (Ok(h), Ok(r)) => sim.kill_proc(h, r),
                    _ => Err(anyhow::anyhow!("host and rank must be numbers")),
                },
                _ => Err(anyhow::anyhow!("unknown command {line:?}")),
            };
            match done {
                Ok(()) => say("ok")?,
                Err(e) => say(&format!("error {e:#}"))?,
            }
        }
        drop(sim);
        anyhow::Ok(())
    })
}
