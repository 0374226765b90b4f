//! The supervision hub: the operator's side of the agent protocol. It dials
//! every host agent of every World (with the World's secret), keeps each
//! agent's last heartbeat in an ordered index, collects proc states from the
//! agents' pushes, and wakes the controllers through coalesced triggers.
//!
//! Invariants:
//! 1. The hub never writes to the API server; controllers read its view
//!    ([`Hub::liveness`], [`Hub::proc_states`]) while reconciling and write
//!    status. A trigger is a request to reconcile, coalesced per object
//!    ([`coalesce`]): first failures and stall starts at once, else at most
//!    once a second.
//! 2. Expiry costs O(expired) ([`heartbeat`]).
//! 3. Agents are the source of truth for procs: on (re)connect an agent's
//!    Snapshot replaces what the hub knew of that host, and requests are
//!    resent only when the desired spec differs from what was sent over the
//!    current connection (CreateOrUpdate is idempotent, so a restarted
//!    operator creates no duplicates).
//! 4. The hub holds its lock only for bookkeeping, never across an await.
//! 5. Syncing a World never waits on an agent: the address book goes to
//!    each agent from a task of its own link ([`book::sender`]), latest
//!    book only, so a hung agent delays neither a reconcile (and with it an
//!    eviction decision) nor the other hosts. After the whole book, an
//!    agent gets only the changes (O(hosts) messages and entries per
//!    change, not O(hosts²)).
//! 6. A failure is stamped when it arrives with the agent's time of it,
//!    corrected by that agent's clock offset ([`clock`], sampled from its
//!    heartbeats and snapshots), and with its receipt time; a report of a
//!    failure already held keeps both, so the order of failures across
//!    hosts is the order they happened, whatever order they arrive in.
//! 7. Rank epochs ([`fence`]): a push from an agent of an older epoch than
//!    its pod's, or from a fenced agent, is refused (no heartbeat counts),
//!    and every heartbeat that counts is answered with a `Renew` of the
//!    pod's epoch from the link's own task, so an agent stops hearing
//!    renewals as soon as this hub stops hearing it.
//! 8. A lost push heals: the hub keeps, per host, what the agent's
//!    [`hostmesh_agent::digest`] reads of every proc it heard of (from the
//!    Snapshot and every change since). When two heartbeats in a row carry
//!    a digest that differs from the digest of that picture, it asks the
//!    agent for a fresh Snapshot ([`AgentLink::resync`]), at most once per
//!    [`RESYNC_INTERVAL`] per host; the Snapshot replaces the picture
//!    (invariant 3).
//! 9. The operator's own stall is no host's silence ([`pause`]): when the
//!    hub's loop wakes much later than it meant to (the process was
//!    stopped, frozen or starved), every heartbeat deadline moves later by
//!    the stall before any is judged or any push that waited through it
//!    is handled.
//! 10. A host that leaves the hub's view (its pod terminating, so it has no
//!     address to dial) keeps when it was last heard and since when it was
//!     watched until a new pod of its rank comes, so a pod stuck
//!     terminating on a hung node is force-deleted once its agent must
//!     have fenced (`controllers::world::fencing`), not waited on forever.
//! 11. A Snapshot that lacks a proc the hub knew alive on that host (its
//!     agent restarted: a container or kubelet restart) makes it `Lost`,
//!     a failure timed at when the agent was last heard before, so the
//!     procs one restart took count as one failure, whichever host's agent
//!     comes back first.

pub mod agent;
pub mod book;
pub mod clock;
pub mod coalesce;
pub mod fence;
pub mod heartbeat;
pub mod holdback;
pub mod pause;
mod procs;
pub mod runtime_client;
pub mod sim;
mod stacks;
pub mod trust;
mod worker;

pub use procs::{mesh_name, parse_proc_name, proc_name};
pub use stacks::RankStacks;

use hostmesh_crds::Rank;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hostmesh_crds::procmesh::ProcState;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::{Notify, mpsc};
use tracing::{debug, info, warn};

pub use agent::{
    AgentConnector, AgentLink, AgentTarget, BookAck, BookUpdate, CreateOrUpdate, HostKey,
    HostReport, LinkError, ProcObs, WorldKey, protocol,
};
use coalesce::Coalescer;
use heartbeat::HeartbeatIndex;

pub use heartbeat::Liveness;

/// Interval between non-urgent status triggers per object.
pub const COALESCE_INTERVAL: Duration = Duration::from_secs(1);
const PUSH_QUEUE: usize = 4096;
const DRAIN_BATCH: usize = 1024;
/// Least time between two requests for a fresh Snapshot of one host
/// (invariant 8).
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(5);

/// A ProcMesh, by namespace and name.
pub type MeshKey = WorldKey;

impl std::fmt::Debug for WorldAgents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secrets stay out of logs.
        f.debug_struct("WorldAgents")
            .field("rotating", &self.previous.is_some())
            .field("trust", &self.trust)
            .field("health_timeout", &self.health_timeout)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("hosts", &self.hosts)
            .field("epochs", &self.epochs)
            .finish()
    }
}

/// Desired agents of a World, as its controller sees them.
#[derive(Clone)]
pub struct WorldAgents {
    /// The World's secret.
    pub secret: Arc<[u8]>,
    /// While the World's secret is rotated: the previous one, which the
    /// hub also dials agents with (those that did not take the new one).
    pub previous: Option<Arc<[u8]>>,
    /// Once the World's token was rotated in place: what every link to
    /// its agents hands the agent ([`trust`]).
    pub trust: Option<Arc<trust::Trust>>,
    /// No heartbeat for this long: Expired.
    pub health_timeout: Duration,
    /// How often its agents send heartbeats (`spec.agent.heartbeatInterval`).
    pub heartbeat_interval: Duration,
    /// Hosts with a pod IP: rank to (pod UID, agent address).
    pub hosts: BTreeMap<Rank, (String, SocketAddr)>,
    /// Rank epochs of those pods (`hostmesh.dev/epoch`; absent: 0).
    pub epochs: BTreeMap<Rank, u64>,
}

struct HostEntry {
    /// What the digest reads of every proc the agent reported, by name
    /// (invariant 8).
    held: BTreeMap<String, hostmesh_agent::DigestEntry>,
    /// The digest of `held`, computed once per change of `held` rather than
    /// on every heartbeat (`None`: not computed since the last change).
    held_digest: Option<u64>,
    /// Heartbeats in a row whose digest differed from `held`'s.
    digest_misses: u32,
    /// When a fresh Snapshot was last asked for (invariant 8).
    resync_asked: Option<Instant>,
    pod_uid: String,
    addr: SocketAddr,
    link: Option<Arc<dyn AgentLink>>,
    connecting: bool,
    /// Requests sent over the current link: a digest of each, by proc name
    /// (only equality matters; a whole request per proc would cost the
    /// hub its spec per rank).
    sent: HashMap<String, u64>,
    /// Stops sent over the current link, by proc name.
    stopping: HashSet<String>,
    /// Wakes the link's address book sender ([`book::sender`]) with the
    /// book's latest version; `None` while there is no link.
    book: Option<tokio::sync::watch::Sender<u64>>,
    /// Hands the link's agent the World's latest trust ([`trust::sender`]);
    /// `None` while there is no link.
    trust: Option<tokio::sync::watch::Sender<Option<Arc<trust::Trust>>>>,
    /// The trust version the current link's agent took (0: none).
    trusted: Arc<std::sync::atomic::AtomicU64>,
    /// The pod's rank epoch.
    epoch: u64,
    /// Wakes the link's renewer ([`fence::renewer`]) on each heartbeat
    /// that counts; `None` while there is no link.
    renew: Option<tokio::sync::watch::Sender<()>>,
    /// When this hub first had the agent's Snapshot (wall clock): before
    /// it, the hub knows nothing of the host's procs (a new leader).
    reported_at: Option<Timestamp>,
    /// Why the last connection to this agent dropped or failed, until a
    /// heartbeat arrives again.
    link_error: Option<String>,
    /// When this hub first had this pod's agent to dial (wall clock).
    watched_at: Timestamp,
    /// The agent's clock offset ([`clock`]), for this pod's agent.
    clock: clock::AgentClock,
    /// When this hub last heard the agent (wall clock): a host that is
    /// lost died after it.
    last_heard: Option<Timestamp>,
    /// The host's Monarch worker as its agent last reported it
    /// ([`worker`]).
    worker: Option<protocol::ProcReport>,
}

impl HostEntry {
    /// Forgets the current link and what was sent over it; its senders
    /// (book, trust, renewals) end with it.
    fn drop_link(&mut self) {
        self.link = None;
        self.sent.clear();
        self.stopping.clear();
        self.book = None;
        self.trust = None;
        self.renew = None;
    }
}

struct WorldEntry {
    agents: WorldAgents,
    hosts: BTreeMap<Rank, HostEntry>,
    /// Proc states by mesh id, then rank.
    procs: HashMap<String, BTreeMap<Rank, ProcObs>>,
    /// The highest epoch given for each rank, kept after its pod goes.
    highest_epochs: BTreeMap<Rank, u64>,
    /// The address book and its recent changes ([`book`]).
    book: Arc<Mutex<book::BookLog>>,
    /// Hosts that left the view, by rank (invariant 10).
    departed: BTreeMap<Rank, Departed>,
}

/// What the hub last knew of a host that left its view (invariant 10).
struct Departed {
    pod_uid: String,
    last_heard: Option<Timestamp>,
    watched_at: Timestamp,
}

struct State {
    worlds: HashMap<WorldKey, WorldEntry>,
    heartbeats: HeartbeatIndex<HostKey>,
    /// Expired hosts and when they expired (wall clock, for status).
    expired: HashMap<HostKey, Timestamp>,
    world_triggers: Coalescer<WorldKey>,
    mesh_triggers: Coalescer<MeshKey>,
}

/// Counters for benchmarks and metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct HubStats {
    /// Pushes handled.
    pub pushes: u64,
    /// World triggers emitted.
    pub world_triggers: u64,
    /// ProcMesh triggers emitted.
    pub mesh_triggers: u64,
    /// Fresh snapshots asked for because a heartbeat's digest differed
    /// from the hub's picture (invariant 8).
    pub resyncs: u64,
}

/// The supervision hub (see the module doc).
pub struct Hub {
    metrics: std::sync::OnceLock<Arc<crate::metrics::Metrics>>,
    connector: Arc<dyn AgentConnector>,
    state: Mutex<State>,
    stats: Mutex<HubStats>,
    push_tx: mpsc::Sender<HostReport>,
    push_rx: Mutex<Option<mpsc::Receiver<HostReport>>>,
    wake: Notify,
}

impl Hub {
    /// A hub dialing agents through `connector`.
    pub fn new(connector: Arc<dyn AgentConnector>) -> Arc<Self> {
        let (push_tx, push_rx) = mpsc::channel(PUSH_QUEUE);
        Arc::new(Hub {
            metrics: std::sync::OnceLock::new(),
            connector,
            state: Mutex::new(State {
                worlds: HashMap::new(),
                heartbeats: HeartbeatIndex::default(),
                expired: HashMap::new(),
                world_triggers: Coalescer::new(COALESCE_INTERVAL),
                mesh_triggers: Coalescer::new(COALESCE_INTERVAL),
            }),
            stats: Mutex::new(HubStats::default()),
            push_tx,
            push_rx: Mutex::new(Some(push_rx)),
            wake: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain bookkeeping behind;
        // keep serving rather than poisoning every controller.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counters so far.
    pub fn stats(&self) -> HubStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records heartbeats (count and the gap since the host's previous one)
    /// in `metrics` from now on; the first call wins.
    pub fn set_metrics(&self, metrics: Arc<crate::metrics::Metrics>) {
        let _ = self.metrics.set(metrics);
    }

    fn observe_heartbeat(&self, gap: Option<Option<Duration>>) {
        if let (Some(m), Some(gap)) = (self.metrics.get(), gap) {
            m.observe_heartbeat(gap);
        }
    }

    /// A sender for pushes (the connector's agents use it; so do tests).
    pub fn push_sender(&self) -> mpsc::Sender<HostReport> {
        self.push_tx.clone()
    }

    /// Runs the hub until `shutdown` resolves: handles pushes, expiry and
    /// coalesced triggers. Call once.
    pub async fn run(
        self: Arc<Self>,
        triggers_world: mpsc::UnboundedSender<WorldKey>,
        triggers_mesh: mpsc::UnboundedSender<MeshKey>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let Some(mut rx) = self
            .push_rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            warn!("supervision hub started twice; ignoring the second start");
            return;
        };
        tokio::pin!(shutdown);
        let mut pause = pause::PauseDetector::default();
        loop {
            self.forgive_stall(pause.woke(Instant::now()));
            let next = self.tick(Instant::now(), &triggers_world, &triggers_mesh);
            let sleep = next
                .map_or(Duration::from_secs(1), |n| {
                    n.saturating_duration_since(Instant::now())
                })
                .min(Duration::from_secs(1));
            pause.expect(Instant::now() + sleep);
            tokio::select! {
                _ = &mut shutdown => return,
                push = rx.recv() => match push {
                    Some(p) => {
                        // A stall is forgiven before the pushes that
                        // waited through it count (invariant 9).
                        self.forgive_stall(pause.woke(Instant::now()));
                        self.handle_push(p, Instant::now());
                        // Drain a bounded batch, so a storm of pushes cannot
                        // starve expiry and triggers.
                        for _ in 0..DRAIN_BATCH {
                            match rx.try_recv() {
                                Ok(p) => self.handle_push(p, Instant::now()),
                                Err(_) => break,
                            }
                        }
                    }
                    None => return,
                },
                _ = tokio::time::sleep(sleep) => {}
                _ = self.wake.notified() => {}
            }
        }
    }

    /// The hub itself stalled for `stalled` ([`pause`]): every live
    /// heartbeat deadline moves that much later, so no host is expired for
    /// the operator's own silence (invariant 9).
    pub fn forgive_stall(&self, stalled: Option<Duration>) {
        let Some(by) = stalled else { return };
        let mut st = self.lock();
        warn!(stalled = ?by, hosts = st.heartbeats.len(), "the operator's process stalled (paused, frozen or starved): heartbeat deadlines moved later by the stall, no host is expired for it");
        st.heartbeats.postpone(by);
    }

    /// Expires silent hosts and emits due triggers; returns when to tick
    /// next.
    pub fn tick(
        &self,
        now: Instant,
        worlds: &mpsc::UnboundedSender<WorldKey>,
        meshes: &mpsc::UnboundedSender<MeshKey>,
    ) -> Option<Instant> {
        let mut st = self.lock();
        for host in st.heartbeats.pop_expired(now) {
            info!(world = %host.world.name, namespace = %host.world.namespace, rank = host.rank, "host agent expired: no heartbeat within healthTimeout");
            st.world_triggers.mark(host.world.clone(), true, now);
            st.expired.insert(host, Timestamp::now());
        }
        let due_w = st.world_triggers.pop_due(now);
        let due_m = st.mesh_triggers.pop_due(now);
        let next = [
            st.heartbeats.next_deadline(),
            st.world_triggers.next_due(),
            st.mesh_triggers.next_due(),
        ]
        .into_iter()
        .flatten()
        .min();
        drop(st);
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats.world_triggers += due_w.len() as u64;
        stats.mesh_triggers += due_m.len() as u64;
        drop(stats);
        for w in due_w {
            let _ = worlds.send(w);
        }
        for m in due_m {
            let _ = meshes.send(m);
        }
        next
    }

    /// Applies one push to the hub's view.
    pub fn handle_push(&self, push: HostReport, now: Instant) {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).pushes += 1;
        let mut guard = self.lock();
        let st = &mut *guard;
        match push {
            HostReport::Heartbeat {
                host,
                pod_uid,
                clock,
                digest,
            } => {
                let gap = beat(st, &host, &pod_uid, now);
                sample_clock(st, &host, &pod_uid, clock);
                self.observe_heartbeat(gap);
                let resync = digest.and_then(|d| check_digest(st, &host, &pod_uid, d, now));
                drop(guard);
                if let Some(link) = resync {
                    self.stats.lock().unwrap_or_else(|e| e.into_inner()).resyncs += 1;
                    link.resync();
                }
            }
            HostReport::Snapshot {
                host,
                pod_uid,
                procs,
                clock,
            } => {
                if !is_current(st, &host, &pod_uid) {
                    debug!(world = %host.world.name, rank = host.rank, "ignoring a snapshot from a pod that is gone or replaced");
                    return;
                }
                // When the agent was heard before this Snapshot: procs it
                // no longer has ended after that (invariant 11).
                let heard_before = st
                    .worlds
                    .get(&host.world)
                    .and_then(|w| w.hosts.get(&host.rank))
                    .and_then(|h| h.last_heard);
                beat(st, &host, &pod_uid, now);
                sample_clock(st, &host, &pod_uid, clock);
                let Some(h) = st
                    .worlds
                    .get_mut(&host.world)
                    .and_then(|w| w.hosts.get_mut(&host.rank))
                else {
                    return;
                };
                h.held = procs
                    .iter()
                    .map(|p| (p.name.clone(), hostmesh_agent::DigestEntry::of(p)))
                    .collect();
                h.held_digest = None;
                h.digest_misses = 0;
                h.resync_asked = None;
                h.reported_at.get_or_insert_with(Timestamp::now);
                let agent_clock = h.clock.clone();
                worker::from_snapshot(st, &host, &procs, now);
                let received = Timestamp::now();
                let Some(w) = st.worlds.get_mut(&host.world) else {
                    return;
                };
                let mut touched = HashSet::new();
                // What the hub knew of this host's procs: a failure it had
                // heard of keeps its times.
                let mut known: HashMap<(String, Rank), ProcObs> = HashMap::new();
                for (mesh, states) in w.procs.iter_mut() {
                    let before = states.len();
                    states.retain(|r, o| {
                        if o.host == host.rank {
                            known.insert((mesh.clone(), *r), o.clone());
                        }
                        o.host != host.rank
                    });
                    if states.len() != before {
                        touched.insert(mesh.clone());
                    }
                }
                for p in procs {
                    let Some((mesh, rank)) = parse_proc_name(&p.name) else {
                        continue;
                    };
                    touched.insert(mesh.to_string());
                    let prev = known.remove(&(mesh.to_string(), rank));
                    let obs = ProcObs::from_agent(host.rank, &p).stamp(
                        &p,
                        &agent_clock,
                        received,
                        prev.as_ref(),
                    );
                    w.procs
                        .entry(mesh.to_string())
                        .or_default()
                        .insert(rank, obs);
                }
                // Invariant 11: a live proc the agent no longer has is lost
                // (its agent restarted), timed after it was last heard.
                for ((mesh, rank), o) in known {
                    if !matches!(
                        o.state,
                        ProcState::Starting | ProcState::Running | ProcState::Stopping
                    ) {
                        continue;
                    }
                    let lost = ProcObs {
                        state: ProcState::Lost,
                        reason: Some(format!(
                            "host {}'s agent no longer has the proc (the agent restarted)",
                            host.rank
                        )),
                        failed_at: Some(heard_before.unwrap_or(received).min(received)),
                        detected_at: Some(received),
                        addr: None,
                        stall: None,
                        ..o
                    };
                    w.procs.entry(mesh).or_default().insert(rank, lost);
                }
                for mesh in touched {
                    let key = MeshKey {
                        namespace: host.world.namespace.clone(),
                        name: mesh_name(&mesh).to_string(),
                    };
                    st.mesh_triggers.mark(key, false, now);
                }
            }
            HostReport::ProcState {
                host,
                pod_uid,
                state,
            } => {
                // A late report of a pod that is gone (its World suspended,
                // its host replaced) is not of the procs this rank runs now.
                if !is_current(st, &host, &pod_uid) {
                    debug!(world = %host.world.name, rank = host.rank, proc = %state.name, "ignoring a proc report from a pod that is gone or replaced");
                    return;
                }
                if let Some(h) = st
                    .worlds
                    .get_mut(&host.world)
                    .and_then(|w| w.hosts.get_mut(&host.rank))
                {
                    h.held
                        .insert(state.name.clone(), hostmesh_agent::DigestEntry::of(&state));
                    h.held_digest = None;
                }
                if worker::is_worker(&state) {
                    worker::record(st, &host, state, now);
                    return;
                }
                let Some(w) = st.worlds.get_mut(&host.world) else {
                    return;
                };
                let Some((mesh, rank)) = parse_proc_name(&state.name) else {
                    debug!(name = %state.name, "ignoring a proc the operator did not name");
                    return;
                };
                let received = Timestamp::now();
                let agent_clock = w
                    .hosts
                    .get(&host.rank)
                    .map(|h| h.clock.clone())
                    .unwrap_or_default();
                let states = w.procs.entry(mesh.to_string()).or_default();
                let before = states.get(&rank);
                let obs = ProcObs::from_agent(host.rank, &state).stamp(
                    &state,
                    &agent_clock,
                    received,
                    before,
                );
                if before == Some(&obs) {
                    return;
                }
                // A failure, a stall that began or a new actor failure is
                // written at once.
                let stall_began = obs.stall.is_some() && before.is_none_or(|o| o.stall.is_none());
                let urgent = obs.state.is_failure()
                    || stall_began
                    || before.map_or(0, |b| b.actor_failures) != obs.actor_failures;
                states.insert(rank, obs);
                let key = MeshKey {
                    namespace: host.world.namespace.clone(),
                    name: mesh_name(mesh).to_string(),
                };
                st.mesh_triggers.mark(key, urgent, now);
            }
            HostReport::Disconnected { host, reason } => {
                if let Some(h) = st
                    .worlds
                    .get_mut(&host.world)
                    .and_then(|w| w.hosts.get_mut(&host.rank))
                {
                    h.link_error = Some(reason);
                    debug!(world = %host.world.name, rank = host.rank, "agent connection dropped");
                    h.drop_link();
                    h.digest_misses = 0;
                }
                st.world_triggers.mark(host.world, false, now);
            }
            HostReport::Rekeyed { host } => {
                st.world_triggers.mark(host.world, false, now);
            }
            HostReport::Refused {
                host,
                pod_uid,
                reason,
            } => {
                let Some(h) = st
                    .worlds
                    .get_mut(&host.world)
                    .and_then(|w| w.hosts.get_mut(&host.rank))
                    .filter(|h| h.pod_uid == pod_uid)
                else {
                    return;
                };
                // A stale agent learns from the renewal's newer epoch that
                // it was replaced, and fences (a fenced one ignores it).
                if let Some(renew) = &h.renew {
                    renew.send_replace(());
                }
                if h.link_error.as_deref() != Some(reason.as_str()) {
                    warn!(world = %host.world.name, namespace = %host.world.namespace, rank = host.rank, %reason, "refusing the agent's pushes");
                    h.link_error = Some(reason);
                    st.world_triggers.mark(host.world, false, now);
                }
            }
        }
    }

    /// The hub's view of host `rank`'s agent in pod `pod_uid`.
    pub fn liveness(&self, world: &WorldKey, rank: Rank, pod_uid: &str) -> Liveness {
        let st = self.lock();
        let key = HostKey {
            world: world.clone(),
            rank,
        };
        let same_pod = st
            .worlds
            .get(world)
            .and_then(|w| w.hosts.get(&rank))
            .is_some_and(|h| h.pod_uid == pod_uid);
        if !same_pod {
            Liveness::Unknown
        } else if st.heartbeats.contains(&key) {
            Liveness::Alive
        } else if st.expired.contains_key(&key) {
            Liveness::Expired
        } else {
            Liveness::Unknown
        }
    }

    /// The key this hub dials `world`'s agents with, if it knows the World.
    pub fn world_secret(&self, world: &WorldKey) -> Option<Arc<[u8]>> {
        self.lock()
            .worlds
            .get(world)
            .map(|w| w.agents.secret.clone())
            .filter(|k| !k.is_empty())
    }

    /// Since when this hub has been dialing host `rank`'s agent in pod
    /// `pod_uid` (a new leader: since it took over).
    pub fn watching_since(&self, world: &WorldKey, rank: Rank, pod_uid: &str) -> Option<Timestamp> {
        let st = self.lock();
        let w = st.worlds.get(world)?;
        match w.hosts.get(&rank) {
            Some(h) => (h.pod_uid == pod_uid).then_some(h.watched_at),
            None => w
                .departed
                .get(&rank)
                .filter(|d| d.pod_uid == pod_uid)
                .map(|d| d.watched_at),
        }
    }

    /// The highest rank epoch this hub was given for host `rank` of
    /// `world` (0: none).
    pub fn highest_epoch(&self, world: &WorldKey, rank: Rank) -> u64 {
        let st = self.lock();
        st.worlds
            .get(world)
            .and_then(|w| w.highest_epochs.get(&rank))
            .copied()
            .unwrap_or(0)
    }

    /// Why the hub's last connection to host `rank`'s agent in pod `pod_uid`
    /// dropped or failed (a refused handshake, an unreachable address), if
    /// no heartbeat came since.
    pub fn link_error(&self, world: &WorldKey, rank: Rank, pod_uid: &str) -> Option<String> {
        let st = self.lock();
        st.worlds
            .get(world)
            .and_then(|w| w.hosts.get(&rank))
            .filter(|h| h.pod_uid == pod_uid)
            .and_then(|h| h.link_error.clone())
    }

    /// When this hub last counted a heartbeat of host `rank`'s agent: of
    /// the one in pod `pod_uid`, or with `None` of whichever pod of the rank
    /// this hub still knows (a lost host's procs died after it).
    pub fn last_heard(
        &self,
        world: &WorldKey,
        rank: Rank,
        pod_uid: Option<&str>,
    ) -> Option<Timestamp> {
        let st = self.lock();
        let w = st.worlds.get(world)?;
        match w.hosts.get(&rank) {
            Some(h) => h
                .last_heard
                .filter(|_| pod_uid.is_none_or(|uid| h.pod_uid == uid)),
            None => w
                .departed
                .get(&rank)
                .filter(|d| pod_uid.is_none_or(|uid| d.pod_uid == uid))
                .and_then(|d| d.last_heard),
        }
    }

    /// When host `rank`'s agent in pod `pod_uid` expired, if it is Expired.
    pub fn expired_since(&self, world: &WorldKey, rank: Rank, pod_uid: &str) -> Option<Timestamp> {
        if self.liveness(world, rank, pod_uid) != Liveness::Expired {
            return None;
        }
        let key = HostKey {
            world: world.clone(),
            rank,
        };
        self.lock().expired.get(&key).copied()
    }

    /// Brings the hub's agents of `world` in line with `agents`: dials new
    /// or replaced hosts, forgets removed ones, hands a changed address book
    /// to each agent's sender (invariant 5). Connection failures are logged;
    /// the next sync retries.
    pub async fn sync_world(self: &Arc<Self>, world: &WorldKey, agents: WorldAgents) {
        let mut dial = Vec::new();
        {
            let mut st = self.lock();
            let st = &mut *st;
            let entry = st
                .worlds
                .entry(world.clone())
                .or_insert_with(|| WorldEntry {
                    agents: agents.clone(),
                    hosts: BTreeMap::new(),
                    procs: HashMap::new(),
                    highest_epochs: BTreeMap::new(),
                    book: Arc::default(),
                    departed: BTreeMap::new(),
                });
            for (r, e) in &agents.epochs {
                let h = entry.highest_epochs.entry(*r).or_default();
                *h = (*h).max(*e);
            }
            let book_changed = book::lock(&entry.book).update(&agents);
            let book_version = book::lock(&entry.book).version();
            // A rotated secret: every host is dialed again by a client
            // with the new secrets (trust invariant 2).
            let redial =
                entry.agents.secret != agents.secret || entry.agents.previous != agents.previous;
            let trust_changed = entry.agents.trust.as_ref().map(|t| t.version)
                != agents.trust.as_ref().map(|t| t.version);
            entry.agents = agents.clone();
            if redial {
                entry.hosts.values_mut().for_each(HostEntry::drop_link);
                self.connector.forget_world(world);
            } else if trust_changed {
                for h in entry.hosts.values() {
                    if let Some(tx) = &h.trust {
                        tx.send_replace(agents.trust.clone());
                    }
                }
            }
            let gone: Vec<Rank> = entry
                .hosts
                .keys()
                .filter(|r| !agents.hosts.contains_key(r))
                .copied()
                .collect();
            for r in gone {
                if let Some(h) = entry.hosts.remove(&r) {
                    entry.departed.insert(
                        r,
                        Departed {
                            pod_uid: h.pod_uid,
                            last_heard: h.last_heard,
                            watched_at: h.watched_at,
                        },
                    );
                }
                // Its procs went with it: a later pod of this rank starts
                // from nothing (a stale Succeeded or Running report must not
                // stand for procs that no longer exist).
                for states in entry.procs.values_mut() {
                    states.retain(|_, o| o.host != r);
                }
                let key = HostKey {
                    world: world.clone(),
                    rank: r,
                };
                self.connector.forget_host(&key);
                st.heartbeats.remove(&key);
                st.expired.remove(&key);
            }
            for (rank, (uid, addr)) in &agents.hosts {
                let epoch = agents.epochs.get(rank).copied().unwrap_or(0);
                let replaced = entry
                    .hosts
                    .get(rank)
                    .is_some_and(|h| &h.pod_uid != uid || &h.addr != addr || h.epoch != epoch);
                if replaced {
                    entry.hosts.remove(rank);
                    let key = HostKey {
                        world: world.clone(),
                        rank: *rank,
                    };
                    st.heartbeats.remove(&key);
                    st.expired.remove(&key);
                    for states in entry.procs.values_mut() {
                        states.retain(|_, o| o.host != *rank);
                    }
                }
                entry.departed.remove(rank);
                let h = entry.hosts.entry(*rank).or_insert_with(|| HostEntry {
                    held: BTreeMap::new(),
                    held_digest: None,
                    digest_misses: 0,
                    resync_asked: None,
                    pod_uid: uid.clone(),
                    addr: *addr,
                    link: None,
                    connecting: false,
                    sent: HashMap::new(),
                    stopping: HashSet::new(),
                    book: None,
                    trust: None,
                    trusted: Arc::default(),
                    epoch,
                    renew: None,
                    reported_at: None,
                    link_error: None,
                    watched_at: Timestamp::now(),
                    clock: clock::AgentClock::default(),
                    last_heard: None,
                    worker: None,
                });
                if book_changed && let Some(tx) = &h.book {
                    tx.send_replace(book_version);
                }
                if h.link.is_none() && !h.connecting {
                    h.connecting = true;
                    dial.push(AgentTarget {
                        host: HostKey {
                            world: world.clone(),
                            rank: *rank,
                        },
                        pod_uid: uid.clone(),
                        addr: *addr,
                        secret: agents.secret.clone(),
                        previous: agents.previous.clone(),
                        epoch,
                        silence: agent::silence_bound(agents.heartbeat_interval),
                    });
                }
            }
        }
        let dials = dial.into_iter().map(|t| self.clone().connect(t));
        futures::future::join_all(dials).await;
    }

    async fn connect(self: Arc<Self>, target: AgentTarget) {
        let host = target.host.clone();
        let uid = target.pod_uid.clone();
        let secrets = (target.secret.clone(), target.previous.clone());
        let res = self.connector.connect(target, self.push_tx.clone()).await;
        let link = {
            let mut st = self.lock();
            let Some(w) = st.worlds.get_mut(&host.world) else {
                return;
            };
            // Dialed with secrets the World rotated away meanwhile: the
            // next sync dials again with the current ones.
            let current = w.agents.secret == secrets.0 && w.agents.previous == secrets.1;
            let Some(h) = w.hosts.get_mut(&host.rank) else {
                return;
            };
            if h.pod_uid != uid {
                return;
            }
            h.connecting = false;
            if !current {
                return;
            }
            match res {
                Ok(link) => {
                    h.link = Some(link.clone());
                    h.sent.clear();
                    h.stopping.clear();
                    link
                }
                Err(e) => {
                    debug!(world = %host.world.name, rank = host.rank, error = %e, "cannot reach agent yet");
                    return;
                }
            }
        };
        let mut st = self.lock();
        let Some(w) = st.worlds.get_mut(&host.world) else {
            return;
        };
        let book = w.book.clone();
        let trust = w.agents.trust.clone();
        if let Some(h) = w.hosts.get_mut(&host.rank).filter(|h| h.pod_uid == uid) {
            h.renew = Some(fence::renewer(link.clone(), h.epoch, host.clone()));
            h.trusted = Arc::default();
            h.trust = Some(trust::sender(
                link.clone(),
                trust,
                host.clone(),
                h.trusted.clone(),
                self.push_tx.clone(),
            ));
            h.book = Some(book::sender(link, book, host));
        }
    }

    /// Forgets a World (deleted).
    pub fn forget_world(&self, world: &WorldKey) {
        let mut st = self.lock();
        if let Some(w) = st.worlds.remove(world) {
            for r in w.hosts.keys() {
                let key = HostKey {
                    world: world.clone(),
                    rank: *r,
                };
                st.heartbeats.remove(&key);
                st.expired.remove(&key);
            }
        }
        st.world_triggers.remove(world);
        drop(st);
        self.connector.forget_world(world);
    }

    /// Whether host `rank`'s agent in pod `pod_uid` took the World's
    /// current trust over its current link (trust invariant 2); `true`
    /// when the World has none to hand out.
    pub fn rekeyed(&self, world: &WorldKey, rank: Rank, pod_uid: &str) -> bool {
        let st = self.lock();
        let Some(w) = st.worlds.get(world) else {
            return false;
        };
        let Some(t) = &w.agents.trust else {
            return true;
        };
        w.hosts.get(&rank).is_some_and(|h| {
            h.pod_uid == pod_uid
                && h.link.is_some()
                && h.trusted.load(std::sync::atomic::Ordering::Acquire) == t.version
        })
    }

    /// Whether every host in `ranks` of `world` has a live connection.
    pub fn connected(&self, world: &WorldKey, ranks: Rank) -> bool {
        let st = self.lock();
        st.worlds
            .get(world)
            .is_some_and(|w| (0..ranks).all(|r| w.hosts.get(&r).is_some_and(|h| h.link.is_some())))
    }

    /// Ends the urgent episode of a ProcMesh (all healthy again).
    pub fn reset_urgent(&self, mesh: &MeshKey) {
        self.lock().mesh_triggers.reset_urgent(mesh);
    }

    /// Wakes the run loop (after a change that moves deadlines earlier).
    pub fn wake(&self) {
        self.wake.notify_one();
    }
}

/// The connector `hostmesh operator` uses to reach agents: the runtime's
/// agent client ([`runtime_client`]).
pub fn default_connector() -> Arc<dyn AgentConnector> {
    Arc::new(Arc::new(runtime_client::RuntimeConnector::default()))
}

/// Adds a clock sample of the agent in pod `pod_uid` ([`clock`]).
fn sample_clock(st: &mut State, host: &HostKey, pod_uid: &str, sample: Option<clock::ClockSample>) {
    let Some(sample) = sample else { return };
    if let Some(h) = st
        .worlds
        .get_mut(&host.world)
        .and_then(|w| w.hosts.get_mut(&host.rank))
        .filter(|h| h.pod_uid == pod_uid)
    {
        h.clock.add(sample);
    }
}

/// Compares an agent's heartbeat `digest` with the hub's picture of the
/// host (invariant 8); returns the link to ask for a fresh Snapshot when
/// it is time to.
fn check_digest(
    st: &mut State,
    host: &HostKey,
    pod_uid: &str,
    digest: u64,
    now: Instant,
) -> Option<Arc<dyn AgentLink>> {
    let h = st
        .worlds
        .get_mut(&host.world)?
        .hosts
        .get_mut(&host.rank)
        .filter(|h| h.pod_uid == pod_uid && h.reported_at.is_some())?;
    let held = *h
        .held_digest
        .get_or_insert_with(|| hostmesh_agent::digest_entries(h.held.values()));
    if held == digest {
        h.digest_misses = 0;
        return None;
    }
    h.digest_misses += 1;
    let recently = h
        .resync_asked
        .is_some_and(|at| now.saturating_duration_since(at) < RESYNC_INTERVAL);
    if h.digest_misses < 2 || recently {
        return None;
    }
    let link = h.link.clone()?;
    info!(world = %host.world.name, namespace = %host.world.namespace, rank = host.rank, agent = digest, hub = held, procs = h.held.len(), "the agent's proc digest differs from the hub's picture; asking for a fresh snapshot");
    h.digest_misses = 0;
    h.resync_asked = Some(now);
    Some(link)
}

/// Whether `pod_uid` is the pod the hub holds for `host` now (its reports
/// count; a gone or replaced pod's do not).
fn is_current(st: &State, host: &HostKey, pod_uid: &str) -> bool {
    st.worlds
        .get(&host.world)
        .and_then(|w| w.hosts.get(&host.rank))
        .is_some_and(|h| h.pod_uid == pod_uid)
}

/// Records a heartbeat of a known host. Returns `None` for a push that does
/// not count (unknown World, host or pod), else the gap since the host's
/// previous heartbeat (`Some(None)` for its first).
fn beat(st: &mut State, host: &HostKey, pod_uid: &str, now: Instant) -> Option<Option<Duration>> {
    let w = st.worlds.get_mut(&host.world)?;
    let h = w
        .hosts
        .get_mut(&host.rank)
        .filter(|h| h.pod_uid == pod_uid)?;
    h.link_error = None;
    h.last_heard = Some(Timestamp::now());
    if let Some(renew) = &h.renew {
        renew.send_replace(());
    }
    let timeout = w.agents.health_timeout;
    let gap = st.heartbeats.deadline(host).map(|deadline| {
        now.saturating_duration_since(deadline.checked_sub(timeout).unwrap_or(deadline))
    });
    if st.heartbeats.beat(host.clone(), now, timeout) {
        st.expired.remove(host);
        st.world_triggers.mark(host.world.clone(), false, now);
    }
    Some(gap)
}

#[cfg(test)]
mod tests;
