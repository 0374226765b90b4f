//! Per-peer links: dialing with backoff, accepting, the writer loop with its
//! unacknowledged window, and the reader loop that hands envelopes to the proc.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use bytes::BytesMut;
use ring::hmac;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::frame::{self, Frame};
use super::handshake;
use super::{ChannelConfig, ChannelError, Envelope};
use crate::id::{ChannelAddr, ProcId};
use crate::port::OPEN_PORT_BIT;

type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// Acks are sent at once after this many unacknowledged envelopes...
const ACK_EVERY: u64 = 256;
/// ...or after this delay, whichever comes first (and always piggybacked on
/// outgoing data).
const ACK_DELAY: Duration = Duration::from_millis(2);
/// A write batch stops growing at this many bytes.
const BATCH_BYTES: usize = 256 * 1024;
/// Read buffer growth step.
const READ_CHUNK: usize = 64 * 1024;

/// What the transport needs from its proc.
pub(crate) trait Inbound: Send + Sync + 'static {
    /// Delivers an envelope addressed to this proc (waits when the
    /// destination's queue is full).
    fn deliver(&self, env: Envelope) -> impl Future<Output = ()> + Send;
    /// Hands back an envelope that could not be delivered.
    fn bounce(&self, env: Envelope, reason: String);
}

/// State shared by a connection's reader and writer.
struct ConnShared {
    /// Envelopes received on this connection (what we ack).
    received: AtomicU64,
    /// Envelopes the peer acknowledged.
    acked: AtomicU64,
    /// Wakes the writer: acks to send or acks received.
    wake: Notify,
    closed: CancellationToken,
    reason: Mutex<Option<String>>,
}

impl ConnShared {
    fn close(&self, reason: String) {
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
    writer: BoxWrite,
    shared: Arc<ConnShared>,
}

struct LinkHandle {
    id: u64,
    tx: mpsc::Sender<Envelope>,
    attach: mpsc::UnboundedSender<Conn>,
    lost: watch::Receiver<u64>,
}

/// A listening socket.
pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// One proc's transport.
pub(crate) struct Transport<I: Inbound> {
    local: ProcId,
    config: ChannelConfig,
    key: Option<hmac::Key>,
    inbound: OnceLock<Weak<I>>,
    links: Mutex<HashMap<ProcId, LinkHandle>>,
    next_id: AtomicU64,
    shutdown: CancellationToken,
}

impl<I: Inbound> Transport<I> {
    pub(crate) fn new(local: ProcId, config: ChannelConfig, secret: Option<&[u8]>) -> Self {
        Transport {
            local,
            config,
            key: secret.map(|s| hmac::Key::new(hmac::HMAC_SHA256, s)),
            inbound: OnceLock::new(),
            links: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            shutdown: CancellationToken::new(),
        }
    }

    pub(crate) fn set_inbound(&self, inbound: Weak<I>) {
        let _ = self.inbound.set(inbound);
    }

    pub(crate) fn inbound(&self) -> Option<Arc<I>> {
        self.inbound.get().and_then(Weak::upgrade)
    }

    fn bounce(&self, env: Envelope, reason: String) {
        match self.inbound() {
            Some(i) => i.bounce(env, reason),
            None => debug!(?env, %reason, "proc gone; dropping undeliverable envelope"),
        }
    }

    fn links(&self) -> std::sync::MutexGuard<'_, HashMap<ProcId, LinkHandle>> {
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn spawn_link(self: &Arc<Self>, peer: ProcId, initial: Option<Conn>) -> LinkHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(self.config.queue_capacity.max(1));
        let (atx, arx) = mpsc::unbounded_channel();
        let (lost_tx, lost_rx) = watch::channel(0);
        let handle = LinkHandle {
            id,
            tx,
            attach: atx,
            lost: lost_rx,
        };
        let link = Link {
            t: self.clone(),
            peer,
            id,
            rx,
            attach: arx,
            lost: lost_tx,
            pending: VecDeque::new(),
        };
        tokio::spawn(link.run(initial));
        handle
    }

    /// Applies `f` to the peer's link, creating the link if needed.
    fn with_link<R>(self: &Arc<Self>, peer: &ProcId, f: impl FnOnce(&LinkHandle) -> R) -> R {
        let mut links = self.links();
        if let Some(h) = links.get(peer) {
            return f(h);
        }
        let h = self.spawn_link(peer.clone(), None);
        let r = f(&h);
        links.insert(peer.clone(), h);
        r
    }

    fn remove_link(&self, peer: &ProcId, id: u64) {
        let mut links = self.links();
        if links.get(peer).is_some_and(|h| h.id == id) {
            links.remove(peer);
        }
    }

    /// A receiver that changes whenever a connection to `peer` is lost.
    pub(crate) fn lost_watch(self: &Arc<Self>, peer: &ProcId) -> watch::Receiver<u64> {
        self.with_link(peer, |h| h.lost.clone())
    }

    /// Queues an envelope for its destination proc (waits while the peer's
    /// queue is full). Failures come back through [`Inbound::bounce`].
    pub(crate) async fn send(self: &Arc<Self>, mut env: Envelope) {
        for _ in 0..2 {
            let (id, tx) = self.with_link(env.dest.actor().proc(), |h| (h.id, h.tx.clone()));
            match tx.send(env).await {
                Ok(()) => return,
                Err(mpsc::error::SendError(back)) => {
                    self.remove_link(back.dest.actor().proc(), id);
                    env = back;
                }
            }
        }
        let reason = format!("link to {} closed", env.dest.actor().proc());
        self.bounce(env, reason);
    }

    /// Attaches an established connection to the peer's link.
    fn register(self: &Arc<Self>, peer: ProcId, conn: Conn) {
        let mut links = self.links();
        let conn = match links.get(&peer) {
            Some(h) => match h.attach.send(conn) {
                Ok(()) => return,
                Err(mpsc::error::SendError(c)) => c,
            },
            None => conn,
        };
        let h = self.spawn_link(peer.clone(), Some(conn));
        links.insert(peer, h);
    }

    /// Dials `addr`, handshakes, attaches the connection to the peer's link
    /// and returns the peer's proc id.
    pub(crate) async fn connect(
        self: &Arc<Self>,
        addr: &ChannelAddr,
    ) -> Result<ProcId, ChannelError> {
        let (peer, conn) = self.dial_once(addr).await?;
        self.register(peer.clone(), conn);
        Ok(peer)
    }

    async fn dial_once(
        self: &Arc<Self>,
        addr: &ChannelAddr,
    ) -> Result<(ProcId, Conn), ChannelError> {
        if !addr.is_dialable() {
            return Err(ChannelError::NotDialable(addr.to_string()));
        }
        let fut = async {
            match addr {
                ChannelAddr::Tcp(a) => {
                    let mut s = TcpStream::connect(a).await?;
                    s.set_nodelay(true)?;
                    let (peer, left) =
                        handshake::dial(&mut s, &self.local, self.key.as_ref()).await?;
                    let (r, w) = s.into_split();
                    Ok((peer, Box::new(r) as BoxRead, Box::new(w) as BoxWrite, left))
                }
                ChannelAddr::Unix(p) => {
                    let mut s = UnixStream::connect(p).await?;
                    let (peer, left) =
                        handshake::dial(&mut s, &self.local, self.key.as_ref()).await?;
                    let (r, w) = s.into_split();
                    Ok((peer, Box::new(r) as BoxRead, Box::new(w) as BoxWrite, left))
                }
                ChannelAddr::Unbound(_) => Err(ChannelError::NotDialable(addr.to_string())),
            }
        };
        let limit = self.config.connect_timeout + self.config.handshake_timeout;
        let (peer, r, w, left) = tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| ChannelError::Timeout("dialing and handshaking"))??;
        let conn = self.start_conn(peer.clone(), r, w, left);
        Ok((peer, conn))
    }

    fn start_conn(self: &Arc<Self>, peer: ProcId, r: BoxRead, w: BoxWrite, left: BytesMut) -> Conn {
        let shared = Arc::new(ConnShared {
            received: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            wake: Notify::new(),
            closed: CancellationToken::new(),
            reason: Mutex::new(None),
        });
        let reader = Reader {
            inbound: self.inbound.get().cloned().unwrap_or_default(),
            local: self.local.clone(),
            peer,
            max_frame: self.config.max_frame_len,
            shared: shared.clone(),
        };
        tokio::spawn(reader.run(r, left));
        Conn { writer: w, shared }
    }

    /// Serves connections from `listener` until the transport shuts down.
    pub(crate) fn serve(self: &Arc<Self>, listener: Listener) {
        let t = self.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = t.shutdown.cancelled() => return,
                    a = accept(&listener) => a,
                };
                match accepted {
                    Ok((r, w, hs)) => {
                        let t = t.clone();
                        tokio::spawn(async move { t.handshake_inbound(r, w, hs).await });
                    }
                    Err(e) => {
                        warn!(proc = %t.local, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
    }

    async fn handshake_inbound(self: Arc<Self>, r: BoxRead, w: BoxWrite, from: String) {
        let mut stream = tokio::io::join(r, w);
        let res = tokio::time::timeout(
            self.config.handshake_timeout,
            handshake::accept(&mut stream, &self.local, self.key.as_ref()),
        )
        .await;
        match res {
            Ok(Ok((peer, left))) => {
                debug!(proc = %self.local, %peer, %from, "accepted connection");
                let (r, w) = stream.into_inner();
                let conn = self.start_conn(peer.clone(), r, w, left);
                self.register(peer, conn);
            }
            Ok(Err(e)) => {
                warn!(proc = %self.local, %from, reason = %e, "closing inbound connection: handshake failed")
            }
            Err(_) => {
                warn!(proc = %self.local, %from, "closing inbound connection: handshake timed out")
            }
        }
    }

    /// Stops accepting and closes every link.
    pub(crate) fn shutdown(&self) {
        self.shutdown.cancel();
    }
}

async fn accept(l: &Listener) -> std::io::Result<(BoxRead, BoxWrite, String)> {
    match l {
        Listener::Tcp(l) => {
            let (s, from) = l.accept().await?;
            s.set_nodelay(true)?;
            let (r, w) = s.into_split();
            Ok((Box::new(r), Box::new(w), from.to_string()))
        }
        Listener::Unix(l) => {
            let (s, _) = l.accept().await?;
            let (r, w) = s.into_split();
            Ok((Box::new(r), Box::new(w), "unix peer".into()))
        }
    }
}

/// The task owning one peer's queue.
struct Link<I: Inbound> {
    t: Arc<Transport<I>>,
    peer: ProcId,
    id: u64,
    rx: mpsc::Receiver<Envelope>,
    attach: mpsc::UnboundedReceiver<Conn>,
    lost: watch::Sender<u64>,
    /// Taken from the queue, not yet written.
    pending: VecDeque<Envelope>,
}

impl<I: Inbound> Link<I> {
    async fn run(mut self, mut conn: Option<Conn>) {
        loop {
            if conn.is_none() && self.pending.is_empty() {
                tokio::select! {
                    biased;
                    _ = self.t.shutdown.cancelled() => return self.close("proc shut down"),
                    c = self.attach.recv() => conn = c,
                    e = self.rx.recv() => match e {
                        Some(e) => self.pending.push_back(e),
                        None => return,
                    },
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
                        for env in self.pending.drain(..) {
                            self.t.bounce(env, reason.clone());
                        }
                        while let Ok(env) = self.rx.try_recv() {
                            self.t.bounce(env, reason.clone());
                        }
                        continue;
                    }
                }
            }
            let Some(c) = conn.take() else { continue };
            let (reason, unacked) = self.run_connected(c).await;
            self.lost.send_modify(|g| *g += 1);
            if !unacked.is_empty() {
                warn!(proc = %self.t.local, peer = %self.peer, %reason, count = unacked.len(), "connection lost with messages unacknowledged");
            } else {
                debug!(proc = %self.t.local, peer = %self.peer, %reason, "connection lost");
            }
            let why = format!("connection to {} lost: {reason}", self.peer);
            let mut port_msgs = 0usize;
            for env in unacked {
                if env.dest.index() & OPEN_PORT_BIT != 0 {
                    // Replies and pushes to opened ports (invariant 4).
                    port_msgs += 1;
                } else {
                    self.t.bounce(env, why.clone());
                }
            }
            if port_msgs > 0 {
                warn!(proc = %self.t.local, peer = %self.peer, count = port_msgs, %reason,
                    "replies or port messages possibly lost with the connection; their receivers see the connection loss");
            }
            if self.t.shutdown.is_cancelled() {
                return self.close("proc shut down");
            }
            if !self.peer.addr().is_dialable() {
                return self.close(&why);
            }
        }
    }

    /// Removes the link and returns everything queued as undeliverable.
    fn close(mut self, reason: &str) {
        self.t.remove_link(&self.peer, self.id);
        self.rx.close();
        for env in self.pending.drain(..) {
            self.t.bounce(env, reason.to_string());
        }
        while let Ok(env) = self.rx.try_recv() {
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
                Err(e @ ChannelError::Auth(_)) => return Err(e),
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

    /// Writes queued envelopes over `conn` until it fails; returns the reason
    /// and the envelopes written but not acknowledged.
    async fn run_connected(&mut self, conn: Conn) -> (String, VecDeque<Envelope>) {
        let Conn { mut writer, shared } = conn;
        let window = self.t.config.window.max(1);
        let max_frame = self.t.config.max_frame_len;
        let mut unacked: VecDeque<Envelope> = VecDeque::new();
        let mut sent: u64 = 0;
        let mut acked: u64 = 0;
        let mut ack_sent: u64 = 0;
        let mut ack_deadline: Option<Instant> = None;
        let mut last_header = frame::LastHeader::default();
        let mut buf = BytesMut::with_capacity(64 * 1024);
        loop {
            let a = shared.acked.load(Ordering::Acquire);
            if a > sent {
                shared.close(format!(
                    "peer acknowledged {a} envelopes but only {sent} were sent"
                ));
            }
            while acked < a.min(sent) {
                unacked.pop_front();
                acked += 1;
            }
            if shared.closed.is_cancelled() {
                return (shared.reason(), unacked);
            }
            // A large payload is written from the envelope, after `buf`.
            let mut tail: Option<bytes::Bytes> = None;
            while unacked.len() < window && buf.len() < BATCH_BYTES && tail.is_none() {
                let env = match self.pending.pop_front() {
                    Some(e) => e,
                    None => match self.rx.try_recv() {
                        Ok(e) => e,
                        Err(_) => break,
                    },
                };
                match frame::encode_envelope(&mut buf, &env, max_frame, &mut last_header) {
                    Ok(inline) => {
                        if !inline {
                            tail = Some(env.payload.clone());
                        }
                        unacked.push_back(env);
                        sent += 1;
                    }
                    Err(e) => self.t.bounce(env, e.to_string()),
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
                let write = async {
                    writer.write_all(&buf).await?;
                    if let Some(t) = &tail {
                        writer.write_all(t).await?;
                    }
                    Ok::<(), std::io::Error>(())
                };
                tokio::select! {
                    res = write => if let Err(e) = res {
                        shared.close(format!("write failed: {e}"));
                        return (shared.reason(), unacked);
                    },
                    _ = shared.closed.cancelled() => return (shared.reason(), unacked),
                }
                buf.clear();
                if buf.capacity() > 4 * BATCH_BYTES {
                    buf = BytesMut::with_capacity(64 * 1024);
                }
                continue;
            }
            let can_take = unacked.len() < window;
            tokio::select! {
                biased;
                _ = shared.closed.cancelled() => {}
                _ = shared.wake.notified() => {}
                c = self.attach.recv() => if let Some(c) = c {
                    // A second connection from the same peer (both dialed at
                    // once): read from it and ack on it, write on this one.
                    tokio::spawn(ack_only(c));
                },
                e = self.rx.recv(), if can_take => match e {
                    Some(e) => self.pending.push_back(e),
                    None => {
                        shared.close("transport dropped".into());
                    }
                },
                _ = sleep_until(ack_deadline), if ack_deadline.is_some() => {}
                _ = self.t.shutdown.cancelled() => shared.close("proc shut down".into()),
            }
        }
    }
}

async fn sleep_until(d: Option<Instant>) {
    match d {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Writer of a secondary connection: only acknowledges what it receives.
async fn ack_only(conn: Conn) {
    let Conn { mut writer, shared } = conn;
    let mut ack_sent = 0;
    loop {
        tokio::select! {
            _ = shared.closed.cancelled() => return,
            _ = shared.wake.notified() => {}
        }
        let r = shared.received.load(Ordering::Acquire);
        if r > ack_sent {
            let mut buf = BytesMut::new();
            frame::encode_ack(&mut buf, r);
            if let Err(e) = writer.write_all(&buf).await {
                shared.close(format!("write failed: {e}"));
                return;
            }
            ack_sent = r;
        }
    }
}

/// The task reading one connection.
struct Reader<I: Inbound> {
    inbound: Weak<I>,
    local: ProcId,
    peer: ProcId,
    max_frame: usize,
    shared: Arc<ConnShared>,
}

impl<I: Inbound> Reader<I> {
    async fn run(self, mut rd: BoxRead, mut buf: BytesMut) {
        let mut received: u64 = 0;
        let mut last_header = None;
        loop {
            let before = received;
            loop {
                match frame::decode(&mut buf, self.max_frame, &mut last_header) {
                    Ok(Some(Frame::Envelope(env))) => {
                        received += 1;
                        let Some(inbound) = self.inbound.upgrade() else {
                            self.shared.close("proc dropped".into());
                            return;
                        };
                        if env.dest.actor().proc() != &self.local {
                            let reason = format!(
                                "{} reached proc {} by mistake",
                                env.dest.actor().proc(),
                                self.local
                            );
                            inbound.bounce(env, reason);
                        } else {
                            inbound.deliver(env).await;
                        }
                    }
                    Ok(Some(Frame::Ack(n))) => {
                        self.shared.acked.store(n, Ordering::Release);
                        self.shared.wake.notify_one();
                    }
                    Ok(Some(Frame::Hello(_))) => {
                        return self.fail("unexpected handshake frame after the handshake".into());
                    }
                    Ok(None) => break,
                    Err(e) => return self.fail(e.to_string()),
                }
            }
            if received > before {
                self.shared.received.store(received, Ordering::Release);
                self.shared.wake.notify_one();
            }
            if buf.capacity() - buf.len() < READ_CHUNK / 4 {
                buf.reserve(READ_CHUNK);
            }
            tokio::select! {
                r = rd.read_buf(&mut buf) => match r {
                    Ok(0) => {
                        self.shared.close("peer closed the connection".into());
                        return;
                    }
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

    fn fail(&self, reason: String) {
        warn!(proc = %self.local, peer = %self.peer, %reason, "closing connection");
        self.shared.close(reason);
    }
}
