//! A link's outgoing queue: envelopes grouped in runs that share a header
//! (the messages after a run's head framed as they are queued), bounded in
//! messages and in large-payload bytes, taken whole by the link task.
//!
//! Invariants:
//! 1. At most `capacity` messages and, beyond the first message,
//!    [`QUEUE_BYTES`] of run-head payloads are queued; a sender waits for
//!    room (`push`) and is woken when the link task takes.
//! 2. A message joins the last run only if it has the same header (no
//!    error, same sender, destination and reply port), so writing a run's
//!    head followed by its frames reproduces the order and the headers of
//!    the messages queued.
//! 3. The link task is woken only after it said, under the lock, that it is
//!    idle: a busy stream costs senders no wake-up.
//! 4. A thread's staged run (see `stage`) is appended whole, even beyond
//!    `capacity`: a stage starts only while the queue has room and holds
//!    at most `capacity` messages, so the queue exceeds its bound by at
//!    most one stage per sending thread.

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::BytesMut;
use tokio::sync::Notify;

use super::Envelope;
use super::frame;
use crate::id::{ActorId, PortId};

/// Senders wait while a link's queue holds this many payload bytes, so
/// large messages queue megabytes, not gigabytes (`queue_capacity` counts
/// messages whatever their size).
pub(super) const QUEUE_BYTES: usize = 4 << 20;

/// Messages of one run after its head are framed as they are queued, with
/// the header elided, when their payload is at most this large...
pub(super) const RUN_PAYLOAD_MAX: usize = 4 * 1024;
/// ...until the run's frames reach this many bytes.
pub(super) const RUN_BYTES: usize = 32 * 1024;

/// Queued envelopes that share one header (sender, destination, reply
/// port): the first as an envelope, the others already framed with the
/// header elided. A stream of messages from one sender to one actor crosses
/// from the sending task to the link task with no per-message allocation
/// and no per-message reference counting.
pub(super) struct SharedHeaderRun {
    pub(super) head: Envelope,
    /// Frames of the messages after the head (header elided).
    pub(super) frames: BytesMut,
    /// How many messages `frames` holds.
    pub(super) more: usize,
}

impl SharedHeaderRun {
    pub(super) fn new(head: Envelope) -> Self {
        SharedHeaderRun {
            head,
            frames: BytesMut::new(),
            more: 0,
        }
    }

    /// A run of `count` messages from `sender` to `dest` framed by
    /// [`frame::encode_repeat_with`]: the first becomes the head.
    fn from_frames(sender: &ActorId, dest: &PortId, mut frames: BytesMut, count: usize) -> Self {
        let payload = frame::split_repeat(&mut frames);
        SharedHeaderRun {
            head: Envelope {
                sender: sender.clone(),
                dest: dest.clone(),
                reply_to: None,
                error: None,
                payload,
            },
            frames,
            more: count.saturating_sub(1),
        }
    }

    pub(super) fn len(&self) -> usize {
        1 + self.more
    }

    /// Whether messages from `sender` to handler port `port` of `dest` may
    /// follow this run's head with the header elided.
    fn repeats(&self, sender: &ActorId, dest: &ActorId, port: u64) -> bool {
        let h = &self.head;
        h.error.is_none()
            && h.reply_to.is_none()
            && h.dest.index() == port
            && h.dest.actor() == dest
            && &h.sender == sender
    }

    /// Appends `env`'s frame if it shares the head's header (`Ok`: what is
    /// left of `env`, to drop); else gives it back.
    #[allow(clippy::result_large_err)]
    fn join(&mut self, env: Envelope, max_frame: usize) -> Result<Envelope, Envelope> {
        if !self.fits(env.payload.len(), max_frame) || !frame::same_header(&self.head, &env) {
            return Err(env);
        }
        self.append(&env.payload);
        Ok(env)
    }

    /// Whether a payload of `len` bytes may join the run (header aside).
    fn fits(&self, len: usize, max_frame: usize) -> bool {
        self.frames.len() < RUN_BYTES
            && len <= RUN_PAYLOAD_MAX
            && self.head.payload.len() <= RUN_PAYLOAD_MAX
            && 4 + len <= max_frame
    }

    fn append(&mut self, payload: &[u8]) {
        self.append_with(|buf| {
            buf.extend_from_slice(payload);
            true
        });
    }

    /// Appends a frame whose payload `encode` writes; `false` (and nothing
    /// appended) if it fails.
    fn append_with(&mut self, encode: impl FnOnce(&mut BytesMut) -> bool) -> bool {
        if self.more == 0 {
            // Room for a run of small messages, allocated once.
            self.frames.reserve(RUN_BYTES / 4);
        }
        if !frame::encode_repeat_with(&mut self.frames, encode) {
            return false;
        }
        self.more += 1;
        true
    }

    /// The run as envelopes, to bounce: the messages after the head carry
    /// its header and no payload (a bounce reports only where a message
    /// went).
    pub(super) fn into_envelopes(self) -> impl Iterator<Item = Envelope> {
        let copies = (0..self.more).map({
            let h = self.head.clone();
            move |_| Envelope {
                payload: bytes::Bytes::new(),
                ..h.clone()
            }
        });
        std::iter::once(self.head).chain(copies)
    }
}

/// A link's outgoing queue: senders push, the link task takes everything
/// queued at once. One lock per message on the sending side, and a wake-up
/// only when the link task is idle (it says so under the lock), so a busy
/// stream costs no per-message atomics beyond the lock.
pub(super) struct LinkQueue {
    items: Mutex<QueueItems>,
    /// Wakes the link task (used only when it said it is idle).
    pub(super) ready: Notify,
    /// Wakes senders waiting for room.
    room: Notify,
    capacity: usize,
    max_frame: usize,
}

#[derive(Default)]
struct QueueItems {
    runs: VecDeque<SharedHeaderRun>,
    /// Messages in `runs` (at most `capacity`).
    len: usize,
    /// Payload bytes of the runs' heads (large messages are always heads).
    bytes: usize,
    closed: bool,
    /// The link task is waiting for `ready`.
    idle: bool,
    /// Senders wait for room.
    waiting: bool,
}

impl QueueItems {
    /// No room for another message: `capacity` messages, or
    /// [`QUEUE_BYTES`] of large payloads (one message always fits).
    fn full(&self, capacity: usize) -> bool {
        self.len >= capacity || (self.len > 0 && self.bytes >= QUEUE_BYTES)
    }
}

/// Why a push failed; the envelope comes back.
pub(super) enum PushError {
    Full(Envelope),
    Closed(Envelope),
}

impl LinkQueue {
    pub(super) fn new(capacity: usize, max_frame: usize) -> Self {
        LinkQueue {
            items: Mutex::new(QueueItems::default()),
            ready: Notify::new(),
            room: Notify::new(),
            capacity: capacity.max(1),
            max_frame,
        }
    }

    fn items(&self) -> std::sync::MutexGuard<'_, QueueItems> {
        self.items.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `env` if there is room now.
    pub(super) fn try_push(&self, env: Envelope) -> Result<(), PushError> {
        let (joined, wake) = {
            let mut items = self.items();
            if items.closed {
                return Err(PushError::Closed(env));
            }
            if items.full(self.capacity) {
                items.waiting = true;
                return Err(PushError::Full(env));
            }
            items.len += 1;
            let env = match items.runs.back_mut() {
                Some(run) => run.join(env, self.max_frame),
                None => Err(env),
            };
            let joined = match env {
                Ok(joined) => Some(joined),
                Err(env) => {
                    items.bytes += env.payload.len();
                    items.runs.push_back(SharedHeaderRun::new(env));
                    None
                }
            };
            (joined, std::mem::take(&mut items.idle))
        };
        // A joined envelope is dropped here, outside the lock (its ids were
        // cloned on this thread: no cache line crosses to the link task).
        drop(joined);
        if wake {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// Appends a message to the last run if it has the same header (see
    /// [`Transport::try_repeat`]) and there is room now.
    pub(super) fn try_repeat(
        &self,
        sender: &ActorId,
        dest: &ActorId,
        port: u64,
        len: usize,
        encode: impl FnOnce(&mut BytesMut) -> bool,
    ) -> bool {
        let wake = {
            let mut items = self.items();
            if items.closed || items.full(self.capacity) {
                return false;
            }
            let Some(run) = items.runs.back_mut() else {
                return false;
            };
            if !(run.repeats(sender, dest, port) && run.fits(len, self.max_frame)) {
                return false;
            }
            if !run.append_with(encode) {
                return false;
            }
            items.len += 1;
            std::mem::take(&mut items.idle)
        };
        if wake {
            self.ready.notify_one();
        }
        true
    }

    /// Messages queued before senders wait.
    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether a message may be queued now (open and not full).
    pub(super) fn has_room(&self) -> bool {
        let items = self.items();
        !items.closed && !items.full(self.capacity)
    }

    /// Appends a thread's staged run: `count` messages from `sender` to
    /// `dest`, framed by [`frame::encode_repeat_with`] (invariant 4). A
    /// closed queue gives them back as a run, to bounce.
    pub(super) fn push_frames(
        &self,
        sender: &ActorId,
        dest: &PortId,
        frames: BytesMut,
        count: usize,
    ) -> Result<(), Box<SharedHeaderRun>> {
        if count == 0 {
            return Ok(());
        }
        let wake = {
            let mut items = self.items();
            if items.closed {
                return Err(Box::new(SharedHeaderRun::from_frames(
                    sender, dest, frames, count,
                )));
            }
            items.len += count;
            // Joins the last run when that moves no bytes or few (a
            // whole staged run becomes a run of its own instead: the link
            // elides its head's header anyway, as it repeats).
            match items.runs.back_mut() {
                Some(run)
                    if run.repeats(sender, dest.actor(), dest.index())
                        && run.head.payload.len() <= RUN_PAYLOAD_MAX
                        && (run.frames.is_empty()
                            || (frames.len() <= RUN_PAYLOAD_MAX
                                && run.frames.len() + frames.len() <= RUN_BYTES)) =>
                {
                    if run.frames.is_empty() {
                        run.frames = frames;
                    } else {
                        run.frames.extend_from_slice(&frames);
                    }
                    run.more += count;
                }
                _ => {
                    let run = SharedHeaderRun::from_frames(sender, dest, frames, count);
                    items.bytes += run.head.payload.len();
                    items.runs.push_back(run);
                }
            }
            std::mem::take(&mut items.idle)
        };
        if wake {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// Queues `env`, waiting for room; gives it back if the queue closed.
    #[allow(clippy::result_large_err)]
    pub(super) async fn push(&self, mut env: Envelope) -> Result<(), Envelope> {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            // Registered before trying, so a take in between is not missed.
            room.as_mut().enable();
            match self.try_push(env) {
                Ok(()) => return Ok(()),
                Err(PushError::Closed(back)) => return Err(back),
                Err(PushError::Full(back)) => env = back,
            }
            room.await;
        }
    }

    /// Moves whole runs to the back of `into` while they fit in `room`
    /// messages (at least one run when `must` is set); returns how many
    /// messages. With nothing to take, marks the link task idle (it waits
    /// for `ready` next).
    pub(super) fn take(
        &self,
        into: &mut VecDeque<SharedHeaderRun>,
        room: usize,
        must: bool,
    ) -> usize {
        let (n, wake) = {
            let mut items = self.items();
            let mut n = 0;
            if into.is_empty() && items.len <= room {
                std::mem::swap(&mut items.runs, into);
                n = std::mem::take(&mut items.len);
                items.bytes = 0;
            }
            while let Some(run) = items.runs.front() {
                if n + run.len() > room && !(must && n == 0) {
                    break;
                }
                n += run.len();
                if let Some(run) = items.runs.pop_front() {
                    items.len -= run.len();
                    items.bytes -= run.head.payload.len();
                    into.push_back(run);
                }
            }
            items.idle = items.len == 0;
            (n, n > 0 && std::mem::take(&mut items.waiting))
        };
        if wake {
            self.room.notify_waiters();
        }
        n
    }

    /// Marks the link task idle if nothing is queued (`None`); else
    /// returns the length of the first queued run (take it instead of
    /// waiting, if it fits).
    pub(super) fn set_idle(&self) -> Option<usize> {
        let mut items = self.items();
        items.idle = items.len == 0;
        items.runs.front().map(SharedHeaderRun::len)
    }

    /// Everything queued now (to bounce when the peer is unreachable).
    pub(super) fn drain_all(&self) -> VecDeque<SharedHeaderRun> {
        let q = {
            let mut items = self.items();
            items.len = 0;
            items.bytes = 0;
            items.waiting = false;
            std::mem::take(&mut items.runs)
        };
        self.room.notify_waiters();
        q
    }

    /// Refuses further pushes; returns what was queued.
    pub(super) fn close(&self) -> VecDeque<SharedHeaderRun> {
        let q = {
            let mut items = self.items();
            items.closed = true;
            items.len = 0;
            items.bytes = 0;
            std::mem::take(&mut items.runs)
        };
        self.room.notify_waiters();
        q
    }
}
