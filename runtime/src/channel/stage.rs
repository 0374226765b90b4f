//! Per-thread send staging: inside a [`batched`] scope, a stream of sends
//! from one sender to one remote actor is framed into a run owned by the
//! sending thread, with no lock and no atomic per message, and handed to
//! the link's queue in one step.
//!
//! A task cannot move to another thread in the middle of a poll, so a run
//! staged during one poll belongs to exactly one task; it is flushed before
//! the poll returns. Invariants:
//! 1. A thread holds at most one staged run, and only while a [`batched`]
//!    future is being polled on it: the run is flushed when the outermost
//!    scope's poll returns (or unwinds), when it reaches the run size bound,
//!    when a send takes another path through any transport of this thread
//!    (so per sender-receiver order holds across paths), and when a send
//!    needs a different run.
//! 2. A run is staged only for a link whose queue has room when it starts,
//!    and holds at most as many messages as that queue (backpressure: a
//!    full queue sends the message the waiting way).
//! 3. Nothing staged is lost: a run whose link closed comes back to its
//!    transport to be bounced as undeliverable.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::BytesMut;

use super::frame;
use super::queue::{LinkQueue, RUN_BYTES, RUN_PAYLOAD_MAX, SharedHeaderRun};
use crate::id::{ActorId, PortId, ProcId};

/// Where a staged run goes back when its link closed.
pub(super) trait Bounce: Send + Sync {
    /// Hands the run's messages back as undeliverable.
    fn bounce_run(&self, run: SharedHeaderRun, reason: String);
}

/// A run of messages staged on this thread.
pub(super) struct Stage {
    /// The transport it belongs to (its unique number).
    pub(super) owner: u64,
    pub(super) queue: Arc<LinkQueue>,
    bounce: Arc<dyn Bounce>,
    max_frame: usize,
    sender: ActorId,
    dest: PortId,
    frames: BytesMut,
    count: usize,
}

impl Stage {
    pub(super) fn new(
        owner: u64,
        queue: Arc<LinkQueue>,
        bounce: Arc<dyn Bounce>,
        max_frame: usize,
        sender: &ActorId,
        dest: PortId,
    ) -> Self {
        Stage {
            owner,
            queue,
            bounce,
            max_frame,
            sender: sender.clone(),
            dest,
            frames: BytesMut::new(),
            count: 0,
        }
    }

    /// The proc the run goes to.
    pub(super) fn peer(&self) -> &ProcId {
        self.dest.actor().proc()
    }

    /// Whether a `len`-byte message from `sender` to handler port `port`
    /// of `dest` on transport `owner` continues this run.
    pub(super) fn continues(
        &self,
        owner: u64,
        sender: &ActorId,
        dest: &ActorId,
        port: u64,
        len: usize,
    ) -> bool {
        self.owner == owner
            && self.count < self.queue.capacity()
            && self.dest.index() == port
            && self.dest.actor() == dest
            && &self.sender == sender
            && Self::fits(len, self.max_frame)
    }

    /// Whether a message of `len` bytes may be staged at all.
    pub(super) fn fits(len: usize, max_frame: usize) -> bool {
        len <= RUN_PAYLOAD_MAX && 4 + len <= max_frame
    }

    /// Appends a message whose payload `encode` writes; `false` (nothing
    /// appended) if it fails.
    pub(super) fn append(
        &mut self,
        len: usize,
        encode: impl FnOnce(&mut BytesMut) -> bool,
    ) -> bool {
        match self.count {
            // A single message is common (a reply-like send per poll)...
            0 => self.frames.reserve(frame::REPEAT_OVERHEAD + len),
            // ...a second one makes it a stream: room for a whole run, so
            // the buffer never moves while it fills.
            1 => self
                .frames
                .reserve(RUN_BYTES + RUN_PAYLOAD_MAX + frame::REPEAT_OVERHEAD),
            _ => {}
        }
        if !frame::encode_repeat_with(&mut self.frames, encode) {
            return false;
        }
        self.count += 1;
        true
    }

    /// Whether the run reached its size bound (flush it).
    pub(super) fn is_full(&self) -> bool {
        self.frames.len() >= RUN_BYTES
    }

    /// Hands the run to its link's queue (or back to its transport).
    pub(super) fn flush(self) {
        let Stage {
            queue,
            bounce,
            sender,
            dest,
            frames,
            count,
            ..
        } = self;
        if let Err(run) = queue.push_frames(&sender, &dest, frames, count) {
            let reason = format!("link to {} closed", dest.actor().proc());
            bounce.bounce_run(*run, reason);
        }
    }
}

#[derive(Default)]
struct Slot {
    /// Nesting depth of [`batched`] polls on this thread.
    depth: u32,
    stage: Option<Stage>,
}

thread_local! {
    static SLOT: RefCell<Slot> = const { RefCell::new(Slot { depth: 0, stage: None }) };
}

/// Runs `f` on this thread's stage slot if a [`batched`] scope is being
/// polled here (`None` otherwise, or when the slot is in use further up
/// the stack).
pub(super) fn with<R>(f: impl FnOnce(&mut Option<Stage>) -> R) -> Option<R> {
    SLOT.try_with(|s| {
        let mut s = s.try_borrow_mut().ok()?;
        if s.depth == 0 {
            return None;
        }
        Some(f(&mut s.stage))
    })
    .ok()
    .flatten()
}

/// Flushes a run if this thread holds one (invariant 1).
pub(super) fn flush() {
    if let Some(Some(stage)) = with(Option::take) {
        stage.flush();
    }
}

/// Wraps a future so that sends made while it is polled are staged per
/// thread and flushed when each poll returns (see the module docs). Actor
/// tasks run this way; wrap a task that streams messages from a [`Proc`]
/// (`crate::Proc`) in it to get the same batching.
pub fn batched<F: Future>(inner: F) -> Batched<F> {
    Batched {
        inner: Box::pin(inner),
    }
}

/// A future whose polls stage sends (see [`batched`]).
#[must_use = "futures do nothing unless polled"]
pub struct Batched<F> {
    inner: Pin<Box<F>>,
}

impl<F> std::fmt::Debug for Batched<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Batched")
    }
}

/// Leaves the scope (also on unwind): the outermost exit flushes.
struct Exit;

impl Drop for Exit {
    fn drop(&mut self) {
        let stage = SLOT
            .try_with(|s| {
                let mut s = s.try_borrow_mut().ok()?;
                s.depth = s.depth.saturating_sub(1);
                if s.depth == 0 { s.stage.take() } else { None }
            })
            .ok()
            .flatten();
        if let Some(stage) = stage {
            stage.flush();
        }
    }
}

impl<F: Future> Future for Batched<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let entered = SLOT
            .try_with(|s| match s.try_borrow_mut() {
                Ok(mut s) => {
                    s.depth += 1;
                    true
                }
                Err(_) => false,
            })
            .unwrap_or(false);
        let _exit = entered.then_some(Exit);
        self.inner.as_mut().poll(cx)
    }
}
