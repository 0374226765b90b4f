//! The transport of one proc: its links by peer, sending (a run continued
//! on the last peer's queue without a map lookup, staged runs, bounces),
//! dialing and accepting connections (a peer's newer connection replaces
//! the older one it dialed; a crossing one is kept as a standby), and
//! shutdown. The per-peer writer is [`super::link`], the per-connection
//! reader [`super::reader`].

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use bytes::BytesMut;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::admit::{Admission, WarnLimiter};
use super::frame::Arrivals;
use super::handshake::{self, Established, Keys};
use super::queue::{LinkQueue, PushError, SharedHeaderRun};
use super::stage::{self, Stage};
use super::{ChannelConfig, ChannelError, Envelope};
use crate::id::{ActorId, ChannelAddr, ProcId};

use super::link::{BoxRead, BoxWrite, Conn, ConnShared, Link};
use super::reader::Reader;

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
    fn bounce_run(&self, run: SharedHeaderRun, reason: String) {
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
    pub(super) local: ProcId,
    pub(super) config: ChannelConfig,
    /// The keys new connections are authenticated with (`None`: neither
    /// authenticated nor sealed); replaced when the proc is rekeyed,
    /// which leaves established connections as they are.
    keys: std::sync::RwLock<Option<Arc<Keys>>>,
    /// This proc's epoch claim and the table peers are checked against.
    epochs: super::epoch::Epochs,
    inbound: OnceLock<Weak<I>>,
    links: Mutex<Links>,
    next_id: AtomicU64,
    pub(super) shutdown: CancellationToken,
    /// Bounds on connections still in their handshake (`admit`).
    admission: Arc<Admission>,
    /// Handshake failures and refusals are logged at most this often.
    warn: WarnLimiter,
}

impl<I: Inbound> Transport<I> {
    pub(crate) fn new(
        local: ProcId,
        config: ChannelConfig,
        keys: Option<Keys>,
        epochs: super::epoch::Epochs,
    ) -> Self {
        let admission =
            Admission::new(config.max_pending_handshakes, config.max_pending_per_source);
        Transport {
            uid: NEXT_TRANSPORT.fetch_add(1, Ordering::Relaxed),
            local,
            config,
            keys: std::sync::RwLock::new(keys.map(Arc::new)),
            epochs,
            inbound: OnceLock::new(),
            links: Mutex::new(Links::default()),
            next_id: AtomicU64::new(1),
            shutdown: CancellationToken::new(),
            admission,
            warn: WarnLimiter::default(),
        }
    }

    /// The keys a new connection's handshake uses.
    fn keys(&self) -> Option<Arc<Keys>> {
        self.keys.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the keys of connections made from now on with `make(seal)`,
    /// `seal` being whether connections are sealed now (a proc without
    /// keys: sealed once it gets some).
    pub(crate) fn set_keys(&self, make: impl FnOnce(bool) -> Keys) {
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        let seal = keys.as_ref().is_none_or(|k| k.seal());
        *keys = Some(Arc::new(make(seal)));
    }

    /// This proc's epoch claim.
    pub(crate) fn own_claim(&self) -> Option<super::epoch::EpochClaim> {
        self.epochs.own
    }

    pub(crate) fn set_inbound(&self, inbound: Weak<I>) {
        let _ = self.inbound.set(inbound);
    }

    pub(crate) fn inbound(&self) -> Option<Arc<I>> {
        self.inbound.get().and_then(Weak::upgrade)
    }

    pub(super) fn bounce(&self, env: Envelope, reason: String) {
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

    pub(super) fn remove_link(&self, peer: &ProcId, id: u64) {
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

    pub(super) async fn dial_once(
        self: &Arc<Self>,
        addr: &ChannelAddr,
    ) -> Result<(ProcId, Conn), ChannelError> {
        if !addr.is_dialable() {
            return Err(ChannelError::NotDialable(addr.to_string()));
        }
        let keys = self.keys();
        let fut = async {
            match addr {
                ChannelAddr::Tcp(a) => {
                    let mut s = TcpStream::connect(a).await?;
                    s.set_nodelay(true)?;
                    let est =
                        handshake::dial(&mut s, &self.local, keys.as_deref(), &self.epochs).await?;
                    let (r, w) = s.into_split();
                    Ok((est, Box::new(r) as BoxRead, Box::new(w) as BoxWrite))
                }
                ChannelAddr::Unix(p) => {
                    let mut s = UnixStream::connect(p).await?;
                    let est =
                        handshake::dial(&mut s, &self.local, keys.as_deref(), &self.epochs).await?;
                    let (r, w) = s.into_split();
                    Ok((est, Box::new(r) as BoxRead, Box::new(w) as BoxWrite))
                }
                ChannelAddr::Unbound(_) => Err(ChannelError::NotDialable(addr.to_string())),
            }
        };
        let limit = self.config.connect_timeout + self.config.handshake_timeout;
        let (est, r, w) = tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| ChannelError::Timeout("dialing and handshaking"))??;
        let peer = est.peer.clone();
        let conn = self.start_conn(est, r, w, true);
        Ok((peer, conn))
    }

    fn start_conn(
        self: &Arc<Self>,
        est: Established,
        r: BoxRead,
        w: BoxWrite,
        outbound: bool,
    ) -> Conn {
        let Established {
            peer,
            left,
            session,
            attested,
        } = est;
        let (sealer, opener) = match session {
            Some(s) => {
                let mut opener = s.opener;
                opener.limit(self.config.max_frame_len);
                (Some(Box::new(s.sealer)), Some(opener))
            }
            None => (None, None),
        };
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
            attested,
            max_frame: self.config.max_frame_len,
            shared: shared.clone(),
        };
        tokio::spawn(reader.run(r, left, opener));
        Conn {
            writer: w,
            sealer,
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
                    Ok((r, w, hs, source)) => match t.admission.admit(source) {
                        Ok(slot) => {
                            let t = t.clone();
                            tokio::spawn(async move {
                                t.handshake_inbound(r, w, hs).await;
                                drop(slot);
                            });
                        }
                        // Over a bound: closed at once (dropping both halves).
                        Err(why) => {
                            if let Some(held) = t.warn.allow(std::time::Instant::now()) {
                                warn!(proc = %t.local, from = %hs, reason = %why, held_back = held, "refusing an inbound connection before its handshake");
                            }
                        }
                    },
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
        let keys = self.keys();
        let res = tokio::time::timeout(
            self.config.handshake_timeout,
            handshake::accept(&mut stream, &self.local, keys.as_deref(), &self.epochs),
        )
        .await;
        match res {
            Ok(Ok(est)) => {
                let peer = est.peer.clone();
                debug!(proc = %self.local, %peer, %from, sealed = est.session.is_some(), "accepted connection");
                let (r, w) = stream.into_inner();
                let conn = self.start_conn(est, r, w, false);
                self.register(peer, conn);
            }
            Ok(Err(e)) => {
                if let Some(held) = self.warn.allow(std::time::Instant::now()) {
                    warn!(proc = %self.local, %from, reason = %e, held_back = held, "closing inbound connection: handshake failed");
                }
            }
            Err(_) => {
                if let Some(held) = self.warn.allow(std::time::Instant::now()) {
                    warn!(proc = %self.local, %from, held_back = held, "closing inbound connection: handshake timed out");
                }
            }
        }
    }

    /// Stops accepting and closes every link.
    pub(crate) fn shutdown(&self) {
        self.shutdown.cancel();
    }
}

/// An accepted connection's halves, its peer for logs, and its source
/// address (`None` for a Unix socket).
type Accepted = (BoxRead, BoxWrite, String, Option<std::net::IpAddr>);

async fn accept(l: &Listener) -> std::io::Result<Accepted> {
    match l {
        Listener::Tcp(l) => {
            let (s, from) = l.accept().await?;
            s.set_nodelay(true)?;
            let (r, w) = s.into_split();
            Ok((Box::new(r), Box::new(w), from.to_string(), Some(from.ip())))
        }
        Listener::Unix(l) => {
            let (s, _) = l.accept().await?;
            let (r, w) = s.into_split();
            Ok((Box::new(r), Box::new(w), "unix peer".into(), None))
        }
    }
}
