//! Per-peer links: the outgoing queue (runs of envelopes sharing a header,
//! framed as they are queued), dialing with backoff, accepting (a peer's
//! newer connection replaces the older one it dialed; a crossing one is kept
//! as a standby), the writer loop with its unacknowledged window, and the
//! reader loop that hands envelopes to the proc in batches (large frames are
//! read into reused buffers of their own size).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use bytes::BytesMut;
use ring::hmac;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::frame::{self, Arrivals, Frame};
use super::handshake;
use super::queue::{LinkQueue, PushError, Run};
use super::stage::{self, Stage};
use super::{ChannelConfig, ChannelError, Envelope};
use crate::id::{ActorId, ChannelAddr, ProcId};
use crate::port::{OPEN_PORT_BIT, UNDELIVERABLE_PORT};

type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// Acks are sent at once after this many unacknowledged envelopes...
const ACK_EVERY: u64 = 1024;
/// ...or after this delay, whichever comes first (and always piggybacked on
/// outgoing data).
const ACK_DELAY: Duration = Duration::from_millis(2);
/// A write batch stops growing at this many bytes.
const BATCH_BYTES: usize = 256 * 1024;
/// Read buffer growth step.
const READ_CHUNK: usize = 64 * 1024;
/// At most this many envelopes are handed to an actor in one batch.
const MAX_BATCH: usize = 1024;

/// What the transport needs from its proc.
pub(crate) trait Inbound: Send + Sync + 'static {
    /// Delivers an envelope addressed to this proc (waits when the
    /// destination's queue is full).
    fn deliver(&self, env: Envelope) -> impl Future<Output = ()> + Send;
    /// Delivers envelopes, in order, all addressed to one actor's handler
    /// or undeliverable ports (never to opened ports), in one hand-off.
    fn deliver_batch(&self, batch: Vec<Arrivals>) -> impl Future<Output = ()> + Send;
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
    /// Dialed by this proc (else accepted from the peer).
    outbound: bool,
}

/// A second connection to the same peer that the link does not write on:
/// its task reads and acknowledges, and gives the connection back when
/// asked (to take over if the link's connection fails).
struct Secondary {
    release: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Option<Conn>>,
}

/// The links of a transport, by peer.
#[derive(Default)]
struct Links {
    map: HashMap<ProcId, LinkHandle>,
    /// The peer sent to last (a stream to one peer skips the hash lookup).
    last: Option<(ProcId, u64, Arc<LinkQueue>)>,
}

impl Links {
    fn insert(&mut self, peer: ProcId, h: LinkHandle) {
        self.remove(&peer);
        self.map.insert(peer, h);
    }

    fn remove(&mut self, peer: &ProcId) {
        if self.last.as_ref().is_some_and(|(p, _, _)| p == peer) {
            self.last = None;
        }
        self.map.remove(peer);
    }
}

struct LinkHandle {
    id: u64,
    queue: Arc<LinkQueue>,
    attach: mpsc::UnboundedSender<Conn>,
    lost: watch::Receiver<u64>,
}

impl<I: Inbound> stage::Bounce for Transport<I> {
    fn bounce_run(&self, run: Run, reason: String) {
        for env in run.into_envelopes() {
            self.bounce(env, reason.clone());
        }
    }
}

/// A listening socket.
pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// Numbers transports, so a thread's staged run names its own.
static NEXT_TRANSPORT: AtomicU64 = AtomicU64::new(1);

/// One proc's transport.
pub(crate) struct Transport<I: Inbound> {
    /// Unique in this process (see `stage`).
    uid: u64,
    local: ProcId,
    config: ChannelConfig,
    key: Option<hmac::Key>,
    inbound: OnceLock<Weak<I>>,
    links: Mutex<Links>,
    next_id: AtomicU64,
    shutdown: CancellationToken,
}

impl<I: Inbound> Transport<I> {
    pub(crate) fn new(local: ProcId, config: ChannelConfig, secret: Option<&[u8]>) -> Self {
        Transport {
            uid: NEXT_TRANSPORT.fetch_add(1, Ordering::Relaxed),
            local,
            config,
            key: secret.map(|s| hmac::Key::new(hmac::HMAC_SHA256, s)),
            inbound: OnceLock::new(),
            links: Mutex::new(Links::default()),
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

    fn links(&self) -> std::sync::MutexGuard<'_, Links> {
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn spawn_link(self: &Arc<Self>, peer: ProcId, initial: Option<Conn>) -> LinkHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let queue = Arc::new(LinkQueue::new(
            self.config.queue_capacity,
            self.config.max_frame_len,
        ));
        let (atx, arx) = mpsc::unbounded_channel();
        let (lost_tx, lost_rx) = watch::channel(0);
        let handle = LinkHandle {
            id,
            queue: queue.clone(),
            attach: atx,
            lost: lost_rx,
        };
        let link = Link {
            t: self.clone(),
            peer,
            id,
            queue,
            attach: arx,
            lost: lost_tx,
            pending: VecDeque::new(),
            secondary: None,
        };
        tokio::spawn(link.run(initial));
        handle
    }

    /// Applies `f` to the peer's link, creating the link if needed.
    fn with_link<R>(self: &Arc<Self>, peer: &ProcId, f: impl FnOnce(&LinkHandle) -> R) -> R {
        let mut links = self.links();
        if let Some(h) = links.map.get(peer) {
            return f(h);
        }
        let h = self.spawn_link(peer.clone(), None);
        let r = f(&h);
        links.insert(peer.clone(), h);
        r
    }

    fn remove_link(&self, peer: &ProcId, id: u64) {
        let mut links = self.links();
        if links.map.get(peer).is_some_and(|h| h.id == id) {
            links.remove(peer);
        }
    }

    /// A receiver that changes whenever a connection to `peer` is lost.
    pub(crate) fn lost_watch(self: &Arc<Self>, peer: &ProcId) -> watch::Receiver<u64> {
        self.with_link(peer, |h| h.lost.clone())
    }

    /// Queues a message from `sender` to handler port `port` of `dest` (on
    /// another proc) with no envelope and no payload buffer of its own:
    /// `encode` writes the payload (about `len` bytes) straight into a run.
    /// Inside a `batched` scope the run is this thread's stage (see
    /// `stage`); elsewhere it is the last run queued for that proc, if it
    /// has the same header and there is room now. `false`: nothing was
    /// queued (send it as an envelope).
    pub(crate) fn try_repeat(
        self: &Arc<Self>,
        sender: &ActorId,
        dest: &ActorId,
        port: u64,
        len: usize,
        encode: impl FnOnce(&mut BytesMut) -> bool,
    ) -> bool {
        let mut encode = Some(encode);
        // Inside a `batched` scope: stage it on this thread (no lock).
        let staged = stage::with(|slot| {
            let st = slot.as_mut()?;
            if !st.continues(self.uid, sender, dest, port, len) {
                return None;
            }
            let enc = encode.take()?;
            let ok = st.append(len, enc);
            let full = if st.is_full() { slot.take() } else { None };
            Some((ok, full))
        });
        match staged {
            Some(Some((ok, full))) => {
                if let Some(full) = full {
                    full.flush();
                }
                return ok;
            }
            Some(None) => {
                return match encode.take() {
                    Some(encode) if dest.proc() != &self.local => {
                        self.start_stage(sender, dest, port, len, encode)
                    }
                    _ => false,
                };
            }
            None => {}
        }
        let Some(encode) = encode else { return false };
        if dest.proc() == &self.local {
            return false;
        }
        let links = self.links();
        match &links.last {
            Some((p, _, queue)) if p == dest.proc() => {
                queue.try_repeat(sender, dest, port, len, encode)
            }
            _ => false,
        }
    }

    /// Starts a run staged on this thread with one message, flushing the
    /// run it replaces; `false` (nothing staged) when the message is too
    /// large to stage or the peer's queue has no room now.
    fn start_stage(
        self: &Arc<Self>,
        sender: &ActorId,
        dest: &ActorId,
        port: u64,
        len: usize,
        encode: impl FnOnce(&mut BytesMut) -> bool,
    ) -> bool {
        let max_frame = self.config.max_frame_len;
        let old = stage::with(Option::take).flatten();
        // The queue of the run replaced, if it goes to the same peer.
        let queue = old
            .as_ref()
            .filter(|o| o.owner == self.uid && o.peer() == dest.proc())
            .map(|o| o.queue.clone());
        if let Some(old) = old {
            old.flush();
        }
        if !Stage::fits(len, max_frame) {
            return false;
        }
        let queue = match queue {
            Some(q) => q,
            None => self.queue_for(dest.proc()),
        };
        if !queue.has_room() {
            return false;
        }
        let bounce: Arc<dyn stage::Bounce> = self.clone();
        let mut st = Stage::new(self.uid, queue, bounce, max_frame, sender, dest.port(port));
        if !st.append(len, encode) {
            return false;
        }
        if stage::with(|slot| *slot = Some(st)).is_none() {
            // Not staged after all (cannot happen inside a scope): the
            // message is encoded, so queue nothing and let the caller
            // send it the ordinary way.
            return false;
        }
        true
    }

    /// The queue of the link to `peer` (created if needed).
    fn queue_for(self: &Arc<Self>, peer: &ProcId) -> Arc<LinkQueue> {
        let mut links = self.links();
        self.select(&mut links, peer).1.clone()
    }

    /// Makes `peer`'s link (created if needed) the one sent to last, which
    /// is found without hashing its id; returns its id and queue.
    fn select<'a>(
        self: &Arc<Self>,
        links: &'a mut Links,
        peer: &ProcId,
    ) -> (u64, &'a Arc<LinkQueue>) {
        if !matches!(&links.last, Some((p, _, _)) if p == peer) {
            let h = match links.map.get(peer) {
                Some(h) => h,
                None => {
                    let h = self.spawn_link(peer.clone(), None);
                    links.map.entry(peer.clone()).or_insert(h)
                }
            };
            let last = (peer.clone(), h.id, h.queue.clone());
            links.last = Some(last);
        }
        let Some((_, id, queue)) = &links.last else {
            unreachable!("just set")
        };
        (*id, queue)
    }

    /// Queues an envelope for its destination proc (waits while the peer's
    /// queue is full). Failures come back through [`Inbound::bounce`].
    pub(crate) async fn send(self: &Arc<Self>, mut env: Envelope) {
        // What this thread staged goes first (per sender order).
        stage::flush();
        for _ in 0..2 {
            // Fast path: a free slot, queued under the links lock without
            // touching any reference count (they are shared with the link
            // task, so every increment would bounce a cache line).
            let (id, full) = {
                let mut links = self.links();
                let (id, queue) = self.select(&mut links, env.dest.actor().proc());
                match queue.try_push(env) {
                    Ok(()) => return,
                    Err(PushError::Full(back)) => (id, (Some(queue.clone()), back)),
                    Err(PushError::Closed(back)) => (id, (None, back)),
                }
            };
            let back = match full {
                (Some(queue), env) => match queue.push(env).await {
                    Ok(()) => return,
                    Err(back) => back,
                },
                (None, back) => back,
            };
            self.remove_link(back.dest.actor().proc(), id);
            env = back;
        }
        let reason = format!("link to {} closed", env.dest.actor().proc());
        self.bounce(env, reason);
    }

    /// Attaches an established connection to the peer's link.
    fn register(self: &Arc<Self>, peer: ProcId, conn: Conn) {
        let mut links = self.links();
        let conn = match links.map.get(&peer) {
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
        let conn = self.start_conn(peer.clone(), r, w, left, true);
        Ok((peer, conn))
    }

    fn start_conn(
        self: &Arc<Self>,
        peer: ProcId,
        r: BoxRead,
        w: BoxWrite,
        left: BytesMut,
        outbound: bool,
    ) -> Conn {
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
        Conn {
            writer: w,
            shared,
            outbound,
        }
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
                let conn = self.start_conn(peer.clone(), r, w, left, false);
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

/// Envelopes written on a connection and not acknowledged yet: the head of
/// each run written, with the run's length.
type Unacked = VecDeque<(Envelope, usize)>;

/// The task owning one peer's queue.
struct Link<I: Inbound> {
    t: Arc<Transport<I>>,
    peer: ProcId,
    id: u64,
    queue: Arc<LinkQueue>,
    attach: mpsc::UnboundedReceiver<Conn>,
    lost: watch::Sender<u64>,
    /// Taken from the queue, not yet written.
    pending: VecDeque<Run>,
    /// The newest connection the link does not write on, if any.
    secondary: Option<Secondary>,
}

impl<I: Inbound> Link<I> {
    async fn run(mut self, mut conn: Option<Conn>) {
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
                            .flat_map(Run::into_envelopes)
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
                    let run = Run {
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
    fn close(mut self, reason: &str) {
        self.t.remove_link(&self.peer, self.id);
        let rest = self.queue.close();
        for env in self
            .pending
            .drain(..)
            .chain(rest)
            .flat_map(Run::into_envelopes)
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

    /// Writes queued envelopes over `conn` until it fails or the peer
    /// replaces it; returns the reason, the envelopes written but not
    /// acknowledged, and the replacing connection.
    async fn run_connected(&mut self, conn: Conn) -> (String, Unacked, Option<Conn>) {
        let Conn {
            mut writer,
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
        let mut buf = BytesMut::with_capacity(64 * 1024);
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
                        return (shared.reason(), unacked, None);
                    },
                    _ = shared.closed.cancelled() => return (shared.reason(), unacked, None),
                }
                buf.clear();
                if buf.capacity() > 4 * BATCH_BYTES {
                    buf = BytesMut::with_capacity(64 * 1024);
                }
                continue;
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
        shared,
        outbound,
    } = conn;
    let mut ack_sent = 0;
    let mut wanted = true;
    loop {
        tokio::select! {
            _ = shared.closed.cancelled() => return None,
            r = &mut release, if wanted => match r {
                Ok(()) => return Some(Conn { writer, shared, outbound }),
                // The link replaced this connection as its secondary.
                Err(_) => wanted = false,
            },
            _ = shared.wake.notified() => {}
        }
        let r = shared.received.load(Ordering::Acquire);
        if r > ack_sent {
            let mut buf = BytesMut::new();
            frame::encode_ack(&mut buf, r);
            if let Err(e) = writer.write_all(&buf).await {
                shared.close(format!("write failed: {e}"));
                return None;
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
        // The header of the last envelope for one of this proc's actors,
        // while the frames that follow may repeat it.
        let mut template: Option<Envelope> = None;
        // Envelopes for one actor, handed over in one wake-up.
        let mut batch = Batch::default();
        // Buffers of large frames, reused once their payloads are dropped
        // (no page faults from a fresh megabyte per frame).
        let mut large_bufs = crate::bufpool::BufPool::default();
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
