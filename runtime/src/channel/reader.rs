//! The reader of one connection: frames read into reused buffers (large
//! frames into buffers of their own size), opened in place when the
//! connection is sealed (large records likewise), acknowledgements
//! counted, and envelopes handed to the proc in batches per actor.
//!
//! Invariant 1: on a connection whose peer proved its proc name with a
//! proc credential (`handshake` invariant 8), every envelope but a return
//! names a sender of that peer proc; one that names another closes the
//! connection. So a handler that reads its message's sender
//! ([`crate::Context::sender`]) reads who sent it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tracing::warn;

use super::Envelope;
use super::frame::{self, Arrivals, Frame};
use super::seal::Opener;
use crate::id::ProcId;
use crate::port::OPEN_PORT_BIT;

use super::link::{BoxRead, ConnShared};
use super::transport::Inbound;

/// Smallest and largest read step: a connection that carries a heartbeat
/// now and then keeps a kilobyte (a sealed heartbeat is a few hundred
/// bytes), one that streams reads 64 KiB at a time (a supervisor holds two
/// connections per agent: tens of thousands of them at 10,000 hosts).
const READ_MIN: usize = 1024;
const READ_MAX: usize = 64 * 1024;
/// At most this many envelopes are handed to an actor in one batch.
const MAX_BATCH: usize = 1024;

/// The task reading one connection.
pub(super) struct Reader<I: Inbound> {
    pub(super) inbound: Weak<I>,
    pub(super) local: ProcId,
    pub(super) peer: ProcId,
    /// The peer proved its proc name with a proc credential: every message
    /// it sends must name a sender of its own proc (invariant 1).
    pub(super) attested: bool,
    pub(super) max_frame: usize,
    pub(super) shared: Arc<ConnShared>,
}

impl<I: Inbound> Reader<I> {
    /// Reads the connection until it closes. `left`: bytes read past the
    /// handshake; `opener`: the record layer, if the connection is sealed.
    pub(super) async fn run(self, mut rd: BoxRead, left: BytesMut, mut opener: Option<Opener>) {
        // Sealed, `raw` holds what was read and `buf` the opened frames;
        // in the clear, `buf` is both.
        let (mut buf, mut raw) = match opener {
            Some(_) => (BytesMut::new(), left),
            None => (left, BytesMut::new()),
        };
        let mut received: u64 = 0;
        let mut last_header = None;
        // The header of the last envelope for one of this proc's actors,
        // while the frames that follow may repeat it.
        let mut template: Option<Envelope> = None;
        // Envelopes for one actor, handed over in one wake-up.
        let mut batch = Batch::default();
        // Buffers of large frames (or records), reused once their payloads
        // are dropped (no page faults from a fresh megabyte per frame).
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
            if let Some(op) = opener.as_mut() {
                let opened = self
                    .open_next(op, &mut rd, &mut raw, &mut large_bufs, &mut chunk)
                    .await;
                match opened {
                    Ok(frames) if buf.is_empty() => buf = frames,
                    // Only a batch cut into several records splits a frame.
                    Ok(frames) => buf.extend_from_slice(&frames),
                    Err(Stop::Fail(reason)) => return self.fail(reason),
                    Err(Stop::Closed) => return,
                }
                continue;
            }
            if let Some(len) = frame::pending_large(&buf) {
                // Read a large frame straight into a buffer of its size.
                let total = frame::HEADER_LEN + len;
                let large = large_bufs.get(total);
                large.extend_from_slice(&buf);
                buf.clear();
                if self.read_to(&mut rd, large, total).await.is_err() {
                    return;
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
            if self.read_some(&mut rd, &mut buf, &mut chunk).await.is_err() {
                return;
            }
        }
    }

    /// Reads until the next record is complete and opens it (invariant 3
    /// of `seal`: nothing of it is used before its tag checked out); a
    /// large record is read into a buffer of its size.
    async fn open_next(
        &self,
        op: &mut Opener,
        rd: &mut BoxRead,
        raw: &mut BytesMut,
        large_bufs: &mut crate::bufpool::BufPool,
        chunk: &mut usize,
    ) -> Result<BytesMut, Stop> {
        loop {
            let len = op.record_len(raw).map_err(|e| Stop::Fail(e.to_string()))?;
            let record = match len {
                Some(len) if raw.len() >= len => raw.split_to(len),
                Some(len) if len >= frame::LARGE_FRAME => {
                    let large = large_bufs.get(len);
                    large.extend_from_slice(raw);
                    raw.clear();
                    self.read_to(rd, large, len).await?;
                    large.split()
                }
                _ => {
                    if let Some(len) = len {
                        raw.reserve(len - raw.len());
                    }
                    self.read_some(rd, raw, chunk).await?;
                    continue;
                }
            };
            return op.open(record).map_err(|e| Stop::Fail(e.to_string()));
        }
    }

    /// Reads into `large` until it holds `total` bytes.
    async fn read_to(
        &self,
        rd: &mut BoxRead,
        large: &mut BytesMut,
        total: usize,
    ) -> Result<(), Stop> {
        let mut rest = rd.take((total - large.len()) as u64);
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
                return Err(Stop::Closed);
            },
            _ = self.shared.closed.cancelled() => return Err(Stop::Closed),
        }
        Ok(())
    }

    /// One read into `buf`, adapting the read step `chunk`.
    async fn read_some(
        &self,
        rd: &mut BoxRead,
        buf: &mut BytesMut,
        chunk: &mut usize,
    ) -> Result<(), Stop> {
        if buf.is_empty() && buf.capacity() > 2 * *chunk {
            // A burst is over: give its buffer back.
            *buf = BytesMut::with_capacity(*chunk);
        }
        if buf.capacity() - buf.len() < *chunk / 4 {
            buf.reserve(*chunk);
        }
        let room = buf.capacity() - buf.len();
        tokio::select! {
            r = rd.read_buf(buf) => match r {
                Ok(0) if buf.is_empty() => {
                    self.shared.close("peer closed the connection".into());
                    Err(Stop::Closed)
                }
                Ok(0) => {
                    self.shared.close(format!(
                        "peer closed the connection in the middle of a frame or record ({} bytes of it read): cut short",
                        buf.len()
                    ));
                    Err(Stop::Closed)
                }
                Ok(n) => {
                    if n >= room {
                        *chunk = (*chunk * 2).min(READ_MAX);
                    } else if n < *chunk / 8 {
                        *chunk = (*chunk / 2).max(READ_MIN);
                    }
                    Ok(())
                }
                Err(e) => {
                    self.shared.close(format!("read failed: {e}"));
                    Err(Stop::Closed)
                }
            },
            _ = self.shared.closed.cancelled() => Err(Stop::Closed),
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
                // Invariant 1. (A return, an error envelope, names the
                // destination it could not reach as its sender.)
                if self.attested && env.error.is_none() && env.sender.proc() != &self.peer {
                    return Err(format!(
                        "{} sent a message as {}: a proc sends only as itself",
                        self.peer, env.sender
                    ));
                }
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

/// Why a read step stopped the reader.
enum Stop {
    /// The connection is closed (its reason recorded).
    Closed,
    /// The peer broke the protocol: close with this reason.
    Fail(String),
}

/// Envelopes read for one actor, not handed over yet.
#[derive(Default)]
struct Batch {
    runs: Vec<Arrivals>,
    /// Envelopes in `runs`.
    len: usize,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::port::handler_port;
    use crate::{Actor, ActorError, Context, Handler, Handlers, Issuer, Proc, ProcId};

    /// Answers with the message, the sender's proc name and how many
    /// messages it handled.
    #[derive(Default)]
    struct Who(u32);
    impl Actor for Who {
        fn register(h: &mut Handlers<Self>) {
            h.handle_sent::<String>();
        }
    }
    impl Handler<String> for Who {
        type Reply = String;
        async fn handle(&mut self, cx: &Context<Self>, m: String) -> Result<String, ActorError> {
            self.0 += 1;
            let from = cx.sender().map(|s| s.proc().name().to_owned());
            Ok(format!("{m} from {} #{}", from.unwrap_or_default(), self.0))
        }
    }

    /// Invariant 1: the handler reads the real sender, and a message naming
    /// another proc as its sender closes the connection undelivered.
    #[tokio::test]
    async fn a_signed_peer_sends_only_as_itself() {
        let issuer = Issuer::from_runtime_key(b"runtime key of the reader test..");
        let server = Proc::builder("server")
            .listen("tcp:127.0.0.1:0".parse().unwrap())
            .issued_by(issuer.clone())
            .build()
            .await
            .unwrap();
        let who = server.spawn("who", Who::default()).await.unwrap();
        let client = Proc::builder("client")
            .issued_by(issuer)
            .build()
            .await
            .unwrap();
        let t = Duration::from_secs(5);
        let hi = who.call(&client, &"hi".to_string(), t).await.unwrap();
        assert_eq!(hi, "hi from client #1");
        let forged = ProcId::new("tcp:10.0.0.9:1".parse().unwrap(), "admin")
            .unwrap()
            .actor("root", 0)
            .unwrap();
        let payload = postcard::to_allocvec(&"forged".to_string()).unwrap();
        client
            .post(
                &forged,
                who.id().port(handler_port::<String>()),
                None,
                payload.into(),
            )
            .await;
        // The next call goes after the forged message (one link, in order):
        // once it is answered, the forged one was read, and not handled.
        let mut again = None;
        for _ in 0..50 {
            match who.call(&client, &"again".to_string(), t).await {
                Ok(r) => {
                    again = Some(r);
                    break;
                }
                // The connection the forged message closed.
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        assert_eq!(again.as_deref(), Some("again from client #2"));
    }
}
