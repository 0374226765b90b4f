//! The agent process: start-up (configuration, secret, health endpoint, proc
//! manager), the wait for SIGTERM / SIGINT or a `ShutdownHost`, and the
//! graceful stop of every proc before exiting.
//!
//! Invariants:
//! 1. Nothing is spawned before the configuration and the secret are valid.
//! 2. On SIGTERM or SIGINT the agent stops its procs gracefully (TERM, grace,
//!    KILL, bounded concurrency) before it exits; a second signal skips the
//!    grace and kills them.
//! 3. The agent's proc is built with the World secret: the runtime handshake
//!    refuses (and logs) every peer that cannot prove it holds it, so such a
//!    peer can spawn nothing and read nothing. Procs hold only the runtime
//!    key derived from it (`keys.rs`) and check in at the agent's second
//!    proc, the desk (`desk.rs`), which serves nothing else.
//! 4. Once its fence trips (`fence.rs`: replaced, or no renewal from the
//!    operator for `--fence-timeout`), the agent stops every proc with the
//!    fence grace, reports not ready, and keeps serving so the operator
//!    learns why from its pushes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Notify;

use super::config::{AgentArgs, AgentConfig, read_secret};
use super::env::AgentIdentity;
use super::error::HostError;
use super::health::{self, Readiness};
use super::manager::ProcManager;
use super::server::{AGENT_PROC_NAME, HOST_AGENT_ACTOR, HostAgent};
use hostmesh_runtime::{ChannelAddr, Proc};

/// A running agent (embedded in tests and benchmarks; `run_agent` for the
/// binary).
pub struct Agent {
    config: AgentConfig,
    manager: ProcManager,
    proc: Proc,
    desk: Proc,
    addr: SocketAddr,
    readiness: Readiness,
    health_addr: SocketAddr,
    shutdown: Arc<Notify>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("proc", self.proc.id())
            .field("health", &self.health_addr)
            .finish_non_exhaustive()
    }
}

/// The World's shared secret; never printed.
#[derive(Clone)]
pub struct Secret(Arc<Vec<u8>>);

impl Secret {
    /// Wraps secret bytes.
    pub fn new(bytes: Vec<u8>) -> Self {
        Secret(Arc::new(bytes))
    }

    /// The secret bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Agent {
    /// Validates `config`, reads the secret and starts serving (invariant 1).
    pub async fn start(config: AgentConfig) -> Result<Agent, HostError> {
        let secret = match &config.secret {
            Some(s) => s.clone(),
            None => Secret::new(read_secret(&config.secret_file)?),
        };
        let runtime_key = super::keys::runtime_key(secret.bytes());
        // Invariant 3: every peer must prove it holds the World secret.
        // Fence invariant 5: the proc claims this host's epoch and checks
        // peers against the table the fence keeps.
        let peers = hostmesh_runtime::channel::epoch::EpochTable::default();
        let proc = host_proc(&config, config.listen, &peers).secret(secret.bytes().to_vec());
        let proc = proc.build().await.map_err(|e| {
            HostError::Runtime(format!(
                "cannot serve the agent protocol on {} (--listen / --pod-ip / --port): {e}",
                config.listen
            ))
        })?;
        let addr = match proc.id().addr() {
            ChannelAddr::Tcp(a) => *a,
            _ => config.listen,
        };
        // Desk invariant 2: the agent's IP, a port of the system's choice,
        // the same epoch claim and table.
        let issuer = hostmesh_runtime::Issuer::from_runtime_key(runtime_key.bytes());
        let desk =
            host_proc(&config, SocketAddr::new(addr.ip(), 0), &peers).issued_by(issuer.clone());
        let desk = desk.build().await.map_err(|e| {
            HostError::Runtime(format!("cannot serve the proc desk on {}: {e}", addr.ip()))
        })?;
        let desk_addr = match desk.id().addr() {
            ChannelAddr::Tcp(a) => *a,
            other => {
                return Err(HostError::Runtime(format!(
                    "the proc desk listens on {other}, not TCP"
                )));
            }
        };
        let identity = AgentIdentity {
            world: config.world.clone(),
            host_rank: config.host_rank,
            addr,
            desk: desk_addr,
            issuer: super::keys::IssuerCell::new(issuer),
        };
        let manager = ProcManager::with_std_output(identity, config.limits.clone())?;
        desk.spawn(
            HOST_AGENT_ACTOR,
            super::desk::ProcDesk::new(manager.clone()),
        )
        .await
        .map_err(|e| HostError::Runtime(format!("cannot start the proc desk actor: {e}")))?;
        manager.fence().share_peers(peers);
        manager.fence().configure(config.fence);
        let shutdown = Arc::new(Notify::new());
        let agent = proc
            .spawn(
                HOST_AGENT_ACTOR,
                HostAgent::new(
                    manager.clone(),
                    config.heartbeat_interval,
                    shutdown.clone(),
                    desk.clone(),
                ),
            )
            .await
            .map_err(|e| HostError::Runtime(format!("cannot start the host agent actor: {e}")))?;
        if let Some(sup) = &config.supervisor {
            super::supervisor::dial_supervisor(proc.clone(), agent, sup.clone());
        }
        let readiness = Readiness::default();
        if let Some(worker) = &config.monarch {
            super::monarch::start(&manager, worker, addr.ip(), readiness.clone())?;
        }
        let (health_addr, health) = health::serve(config.health, readiness.clone()).await?;
        tokio::spawn(health);
        readiness.set(true);
        // Invariant 4: a tripped fence stops every proc; the agent stays up
        // (not ready) to tell the operator why.
        {
            let (manager, readiness) = (manager.clone(), readiness.clone());
            let concurrency = config.limits.shutdown_concurrency;
            tokio::spawn(async move {
                manager.fence().watch().await;
                readiness.set(false);
                manager.fence_procs(concurrency).await;
                super::descendants::kill_all();
            });
        }
        tracing::info!(
            world = %config.world,
            host_rank = config.host_rank,
            listen = %addr,
            desk = %desk_addr,
            health = %health_addr,
            "hostmesh agent started"
        );
        Ok(Agent {
            config,
            manager,
            proc,
            desk,
            addr,
            readiness,
            health_addr,
            shutdown,
        })
    }

    /// The proc manager.
    pub fn manager(&self) -> &ProcManager {
        &self.manager
    }

    /// The validated configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// The agent's runtime address (the bound one when port 0 was asked).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The agent's proc.
    pub fn proc(&self) -> &Proc {
        &self.proc
    }

    /// The agent's proc desk (`desk.rs`): where runtime-aware procs
    /// check in, with a credential of the World's proc issuer.
    pub fn desk(&self) -> &Proc {
        &self.desk
    }

    /// The bound health endpoint.
    pub fn health_addr(&self) -> SocketAddr {
        self.health_addr
    }

    /// Asks the agent to exit (after `ShutdownHost` has stopped the procs).
    pub fn request_exit(&self) {
        self.shutdown.notify_one();
    }

    /// Runs until SIGTERM, SIGINT or [`Agent::request_exit`], then stops
    /// every proc (invariant 2).
    pub async fn run_until_stopped(self) -> Result<(), HostError> {
        let signals = Signals::new()?;
        self.run_with(signals).await
    }

    async fn run_with(self, signals: Signals) -> Result<(), HostError> {
        let Signals { mut term, mut int } = signals;
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: stopping procs"),
            _ = int.recv() => tracing::info!("SIGINT: stopping procs"),
            () = self.shutdown.notified() => tracing::info!("shutdown requested"),
        }
        self.readiness.set(false);
        let limits = &self.config.limits;
        let graceful = self
            .manager
            .shutdown(limits.stop_grace, limits.shutdown_concurrency);
        tokio::select! {
            () = graceful => {}
            _ = term.recv() => {
                tracing::warn!("second signal: killing procs without grace");
                self.manager.shutdown(Duration::ZERO, usize::MAX).await;
            }
            _ = int.recv() => {
                tracing::warn!("second signal: killing procs without grace");
                self.manager.shutdown(Duration::ZERO, usize::MAX).await;
            }
        }
        // Nothing the procs left survives the agent (in the `hostmesh
        // agent` process, which reaps its procs' orphans).
        super::descendants::kill_all();
        self.manager.close_output().await;
        self.desk.shutdown();
        self.proc.shutdown();
        tracing::info!("hostmesh agent stopped");
        Ok(())
    }
}

/// `hostmesh agent`: validates the arguments, starts the agent and runs it
/// until it is told to stop.
pub async fn run_agent(args: AgentArgs) -> Result<(), HostError> {
    let config = args.validate()?;
    // Watch signals before anything is spawned, so an early SIGTERM still
    // stops procs gracefully.
    let signals = Signals::new()?;
    // What the procs start stays below the agent, setsid daemons included
    // (`descendants.rs`).
    super::descendants::become_subreaper()
        .map_err(|e| HostError::io("cannot become the procs' child subreaper", e))?;
    let agent = Agent::start(config).await?;
    agent.run_with(signals).await
}

/// Most threads of the runtime's blocking pool (file reads, stack
/// captures): bounded like the workers, whatever the node's size.
const MAX_BLOCKING_THREADS: usize = 16;

/// A proc of this host named `agent` listening at `listen`, checking peers
/// against `peers` and claiming the host's epoch when it has one (fence
/// invariant 5): the agent's own proc (keyed with the World secret) and
/// its desk (with a credential of the World's issuer).
fn host_proc(
    config: &AgentConfig,
    listen: SocketAddr,
    peers: &hostmesh_runtime::channel::epoch::EpochTable,
) -> hostmesh_runtime::ProcBuilder {
    let builder = Proc::builder(AGENT_PROC_NAME)
        .listen(ChannelAddr::Tcp(listen))
        .epoch_table(peers.clone());
    if config.fence.epoch == 0 {
        return builder;
    }
    builder.epoch(hostmesh_runtime::channel::epoch::EpochClaim {
        rank: config.host_rank,
        epoch: config.fence.epoch,
    })
}

/// Logs of a process of this crate (`hostmesh agent`, `hostmesh
/// echo-proc`) go to stderr, filtered by `RUST_LOG`, else `info`.
pub(crate) fn log_to_stderr() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
}

/// `hostmesh agent` as a process: logs to stderr (`RUST_LOG`, else
/// `info`; stdout carries the procs' output), then runs the agent on a
/// runtime of `--worker-threads` workers until it is told to stop.
pub fn run_blocking(mut args: AgentArgs) -> Result<(), HostError> {
    // Keys invariants 2 and 3: before any thread starts, the secret leaves
    // the environment, and the process stops being dumpable.
    args.secret = super::keys::take_env_secret()?;
    super::keys::become_undumpable()
        .map_err(|e| HostError::io("cannot make the agent non-dumpable", e))?;
    log_to_stderr();
    if args.worker_threads == 0 {
        return Err(HostError::config(
            "--worker-threads (HOSTMESH_WORKER_THREADS)",
            "must be at least 1".to_owned(),
        ));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.worker_threads)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .enable_all()
        .thread_name("hostmesh-agent")
        .build()
        .map_err(|e| HostError::io("cannot start the tokio runtime", e))?;
    rt.block_on(run_agent(args))
}

struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self, HostError> {
        Ok(Signals {
            term: signal(SignalKind::terminate())
                .map_err(|e| HostError::io("cannot watch SIGTERM", e))?,
            int: signal(SignalKind::interrupt())
                .map_err(|e| HostError::io("cannot watch SIGINT", e))?,
        })
    }
}
