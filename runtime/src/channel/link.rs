//! Per-peer links: the task owning one peer's outgoing queue, writing runs
//! of envelopes on one connection with an unacknowledged window, redialing
//! with backoff, taking over a standby connection, and bouncing what could
//! not be delivered; and the connection halves it writes on.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::frame::{self};
use super::queue::{LinkQueue, SharedHeaderRun};
use super::seal::Sealer;
use super::{ChannelError, Envelope};
use crate::id::ProcId;
use crate::port::{OPEN_PORT_BIT, UNDELIVERABLE_PORT};

use super::transport::{Inbound, Transport};

pub(super) type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
pub(super) type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// Acks are sent at once after this many unacknowledged envelopes...
const ACK_EVERY: u64 = 1024;
/// ...or after this delay, whichever comes first (and always piggybacked on
/// outgoing data).
const ACK_DELAY: Duration = Duration::from_millis(2);
/// A write batch stops growing at this many bytes.
const BATCH_BYTES: usize = 256 * 1024;
/// A connection's write buffer when it is idle (a kilobyte: most of a
/// supervisor's connections carry a heartbeat now and then).
const WRITE_MIN: usize = 1024;
/// State shared by a connection's reader and writer.
pub(super) struct ConnShared {
    /// Envelopes received on this connection (what we ack).
    pub(super) received: AtomicU64,
    /// Envelopes the peer acknowledged.
    pub(super) acked: AtomicU64,
    /// Wakes the writer: acks to send or acks received.
    pub(super) wake: Notify,
    pub(super) closed: CancellationToken,
    pub(super) reason: Mutex<Option<String>>,
}

impl ConnShared {
    pub(super) fn close(&self, reason: String) {
        let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        if r.is_none() {
            *r = Some(reason);
        }
        self.closed.cancel();
    }

    fn reason(&self) -> String {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| "connection closed".into())
    }
}

/// The writing half of an established connection (its reader runs as a task).
pub(crate) struct Conn {
    pub(super) writer: BoxWrite,
    /// Seals what is written (`None`: frames in the clear). Boxed: a
    /// connection is handed to its link through a channel whose blocks hold
    /// 32 of them, and a sealer's key schedule would make each block
    /// 20 KB (an operator has a link per agent).
    pub(super) sealer: Option<Box<Sealer>>,
    pub(super) shared: Arc<ConnShared>,
    /// Dialed by this proc (else accepted from the peer).
    pub(super) outbound: bool,
}

/// A second connection to the same peer that the link does not write on:
/// its task reads and acknowledges, and gives the connection back when
/// asked (to take over if the link's connection fails).
pub(super) struct Secondary {
    release: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Option<Conn>>,
}

/// Envelopes written on a connection and not acknowledged yet: the head of
/// each run written, with the run's length.
type Unacked = VecDeque<(Envelope, usize)>;

/// The task owning one peer's queue.
pub(super) struct Link<I: Inbound> {
    pub(super) t: Arc<Transport<I>>,
    pub(super) peer: ProcId,
    pub(super) id: u64,
    pub(super) queue: Arc<LinkQueue>,
    pub(super) attach: mpsc::UnboundedReceiver<Conn>,
    pub(super) lost: watch::Sender<u64>,
    /// Taken from the queue, not yet written.
    pub(super) pending: VecDeque<SharedHeaderRun>,
    /// The newest connection the link does not write on, if any.
    pub(super) secondary: Option<Secondary>,
}

impl<I: Inbound> Link<I> {
    pub(super) async fn run(mut self, mut conn: Option<Conn>) {
        loop {
            if conn.is_none() && self.pending.is_empty() {
                if self.queue.set_idle().is_some() {
                    self.queue
                        .take(&mut self.pending, self.t.config.window.max(1), true);
                    continue;
                }
                tokio::select! {
                    biased;
                    _ = self.t.shutdown.cancelled() => return self.close("proc shut down"),
                    c = self.attach.recv() => conn = c,
                    _ = self.queue.ready.notified() => {
                        self.queue.take(&mut self.pending, self.t.config.window.max(1), true);
                    }
                }
            }
            if conn.is_none() && !self.pending.is_empty() {
                if !self.peer.addr().is_dialable() {
                    let reason = format!(
                        "no connection to {} and it has no dialable address",
                        self.peer
                    );
                    return self.close(&reason);
                }
                match self.dial_with_backoff().await {
                    Ok(c) => conn = Some(c),
                    Err(e) => {
                        let reason = format!("cannot reach {}: {e}", self.peer);
                        warn!(proc = %self.t.local, peer = %self.peer, %reason, "dropping queued messages as undeliverable");
                        let rest = self.queue.drain_all();
                        for env in self
                            .pending
                            .drain(..)
                            .chain(rest)
                            .flat_map(SharedHeaderRun::into_envelopes)
                        {
                            self.t.bounce(env, reason.clone());
                        }
                        continue;
                    }
                }
            }
            let Some(c) = conn.take() else { continue };
            let (reason, unacked, next) = self.run_connected(c).await;
            // A newer connection from the peer replaces this one; else a
            // secondary connection that is still open takes over.
            conn = match next {
                Some(c) => Some(c),
                None => self.take_secondary().await,
            };
            self.lost.send_modify(|g| *g += 1);
            let count: usize = unacked.iter().map(|(_, n)| n).sum();
            if count > 0 {
                warn!(proc = %self.t.local, peer = %self.peer, %reason, count, "connection lost with messages unacknowledged");
            } else {
                debug!(proc = %self.t.local, peer = %self.peer, %reason, "connection lost");
            }
            let why = format!("connection to {} lost: {reason}", self.peer);
            let mut port_msgs = 0usize;
            for (env, n) in unacked {
                if env.dest.index() & OPEN_PORT_BIT != 0 {
                    // Replies and pushes to opened ports (invariant 4).
                    port_msgs += n;
                } else {
                    let run = SharedHeaderRun {
                        head: env,
                        frames: BytesMut::new(),
                        more: n - 1,
                    };
                    for env in run.into_envelopes() {
                        self.t.bounce(env, why.clone());
                    }
                }
            }
            if port_msgs > 0 {
                warn!(proc = %self.t.local, peer = %self.peer, count = port_msgs, %reason,
                    "replies or port messages possibly lost with the connection; their receivers see the connection loss");
            }
            if self.t.shutdown.is_cancelled() {
                return self.close("proc shut down");
            }
            if conn.is_none() && !self.peer.addr().is_dialable() {
                return self.close(&why);
            }
        }
    }

    /// The secondary connection, if it is still open.
    async fn take_secondary(&mut self) -> Option<Conn> {
        let s = self.secondary.take()?;
        let _ = s.release.send(());
        s.task.await.ok().flatten()
    }

    /// Keeps `c` as the secondary connection (acknowledging only).
    fn set_secondary(&mut self, c: Conn) {
        let (release, rx) = oneshot::channel();
        let task = tokio::spawn(ack_only(c, rx));
        // An older secondary keeps acknowledging until it closes.
        self.secondary = Some(Secondary { release, task });
    }

    /// Removes the link and returns everything queued as undeliverable.
    pub(super) fn close(mut self, reason: &str) {
        self.t.remove_link(&self.peer, self.id);
        let rest = self.queue.close();
        for env in self
            .pending
            .drain(..)
            .chain(rest)
            .flat_map(SharedHeaderRun::into_envelopes)
        {
            self.t.bounce(env, reason.to_string());
        }
    }

    async fn dial_with_backoff(&mut self) -> Result<Conn, ChannelError> {
        let deadline = Instant::now() + self.t.config.reconnect_timeout;
        let mut delay = Duration::from_millis(20);
        loop {
            match self.t.dial_once(self.peer.addr()).await {
                Ok((found, conn)) if found == self.peer => return Ok(conn),
                Ok((found, _)) => {
                    return Err(ChannelError::WrongProc {
                        addr: self.peer.addr().to_string(),
                        wanted: self.peer.to_string(),
                        found: found.to_string(),
                    });
                }
                // Neither a refusal nor another wire version heals by retrying.
                Err(e @ (ChannelError::Auth(_) | ChannelError::Version { .. })) => return Err(e),
                Err(e) => {
                    if Instant::now() + delay > deadline {
                        return Err(e);
                    }
                    debug!(peer = %self.peer, error = %e, ?delay, "dial failed; retrying");
                }
            }
            // An inbound connection from the peer is as good as a dial.
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                c = self.attach.recv() => if let Some(c) = c { return Ok(c) },
            }
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }

    /// Writes queued envelopes over `conn` until it fails or the peer
    /// replaces it; returns the reason, the envelopes written but not
    /// acknowledged, and the replacing connection.
    async fn run_connected(&mut self, conn: Conn) -> (String, Unacked, Option<Conn>) {
        let Conn {
            mut writer,
            mut sealer,
            shared,
            outbound,
        } = conn;
        let window = self.t.config.window.max(1);
        let max_frame = self.t.config.max_frame_len;
        // Written, not yet acknowledged: each head with its run's length.
        let mut unacked: Unacked = VecDeque::new();
        let mut sent: u64 = 0;
        let mut acked: u64 = 0;
        let mut ack_sent: u64 = 0;
        let mut ack_deadline: Option<Instant> = None;
        let mut last_header = frame::LastHeader::default();
        let mut buf = BytesMut::with_capacity(WRITE_MIN);
        loop {
            let a = shared.acked.load(Ordering::Acquire);
            if a > sent {
                shared.close(format!(
                    "peer acknowledged {a} envelopes but only {sent} were sent"
                ));
            }
            let mut n = a.min(sent).saturating_sub(acked);
            while n > 0 {
                let Some(front) = unacked.front_mut() else {
                    break;
                };
                let k = front.1.min(n as usize);
                front.1 -= k;
                n -= k as u64;
                acked += k as u64;
                if front.1 == 0 {
                    unacked.pop_front();
                }
            }
            if shared.closed.is_cancelled() {
                return (shared.reason(), unacked, None);
            }
            // A large payload is written from the envelope, after `buf`.
            let mut tail: Option<bytes::Bytes> = None;
            let mut in_flight = (sent - acked) as usize;
            while in_flight < window && buf.len() < BATCH_BYTES && tail.is_none() {
                let Some(mut run) = self.pending.pop_front() else {
                    // Everything queued that fits the window, in one take.
                    let room = window - in_flight;
                    if self.queue.take(&mut self.pending, room, in_flight == 0) == 0 {
                        break;
                    }
                    continue;
                };
                let n = run.len();
                match frame::encode_envelope(&mut buf, &run.head, max_frame, &mut last_header) {
                    Ok(inline) => {
                        if !inline {
                            tail = Some(std::mem::take(&mut run.head.payload));
                        } else if run.head.dest.index() != UNDELIVERABLE_PORT {
                            // Written: only the header matters for a bounce
                            // (an undeliverable notice keeps its payload).
                            run.head.payload = bytes::Bytes::new();
                        }
                        // The rest of the run follows its head (only an
                        // inline head has followers).
                        buf.extend_from_slice(&run.frames);
                        unacked.push_back((run.head, n));
                        sent += n as u64;
                        in_flight += n;
                    }
                    Err(e) => {
                        let reason = e.to_string();
                        for env in run.into_envelopes() {
                            self.t.bounce(env, reason.clone());
                        }
                    }
                }
            }
            let r = shared.received.load(Ordering::Acquire);
            // Never put an ack between a frame header and its tail payload.
            if r > ack_sent && tail.is_none() {
                let due = ack_deadline.is_some_and(|d| d <= Instant::now());
                if !buf.is_empty() || r - ack_sent >= ACK_EVERY || due {
                    frame::encode_ack(&mut buf, r);
                    ack_sent = r;
                    ack_deadline = None;
                } else if ack_deadline.is_none() {
                    ack_deadline = Some(Instant::now() + ACK_DELAY);
                }
            }
            if !buf.is_empty() {
                let write =
                    write_batch(&mut writer, sealer.as_deref_mut(), &mut buf, tail.as_ref());
                tokio::select! {
                    res = write => if let Err(e) = res {
                        shared.close(e);
                        return (shared.reason(), unacked, None);
                    },
                    _ = shared.closed.cancelled() => return (shared.reason(), unacked, None),
                }
                buf.clear();
                if buf.capacity() > 4 * BATCH_BYTES {
                    buf = BytesMut::with_capacity(WRITE_MIN);
                }
                continue;
            }
            // Idle: a burst's buffer goes back (a supervisor holds one
            // connection per agent, most of them quiet).
            if buf.capacity() > 4 * WRITE_MIN {
                buf = BytesMut::with_capacity(WRITE_MIN);
            }
            // So does the sealer's, once everything written is acknowledged
            // (a stream of large messages keeps it: acks lag behind).
            if in_flight == 0
                && let Some(s) = sealer.as_mut()
            {
                s.shrink();
            }
            // Wait for senders only after saying so under the queue's lock
            // (else take what arrived meanwhile).
            let mut can_take = in_flight < window && self.pending.is_empty();
            if can_take && let Some(front) = self.queue.set_idle() {
                if in_flight == 0 || in_flight + front <= window {
                    continue;
                }
                // It does not fit the window: wait for acknowledgements.
                can_take = false;
            }
            tokio::select! {
                biased;
                _ = shared.closed.cancelled() => {}
                _ = shared.wake.notified() => {}
                c = self.attach.recv() => if let Some(c) = c {
                    if !outbound && !c.outbound {
                        // The peer dialed again: it gave up the connection
                        // it dialed before (it restarted under the same
                        // name, or lost the connection on its side while
                        // this side did not notice). Write on the new one.
                        shared.close("replaced by a newer connection from the peer".into());
                        return (shared.reason(), unacked, Some(c));
                    }
                    // Both dialed at once (or this proc dialed again): read
                    // from it and ack on it, write on this one; it takes
                    // over if this one fails.
                    self.set_secondary(c);
                },
                _ = self.queue.ready.notified(), if can_take => {}
                _ = sleep_until(ack_deadline), if ack_deadline.is_some() => {}
                _ = self.t.shutdown.cancelled() => shared.close("proc shut down".into()),
            }
        }
    }
}

/// Writes a batch of frames and the large payload that ends it (if any),
/// sealed when the connection is; the error is the connection's reason.
async fn write_batch(
    writer: &mut BoxWrite,
    sealer: Option<&mut Sealer>,
    buf: &mut BytesMut,
    tail: Option<&bytes::Bytes>,
) -> Result<(), String> {
    match sealer {
        Some(s) => s.write(writer, buf, tail).await.map_err(|e| match e {
            ChannelError::Io(e) => format!("write failed: {e}"),
            e => e.to_string(),
        }),
        None => {
            let plain = async {
                writer.write_all(buf).await?;
                if let Some(t) = tail {
                    writer.write_all(t).await?;
                }
                Ok::<(), std::io::Error>(())
            };
            plain.await.map_err(|e| format!("write failed: {e}"))
        }
    }
}

async fn sleep_until(d: Option<Instant>) {
    match d {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Writer of a secondary connection: only acknowledges what it receives,
/// until it closes (`None`) or `release` asks for the connection back.
async fn ack_only(conn: Conn, mut release: oneshot::Receiver<()>) -> Option<Conn> {
    let Conn {
        mut writer,
        mut sealer,
        shared,
        outbound,
    } = conn;
    let mut ack_sent = 0;
    let mut wanted = true;
    loop {
        tokio::select! {
            _ = shared.closed.cancelled() => return None,
            r = &mut release, if wanted => match r {
                Ok(()) => return Some(Conn { writer, sealer, shared, outbound }),
                // The link replaced this connection as its secondary.
                Err(_) => wanted = false,
            },
            _ = shared.wake.notified() => {}
        }
        let r = shared.received.load(Ordering::Acquire);
        if r > ack_sent {
            let mut buf = BytesMut::new();
            frame::encode_ack(&mut buf, r);
            if let Err(e) = write_batch(&mut writer, sealer.as_deref_mut(), &mut buf, None).await {
                shared.close(e);
                return None;
            }
            ack_sent = r;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link's attach channel allocates its connections 32 at a time, one
    /// block per link: a connection must stay small (the sealer's key
    /// schedule is boxed), or an operator pays kilobytes per agent.
    #[test]
    fn a_connection_handed_to_a_link_is_small() {
        let size = std::mem::size_of::<Conn>();
        assert!(size <= 64, "Conn is {size} bytes");
    }
}
