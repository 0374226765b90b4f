//! The per-type table from handler port to type-erased handlers: one that
//! decodes a message at once and returns the handler's future, and one that
//! handles the rest of a run (messages repeating one header) in a single
//! future, so a stream of one message type costs no allocation per message.

use std::collections::HashMap;

use bytes::Bytes;
use futures::future::BoxFuture;

use super::mailbox::MailboxRx;
use super::{Actor, Context, Handler};
use crate::error::ActorError;
use crate::id::ActorId;
use crate::payload::Src;
use crate::port::{Message, handler_port};

/// Why a handler did not produce a reply.
pub(crate) enum HandlerFailure {
    /// The payload did not decode as the handler's message type.
    Decode(String),
    /// The handler returned an error.
    Failed(ActorError),
    /// The reply did not encode.
    Encode(String),
}

/// Decodes the message (at once) and returns the handler's future; the
/// message's sender comes along for [`Handlers::handle_sent`].
type Dispatch<A> =
    for<'a, 'b> fn(
        &'a mut A,
        &'a Context<A>,
        &ActorId,
        Src<'b>,
        bool,
    )
        -> Result<BoxFuture<'a, Result<Option<Bytes>, HandlerFailure>>, HandlerFailure>;

/// Handles the message at `range` of the block, then the ones repeating it
/// that the mailbox holds, in one future, until the run ends, the actor is
/// stopping, or a message fails (its failure is returned; the messages after
/// it stay in the mailbox). Replies are not wanted (a run with a reply port
/// goes through [`Dispatch`]).
type DispatchRun<A> = for<'a> fn(
    &'a mut A,
    &'a Context<A>,
    &ActorId,
    &'a mut Bytes,
    std::ops::Range<usize>,
    &'a mut MailboxRx,
) -> BoxFuture<'a, Result<(), HandlerFailure>>;

/// Handler ports are already hashes (FNV-1a of a type path): the map uses
/// them as they are instead of hashing them again for every message.
#[derive(Default)]
struct PortHasher(u64);

impl std::hash::Hasher for PortHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The message types an actor type handles; filled by [`Actor::register`].
pub struct Handlers<A: Actor> {
    map: HashMap<u64, (Dispatch<A>, DispatchRun<A>), std::hash::BuildHasherDefault<PortHasher>>,
}

fn dispatch<'a, A, M>(
    actor: &'a mut A,
    cx: &'a Context<A>,
    _sender: &ActorId,
    src: Src<'_>,
    want_reply: bool,
) -> Result<BoxFuture<'a, Result<Option<Bytes>, HandlerFailure>>, HandlerFailure>
where
    A: Handler<M>,
    M: Message,
{
    let msg: M = crate::payload::decode_shared(src).map_err(|e| {
        HandlerFailure::Decode(format!("not a {}: {e}", std::any::type_name::<M>()))
    })?;
    Ok(Box::pin(async move {
        let reply = actor
            .handle(cx, msg)
            .await
            .map_err(HandlerFailure::Failed)?;
        if !want_reply {
            return Ok(None);
        }
        postcard::to_allocvec(&reply)
            .map(|v| Some(Bytes::from(v)))
            .map_err(|e| HandlerFailure::Encode(e.to_string()))
    }))
}

fn dispatch_run<'a, A, M>(
    actor: &'a mut A,
    cx: &'a Context<A>,
    _sender: &ActorId,
    block: &'a mut Bytes,
    first: std::ops::Range<usize>,
    rx: &'a mut MailboxRx,
) -> BoxFuture<'a, Result<(), HandlerFailure>>
where
    A: Handler<M>,
    M: Message,
{
    Box::pin(async move {
        let mut range = first;
        loop {
            let msg: M = crate::payload::decode_shared(Src::Range(block, range)).map_err(|e| {
                HandlerFailure::Decode(format!("not a {}: {e}", std::any::type_name::<M>()))
            })?;
            actor
                .handle(cx, msg)
                .await
                .map_err(HandlerFailure::Failed)?;
            if cx.stopping.load(std::sync::atomic::Ordering::Acquire) {
                return Ok(());
            }
            match rx.next_repeat() {
                Some(next) => range = next,
                None => return Ok(()),
            }
        }
    })
}

/// [`dispatch`] with the sender in the context while the handler runs
/// (and only then: a panic leaves it set, but the actor stops with it).
fn dispatch_sent<'a, A, M>(
    actor: &'a mut A,
    cx: &'a Context<A>,
    sender: &ActorId,
    src: Src<'_>,
    want_reply: bool,
) -> Result<BoxFuture<'a, Result<Option<Bytes>, HandlerFailure>>, HandlerFailure>
where
    A: Handler<M>,
    M: Message,
{
    cx.set_sender(Some(sender.clone()));
    match dispatch::<A, M>(actor, cx, sender, src, want_reply) {
        Ok(fut) => Ok(Box::pin(async move {
            let r = fut.await;
            cx.set_sender(None);
            r
        })),
        Err(e) => {
            cx.set_sender(None);
            Err(e)
        }
    }
}

/// [`dispatch_run`] with the run's sender in the context.
fn dispatch_run_sent<'a, A, M>(
    actor: &'a mut A,
    cx: &'a Context<A>,
    sender: &ActorId,
    block: &'a mut Bytes,
    first: std::ops::Range<usize>,
    rx: &'a mut MailboxRx,
) -> BoxFuture<'a, Result<(), HandlerFailure>>
where
    A: Handler<M>,
    M: Message,
{
    cx.set_sender(Some(sender.clone()));
    let run = dispatch_run::<A, M>(actor, cx, sender, block, first, rx);
    Box::pin(async move {
        let r = run.await;
        cx.set_sender(None);
        r
    })
}

impl<A: Actor> Handlers<A> {
    pub(crate) fn build() -> Self {
        let mut h = Handlers {
            map: HashMap::default(),
        };
        A::register(&mut h);
        h
    }

    /// Declares that the actor handles `M`.
    pub fn handle<M: Message>(&mut self) -> &mut Self
    where
        A: Handler<M>,
    {
        self.map.insert(
            handler_port::<M>(),
            (dispatch::<A, M>, dispatch_run::<A, M>),
        );
        self
    }

    /// Declares that the actor handles `M` and reads each one's sender
    /// with [`Context::sender`] (a message that came over a connection
    /// authenticated with a proc credential names a sender of the peer
    /// proc only, `channel::reader`).
    pub fn handle_sent<M: Message>(&mut self) -> &mut Self
    where
        A: Handler<M>,
    {
        self.map.insert(
            handler_port::<M>(),
            (dispatch_sent::<A, M>, dispatch_run_sent::<A, M>),
        );
        self
    }

    pub(crate) fn get(&self, port: u64) -> Option<Dispatch<A>> {
        self.map.get(&port).map(|h| h.0)
    }

    /// The per-type loop over a run for messages to `port`.
    pub(crate) fn get_run(&self, port: u64) -> Option<DispatchRun<A>> {
        self.map.get(&port).map(|h| h.1)
    }
}
