//! An actor's mailbox: a queue of signals bounded in *messages*, so a reader
//! can hand a whole batch of envelopes to an actor in one wake-up.
//!
//! Invariants:
//! 1. At most `capacity` messages wait in the queue (a batch of n counts n);
//!    a sender waits for room (backpressure), and a batch larger than the
//!    capacity is handed over in parts.
//! 2. A permit comes back when the actor takes a message out to handle it;
//!    within a batch, in bulk (every 32 messages and at the batch's last),
//!    so at most 31 slots stay reserved for messages already taken.
//! 3. Once closed (the actor stopped), every send fails and gives its
//!    signal back, so nothing queued after the end goes unreported.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc};

use super::run::Signal;
use crate::channel::{Arrivals, Envelope};

/// The sending side (cheap to clone).
#[derive(Clone)]
pub(crate) struct Mailbox {
    tx: mpsc::UnboundedSender<Signal>,
    space: Arc<Semaphore>,
    capacity: usize,
}

/// The actor's side.
pub(crate) struct MailboxRx {
    rx: mpsc::UnboundedReceiver<Signal>,
    space: Arc<Semaphore>,
    /// Messages of a batch not yet handed out.
    batch: VecDeque<Arrivals>,
    /// Messages taken out whose permits have not been returned yet.
    owed: usize,
}

/// Permits are returned at least every this many messages.
const RETURN_EVERY: usize = 32;

/// A mailbox for `capacity` messages.
pub(crate) fn mailbox(capacity: usize) -> (Mailbox, MailboxRx) {
    let capacity = capacity.clamp(1, Semaphore::MAX_PERMITS);
    let (tx, rx) = mpsc::unbounded_channel();
    let space = Arc::new(Semaphore::new(capacity));
    (
        Mailbox {
            tx,
            space: space.clone(),
            capacity,
        },
        MailboxRx {
            rx,
            space,
            batch: VecDeque::new(),
            owed: 0,
        },
    )
}

impl Mailbox {
    /// Queues one signal, waiting for room; gives it back if the actor
    /// stopped.
    pub(crate) async fn send(&self, sig: Signal) -> Result<(), Signal> {
        match self.space.acquire().await {
            Ok(p) => p.forget(),
            Err(_) => return Err(sig),
        }
        self.tx.send(sig).map_err(|e| e.0)
    }

    /// Queues one signal if there is room now.
    pub(crate) fn try_send(&self, sig: Signal) -> Result<(), Signal> {
        match self.space.try_acquire() {
            Ok(p) => p.forget(),
            Err(_) => return Err(sig),
        }
        self.tx.send(sig).map_err(|e| e.0)
    }

    /// Queues a batch of messages in order (in parts of at most the
    /// capacity), waiting for room; gives back the ones not queued if the
    /// actor stopped.
    pub(crate) async fn send_batch(&self, mut runs: Vec<Arrivals>) -> Result<(), Vec<Arrivals>> {
        let mut runs_iter = std::mem::take(&mut runs).into_iter();
        let mut carry: Option<Arrivals> = None;
        loop {
            // The next part: whole runs while they fit, splitting the one
            // that does not.
            let mut part = Vec::new();
            let mut n = 0;
            while n < self.capacity {
                let Some(mut run) = carry.take().or_else(|| runs_iter.next()) else {
                    break;
                };
                if n + run.len() > self.capacity {
                    carry = Some(run.split_off(self.capacity - n));
                }
                n += run.len();
                part.push(run);
            }
            if part.is_empty() {
                return Ok(());
            }
            let permits = match self.space.try_acquire_many(n as u32) {
                Ok(p) => Ok(p),
                Err(tokio::sync::TryAcquireError::Closed) => Err(()),
                Err(tokio::sync::TryAcquireError::NoPermits) => {
                    self.space.acquire_many(n as u32).await.map_err(|_| ())
                }
            };
            let sent = match permits {
                Ok(p) => {
                    p.forget();
                    self.tx.send(Signal::Batch(part)).map_err(|e| match e.0 {
                        Signal::Batch(part) => part,
                        _ => Vec::new(),
                    })
                }
                Err(()) => Err(part),
            };
            if let Err(mut back) = sent {
                back.extend(carry);
                back.extend(runs_iter);
                return Err(back);
            }
        }
    }
}

/// What the actor takes out of its mailbox.
pub(crate) enum Next {
    /// A message; with the block that the payloads of the [`Next::Repeat`]s
    /// following it are ranges of, if any follow.
    Message(Envelope, Option<bytes::Bytes>),
    /// The payload of a message with the same header as the message taken
    /// just before it: a range of that message's block.
    Repeat(std::ops::Range<usize>),
    Child(Box<crate::supervision::SupervisionEvent>),
    Stop(String),
}

impl MailboxRx {
    /// The next message or signal; `None` when every sender is gone.
    pub(crate) async fn recv(&mut self) -> Option<Next> {
        loop {
            if let Some(next) = self.pop_batch(true) {
                return Some(next);
            }
            let sig = self.rx.recv().await?;
            if let Some(next) = self.unpack(sig) {
                return Some(next);
            }
        }
    }

    /// The next message or signal if one is queued.
    pub(crate) fn try_recv(&mut self) -> Option<Next> {
        loop {
            if let Some(next) = self.pop_batch(false) {
                return Some(next);
            }
            let sig = self.rx.try_recv().ok()?;
            if let Some(next) = self.unpack(sig) {
                return Some(next);
            }
        }
    }

    /// The next message of the batch: with `repeats`, a message after the
    /// first of its run comes as [`Next::Repeat`] (no header copied).
    fn pop_batch(&mut self, repeats: bool) -> Option<Next> {
        let next = loop {
            let run = self.batch.front_mut()?;
            if repeats && let Some(r) = run.repeat() {
                break Next::Repeat(r);
            }
            match run.next() {
                Some(env) => {
                    let block = (repeats && run.len() > 0).then(|| run.block().clone());
                    break Next::Message(env, block);
                }
                None => {
                    self.batch.pop_front();
                }
            }
        };
        if self.batch.front().is_some_and(|r| r.len() == 0) {
            self.batch.pop_front();
        }
        self.owed += 1;
        if self.batch.is_empty() || self.owed >= RETURN_EVERY {
            self.return_permits();
        }
        Some(next)
    }

    /// The payload range of the next message if it repeats the header of
    /// the message taken just before it (the rest of a run, taken by the
    /// actor's per-type loop without going back to [`MailboxRx::recv`]).
    pub(crate) fn next_repeat(&mut self) -> Option<std::ops::Range<usize>> {
        let run = self.batch.front_mut()?;
        let range = run.repeat()?;
        if run.len() == 0 {
            self.batch.pop_front();
        }
        self.owed += 1;
        if self.batch.is_empty() || self.owed >= RETURN_EVERY {
            self.return_permits();
        }
        Some(range)
    }

    fn return_permits(&mut self) {
        if self.owed > 0 {
            self.space.add_permits(self.owed);
            self.owed = 0;
        }
    }

    fn unpack(&mut self, sig: Signal) -> Option<Next> {
        self.owed += 1;
        match sig {
            Signal::Message(env) => {
                self.return_permits();
                Some(Next::Message(*env, None))
            }
            Signal::Batch(runs) => {
                // One permit per message: the first is counted by
                // `pop_batch`.
                self.owed -= 1;
                self.batch.extend(runs);
                self.pop_batch(true)
            }
            Signal::Child(e) => {
                self.return_permits();
                Some(Next::Child(e))
            }
            Signal::Stop(r) => {
                self.return_permits();
                Some(Next::Stop(r))
            }
        }
    }

    /// Refuses every later send (invariant 3); what is queued stays for
    /// [`MailboxRx::try_recv`].
    pub(crate) fn close(&mut self) {
        self.space.close();
        self.rx.close();
    }
}
