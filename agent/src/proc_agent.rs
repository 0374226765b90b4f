//! The proc side of a runtime-aware proc: joining the host (check-in with
//! the agent, which makes the proc Ready) and the `mesh` actor that spawns
//! actors by registered type for a controlling client, answers actor state
//! queries, and stops a client's actors when its keepalive lapses (the
//! reference's orphan timeout).
//!
//! Invariants:
//! 1. A proc checks in only after its listener and its `mesh` actor run, so
//!    Ready means "can take actor requests".
//! 2. Every actor spawned through `mesh` belongs to exactly one client; when
//!    no `Keepalive` from that client arrived for the keepalive it asked
//!    for, all of its actors are stopped (status `Stopped`, reason names the
//!    lapse).
//! 3. Actor states are kept after the actor ends, so a late query still
//!    learns how it ended.
//! 4. A tracked actor that fails is reported to the host agent
//!    ([`ActorFailed`]), which puts it in the proc's state and pushes it to
//!    the operator; the report is best effort and never blocks the
//!    forwarding of the event to the actor's owner.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::desk::{ProcDesk, desk_ref};
use super::env::PROC_CREDENTIAL_VAR;
use super::error::HostError;
use super::protocol::{ActorFailed, CheckIn};
use hostmesh_runtime::{
    Actor, ActorError, ActorId, ActorRef, ActorStatus, ChannelAddr, Context, Handler, Handlers,
    PortRef, Proc, ProcBuilder, SupervisionEvent,
};

/// Name of the actor that manages a runtime-aware proc's actors.
pub const MESH_ACTOR: &str = "mesh";

/// How often keepalives are checked.
const KEEPALIVE_CHECK: Duration = Duration::from_millis(100);

/// Spawn an actor of a registered type on behalf of `client`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpawnFor {
    /// Registered type name (`std::any::type_name` of the actor type).
    pub type_name: String,
    /// Actor name (it gets index 0).
    pub name: String,
    /// Postcard-encoded parameters.
    pub params: Vec<u8>,
    /// The controlling client (any stable id, e.g. its proc id).
    pub client: String,
    /// The client's keepalive period bound, in milliseconds: without a
    /// `Keepalive` for this long, the client's actors stop.
    pub keepalive_ms: u64,
    /// Where the actor's supervision events are forwarded, if anywhere.
    pub owner: Option<PortRef<SupervisionEvent>>,
}

/// The controlling client is alive.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Keepalive {
    /// The client id used in [`SpawnFor`].
    pub client: String,
}

/// Ask for an actor's state by name.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GetActorState {
    /// The actor name.
    pub name: String,
}

/// An actor's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorState {
    /// The actor's id.
    pub actor: ActorId,
    /// Whether the actor runs, stopped or failed (with the reason).
    pub status: ActorStatus,
    /// Its controlling client.
    pub client: String,
}

struct Tracked {
    state: ActorState,
    owner: Option<PortRef<SupervisionEvent>>,
}

#[derive(Default)]
struct Book {
    actors: HashMap<String, Tracked>,
    clients: HashMap<String, (Instant, Duration)>,
}

/// The `mesh` actor of a runtime-aware proc.
pub struct MeshAgent {
    book: Arc<Mutex<Book>>,
    events: Option<PortRef<SupervisionEvent>>,
    /// The host agent and this proc's name there: failed actors are
    /// reported to it (invariant 4).
    host: Option<(ActorRef<ProcDesk>, String)>,
}

impl MeshAgent {
    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Actor for MeshAgent {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<SpawnFor>()
            .handle::<Keepalive>()
            .handle::<GetActorState>();
    }

    async fn init(&mut self, cx: &Context<Self>) -> Result<(), ActorError> {
        let (port, mut rx) = cx.open_port::<SupervisionEvent>();
        self.events = Some(port);
        let book = self.book.clone();
        let proc = cx.proc_ref().clone();
        let host = self.host.clone();
        // Supervision events of tracked actors: record, report a failure,
        // then forward.
        tokio::spawn({
            let book = book.clone();
            let proc = proc.clone();
            async move {
                while let Ok(ev) = rx.recv().await {
                    if let (ActorStatus::Failed(reason), Some((agent, name))) = (&ev.status, &host)
                    {
                        let report = ActorFailed {
                            name: name.clone(),
                            actor: ev.actor.to_string(),
                            reason: reason.clone(),
                        };
                        if let Err(e) = agent.send(&proc, &report).await {
                            tracing::warn!(actor = %ev.actor, error = %e, "cannot report an actor failure to the agent");
                        }
                    }
                    let owner = {
                        let mut b = book.lock().unwrap_or_else(|p| p.into_inner());
                        match b.actors.get_mut(ev.actor.name()) {
                            Some(t) if t.state.actor == ev.actor => {
                                t.state.status = ev.status.clone();
                                t.owner.clone()
                            }
                            _ => None,
                        }
                    };
                    if let Some(o) = owner {
                        let _ = o.send(&proc, &ev).await;
                    }
                }
            }
        });
        // Invariant 2: the keepalive watchdog.
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(KEEPALIVE_CHECK);
            loop {
                tick.tick().await;
                let now = Instant::now();
                let lapsed: Vec<(ActorId, String)> = {
                    let mut b = book.lock().unwrap_or_else(|p| p.into_inner());
                    let dead: Vec<String> = b
                        .clients
                        .iter()
                        .filter(|(_, (seen, within))| now.duration_since(*seen) > *within)
                        .map(|(c, _)| c.clone())
                        .collect();
                    for c in &dead {
                        b.clients.remove(c);
                    }
                    b.actors
                        .values()
                        .filter(|t| {
                            dead.contains(&t.state.client) && t.state.status == ActorStatus::Running
                        })
                        .map(|t| (t.state.actor.clone(), t.state.client.clone()))
                        .collect()
                };
                for (actor, client) in lapsed {
                    tracing::warn!(%actor, %client, "controller keepalive lapsed; stopping actor");
                    proc.stop_actor(&actor, format!("keepalive from controller {client} lapsed"))
                        .await;
                }
            }
        });
        Ok(())
    }
}

impl Handler<SpawnFor> for MeshAgent {
    type Reply = Result<ActorId, String>;
    async fn handle(&mut self, cx: &Context<Self>, m: SpawnFor) -> Result<Self::Reply, ActorError> {
        let proc = cx.proc_ref();
        if !proc.is_registered(&m.type_name) {
            return Ok(Err(format!(
                "actor type {} is not registered on proc {}",
                m.type_name,
                proc.id()
            )));
        }
        if m.keepalive_ms == 0 {
            return Ok(Err("keepalive_ms must be at least 1".into()));
        }
        {
            let mut b = self.book();
            if b.actors
                .get(&m.name)
                .is_some_and(|t| t.state.status == ActorStatus::Running)
            {
                return Ok(Err(format!(
                    "an actor named {:?} already runs here",
                    m.name
                )));
            }
            b.clients.insert(
                m.client.clone(),
                (Instant::now(), Duration::from_millis(m.keepalive_ms)),
            );
        }
        let spawned = proc
            .spawn_registered(
                &m.type_name,
                m.name.clone(),
                m.params.into(),
                self.events.clone(),
            )
            .await;
        let id = match spawned {
            Some(Ok(id)) => id,
            Some(Err(e)) => return Ok(Err(e.to_string())),
            None => return Ok(Err(format!("actor type {} is not registered", m.type_name))),
        };
        self.book().actors.insert(
            m.name,
            Tracked {
                state: ActorState {
                    actor: id.clone(),
                    status: ActorStatus::Running,
                    client: m.client,
                },
                owner: m.owner,
            },
        );
        Ok(Ok(id))
    }
}

impl Handler<Keepalive> for MeshAgent {
    type Reply = ();
    async fn handle(&mut self, _cx: &Context<Self>, m: Keepalive) -> Result<(), ActorError> {
        if let Some((seen, _)) = self.book().clients.get_mut(&m.client) {
            *seen = Instant::now();
        }
        Ok(())
    }
}

impl Handler<GetActorState> for MeshAgent {
    type Reply = Result<ActorState, String>;
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        m: GetActorState,
    ) -> Result<Self::Reply, ActorError> {
        Ok(self
            .book()
            .actors
            .get(&m.name)
            .map(|t| t.state.clone())
            .ok_or_else(|| format!("no actor named {:?} on this proc", m.name)))
    }
}

/// A runtime-aware proc that joined its host.
#[derive(Clone)]
pub struct JoinedProc {
    /// The proc (register actor types before joining).
    pub proc: Proc,
    /// Its `mesh` actor.
    pub mesh: ActorRef<MeshAgent>,
    /// Its host agent's proc desk (where it checked in).
    pub agent: ActorRef<ProcDesk>,
    /// Its proc name (`HOSTMESH_PROC_NAME`).
    pub name: String,
}

impl std::fmt::Debug for JoinedProc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinedProc")
            .field("proc", self.proc.id())
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The `mesh` actor of the proc at `proc`.
pub fn mesh_ref(
    proc: &hostmesh_runtime::ProcId,
) -> Result<ActorRef<MeshAgent>, hostmesh_runtime::id::IdError> {
    Ok(ActorRef::attest(proc.actor(MESH_ACTOR, 0)?))
}

fn env(name: &'static str) -> Result<String, HostError> {
    std::env::var(name).map_err(|_| {
        HostError::config(
            name,
            "not set: a runtime-aware proc must be started by the hostmesh agent",
        )
    })
}

/// Joins the host this proc was started on, from the proc environment
/// (`HOSTMESH_PROC_NAME`, `HOSTMESH_AGENT_ADDR`: the agent's proc desk,
/// `HOSTMESH_PROC_CREDENTIAL`: this proc's own credential, and
/// `HOSTMESH_RANK_EPOCH(S)` when the host has an epoch):
/// builds the proc with `configure` (register actor types there), listening
/// on the agent's IP, starts the `mesh` actor and checks in (invariant 1).
pub async fn join_host(
    configure: impl FnOnce(ProcBuilder) -> ProcBuilder,
) -> Result<JoinedProc, HostError> {
    let name = env("HOSTMESH_PROC_NAME")?;
    let agent_addr: SocketAddr = env("HOSTMESH_AGENT_ADDR")?.parse().map_err(|e| {
        HostError::config(
            "HOSTMESH_AGENT_ADDR",
            format!("not an ip:port address ({e})"),
        )
    })?;
    let credential = hostmesh_runtime::Credential::from_text(&env(PROC_CREDENTIAL_VAR)?)
        .map_err(|e| HostError::config(PROC_CREDENTIAL_VAR, e.to_string()))?;
    let listen = SocketAddr::new(agent_addr.ip(), 0);
    let mut builder = Proc::builder(name.clone())
        .listen(ChannelAddr::Tcp(listen))
        .credential(credential);
    // The host copy's epoch: peers that know a newer one refuse this proc,
    // and it refuses peers older than the epochs known at its start.
    let epochs = super::fence::proc_epochs(
        std::env::var(super::fence::RANK_EPOCH_ENV).ok().as_deref(),
        std::env::var(super::fence::RANK_EPOCHS_ENV).ok().as_deref(),
    )?;
    if let Some((claim, table)) = epochs {
        builder = builder.epoch(claim).epoch_table(table);
    }
    let proc = configure(builder)
        .build()
        .await
        .map_err(|e| HostError::Runtime(format!("cannot start the proc: {e}")))?;
    let agent = desk_ref(agent_addr).map_err(|e| HostError::Runtime(e.to_string()))?;
    let mesh = proc
        .spawn(
            MESH_ACTOR,
            MeshAgent {
                book: Arc::default(),
                events: None,
                host: Some((agent.clone(), name.clone())),
            },
        )
        .await
        .map_err(|e| HostError::Runtime(format!("cannot start the mesh actor: {e}")))?;
    let check_in = CheckIn {
        name: name.clone(),
        addr: proc.id().addr().to_string(),
    };
    agent
        .call(&proc, &check_in, Duration::from_secs(30))
        .await
        .map_err(|e| {
            HostError::Runtime(format!(
                "cannot check in with the agent at {agent_addr}: {e}"
            ))
        })?
        .map_err(|e| {
            HostError::Runtime(format!(
                "the agent at {agent_addr} refused the check-in: {e}"
            ))
        })?;
    tracing::info!(proc = %proc.id(), "joined the host");
    Ok(JoinedProc {
        proc,
        mesh,
        agent,
        name,
    })
}
