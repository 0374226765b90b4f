//! The actor task: init, the message loop (a run of messages sharing a
//! header is handled without copying the header per message, and its
//! messages after the first by one per-type loop in a single future),
//! failure capture (errors and panics), cleanup, and reporting the final
//! status to the supervisor.

use std::any::Any;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use futures::FutureExt as _;
use tokio::sync::oneshot;
use tracing::debug;

use super::handlers::HandlerFailure;
use super::mailbox::{Mailbox, MailboxRx, Next};
use super::{Actor, Context, Handlers};
use crate::channel::{Arrivals, Envelope};
use crate::error::StartError;
use crate::id::ActorId;
use crate::payload::Src;
use crate::port::{PortRef, UNDELIVERABLE_PORT};
use crate::proc::{Proc, undeliverable_of};
use crate::supervision::{ActorStatus, SupervisionEvent};

/// What an actor's mailbox carries.
pub(crate) enum Signal {
    /// A message (or an undeliverable return) for the actor.
    Message(Box<Envelope>),
    /// Messages in order, handed over in one wake-up (each counts against
    /// the mailbox's capacity).
    Batch(Vec<Arrivals>),
    /// A child stopped.
    Child(Box<SupervisionEvent>),
    /// Stop now.
    Stop(String),
}

/// Who hears about an actor's end.
pub(crate) enum Supervisor {
    /// A parent on the same proc.
    Parent(Mailbox),
    /// A port, possibly remote (the owner of a mesh).
    Owner(PortRef<SupervisionEvent>),
    /// The proc's sink (failures only).
    Sink,
}

impl Supervisor {
    pub(crate) fn from_owner(owner: Option<PortRef<SupervisionEvent>>) -> Self {
        owner.map_or(Supervisor::Sink, Supervisor::Owner)
    }
}

fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".into()
    }
}

/// Starts the actor task; resolves once `init` finished (Err: why it failed).
pub(crate) async fn start<A: Actor>(
    proc: Proc,
    id: ActorId,
    actor: A,
    mailbox: Mailbox,
    rx: MailboxRx,
    handlers: Arc<Handlers<A>>,
    supervisor: Supervisor,
) -> Result<(), StartError> {
    let cx = Context {
        proc,
        id,
        mailbox,
        stop: Mutex::new(None),
        stopping: std::sync::atomic::AtomicBool::new(false),
        children: Mutex::new(Vec::new()),
        sender: Mutex::new(None),
        _a: PhantomData,
    };
    let (init_tx, init_rx) = oneshot::channel();
    // Sends from handlers are staged per poll (see `channel::stage`).
    tokio::spawn(crate::channel::batched(run(
        actor, cx, rx, handlers, supervisor, init_tx,
    )));
    init_rx.await.unwrap_or(Err(StartError::TaskEnded))
}

async fn run<A: Actor>(
    mut actor: A,
    cx: Context<A>,
    mut rx: MailboxRx,
    handlers: Arc<Handlers<A>>,
    supervisor: Supervisor,
    init_tx: oneshot::Sender<Result<(), StartError>>,
) {
    // Sub-futures are boxed so an idle actor's task stays small.
    let init = Box::pin(AssertUnwindSafe(actor.init(&cx)).catch_unwind()).await;
    let init_err = match init {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(StartError::Init(e.to_string())),
        Err(p) => Some(StartError::Panicked(panic_message(&*p))),
    };
    let mut cause = None;
    let status = match init_err {
        Some(reason) => {
            let status = ActorStatus::Failed(reason.to_string());
            let _ = init_tx.send(Err(reason));
            status
        }
        None => {
            let _ = init_tx.send(Ok(()));
            message_loop(&mut actor, &cx, &mut rx, &handlers, &mut cause).await
        }
    };
    let _ = AssertUnwindSafe(actor.cleanup(&cx, &status))
        .catch_unwind()
        .await;
    finish(cx, rx, status, cause, supervisor).await;
}

async fn message_loop<A: Actor>(
    actor: &mut A,
    cx: &Context<A>,
    rx: &mut MailboxRx,
    handlers: &Handlers<A>,
    cause: &mut Option<Box<SupervisionEvent>>,
) -> ActorStatus {
    // The header of the last message, for the repeats that follow it, and
    // the block their payloads are ranges of.
    let mut last: Option<Envelope> = None;
    let mut block = bytes::Bytes::new();
    loop {
        // The context holds a sender, so the mailbox never closes here.
        let Some(next) = rx.recv().await else {
            return ActorStatus::Stopped("mailbox closed".into());
        };
        let outcome = match next {
            Next::Message(mut env, run_block) => {
                let payload = std::mem::take(&mut env.payload);
                block = run_block.unwrap_or_default();
                let header = last.insert(env);
                handle_message(actor, cx, handlers, header, Src::Own(payload)).await
            }
            Next::Repeat(range) => match &last {
                Some(header)
                    if header.reply_to.is_none()
                        && let Some(run) = handlers.get_run(header.dest.index()) =>
                {
                    // The rest of the run in one future (no allocation per
                    // message); a failure is the failing message's.
                    let r = AssertUnwindSafe(run(actor, cx, &header.sender, &mut block, range, rx))
                        .catch_unwind()
                        .await;
                    match r {
                        Ok(Ok(())) => None,
                        Ok(Err(f)) => Box::pin(after_handler(cx, header.clone(), Ok(Err(f)))).await,
                        Err(p) => Box::pin(after_handler(cx, header.clone(), Err(p))).await,
                    }
                }
                Some(header) => {
                    let src = Src::Range(&mut block, range);
                    handle_message(actor, cx, handlers, header, src).await
                }
                None => unreachable!("a repeat follows the message whose header it repeats"),
            },
            Next::Stop(reason) => return ActorStatus::Stopped(reason),
            Next::Child(event) => {
                let r = Box::pin(
                    AssertUnwindSafe(actor.handle_supervision_event(cx, &event)).catch_unwind(),
                )
                .await;
                match r {
                    Ok(Ok(true)) => None,
                    Ok(Ok(false)) if !event.status.is_failure() => None,
                    Ok(Ok(false)) => {
                        let reason = format!("unhandled failure of child {}", event.actor);
                        *cause = Some(event);
                        Some(ActorStatus::Failed(reason))
                    }
                    Ok(Err(e)) => {
                        *cause = Some(event);
                        Some(ActorStatus::Failed(format!(
                            "supervision handler failed: {e}"
                        )))
                    }
                    Err(p) => {
                        *cause = Some(event);
                        Some(ActorStatus::Failed(format!(
                            "supervision handler panicked: {}",
                            panic_message(&*p)
                        )))
                    }
                }
            }
        };
        if let Some(status) = outcome {
            return status;
        }
        if cx.stopping.load(std::sync::atomic::Ordering::Acquire)
            && let Some(reason) = cx.stop.lock().unwrap_or_else(|e| e.into_inner()).take()
        {
            return ActorStatus::Stopped(reason);
        }
    }
}

/// Handles one message (`header` with `payload`); `Some(status)` when the
/// actor must stop. The common case (a handler that succeeds with no reply
/// wanted) runs inline; everything else is boxed so that the actor's task
/// stays small.
async fn handle_message<A: Actor>(
    actor: &mut A,
    cx: &Context<A>,
    handlers: &Handlers<A>,
    header: &Envelope,
    src: Src<'_>,
) -> Option<ActorStatus> {
    let port = header.dest.index();
    if port == UNDELIVERABLE_PORT {
        let env = Envelope {
            payload: src.into_bytes(),
            ..header.clone()
        };
        return Box::pin(handle_undeliverable(actor, cx, env)).await;
    }
    let Some(handler) = handlers.get(port) else {
        let reason = format!(
            "actor {} has no handler for this message type (port {port})",
            cx.id
        );
        cx.proc.bounce(header.clone(), reason);
        return None;
    };
    let want_reply = header.reply_to.is_some();
    // The message is decoded at once (the payload goes to the handler; what
    // follows needs only the header).
    let fut = match std::panic::catch_unwind(AssertUnwindSafe(move || {
        handler(actor, cx, &header.sender, src, want_reply)
    })) {
        Ok(Ok(fut)) => fut,
        Ok(Err(failure)) => {
            return Box::pin(after_handler(cx, header.clone(), Ok(Err(failure)))).await;
        }
        Err(p) => return Box::pin(after_handler(cx, header.clone(), Err(p))).await,
    };
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(Ok(None)) => None,
        r => Box::pin(after_handler(cx, header.clone(), r)).await,
    }
}

async fn handle_undeliverable<A: Actor>(
    actor: &mut A,
    cx: &Context<A>,
    env: Envelope,
) -> Option<ActorStatus> {
    let u = undeliverable_of(&env);
    let r = AssertUnwindSafe(actor.handle_undeliverable(cx, u))
        .catch_unwind()
        .await;
    match r {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(ActorStatus::Failed(e.to_string())),
        Err(p) => Some(ActorStatus::Failed(format!(
            "undeliverable handler panicked: {}",
            panic_message(&*p)
        ))),
    }
}

type HandlerOutcome =
    Result<Result<Option<bytes::Bytes>, HandlerFailure>, Box<dyn Any + Send + 'static>>;

/// Sends the reply, bounces an undecodable message, or fails the actor.
async fn after_handler<A: Actor>(
    cx: &Context<A>,
    env: Envelope,
    r: HandlerOutcome,
) -> Option<ActorStatus> {
    let failure = match r {
        Ok(Ok(None)) => return None,
        Ok(Ok(Some(reply))) => {
            if let Some(reply_to) = env.reply_to {
                cx.proc.post(&cx.id, reply_to, None, reply).await;
            }
            return None;
        }
        Ok(Err(HandlerFailure::Decode(reason))) => {
            cx.proc.bounce(
                env,
                format!("cannot decode message for {}: {reason}", cx.id),
            );
            return None;
        }
        Ok(Err(HandlerFailure::Encode(reason))) => format!("cannot encode reply: {reason}"),
        Ok(Err(HandlerFailure::Failed(e))) => format!("handler failed: {e}"),
        Err(p) => format!("handler panicked: {}", panic_message(&*p)),
    };
    // Tell a waiting caller at once, then stop.
    if let Some(reply_to) = env.reply_to {
        let ret = Envelope {
            sender: cx.id.clone(),
            dest: reply_to,
            reply_to: None,
            error: Some(format!("{} {failure}", cx.id)),
            payload: bytes::Bytes::new(),
        };
        cx.proc.route(ret).await;
    }
    Some(ActorStatus::Failed(failure))
}

async fn finish<A: Actor>(
    cx: Context<A>,
    mut rx: MailboxRx,
    status: ActorStatus,
    cause: Option<Box<SupervisionEvent>>,
    supervisor: Supervisor,
) {
    debug!(actor = %cx.id, %status, "actor stopped");
    cx.proc.remove_actor(&cx.id);
    rx.close();
    while let Some(next) = rx.try_recv() {
        if let Next::Message(env, _) = next {
            let reason = format!("actor {} {status}", cx.id);
            cx.proc.bounce(env, reason);
        }
    }
    let children = std::mem::take(&mut *cx.children.lock().unwrap_or_else(|e| e.into_inner()));
    for child in children {
        let _ = child.try_send(Signal::Stop(format!("parent {} stopped", cx.id)));
    }
    let event = SupervisionEvent {
        actor: cx.id.clone(),
        status,
        cause,
    };
    match supervisor {
        Supervisor::Parent(tx) => {
            if let Err(Signal::Child(event)) = tx.send(Signal::Child(Box::new(event))).await
                && event.status.is_failure()
            {
                cx.proc.report(*event);
            }
        }
        Supervisor::Owner(port) => {
            if let Err(e) = port.send(&cx.proc, &event).await {
                debug!(error = %e, "cannot send supervision event to owner");
                cx.proc.report(event);
            }
        }
        Supervisor::Sink => {
            if event.status.is_failure() {
                cx.proc.report(event);
            }
        }
    }
}
