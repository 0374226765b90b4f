//! Procs: a proc hosts actors and open ports, routes envelopes between them
//! (same-proc delivery never touches a socket), owns the transport to other
//! procs, and reports supervision events nobody handled to its sink.
//!
//! Invariants:
//! 1. An envelope for this proc goes straight to the destination's queue;
//!    any other goes to the peer's link.
//! 2. Every envelope that cannot be delivered is bounced exactly once:
//!    to the caller's reply port if it has one, else to the sender's
//!    undeliverable port. A bounce that itself cannot be delivered goes to
//!    the sink of the proc where it ends up (never bounced again).
//! 3. Each actor id is unique on its proc while the actor runs.

mod system;

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, error, warn};

use crate::actor::{self, Actor, ActorRef, Handlers, Mailbox, RemoteSpawn, Signal};
use crate::channel::credential::{Credential, CredentialError, Issuer};
use crate::channel::handshake::Keys;
use crate::channel::{Arrivals, ChannelConfig, Envelope, Inbound, Listener, Transport};
use crate::error::RuntimeError;
use crate::id::{ActorId, ChannelAddr, PortId, ProcId};
use crate::port::{
    self, Message, OPEN_PORT_BIT, OncePortRef, OnceReceiver, PortReceiver, PortRef,
    UNDELIVERABLE_PORT,
};
use crate::supervision::{ActorStatus, SupervisionEvent, Undeliverable};

pub use system::{ProcAgent, SpawnActor};

/// Name of every proc's system actor (remote spawn, undeliverables of the
/// proc itself).
pub const SYSTEM_ACTOR: &str = "_proc";

/// Anything that can send messages: a [`Proc`] (as its system actor) or an
/// actor's [`Context`](crate::Context).
pub trait CanSend: Send + Sync {
    /// The proc sending.
    fn proc(&self) -> &Proc;
    /// The sender's actor id (where undeliverables return to).
    fn sender_id(&self) -> &ActorId;
}

/// Where supervision events nobody handled end up.
pub type SupervisionSink = Arc<dyn Fn(SupervisionEvent) + Send + Sync>;

/// Tunables of a proc.
#[derive(Debug, Clone)]
pub struct ProcConfig {
    /// The transport's settings.
    pub channel: ChannelConfig,
    /// Messages queued per actor before senders wait (default 1024).
    pub mailbox_capacity: usize,
    /// Messages queued per opened port before senders wait (default 1024).
    pub port_capacity: usize,
}

impl Default for ProcConfig {
    fn default() -> Self {
        ProcConfig {
            channel: ChannelConfig::default(),
            mailbox_capacity: 1024,
            port_capacity: 1024,
        }
    }
}

pub(crate) enum PortSink {
    Once(oneshot::Sender<Envelope>),
    Many(mpsc::Sender<Envelope>),
}

type SpawnFn = Arc<
    dyn Fn(
            Proc,
            String,
            Bytes,
            Option<PortRef<SupervisionEvent>>,
        ) -> BoxFuture<'static, Result<ActorId, RuntimeError>>
        + Send
        + Sync,
>;

/// How a proc authenticates its connections.
enum Auth {
    /// The current secret and, while it is rotated, the previous one.
    Secret(Vec<u8>, Option<Vec<u8>>),
    Credential(Credential),
    Issuer(Issuer),
}

/// Builds a [`Proc`].
pub struct ProcBuilder {
    name: String,
    listen: Option<ChannelAddr>,
    auth: Option<Auth>,
    /// Frames in the clear although a secret is set (benchmark baseline).
    plaintext: bool,
    epochs: crate::channel::epoch::Epochs,
    config: ProcConfig,
    registry: HashMap<String, SpawnFn>,
    sink: Option<SupervisionSink>,
}

impl ProcBuilder {
    /// Listens on `addr` (TCP `ip:port`, port 0 picks one; or a Unix path).
    /// Without a listener the proc is `unbound`: it can dial others and is
    /// reached back over the connections it opened.
    pub fn listen(mut self, addr: ChannelAddr) -> Self {
        self.listen = Some(addr);
        self
    }

    /// The shared secret that authenticates every connection (both sides
    /// must hold the same secret) and keys its encryption: every frame
    /// after the handshake is sealed with AES-256-GCM under keys derived
    /// for that connection (`channel::seal`). Without one, connections are
    /// neither authenticated nor encrypted.
    pub fn secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.auth = Some(Auth::Secret(secret.into(), None));
        self
    }

    /// With [`ProcBuilder::secret`], while a World's secret is rotated: the
    /// previous secret, which this proc still dials peers that hold only
    /// it with (the peer proves itself first, so the dialer answers with
    /// whichever secret the peer holds). It accepts connections with the
    /// current secret only.
    pub fn previous_secret(mut self, previous: impl Into<Vec<u8>>) -> Self {
        if let Some(Auth::Secret(_, p)) = &mut self.auth {
            *p = Some(previous.into());
        }
        self
    }

    /// Joins its World's runtime with its own proc credential
    /// ([`crate::channel::credential`]): every connection is authenticated
    /// by certificates of the credential's issuer, binding each side to its
    /// own proc name and epoch claim, and sealed under keys of an ephemeral
    /// key exchange. The credential must be issued for this proc's name and
    /// epoch claim ([`ProcBuilder::build`] fails otherwise).
    pub fn credential(mut self, credential: Credential) -> Self {
        self.auth = Some(Auth::Credential(credential));
        self
    }

    /// Like [`ProcBuilder::credential`], with a credential `issuer` issues
    /// this proc when it is built (for this proc's name and epoch claim):
    /// for those that hold the World's runtime key (an agent's proc desk,
    /// clients of actors).
    pub fn issued_by(mut self, issuer: Issuer) -> Self {
        self.auth = Some(Auth::Issuer(issuer));
        self
    }

    /// Benchmark baseline only: connections are authenticated with the
    /// secret but their frames travel in the clear, so the runtime bench
    /// can measure what encryption costs. Both ends must set it. Exists
    /// only with the `bench-baseline` feature, which only the bench crate
    /// enables; no binary, flag, variable or resource reaches it.
    #[cfg(feature = "bench-baseline")]
    #[doc(hidden)]
    pub fn plaintext_benchmark_baseline(mut self) -> Self {
        self.plaintext = true;
        self
    }

    /// Claims `claim` (host rank and epoch) in every handshake; peers that
    /// know a newer epoch for the rank refuse this proc
    /// ([`crate::channel::epoch`]).
    pub fn epoch(mut self, claim: crate::channel::epoch::EpochClaim) -> Self {
        self.epochs.own = Some(claim);
        self
    }

    /// Checks peers' epoch claims against `table` (shared: raising an epoch
    /// in it refuses that rank's older copies from then on).
    pub fn epoch_table(mut self, table: crate::channel::epoch::EpochTable) -> Self {
        self.epochs.table = table;
        self
    }

    /// Replaces the default settings.
    pub fn config(mut self, config: ProcConfig) -> Self {
        self.config = config;
        self
    }

    /// Lets other procs spawn actors of type `A` here (actor meshes).
    pub fn register<A: RemoteSpawn>(mut self) -> Self {
        let f: SpawnFn = Arc::new(|proc: Proc, name: String, params: Bytes, owner| {
            Box::pin(async move {
                let params: A::Params =
                    postcard::from_bytes(&params).map_err(|e| RuntimeError::Decode {
                        from: format!("spawn parameters of {}", std::any::type_name::<A>()),
                        reason: e.to_string(),
                    })?;
                let actor = A::new(params)
                    .await
                    .map_err(|e| RuntimeError::SpawnFailed {
                        actor: name.clone(),
                        reason: crate::error::StartError::New(e.to_string()),
                    })?;
                let r = proc
                    .spawn_with(&name, 0, actor, actor::Supervisor::from_owner(owner))
                    .await?;
                Ok(r.id().clone())
            })
        });
        self.registry
            .insert(std::any::type_name::<A>().to_string(), f);
        self
    }

    /// Where supervision events nobody handled go (default: an error log).
    pub fn supervision_sink(
        mut self,
        sink: impl Fn(SupervisionEvent) + Send + Sync + 'static,
    ) -> Self {
        self.sink = Some(Arc::new(sink));
        self
    }

    /// Binds the listener (if any) and starts the proc.
    pub async fn build(self) -> Result<Proc, RuntimeError> {
        let (addr, listener) = match &self.listen {
            None | Some(ChannelAddr::Unbound(_)) => (ChannelAddr::Unbound(rand::random()), None),
            Some(ChannelAddr::Tcp(a)) => {
                let l = TcpListener::bind(a)
                    .await
                    .map_err(|source| RuntimeError::Listen {
                        addr: a.to_string(),
                        source,
                    })?;
                let local = l.local_addr().map_err(|source| RuntimeError::Listen {
                    addr: a.to_string(),
                    source,
                })?;
                (ChannelAddr::Tcp(local), Some(Listener::Tcp(l)))
            }
            Some(ChannelAddr::Unix(p)) => {
                let l = UnixListener::bind(p).map_err(|source| RuntimeError::Listen {
                    addr: p.display().to_string(),
                    source,
                })?;
                (ChannelAddr::Unix(PathBuf::from(p)), Some(Listener::Unix(l)))
            }
        };
        let id = ProcId::new(addr, self.name)?;
        let system_id = id.actor(SYSTEM_ACTOR, 0)?;
        let seal = !self.plaintext;
        let keys = match self.auth {
            None => None,
            Some(Auth::Secret(s, previous)) => Some(Keys::rotating(&s, previous.as_deref(), seal)),
            Some(Auth::Issuer(issuer)) => Some(Keys::signed(
                issuer.issue(id.name(), self.epochs.own)?,
                seal,
            )),
            Some(Auth::Credential(c)) => {
                let cert = c.certificate();
                if cert.name != id.name() || cert.claim != self.epochs.own {
                    return Err(CredentialError::NotThisProc(format!(
                        "the credential is for proc {:?} claiming {:?}, this proc is {:?} claiming {:?}",
                        cert.name,
                        cert.claim,
                        id.name(),
                        self.epochs.own
                    ))
                    .into());
                }
                Some(Keys::signed(c, seal))
            }
        };
        let transport = Arc::new(Transport::new(
            id.clone(),
            self.config.channel.clone(),
            keys,
            self.epochs,
        ));
        let sink = self.sink.unwrap_or_else(|| {
            Arc::new(|e: SupervisionEvent| error!(event = %e, "unhandled supervision event"))
        });
        let inner = Arc::new(ProcInner {
            id,
            system_id,
            config: self.config,
            transport: transport.clone(),
            actors: Mutex::new(HashMap::new()),
            ports: Mutex::new(HashMap::new()),
            next_port: AtomicU64::new(1),
            next_index: Mutex::new(HashMap::new()),
            handler_cache: Mutex::new(HashMap::new()),
            registry: self.registry,
            sink: RwLock::new(sink),
        });
        transport.set_inbound(Arc::downgrade(&inner));
        if let Some(l) = listener {
            transport.serve(l);
        }
        let proc = Proc { inner };
        proc.spawn_with(SYSTEM_ACTOR, 0, ProcAgent, actor::Supervisor::Sink)
            .await?;
        Ok(proc)
    }
}

/// A proc: hosts actors and ports and talks to other procs. Cheap to clone.
///
/// Dropping every clone does not stop running actors; call
/// [`Proc::shutdown`] to stop accepting and close links.
#[derive(Clone)]
pub struct Proc {
    inner: Arc<ProcInner>,
}

pub(crate) struct ProcInner {
    id: ProcId,
    system_id: ActorId,
    config: ProcConfig,
    transport: Arc<Transport<ProcInner>>,
    actors: Mutex<HashMap<ActorId, Mailbox>>,
    ports: Mutex<HashMap<u64, PortSink>>,
    next_port: AtomicU64,
    next_index: Mutex<HashMap<String, u32>>,
    handler_cache: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    registry: HashMap<String, SpawnFn>,
    sink: RwLock<SupervisionSink>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Proc {
    /// Starts building a proc named `name` (see [`crate::id::check_name`]).
    pub fn builder(name: impl Into<String>) -> ProcBuilder {
        ProcBuilder {
            name: name.into(),
            listen: None,
            auth: None,
            plaintext: false,
            epochs: Default::default(),
            config: ProcConfig::default(),
            registry: HashMap::new(),
            sink: None,
        }
    }

    /// This proc's id (its address and name).
    pub fn id(&self) -> &ProcId {
        &self.inner.id
    }

    /// Authenticates connections made from now on with the shared secret
    /// `secret` (a World's secret was rotated); connections already
    /// established keep their session. Connections stay sealed unless the
    /// proc was built as the benchmark baseline.
    pub fn set_secret(&self, secret: &[u8]) {
        self.inner
            .transport
            .set_keys(|seal| Keys::new(secret, seal));
    }

    /// Joins connections made from now on with a credential `issuer`
    /// issues this proc (its name and epoch claim), as
    /// [`ProcBuilder::issued_by`] does; connections already established
    /// keep their session.
    pub fn reissue(&self, issuer: &Issuer) -> Result<(), RuntimeError> {
        let t = &self.inner.transport;
        let credential = issuer.issue(self.inner.id.name(), t.own_claim())?;
        t.set_keys(|seal| Keys::signed(credential, seal));
        Ok(())
    }

    /// This proc's settings.
    pub fn config(&self) -> &ProcConfig {
        &self.inner.config
    }

    /// Replaces the supervision sink.
    pub fn set_supervision_sink(&self, sink: impl Fn(SupervisionEvent) + Send + Sync + 'static) {
        *self.inner.sink.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(sink);
    }

    /// Spawns a top-level actor `name[0]`; its failure goes to the sink.
    pub async fn spawn<A: Actor>(&self, name: &str, actor: A) -> Result<ActorRef<A>, RuntimeError> {
        self.spawn_with(name, 0, actor, actor::Supervisor::Sink)
            .await
    }

    pub(crate) fn next_index(&self, name: &str) -> u32 {
        let mut m = lock(&self.inner.next_index);
        let n = m.entry(name.to_string()).or_insert(0);
        *n += 1;
        *n
    }

    pub(crate) async fn spawn_with<A: Actor>(
        &self,
        name: &str,
        index: u32,
        actor: A,
        supervisor: actor::Supervisor,
    ) -> Result<ActorRef<A>, RuntimeError> {
        let id = self.id().actor(name, index)?;
        let (tx, rx) = actor::mailbox(self.inner.config.mailbox_capacity);
        {
            let mut actors = lock(&self.inner.actors);
            if actors.contains_key(&id) {
                return Err(RuntimeError::ActorExists(Box::new(id)));
            }
            actors.insert(id.clone(), tx.clone());
        }
        let handlers = self.handlers::<A>();
        let started = actor::start(
            self.clone(),
            id.clone(),
            actor,
            tx,
            rx,
            handlers,
            supervisor,
        );
        match started.await {
            Ok(()) => Ok(ActorRef::attest(id)),
            Err(reason) => Err(RuntimeError::SpawnFailed {
                actor: id.to_string(),
                reason,
            }),
        }
    }

    fn handlers<A: Actor>(&self) -> Arc<Handlers<A>> {
        let mut cache = lock(&self.inner.handler_cache);
        let any = cache
            .entry(TypeId::of::<A>())
            .or_insert_with(|| Arc::new(Handlers::<A>::build()) as Arc<dyn Any + Send + Sync>)
            .clone();
        drop(cache);
        any.downcast::<Handlers<A>>()
            .unwrap_or_else(|_| unreachable!("the cache is keyed by type id"))
    }

    pub(crate) fn actor_mailbox(&self, id: &ActorId) -> Option<Mailbox> {
        lock(&self.inner.actors).get(id).cloned()
    }

    pub(crate) fn remove_actor(&self, id: &ActorId) {
        lock(&self.inner.actors).remove(id);
    }

    /// Number of actors running on this proc (including the system actor).
    pub fn num_actors(&self) -> usize {
        lock(&self.inner.actors).len()
    }

    /// Dials `addr`, authenticates, and returns the proc found there. Later
    /// messages to that proc use this connection.
    pub async fn connect(&self, addr: &ChannelAddr) -> Result<ProcId, RuntimeError> {
        Ok(self.inner.transport.connect(addr).await?)
    }

    /// Opens a port for any number of `M`s, owned by the proc.
    pub fn open_port<M: Message>(&self) -> (PortRef<M>, PortReceiver<M>) {
        port::port_pair(self, &self.inner.system_id, self.inner.config.port_capacity)
    }

    /// Opens a port for one `M`, owned by the proc.
    pub fn open_once_port<M: Message>(&self) -> (OncePortRef<M>, OnceReceiver<M>) {
        port::once_pair(self, &self.inner.system_id)
    }

    /// A typed reference to an actor by id (the caller vouches for the type).
    pub fn actor_ref<A: Actor>(&self, id: ActorId) -> ActorRef<A> {
        ActorRef::attest(id)
    }

    /// A reference to another proc's system actor (remote spawn).
    pub fn system_actor_of(proc: &ProcId) -> ActorRef<ProcAgent> {
        ActorRef::attest(
            proc.actor(SYSTEM_ACTOR, 0)
                .unwrap_or_else(|_| unreachable!("the system actor name is valid")),
        )
    }

    /// Stops accepting connections and closes links. Running actors keep
    /// running until their handles are dropped.
    pub fn shutdown(&self) {
        self.inner.transport.shutdown();
    }

    pub(crate) fn register_port(&self, sink: PortSink) -> u64 {
        let port = self.inner.next_port.fetch_add(1, Ordering::Relaxed) | OPEN_PORT_BIT;
        lock(&self.inner.ports).insert(port, sink);
        port
    }

    pub(crate) fn close_port(&self, port: u64) {
        lock(&self.inner.ports).remove(&port);
    }

    /// Sends one envelope.
    pub(crate) async fn post(
        &self,
        sender: &ActorId,
        dest: PortId,
        reply_to: Option<PortId>,
        payload: Bytes,
    ) {
        let env = Envelope {
            sender: sender.clone(),
            dest,
            reply_to,
            error: None,
            payload,
        };
        self.inner.route(env).await;
    }

    /// Queues `msg` for handler port `port` of `dest` on another proc
    /// without building an envelope: staged on this thread inside a
    /// [`crate::batched`] scope, else appended to the run last queued for
    /// that proc if it has the same sender and destination. `false`: send
    /// it the ordinary way.
    pub(crate) fn try_repeat<M: serde::Serialize>(
        &self,
        sender: &ActorId,
        dest: &ActorId,
        port: u64,
        msg: &M,
    ) -> bool {
        let Ok(len) = postcard::experimental::serialized_size(msg) else {
            return false;
        };
        self.inner
            .transport
            .try_repeat(sender, dest, port, len, |buf| {
                crate::port::encode_into(msg, buf).is_ok()
            })
    }

    pub(crate) async fn route(&self, env: Envelope) {
        self.inner.route(env).await;
    }

    pub(crate) fn bounce(&self, env: Envelope, reason: String) {
        self.inner.bounce(env, reason);
    }

    /// Changes whenever the connection to `peer` is lost (`None` for this
    /// proc itself).
    pub fn lost_watch(&self, peer: &ProcId) -> Option<watch::Receiver<u64>> {
        (peer != &self.inner.id).then(|| self.inner.transport.lost_watch(peer))
    }

    pub(crate) fn report(&self, event: SupervisionEvent) {
        let sink = self
            .inner
            .sink
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        sink(event);
    }

    pub(crate) fn registry_spawn(&self, type_name: &str) -> Option<SpawnFn> {
        self.inner.registry.get(type_name).cloned()
    }

    /// Whether an actor type of that name was registered for remote spawn
    /// ([`ProcBuilder::register`]).
    pub fn is_registered(&self, type_name: &str) -> bool {
        self.inner.registry.contains_key(type_name)
    }

    /// Spawns an actor of the registered type `type_name` named `name` from
    /// its encoded `params`, reporting its supervision events to `events`;
    /// `None` when no such type is registered.
    pub async fn spawn_registered(
        &self,
        type_name: &str,
        name: String,
        params: Bytes,
        events: Option<PortRef<SupervisionEvent>>,
    ) -> Option<Result<ActorId, RuntimeError>> {
        let spawn = self.registry_spawn(type_name)?;
        Some(spawn(self.clone(), name, params, events).await)
    }

    /// Asks the actor `id` of this proc to stop, with `reason` in its
    /// status; false when no such actor runs here.
    pub async fn stop_actor(&self, id: &ActorId, reason: String) -> bool {
        match self.actor_mailbox(id) {
            Some(mb) => mb.send(crate::actor::Signal::Stop(reason)).await.is_ok(),
            None => false,
        }
    }
}

impl CanSend for Proc {
    fn proc(&self) -> &Proc {
        self
    }
    fn sender_id(&self) -> &ActorId {
        &self.inner.system_id
    }
}

impl ProcInner {
    async fn route(self: &Arc<Self>, env: Envelope) {
        if env.dest.actor().proc() == &self.id {
            self.deliver(env).await;
        } else {
            self.transport.send(env).await;
        }
    }

    fn proc(self: &Arc<Self>) -> Proc {
        Proc {
            inner: self.clone(),
        }
    }

    /// An error-return nobody can take: report it to the sink.
    fn report_lost_return(self: &Arc<Self>, env: &Envelope, reason: &str) {
        let what = if env.dest.index() == UNDELIVERABLE_PORT {
            let dest: Option<PortId> = postcard::from_bytes(&env.payload).ok();
            format!(
                "undeliverable message to {}: {}",
                dest.map(|d| d.to_string()).unwrap_or_else(|| "?".into()),
                env.error.as_deref().unwrap_or("")
            )
        } else {
            format!(
                "failed reply from {}: {}",
                env.sender,
                env.error.as_deref().unwrap_or("")
            )
        };
        self.proc().report(SupervisionEvent {
            actor: env.dest.actor().clone(),
            status: ActorStatus::Failed(format!("{what} (and the sender is gone: {reason})")),
            cause: None,
        });
    }
}

impl Inbound for ProcInner {
    async fn deliver(&self, env: Envelope) {
        let port = env.dest.index();
        if port & OPEN_PORT_BIT != 0 {
            let sink = {
                let mut ports = lock(&self.ports);
                match ports.get(&port) {
                    Some(PortSink::Once(_)) => ports.remove(&port),
                    Some(PortSink::Many(tx)) => Some(PortSink::Many(tx.clone())),
                    None => None,
                }
            };
            match sink {
                Some(PortSink::Once(tx)) => {
                    if let Err(env) = tx.send(env) {
                        self.bounce(env, "the reply port's receiver is gone".into());
                    }
                }
                Some(PortSink::Many(tx)) => {
                    if let Err(mpsc::error::SendError(env)) = tx.send(env).await {
                        lock(&self.ports).remove(&port);
                        self.bounce(env, "the port's receiver is gone".into());
                    }
                }
                None => {
                    let reason = format!("port {} is closed", env.dest);
                    self.bounce(env, reason);
                }
            }
            return;
        }
        let mailbox = lock(&self.actors).get(env.dest.actor()).cloned();
        match mailbox {
            Some(tx) => {
                if let Err(Signal::Message(env)) = tx.send(Signal::Message(Box::new(env))).await {
                    let reason = format!("actor {} stopped", env.dest.actor());
                    self.bounce(*env, reason);
                }
            }
            None => {
                let reason = format!("no actor {} on this proc", env.dest.actor());
                self.bounce(env, reason);
            }
        }
    }

    async fn deliver_batch(&self, batch: Vec<Arrivals>) {
        let Some(first) = batch.first() else { return };
        let mailbox = lock(&self.actors).get(first.dest().actor()).cloned();
        let (back, stopped) = match mailbox {
            Some(tx) => match tx.send_batch(batch).await {
                Ok(()) => return,
                Err(back) => (back, true),
            },
            None => (batch, false),
        };
        for env in back.into_iter().flatten() {
            let reason = if stopped {
                format!("actor {} stopped", env.dest.actor())
            } else {
                format!("no actor {} on this proc", env.dest.actor())
            };
            self.bounce(env, reason);
        }
    }

    fn bounce(&self, env: Envelope, reason: String) {
        // Rebuild an Arc to route the return (the transport holds a Weak).
        let Some(inner) = self.transport_inbound() else {
            return;
        };
        if env.error.is_some() || env.dest.index() == UNDELIVERABLE_PORT {
            // Never bounce a return: report it where it ended up.
            inner.report_lost_return(&env, &reason);
            return;
        }
        debug!(dest = %env.dest, %reason, "bouncing undeliverable message");
        let ret = match env.reply_to {
            Some(reply_to) => Envelope {
                sender: env.dest.actor().clone(),
                dest: reply_to,
                reply_to: None,
                error: Some(reason),
                payload: Bytes::new(),
            },
            None => {
                let payload = match postcard::to_allocvec(&env.dest) {
                    Ok(p) => Bytes::from(p),
                    Err(e) => {
                        warn!(error = %e, "cannot encode an undeliverable notice");
                        return;
                    }
                };
                Envelope {
                    sender: env.dest.actor().clone(),
                    dest: env.sender.port(UNDELIVERABLE_PORT),
                    reply_to: None,
                    error: Some(reason),
                    payload,
                }
            }
        };
        tokio::spawn(async move { inner.route(ret).await });
    }
}

impl ProcInner {
    fn transport_inbound(&self) -> Option<Arc<ProcInner>> {
        self.transport.inbound()
    }
}

/// Decodes the undeliverable notice carried by a return envelope.
pub(crate) fn undeliverable_of(env: &Envelope) -> Undeliverable {
    let dest = postcard::from_bytes(&env.payload).unwrap_or_else(|_| env.dest.clone());
    Undeliverable {
        dest,
        reason: env.error.clone().unwrap_or_default(),
    }
}
