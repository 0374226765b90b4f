//! A small runtime-aware proc, the starting point for programs that join a
//! hostmesh World: it checks in with its host agent (which makes it Ready),
//! offers the [`Echo`] actor type for remote spawn, and exits 0 on SIGTERM.
//!
//! Start it through a ProcMesh with `spec.runtimeAware: true` (or
//! `ProcSpec::runtime_aware`); the agent gives it the environment it needs
//! (`HOSTMESH_PROC_NAME`, `HOSTMESH_AGENT_ADDR`, `HOSTMESH_RUNTIME_KEY`,
//! `RANK`, ...). Spawn an `Echo` on it with `hostmesh_agent::SpawnFor`
//! sent to its `mesh` actor, then `call` it with a `String`.

use hostmesh_agent::{JoinedProc, join_host};
use hostmesh_runtime::{Actor, ActorError, Context, Handler, Handlers, RemoteSpawn};
use tokio::signal::unix::{SignalKind, signal};

/// Answers every `String` with `<RANK>:<string>`; a [`Fail`] makes it fail,
/// to see supervision at work (the failure reaches the agent, and a
/// ProcMesh's `status.actorFailures`).
#[derive(Debug)]
pub struct Echo {
    rank: String,
}

impl Actor for Echo {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<String>().handle::<Fail>();
    }
}

/// Makes the [`Echo`] fail with this reason.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Fail(pub String);

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
pub async fn run() -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
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
