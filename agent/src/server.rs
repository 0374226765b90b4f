//! The agent's runtime face: the `HostAgent` actor that serves the agent
//! protocol (docs/architecture.md, "Agent protocol") on the agent's proc,
//! and the subscriber actors that push state to supervisors.
//!
//! Invariants:
//! 1. Only peers that passed the runtime handshake (HMAC with the World
//!    secret) can reach these handlers: the agent's proc is built with the
//!    secret, and the transport refuses and logs any other peer. Procs
//!    hold only a proc credential, so they cannot: they check in at the
//!    agent's proc desk (`desk.rs`).
//! 2. Handlers never wait for a process: stops and shutdowns run as tasks,
//!    so the agent keeps answering while procs wind down; and no handler
//!    returns an error (which would stop the actor): refusals are replies.
//! 3. A subscriber gets a snapshot first, then every change and a heartbeat
//!    every interval (`subscription.rs`); a subscriber whose pushes come back
//!    undeliverable is dropped; one that subscribes again replaces itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::manager::ProcManager;
use super::protocol::{
    AgentPush, CaptureStacks, CreateOrUpdate, CreateOutcome, GetRankStatus, GetState,
    PatchAddressBook, ProcReport, ProcStacks, RankReport, Rekey, Renew, SetAddressBook,
    ShutdownHost, Stop, Subscribe,
};
use super::subscription::Subscription;
use hostmesh_runtime::{
    Actor, ActorError, ActorRef, Context, Handler, Handlers, PortId, PortRef, Proc, Undeliverable,
};

/// Name of the agent's proc; its actor is [`HOST_AGENT_ACTOR`]`[0]`.
pub const AGENT_PROC_NAME: &str = "agent";
/// Name of the actor serving the agent protocol.
pub const HOST_AGENT_ACTOR: &str = "host";
/// Most subscribers an agent serves at once.
pub const MAX_SUBSCRIBERS: usize = 64;

/// The actor serving the agent protocol.
pub struct HostAgent {
    manager: ProcManager,
    heartbeat: Duration,
    subscribers: HashMap<PortId, Arc<AtomicBool>>,
    exit: Arc<Notify>,
    /// The agent's proc desk (`desk.rs`), reissued on `Rekey`.
    desk: Proc,
}

impl HostAgent {
    /// An agent actor over `manager`; `exit` is notified once a
    /// `ShutdownHost` has stopped every proc; `desk` is the agent's proc
    /// desk.
    pub fn new(manager: ProcManager, heartbeat: Duration, exit: Arc<Notify>, desk: Proc) -> Self {
        HostAgent {
            manager,
            heartbeat,
            subscribers: HashMap::new(),
            exit,
            desk,
        }
    }
}

impl Actor for HostAgent {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<CreateOrUpdate>()
            .handle::<GetRankStatus>()
            .handle::<GetState>()
            .handle::<Stop>()
            .handle::<ShutdownHost>()
            .handle::<SetAddressBook>()
            .handle::<PatchAddressBook>()
            .handle::<Renew>()
            .handle::<Rekey>()
            .handle::<Subscribe>()
            .handle::<CaptureStacks>();
    }

    async fn handle_supervision_event(
        &mut self,
        _cx: &Context<Self>,
        event: &hostmesh_runtime::SupervisionEvent,
    ) -> Result<bool, ActorError> {
        // A pusher ended (its subscriber went away): never the agent's end.
        tracing::debug!(%event, "subscriber pusher ended");
        Ok(true)
    }

    async fn handle_undeliverable(
        &mut self,
        _cx: &Context<Self>,
        message: Undeliverable,
    ) -> Result<(), ActorError> {
        // Replies to callers that went away: nothing to do, never fatal.
        tracing::debug!(%message, "reply from the host agent undeliverable");
        Ok(())
    }
}

impl Handler<CreateOrUpdate> for HostAgent {
    type Reply = Result<CreateOutcome, String>;
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        m: CreateOrUpdate,
    ) -> Result<Self::Reply, ActorError> {
        Ok(self.manager.create_or_update(m).map_err(|e| e.to_string()))
    }
}

impl Handler<GetRankStatus> for HostAgent {
    type Reply = Result<RankReport, String>;
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        m: GetRankStatus,
    ) -> Result<Self::Reply, ActorError> {
        Ok(self.manager.rank_status(&m.name).map_err(|e| e.to_string()))
    }
}

impl Handler<GetState> for HostAgent {
    type Reply = Result<ProcReport, String>;
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        m: GetState,
    ) -> Result<Self::Reply, ActorError> {
        Ok(self.manager.state(&m.name).map_err(|e| e.to_string()))
    }
}

impl Handler<Stop> for HostAgent {
    type Reply = Result<(), String>;
    async fn handle(&mut self, _cx: &Context<Self>, m: Stop) -> Result<Self::Reply, ActorError> {
        if let Err(e) = self.manager.state(&m.name) {
            return Ok(Err(e.to_string()));
        }
        // Invariant 2: the final status arrives as a push.
        let manager = self.manager.clone();
        tokio::spawn(async move {
            let _ = manager
                .stop(&m.name, Duration::from_millis(m.grace_ms))
                .await;
        });
        Ok(Ok(()))
    }
}

impl Handler<ShutdownHost> for HostAgent {
    type Reply = ();
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        m: ShutdownHost,
    ) -> Result<Self::Reply, ActorError> {
        tracing::info!(
            grace_ms = m.grace_ms,
            max_concurrency = m.max_concurrency,
            "ShutdownHost"
        );
        let manager = self.manager.clone();
        let exit = self.exit.clone();
        tokio::spawn(async move {
            manager
                .shutdown(Duration::from_millis(m.grace_ms), m.max_concurrency)
                .await;
            exit.notify_one();
        });
        Ok(())
    }
}

impl Handler<SetAddressBook> for HostAgent {
    type Reply = ();
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        m: SetAddressBook,
    ) -> Result<Self::Reply, ActorError> {
        self.manager.fence().address_book(&m.epochs);
        self.manager.set_address_book(m.hosts, m.version);
        Ok(())
    }
}

impl Handler<PatchAddressBook> for HostAgent {
    type Reply = Result<(), u64>;
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        m: PatchAddressBook,
    ) -> Result<Self::Reply, ActorError> {
        let applied = self.manager.patch_address_book(&m);
        if applied.is_ok() {
            self.manager
                .fence()
                .book_epochs(m.changes.iter().map(|e| (e.rank, e.epoch)));
        }
        Ok(applied)
    }
}

impl Handler<Renew> for HostAgent {
    type Reply = crate::EpochVerdict;
    async fn handle(&mut self, _cx: &Context<Self>, m: Renew) -> Result<Self::Reply, ActorError> {
        Ok(self.manager.fence().contact(m.epoch))
    }
}

impl Handler<Rekey> for HostAgent {
    type Reply = Result<(), String>;
    async fn handle(&mut self, cx: &Context<Self>, m: Rekey) -> Result<Self::Reply, ActorError> {
        let issuer = &self.manager.identity().issuer;
        Ok(
            super::keys::rekey(&m.secret, &m.lineage, cx.proc_ref(), &self.desk, issuer)
                .map_err(|e| e.to_string()),
        )
    }
}

/// Most stack captures one agent runs at once.
const CAPTURE_CONCURRENCY: usize = 8;

impl Handler<CaptureStacks> for HostAgent {
    type Reply = Result<(), String>;
    async fn handle(
        &mut self,
        cx: &Context<Self>,
        m: CaptureStacks,
    ) -> Result<Self::Reply, ActorError> {
        // Invariant 2: captured by a task; the stacks go to the reply port.
        let manager = self.manager.clone();
        let proc = cx.proc_ref().clone();
        let max = usize::try_from(m.max_bytes).unwrap_or(usize::MAX);
        tracing::info!(procs = m.names.len(), "capturing stacks");
        tokio::spawn(async move {
            use futures::StreamExt as _;
            let stacks: Vec<ProcStacks> = futures::stream::iter(m.names)
                .map(|name| {
                    let manager = manager.clone();
                    async move {
                        let state = manager.state(&name).ok();
                        let rank = state.as_ref().map_or(0, |s| s.rank);
                        match state
                            .filter(|s| !s.status.is_terminal())
                            .and_then(|s| s.pid)
                        {
                            Some(pid) => {
                                let c = super::stacks::capture(pid, max).await;
                                ProcStacks {
                                    name,
                                    rank,
                                    method: c.method.to_owned(),
                                    text: c.text,
                                    truncated: c.truncated,
                                }
                            }
                            None => ProcStacks {
                                name,
                                rank,
                                method: "none".to_owned(),
                                text: "no running process".to_owned(),
                                truncated: false,
                            },
                        }
                    }
                })
                .buffered(CAPTURE_CONCURRENCY)
                .collect()
                .await;
            if let Err(e) = m.reply.send(&proc, &stacks).await {
                tracing::warn!(error = %e, "cannot send the captured stacks");
            }
        });
        Ok(Ok(()))
    }
}

impl Handler<Subscribe> for HostAgent {
    type Reply = Result<(), String>;
    async fn handle(
        &mut self,
        cx: &Context<Self>,
        m: Subscribe,
    ) -> Result<Self::Reply, ActorError> {
        self.subscribers
            .retain(|_, closed| !closed.load(Ordering::SeqCst));
        // Invariant 3: a repeated subscription replaces the old one.
        if let Some(old) = self.subscribers.remove(m.port.id()) {
            old.store(true, Ordering::SeqCst);
        }
        if self.subscribers.len() >= MAX_SUBSCRIBERS {
            return Ok(Err(format!(
                "this agent already serves {MAX_SUBSCRIBERS} subscribers"
            )));
        }
        let closed = Arc::new(AtomicBool::new(false));
        let pusher = Pusher {
            port: m.port.clone(),
            closed: closed.clone(),
        };
        // A failure here refuses this subscriber; it never stops the agent.
        let pusher = match cx.spawn_child(pusher).await {
            Ok(p) => p,
            Err(e) => return Ok(Err(format!("cannot start a subscriber: {e}"))),
        };
        tracing::info!(subscriber = %m.port.id(), "subscribed");
        self.subscribers.insert(m.port.id().clone(), closed.clone());
        let sub = Subscription::new(self.manager.clone(), self.heartbeat);
        pump(cx.proc_ref().clone(), pusher, sub, closed);
        Ok(Ok(()))
    }
}

/// Feeds one subscription to its pusher actor until it closes.
pub(crate) fn pump(
    proc: Proc,
    pusher: ActorRef<Pusher>,
    mut sub: Subscription,
    closed: Arc<AtomicBool>,
) {
    tokio::spawn(async move {
        while !closed.load(Ordering::SeqCst) {
            let push = sub.next().await;
            if closed.load(Ordering::SeqCst)
                || pusher.send(&proc, &ForwardPush(push)).await.is_err()
            {
                break;
            }
        }
    });
}

/// A push on its way to a subscriber (local to the agent's proc).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct ForwardPush(pub(crate) AgentPush);

/// Sends pushes to one subscriber's port; stops when they come back
/// undeliverable (the subscriber is gone).
pub(crate) struct Pusher {
    pub(crate) port: PortRef<AgentPush>,
    pub(crate) closed: Arc<AtomicBool>,
}

impl Actor for Pusher {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<ForwardPush>();
    }

    async fn handle_undeliverable(
        &mut self,
        cx: &Context<Self>,
        message: Undeliverable,
    ) -> Result<(), ActorError> {
        tracing::info!(subscriber = %self.port.id(), reason = %message, "subscriber gone; dropping it");
        self.closed.store(true, Ordering::SeqCst);
        cx.stop("subscriber gone");
        Ok(())
    }

    async fn cleanup(&mut self, _cx: &Context<Self>, _status: &hostmesh_runtime::ActorStatus) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

impl Handler<ForwardPush> for Pusher {
    type Reply = ();
    async fn handle(&mut self, cx: &Context<Self>, m: ForwardPush) -> Result<(), ActorError> {
        if self.closed.load(Ordering::SeqCst) {
            cx.stop("subscription replaced");
            return Ok(());
        }
        self.port
            .send(cx, &m.0)
            .await
            .map_err(|e| ActorError::new(format!("cannot push to {}: {e}", self.port.id())))
    }
}
