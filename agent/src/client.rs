//! The supervisor side of the agent protocol: [`AgentClient`], one client
//! proc that talks to many agents of one World (one secret), sends them
//! requests, and delivers every agent's pushes, tagged with the host, into
//! one channel.
//!
//! Invariants:
//! 1. Every watched host has one task that subscribes, forwards pushes, and
//!    on silence (no push for `heartbeat_timeout`) or a failed subscribe
//!    reports `Disconnected` once and resubscribes with exponential backoff.
//!    Each (re)subscription starts with a full `Snapshot`, so nothing is
//!    lost across an outage on either side. [`AgentClient::resync`] asks a
//!    connected watch to subscribe again over the same port (the agent
//!    replaces the old subscription): a fresh `Snapshot`, no `Disconnected`.
//! 2. Requests are calls with `call_timeout`; a call never waits forever.
//! 3. Dropping the last clone of a client stops its watches and shuts its
//!    proc down, so agents see the supervisor go.
//! 4. In listening mode, agents that dial the supervisor themselves
//!    (`--supervisor`) push to the `supervisor` actor; their pushes reach the
//!    same channel.

use hostmesh_mesh::Rank;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::protocol::{
    AgentPush, CaptureStacks, CreateOrUpdate, CreateOutcome, GetRankStatus, GetState,
    PatchAddressBook, ProcReport, ProcStacks, RankReport, Rekey, SetAddressBook, ShutdownHost,
    Stop, Subscribe, duration_ms,
};
use super::server::{AGENT_PROC_NAME, HOST_AGENT_ACTOR, HostAgent};
use hostmesh_runtime::{
    Actor, ActorError, ActorRef, ChannelAddr, Context, Handler, Handlers, Proc, ProcId,
};

/// Name of the actor that receives pushes from agents that dial in.
pub const SUPERVISOR_ACTOR: &str = "supervisor";

/// One agent: its host rank and address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostId {
    /// Host rank.
    pub rank: Rank,
    /// Agent address (pod IP and World port).
    pub addr: SocketAddr,
}

/// Something that happened with one agent.
#[derive(Debug, Clone)]
pub struct AgentEvent {
    /// Which agent.
    pub host: HostId,
    /// What happened.
    pub kind: AgentEventKind,
}

/// The kinds of [`AgentEvent`].
// Pushes are nearly every event and each is moved once through a channel:
// boxing the large variant would allocate for almost every event, for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum AgentEventKind {
    /// Subscribed (a `Snapshot` push follows).
    Connected,
    /// A push from the agent.
    Push(AgentPush),
    /// The subscription is gone (reported once per outage); the client
    /// keeps retrying.
    Disconnected {
        /// Why.
        reason: String,
    },
}

/// Errors of [`AgentClient`] requests.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The request did not reach the agent or got no answer.
    #[error("agent {addr}: {source}")]
    Call {
        /// The agent.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: hostmesh_runtime::RuntimeError,
    },
    /// The agent refused the request.
    #[error("agent {addr} refused: {message}")]
    Refused {
        /// The agent.
        addr: SocketAddr,
        /// Its reason.
        message: String,
    },
    /// The client proc could not start.
    #[error("cannot start the agent client: {0}")]
    Start(#[source] hostmesh_runtime::RuntimeError),
}

/// Tunables of [`AgentClient`].
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Longest wait for an agent's answer.
    pub call_timeout: Duration,
    /// Silence after which a subscription counts as lost (a few heartbeat
    /// intervals).
    pub heartbeat_timeout: Duration,
    /// First retry delay after a failure.
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Listen here for agents that dial the supervisor themselves.
    pub listen: Option<SocketAddr>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            call_timeout: Duration::from_secs(10),
            heartbeat_timeout: Duration::from_secs(5),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            listen: None,
        }
    }
}

struct Watch {
    addr: SocketAddr,
    cancel: CancellationToken,
    /// Asks the watch for a fresh snapshot ([`AgentClient::resync`]).
    resync: Arc<tokio::sync::Notify>,
}

struct Inner {
    proc: Proc,
    config: ClientConfig,
    events: mpsc::Sender<AgentEvent>,
    watches: Mutex<HashMap<usize, Watch>>,
}

/// A client of many agents of one World. Cheap to clone.
#[derive(Clone)]
pub struct AgentClient {
    inner: Arc<Inner>,
    _guard: Arc<Guard>,
}

/// Shared by the clones of one client (not by its watch tasks): when the
/// last clone goes, the watches stop and the proc shuts down.
struct Guard(Arc<Inner>);

impl Drop for Guard {
    fn drop(&mut self) {
        for w in self
            .0
            .watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            w.cancel.cancel();
        }
        self.0.proc.shutdown();
    }
}

impl std::fmt::Debug for AgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentClient")
            .field("proc", self.inner.proc.id())
            .finish_non_exhaustive()
    }
}

impl AgentClient {
    /// Starts a client proc named `name`, authenticated with the World's
    /// `secret`; events of every watched agent go to `events`. A client
    /// that does not listen has an `unbound:<random>` address, so a
    /// restarted client is a new peer to the agents; a listening client
    /// restarted at the same address is the same peer, and its new
    /// connections replace the old ones on the agents' side (channel
    /// invariant 2).
    pub async fn new(
        name: &str,
        secret: &[u8],
        config: ClientConfig,
        events: mpsc::Sender<AgentEvent>,
    ) -> Result<Self, ClientError> {
        Self::rotating(name, secret, None, config, events).await
    }

    /// Like [`AgentClient::new`], while the World's secret is rotated: it
    /// also dials agents that still hold the `previous` secret (runtime
    /// handshake invariant 9), so it reaches every agent whether or not
    /// it took the new secret yet.
    pub async fn rotating(
        name: &str,
        secret: &[u8],
        previous: Option<&[u8]>,
        config: ClientConfig,
        events: mpsc::Sender<AgentEvent>,
    ) -> Result<Self, ClientError> {
        let mut builder = Proc::builder(name).secret(secret.to_vec());
        if let Some(p) = previous {
            builder = builder.previous_secret(p.to_vec());
        }
        if let Some(addr) = config.listen {
            builder = builder.listen(ChannelAddr::Tcp(addr));
        }
        let proc = builder.build().await.map_err(ClientError::Start)?;
        if config.listen.is_some() {
            proc.spawn(
                SUPERVISOR_ACTOR,
                SupervisorInbox {
                    events: events.clone(),
                    addrs: HashMap::new(),
                },
            )
            .await
            .map_err(ClientError::Start)?;
        }
        let inner = Arc::new(Inner {
            proc,
            config,
            events,
            watches: Mutex::new(HashMap::new()),
        });
        Ok(AgentClient {
            _guard: Arc::new(Guard(inner.clone())),
            inner,
        })
    }

    /// The client's proc (its id is what agents see).
    pub fn proc(&self) -> &Proc {
        &self.inner.proc
    }

    /// Subscribes to the agent of host `rank` at `addr` and keeps the
    /// subscription alive (invariant 1). Watching the same rank at a new
    /// address replaces the old watch; at the same address it is a no-op.
    pub fn watch(&self, rank: Rank, addr: SocketAddr) {
        let mut watches = self.lock();
        if watches.get(&rank).is_some_and(|w| w.addr == addr) {
            return;
        }
        if let Some(old) = watches.remove(&rank) {
            old.cancel.cancel();
        }
        let cancel = CancellationToken::new();
        let resync = Arc::new(tokio::sync::Notify::new());
        watches.insert(
            rank,
            Watch {
                addr,
                cancel: cancel.clone(),
                resync: resync.clone(),
            },
        );
        tokio::spawn(watch_loop(
            self.inner.clone(),
            HostId { rank, addr },
            cancel,
            resync,
        ));
    }

    /// Asks the agent of host `rank` for a fresh `Snapshot` (invariant 1):
    /// the supervisor's picture of it no longer matches the digest in its
    /// heartbeat. Nothing happens for a rank that is not watched; a watch
    /// that is reconnecting gets its snapshot from the reconnect.
    pub fn resync(&self, rank: Rank) {
        if let Some(w) = self.lock().get(&rank) {
            w.resync.notify_one();
        }
    }

    /// Stops watching host `rank`.
    pub fn unwatch(&self, rank: Rank) {
        if let Some(w) = self.lock().remove(&rank) {
            w.cancel.cancel();
        }
    }

    /// Creates (or restarts, or confirms) a proc on the agent at `addr`.
    pub async fn create_or_update(
        &self,
        addr: SocketAddr,
        req: CreateOrUpdate,
    ) -> Result<CreateOutcome, ClientError> {
        self.call(addr, &req)
            .await?
            .map_err(|message| ClientError::Refused { addr, message })
    }

    /// Hands the agent at `addr` the World's rotated secret and the new
    /// issuer's lineage (`Rekey`); its connections from then on use them.
    pub async fn rekey(
        &self,
        addr: SocketAddr,
        secret: &[u8],
        lineage: &str,
    ) -> Result<(), ClientError> {
        let m = Rekey {
            secret: secret.to_vec(),
            lineage: lineage.to_owned(),
        };
        self.call(addr, &m)
            .await?
            .map_err(|message| ClientError::Refused { addr, message })
    }

    /// Asks the agent to stop a proc (TERM, `grace`, KILL); the final
    /// status arrives as a push.
    pub async fn stop(
        &self,
        addr: SocketAddr,
        name: &str,
        grace: Duration,
    ) -> Result<(), ClientError> {
        let m = Stop {
            name: name.to_owned(),
            grace_ms: duration_ms(grace),
        };
        self.call(addr, &m)
            .await?
            .map_err(|message| ClientError::Refused { addr, message })
    }

    /// A proc's full state.
    pub async fn get_state(&self, addr: SocketAddr, name: &str) -> Result<ProcReport, ClientError> {
        let m = GetState {
            name: name.to_owned(),
        };
        self.call(addr, &m)
            .await?
            .map_err(|message| ClientError::Refused { addr, message })
    }

    /// A proc's rank and status.
    pub async fn get_rank_status(
        &self,
        addr: SocketAddr,
        name: &str,
    ) -> Result<RankReport, ClientError> {
        let m = GetRankStatus {
            name: name.to_owned(),
        };
        self.call(addr, &m)
            .await?
            .map_err(|message| ClientError::Refused { addr, message })
    }

    /// Stops every proc on the host, then the agent exits.
    pub async fn shutdown_host(
        &self,
        addr: SocketAddr,
        grace: Duration,
        max_concurrency: usize,
    ) -> Result<(), ClientError> {
        let m = ShutdownHost {
            grace_ms: duration_ms(grace),
            max_concurrency,
        };
        self.call(addr, &m).await
    }

    /// `SetAddressBook`: the agent addresses and rank epochs by host rank
    /// (`epochs` may be empty: no epochs), numbered `version` (0: no patch
    /// applies on top of it). An agent whose own rank is at a newer epoch
    /// fences itself.
    pub async fn set_address_book(
        &self,
        addr: SocketAddr,
        hosts: Vec<String>,
        epochs: Vec<u64>,
        version: u64,
    ) -> Result<(), ClientError> {
        self.call(
            addr,
            &SetAddressBook {
                hosts,
                epochs,
                version,
            },
        )
        .await
    }

    /// `PatchAddressBook`: the changes since the book of version
    /// `patch.base`. `Ok(Err(v))`: the agent holds version `v`, not the
    /// base, and changed nothing (send it the whole book).
    pub async fn patch_address_book(
        &self,
        addr: SocketAddr,
        patch: PatchAddressBook,
    ) -> Result<Result<(), u64>, ClientError> {
        self.call(addr, &patch).await
    }

    /// `Renew {epoch}`: tells the agent at `addr` that its heartbeats reach
    /// this supervisor, which holds `epoch` for its rank; answers how the
    /// agent judged that epoch (`Replaced`: it fenced itself).
    pub async fn renew(
        &self,
        addr: SocketAddr,
        epoch: u64,
    ) -> Result<crate::EpochVerdict, ClientError> {
        self.call(addr, &crate::protocol::Renew { epoch }).await
    }

    /// The stacks of the named procs on the agent at `addr`, each at most
    /// `max_bytes`; waits at most `timeout` for them (on top of the call).
    pub async fn capture_stacks(
        &self,
        addr: SocketAddr,
        names: Vec<String>,
        max_bytes: usize,
        timeout: Duration,
    ) -> Result<Vec<ProcStacks>, ClientError> {
        let (reply, rx) = self.inner.proc.open_once_port::<Vec<ProcStacks>>();
        let m = CaptureStacks {
            names,
            max_bytes: max_bytes as u64,
            reply,
        };
        self.call(addr, &m)
            .await?
            .map_err(|message| ClientError::Refused { addr, message })?;
        match tokio::time::timeout(timeout, rx.recv()).await {
            Ok(r) => r.map_err(|source| ClientError::Call { addr, source }),
            Err(_) => Err(ClientError::Refused {
                addr,
                message: format!("no stacks within {timeout:?}"),
            }),
        }
    }

    async fn call<M>(
        &self,
        addr: SocketAddr,
        m: &M,
    ) -> Result<<HostAgent as Handler<M>>::Reply, ClientError>
    where
        M: hostmesh_runtime::Message,
        HostAgent: Handler<M>,
    {
        let agent = agent_ref(addr).map_err(|e| ClientError::Call {
            addr,
            source: e.into(),
        })?;
        agent
            .call(&self.inner.proc, m, self.inner.config.call_timeout)
            .await
            .map_err(|source| ClientError::Call { addr, source })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Watch>> {
        self.inner.watches.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The host agent actor at `addr`.
pub fn agent_ref(addr: SocketAddr) -> Result<ActorRef<HostAgent>, hostmesh_runtime::id::IdError> {
    let proc = ProcId::new(ChannelAddr::Tcp(addr), AGENT_PROC_NAME)?;
    Ok(ActorRef::attest(proc.actor(HOST_AGENT_ACTOR, 0)?))
}

async fn watch_loop(
    inner: Arc<Inner>,
    host: HostId,
    cancel: CancellationToken,
    resync: Arc<tokio::sync::Notify>,
) {
    let cfg = inner.config.clone();
    let mut backoff = cfg.backoff_initial;
    let mut down_reported = false;
    let emit = |kind: AgentEventKind| {
        let events = inner.events.clone();
        let host = host.clone();
        async move {
            let _ = events.send(AgentEvent { host, kind }).await;
        }
    };
    while !cancel.is_cancelled() {
        let (port, rx) = inner.proc.open_port::<AgentPush>();
        let reason = match subscribe(&inner, host.addr, &port).await {
            Err(reason) => reason,
            Ok(()) => {
                let mut rx = rx;
                emit(AgentEventKind::Connected).await;
                backoff = cfg.backoff_initial;
                down_reported = false;
                loop {
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = resync.notified() => {
                            // The same port: the agent replaces the old
                            // subscription with one that starts with a
                            // Snapshot.
                            tracing::info!(rank = host.rank, addr = %host.addr, "resubscribing for a fresh snapshot");
                            if let Err(e) = subscribe(&inner, host.addr, &port).await {
                                break format!("resubscribe failed: {e}");
                            }
                        }
                        r = tokio::time::timeout(cfg.heartbeat_timeout, rx.recv()) => match r {
                            Ok(Ok(push)) => emit(AgentEventKind::Push(push)).await,
                            Ok(Err(e)) => break format!("subscription closed: {e}"),
                            Err(_) => break format!(
                                "no heartbeat for {:?}", cfg.heartbeat_timeout
                            ),
                        },
                    }
                }
            }
        };
        if !down_reported {
            tracing::warn!(rank = host.rank, addr = %host.addr, %reason, "agent unreachable; retrying");
            emit(AgentEventKind::Disconnected { reason }).await;
            down_reported = true;
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(cfg.backoff_max);
    }
}

async fn subscribe(
    inner: &Inner,
    addr: SocketAddr,
    port: &hostmesh_runtime::PortRef<AgentPush>,
) -> Result<(), String> {
    let agent = agent_ref(addr).map_err(|e| e.to_string())?;
    let port = port.clone();
    match agent
        .call(&inner.proc, &Subscribe { port }, inner.config.call_timeout)
        .await
    {
        Ok(Ok(())) => Ok(()),
        Ok(Err(refused)) => Err(format!("subscribe refused: {refused}")),
        Err(e) => Err(e.to_string()),
    }
}

/// Receives pushes from agents that dial in (invariant 4).
pub struct SupervisorInbox {
    events: mpsc::Sender<AgentEvent>,
    addrs: HashMap<usize, SocketAddr>,
}

impl Actor for SupervisorInbox {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<AgentPush>();
    }
}

impl Handler<AgentPush> for SupervisorInbox {
    type Reply = ();
    async fn handle(&mut self, _cx: &Context<Self>, push: AgentPush) -> Result<(), ActorError> {
        let rank = match &push {
            AgentPush::Snapshot {
                host_rank,
                agent_addr,
                ..
            } => {
                if let Ok(a) = agent_addr.parse() {
                    self.addrs.insert(*host_rank, a);
                }
                *host_rank
            }
            AgentPush::Changed(c) => c.host_rank,
            AgentPush::Heartbeat { host_rank, .. } => *host_rank,
        };
        let Some(addr) = self.addrs.get(&rank).copied() else {
            tracing::debug!(
                rank,
                "push before the first snapshot of a dialing agent; ignored"
            );
            return Ok(());
        };
        let _ = self
            .events
            .send(AgentEvent {
                host: HostId { rank, addr },
                kind: AgentEventKind::Push(push),
            })
            .await;
        Ok(())
    }
}
