//! `hostmesh echo-proc`: a small runtime-aware proc that every host pod can
//! run (it is in the agent binary the pod already has), to check a World's
//! runtime end to end and as the starting point for programs that join a
//! hostmesh World: it checks in with its host agent (which makes it Ready),
//! offers the [`Echo`] actor type for remote spawn, and exits 0 on SIGTERM.
//!
//! Start it through a ProcMesh with `spec.runtimeAware: true` and `command:
//! [/hostmesh/bin/hostmesh, echo-proc]` (or `ProcSpec::runtime_aware`); the
//! agent gives it the environment it needs
//! (`HOSTMESH_PROC_NAME`, `HOSTMESH_AGENT_ADDR`, `HOSTMESH_PROC_CREDENTIAL`,
//! `RANK`, ...). Spawn an `Echo` on it with `hostmesh_agent::SpawnFor`
//! sent to its `mesh` actor, then `call` it with a `String`.

use super::error::HostError;
use super::proc_agent::{JoinedProc, join_host};
use hostmesh_runtime::{Actor, ActorError, Context, Handler, Handlers, RemoteSpawn};
use tokio::signal::unix::{SignalKind, signal};

/// Answers every `String` with `<RANK>:<string>`; an [`Exit`] ends its
/// proc; a [`Fail`] makes it fail,
/// to see supervision at work (the failure reaches the agent, and a
/// ProcMesh's `status.actorFailures`).
#[derive(Debug)]
pub struct Echo {
    rank: String,
}

impl Actor for Echo {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<String>().handle::<Fail>().handle::<Exit>();
    }
}

/// Makes the [`Echo`] fail with this reason.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Fail(pub String);

/// Makes the whole proc exit with this code, at once: to see a proc's end
/// reach the ProcMesh's status and its clients without a shell on the
/// host.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Exit(pub i32);

impl Handler<Exit> for Echo {
    type Reply = ();
    async fn handle(&mut self, _cx: &Context<Self>, m: Exit) -> Result<(), ActorError> {
        tracing::warn!(code = m.0, "exiting as asked");
        std::process::exit(m.0);
    }
}

impl Handler<Fail> for Echo {
    type Reply = ();
    async fn handle(&mut self, _cx: &Context<Self>, m: Fail) -> Result<(), ActorError> {
        Err(ActorError::new(m.0))
    }
}

impl Handler<String> for Echo {
    type Reply = String;
    async fn handle(&mut self, _cx: &Context<Self>, s: String) -> Result<String, ActorError> {
        Ok(format!("{}:{s}", self.rank))
    }
}

impl RemoteSpawn for Echo {
    type Params = ();
    async fn new(_params: ()) -> Result<Self, ActorError> {
        Ok(Echo {
            rank: std::env::var("RANK").unwrap_or_default(),
        })
    }
}

/// The registered type name of [`Echo`] (what `SpawnFor::type_name` takes).
pub fn echo_type_name() -> &'static str {
    std::any::type_name::<Echo>()
}

/// Joins the host with [`Echo`] registered and runs until SIGTERM or
/// SIGINT.
pub async fn run() -> Result<(), HostError> {
    let mut term =
        signal(SignalKind::terminate()).map_err(|e| HostError::io("cannot watch SIGTERM", e))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|e| HostError::io("cannot watch SIGINT", e))?;
    let joined: JoinedProc = join_host(|b| b.register::<Echo>()).await?;
    tracing::info!(proc = %joined.proc.id(), "echo proc ready");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("echo proc stopping");
    joined.proc.shutdown();
    Ok(())
}

/// `hostmesh echo-proc` as a process: logs to stderr, two runtime workers.
pub fn run_blocking() -> Result<(), HostError> {
    super::agent::log_to_stderr();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| HostError::io("cannot start the tokio runtime", e))?
        .block_on(run())
}
