//! The reader of one connection: frames read into reused buffers (large
//! frames into buffers of their own size), acknowledgements counted, and
//! envelopes handed to the proc in batches per actor.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tracing::warn;

use super::Envelope;
use super::frame::{self, Arrivals, Frame};
use crate::id::ProcId;
use crate::port::OPEN_PORT_BIT;

use super::link::{BoxRead, ConnShared};
use super::transport::Inbound;

/// Smallest and largest read step: a connection that carries a heartbeat
/// a second keeps a page-sized buffer, one that streams reads 64 KiB at a
/// time (a supervisor holds a connection per agent: thousands of them).
const READ_MIN: usize = 4 * 1024;
const READ_MAX: usize = 64 * 1024;
/// At most this many envelopes are handed to an actor in one batch.
const MAX_BATCH: usize = 1024;

/// The task reading one connection.
pub(super) struct Reader<I: Inbound> {
    pub(super) inbound: Weak<I>,
    pub(super) local: ProcId,
    pub(super) peer: ProcId,
    pub(super) max_frame: usize,
    pub(super) shared: Arc<ConnShared>,
}

impl<I: Inbound> Reader<I> {
    pub(super) async fn run(self, mut rd: BoxRead, mut buf: BytesMut) {
        let mut received: u64 = 0;
        let mut last_header = None;
        // The header of the last envelope for one of this proc's actors,
        // while the frames that follow may repeat it.
        let mut template: Option<Envelope> = None;
        // Envelopes for one actor, handed over in one wake-up.
        let mut batch = Batch::default();
        // Buffers of large frames, reused once their payloads are dropped
        // (no page faults from a fresh megabyte per frame).
        let mut large_bufs = crate::bufpool::BufPool::default();
        // The read step: doubled after a read that filled the room it was
        // given, halved after one that used little of it.
        let mut chunk = READ_MIN;
        loop {
            let before = received;
            loop {
                if let Some(t) = &template
                    && let Some(run) = frame::take_repeats(&mut buf, self.max_frame, t)
                {
                    received += run.len() as u64;
                    if !self.push(&mut batch, run).await {
                        return;
                    }
                    continue;
                }
                let frame = match frame::decode(&mut buf, self.max_frame, &mut last_header) {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(e) => return self.fail(e.to_string()),
                };
                match self.on_frame(frame, &mut batch, &mut template).await {
                    Ok(n) => received += n,
                    Err(reason) => return self.fail(reason),
                }
            }
            if !self.flush(&mut batch).await {
                return;
            }
            if received > before {
                self.shared.received.store(received, Ordering::Release);
                self.shared.wake.notify_one();
            }
            if let Some(len) = frame::pending_large(&buf) {
                // Read a large frame straight into a buffer of its size.
                let total = frame::HEADER_LEN + len;
                let large = large_bufs.get(total);
                large.extend_from_slice(&buf);
                buf.clear();
                let mut rest = (&mut rd).take((total - large.len()) as u64);
                let read = async {
                    while large.len() < total {
                        if rest.read_buf(large).await? == 0 {
                            return Err(std::io::ErrorKind::UnexpectedEof.into());
                        }
                    }
                    Ok::<(), std::io::Error>(())
                };
                tokio::select! {
                    r = read => if let Err(e) = r {
                        self.shared.close(format!("read failed: {e}"));
                        return;
                    },
                    _ = self.shared.closed.cancelled() => return,
                }
                let frame = match frame::decode(large, self.max_frame, &mut last_header) {
                    Ok(Some(f)) => f,
                    Ok(None) => return self.fail("incomplete large frame".into()),
                    Err(e) => return self.fail(e.to_string()),
                };
                match self.on_frame(frame, &mut batch, &mut template).await {
                    Ok(n) => received += n,
                    Err(reason) => return self.fail(reason),
                }
                continue;
            }
            if buf.is_empty() && buf.capacity() > 2 * chunk {
                // A burst is over: give its buffer back.
                buf = BytesMut::with_capacity(chunk);
            }
            if buf.capacity() - buf.len() < chunk / 4 {
                buf.reserve(chunk);
            }
            let room = buf.capacity() - buf.len();
            tokio::select! {
                r = rd.read_buf(&mut buf) => match r {
                    Ok(0) => {
                        self.shared.close("peer closed the connection".into());
                        return;
                    }
                    Ok(n) if n >= room => chunk = (chunk * 2).min(READ_MAX),
                    Ok(n) if n < chunk / 8 => chunk = (chunk / 2).max(READ_MIN),
                    Ok(_) => {}
                    Err(e) => {
                        self.shared.close(format!("read failed: {e}"));
                        return;
                    }
                },
                _ = self.shared.closed.cancelled() => return,
            }
        }
    }

    /// Handles one decoded frame; returns the number of envelopes it
    /// carried. Envelopes for actors collect in `batch`; others are
    /// delivered at once, in order.
    async fn on_frame(
        &self,
        frame: Frame,
        batch: &mut Batch,
        template: &mut Option<Envelope>,
    ) -> Result<u64, String> {
        match frame {
            Frame::Envelope(env) => {
                *template = None;
                if env.dest.actor().proc() != &self.local {
                    let Some(inbound) = self.inbound.upgrade() else {
                        return Err("proc dropped".into());
                    };
                    let reason = format!(
                        "{} reached proc {} by mistake",
                        env.dest.actor().proc(),
                        self.local
                    );
                    inbound.bounce(env, reason);
                } else if env.dest.index() & OPEN_PORT_BIT != 0 {
                    if !self.flush(batch).await {
                        return Err("proc dropped".into());
                    }
                    let Some(inbound) = self.inbound.upgrade() else {
                        return Err("proc dropped".into());
                    };
                    inbound.deliver(env).await;
                } else {
                    if env.error.is_none() {
                        *template = Some(Envelope {
                            payload: bytes::Bytes::new(),
                            ..env.clone()
                        });
                    }
                    if !self.push(batch, Arrivals::one(env)).await {
                        return Err("proc dropped".into());
                    }
                }
                Ok(1)
            }
            Frame::Ack(n) => {
                self.shared.acked.store(n, Ordering::Release);
                self.shared.wake.notify_one();
                Ok(0)
            }
            Frame::Hello(_) => Err("unexpected handshake frame after the handshake".into()),
        }
    }

    /// Adds `run` to the batch, first handing the batch over if it goes to
    /// another actor or is full; `false` when the proc is gone.
    async fn push(&self, batch: &mut Batch, run: Arrivals) -> bool {
        let other = batch
            .runs
            .last()
            .is_some_and(|l| l.dest().actor() != run.dest().actor());
        if (other || batch.len >= MAX_BATCH) && !self.flush(batch).await {
            return false;
        }
        batch.len += run.len();
        batch.runs.push(run);
        true
    }

    /// Hands the batch to its actor; `false` when the proc is gone.
    async fn flush(&self, batch: &mut Batch) -> bool {
        if batch.runs.is_empty() {
            return true;
        }
        let Some(inbound) = self.inbound.upgrade() else {
            self.shared.close("proc dropped".into());
            return false;
        };
        batch.len = 0;
        inbound.deliver_batch(std::mem::take(&mut batch.runs)).await;
        true
    }

    fn fail(&self, reason: String) {
        warn!(proc = %self.local, peer = %self.peer, %reason, "closing connection");
        self.shared.close(reason);
    }
}

/// Envelopes read for one actor, not handed over yet.
#[derive(Default)]
struct Batch {
    runs: Vec<Arrivals>,
    /// Envelopes in `runs`.
    len: usize,
}
