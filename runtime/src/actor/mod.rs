//! Actors: the [`Actor`] trait with its hooks, typed [`Handler`]s, the
//! per-message [`Context`], [`ActorRef`] with `send` and `call`, and the
//! mailbox (`mailbox`) the actor task (`run`) takes its messages from.
//!
//! Invariants:
//! 1. An actor handles one message at a time, in arrival order; messages
//!    from one sender arrive in the order they were sent.
//! 2. `init` runs before any message; `cleanup` runs once, after the last
//!    message, whatever the reason for stopping (also after a panic).
//! 3. A `call` ends with the reply, an error naming why the message was not
//!    handled (undeliverable, handler failed), the loss of the connection to
//!    the callee's proc, or its timeout; it never waits forever.

mod handlers;
mod mailbox;
mod run;

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{ActorError, RuntimeError};
use crate::id::ActorId;
use crate::port::{self, Message, OncePortRef, OnceReceiver, PortReceiver, PortRef, handler_port};
use crate::proc::{CanSend, Proc};
use crate::supervision::{ActorStatus, SupervisionEvent, Undeliverable};

pub use handlers::Handlers;
pub(crate) use mailbox::{Mailbox, mailbox};
pub(crate) use run::{Signal, Supervisor, start};

/// An actor: state plus handlers, run by its proc one message at a time.
///
/// ```
/// use hostmesh_runtime::{Actor, ActorError, Context, Handler, Handlers};
///
/// struct Counter(u64);
///
/// impl Actor for Counter {
///     fn register(h: &mut Handlers<Self>) {
///         h.handle::<u64>();
///     }
/// }
///
/// impl Handler<u64> for Counter {
///     type Reply = u64;
///     async fn handle(&mut self, _cx: &Context<Self>, n: u64) -> Result<u64, ActorError> {
///         self.0 += n;
///         Ok(self.0)
///     }
/// }
/// ```
pub trait Actor: Sized + Send + 'static {
    /// Lists the message types this actor handles (`h.handle::<M>()` for
    /// each `Handler<M>` impl).
    fn register(handlers: &mut Handlers<Self>);

    /// Runs before the first message; an error fails the spawn.
    fn init(&mut self, cx: &Context<Self>) -> impl Future<Output = Result<(), ActorError>> + Send {
        let _ = cx;
        async { Ok(()) }
    }

    /// Runs once when the actor stops, with its final status.
    fn cleanup(
        &mut self,
        cx: &Context<Self>,
        status: &ActorStatus,
    ) -> impl Future<Output = ()> + Send {
        let _ = (cx, status);
        async {}
    }

    /// A child stopped. Return `Ok(true)` if handled; an unhandled failure
    /// fails this actor too (with the child's event as the cause).
    fn handle_supervision_event(
        &mut self,
        cx: &Context<Self>,
        event: &SupervisionEvent,
    ) -> impl Future<Output = Result<bool, ActorError>> + Send {
        let _ = (cx, event);
        async { Ok(false) }
    }

    /// A message this actor sent came back undeliverable. By default the
    /// actor fails, which turns it into a supervision event.
    fn handle_undeliverable(
        &mut self,
        cx: &Context<Self>,
        message: Undeliverable,
    ) -> impl Future<Output = Result<(), ActorError>> + Send {
        let _ = cx;
        async move { Err(ActorError::new(message)) }
    }
}

/// Handling of message type `M`.
pub trait Handler<M: Message>: Actor {
    /// What a `call` gets back (`()` for messages only ever `send`).
    type Reply: Message;

    /// Handles one message. An error (or a panic) stops the actor.
    fn handle(
        &mut self,
        cx: &Context<Self>,
        message: M,
    ) -> impl Future<Output = Result<Self::Reply, ActorError>> + Send;
}

/// Actors that other procs may spawn by type (actor meshes). Register them
/// with [`ProcBuilder::register`](crate::ProcBuilder::register).
pub trait RemoteSpawn: Actor {
    /// Construction parameters, sent serialized.
    type Params: Message;
    /// Builds the actor from its parameters.
    fn new(params: Self::Params) -> impl Future<Output = Result<Self, ActorError>> + Send;
}

/// What a handler gets besides the message: its identity, its proc, and
/// ways to send, spawn children and stop.
pub struct Context<A: Actor> {
    proc: Proc,
    id: ActorId,
    mailbox: Mailbox,
    stop: Mutex<Option<String>>,
    /// Set with `stop`, so the message loop checks it without the lock.
    stopping: std::sync::atomic::AtomicBool,
    children: Mutex<Vec<Mailbox>>,
    /// The sender of the message being handled, for types registered with
    /// [`Handlers::handle_sent`] (their dispatch sets it).
    sender: Mutex<Option<ActorId>>,
    _a: PhantomData<fn() -> A>,
}

impl<A: Actor> Context<A> {
    /// This actor's id.
    pub fn actor_id(&self) -> &ActorId {
        &self.id
    }

    /// The sender of the message being handled, for message types the
    /// actor registered with [`Handlers::handle_sent`] (`None` for others).
    /// A message that came over a connection authenticated with a proc
    /// credential names a sender of that connection's peer proc only, so
    /// the sender's proc name is the one its certificate names.
    pub fn sender(&self) -> Option<ActorId> {
        self.sender
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_sender(&self, sender: Option<ActorId>) {
        *self.sender.lock().unwrap_or_else(|e| e.into_inner()) = sender;
    }

    /// The proc running this actor.
    pub fn proc_ref(&self) -> &Proc {
        &self.proc
    }

    /// A reference to this actor.
    pub fn self_ref(&self) -> ActorRef<A> {
        ActorRef::attest(self.id.clone())
    }

    /// Stops this actor after the current message, with status
    /// `Stopped(reason)`.
    pub fn stop(&self, reason: impl Into<String>) {
        *self.stop.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.into());
        self.stopping
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Spawns a child actor supervised by this one; it is named after this
    /// actor with the next free index.
    pub async fn spawn_child<C: Actor>(&self, child: C) -> Result<ActorRef<C>, RuntimeError> {
        let index = self.proc.next_index(self.id.name());
        let r = self
            .proc
            .spawn_with(
                self.id.name(),
                index,
                child,
                Supervisor::Parent(self.mailbox.clone()),
            )
            .await?;
        if let Some(tx) = self.proc.actor_mailbox(r.id()) {
            self.children
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(tx);
        }
        Ok(r)
    }

    /// Opens a port owned by this actor.
    pub fn open_port<M: Message>(&self) -> (PortRef<M>, PortReceiver<M>) {
        port::port_pair(&self.proc, &self.id, self.proc.config().port_capacity)
    }

    /// Opens a one-shot port owned by this actor.
    pub fn open_once_port<M: Message>(&self) -> (OncePortRef<M>, OnceReceiver<M>) {
        port::once_pair(&self.proc, &self.id)
    }
}

impl<A: Actor> CanSend for Context<A> {
    fn proc(&self) -> &Proc {
        &self.proc
    }
    fn sender_id(&self) -> &ActorId {
        &self.id
    }
}

/// A typed reference to an actor; serializable, so it can travel in messages.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct ActorRef<A> {
    id: ActorId,
    #[serde(skip)]
    _a: PhantomData<fn() -> A>,
}

impl<A> Clone for ActorRef<A> {
    fn clone(&self) -> Self {
        ActorRef {
            id: self.id.clone(),
            _a: PhantomData,
        }
    }
}

impl<A> PartialEq for ActorRef<A> {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl<A: Actor> ActorRef<A> {
    /// A typed reference to an actor id; the caller vouches for the type.
    pub fn attest(id: ActorId) -> Self {
        ActorRef {
            id,
            _a: PhantomData,
        }
    }

    /// The actor's id.
    pub fn id(&self) -> &ActorId {
        &self.id
    }

    /// The actor's port for message type `M`.
    pub fn port<M: Message>(&self) -> PortRef<M>
    where
        A: Handler<M>,
    {
        PortRef::attest(self.id.port(handler_port::<M>()))
    }

    /// Sends `msg` (fire and forget). Waits only while the destination's
    /// queue is full; delivery failures return to `cx` as undeliverable.
    pub async fn send<M: Message>(&self, cx: &impl CanSend, msg: &M) -> Result<(), RuntimeError>
    where
        A: Handler<M>,
    {
        let port = handler_port::<M>();
        let proc = cx.proc();
        if proc.try_repeat(cx.sender_id(), &self.id, port, msg) {
            return Ok(());
        }
        let payload = port::encode(msg)?;
        proc.post(cx.sender_id(), self.id.port(port), None, payload)
            .await;
        Ok(())
    }

    /// Sends `msg` and waits up to `timeout` for the handler's reply.
    pub async fn call<M: Message>(
        &self,
        cx: &impl CanSend,
        msg: &M,
        timeout: Duration,
    ) -> Result<<A as Handler<M>>::Reply, RuntimeError>
    where
        A: Handler<M>,
    {
        let dest = self.id.port(handler_port::<M>());
        let payload = port::encode(msg)?;
        call_raw(cx, dest, payload, timeout).await
    }
}

/// Sends `payload` to `dest` with a one-shot reply port and waits for the
/// reply, its failure, the loss of the peer's connection, or the timeout.
pub(crate) async fn call_raw<R: Message>(
    cx: &impl CanSend,
    dest: crate::id::PortId,
    payload: bytes::Bytes,
    timeout: Duration,
) -> Result<R, RuntimeError> {
    let proc = cx.proc();
    let (reply, mut rx) = port::once_pair::<R>(proc, cx.sender_id());
    let peer = dest.actor().proc().clone();
    let mut lost = proc.lost_watch(&peer);
    if let Some(l) = lost.as_mut() {
        l.borrow_and_update();
    }
    proc.post(
        cx.sender_id(),
        dest.clone(),
        Some(reply.id().clone()),
        payload,
    )
    .await;
    let lost_fut = async {
        match lost.as_mut() {
            Some(l) => {
                if l.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        r = rx.recv_envelope() => match r {
            Ok(env) => port::decode(&env),
            Err(RuntimeError::CallFailed { reason, .. }) => Err(RuntimeError::CallFailed { dest: dest.to_string(), reason }),
            Err(e) => Err(e),
        },
        _ = tokio::time::sleep(timeout) => Err(RuntimeError::Timeout { dest: dest.to_string(), timeout }),
        _ = lost_fut => Err(RuntimeError::ConnectionLost { peer: peer.to_string(), dest: dest.to_string() }),
    }
}

impl<T> std::fmt::Debug for ActorRef<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ActorRef")
            .field(&format_args!("{}", self.id))
            .finish()
    }
}
