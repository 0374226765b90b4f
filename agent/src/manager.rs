//! The proc manager: the table of procs on this host, the requests on it
//! (create-or-update, stop, state, shutdown, check-in, address book) and the
//! stream of state changes. One lifecycle task per proc incarnation
//! (`lifecycle.rs`) owns its OS process.
//!
//! Invariants:
//! 1. `CreateOrUpdate` is idempotent: the same name, rank, spec and
//!    incarnation change nothing; a different rank or spec is refused
//!    ([`HostError::SpecConflict`]); a higher incarnation restarts a proc
//!    only once it has ended.
//! 2. Every status change gets the next agent-wide sequence number and is
//!    broadcast to subscribers at once, in sequence order.
//! 3. The table holds at most `max_procs` entries; when full, the oldest
//!    ended proc is forgotten to make room, never a running one.
//! 4. After `shutdown` starts, nothing new is spawned.
//! 5. Every status change is stamped with the agent's wall clock
//!    (`changed_at_ms`), so a failure's time is when it happened here, not
//!    when a supervisor heard of it.
//! 6. Once the fence has tripped (`fence.rs`), nothing new is spawned and
//!    [`ProcManager::fence_procs`] stops every proc as a failure (not a
//!    requested stop), so the operator restarts those ranks elsewhere.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt as _;
use tokio::sync::{broadcast, mpsc, watch};

use super::config::Limits;
use super::env::{self, AgentIdentity};
use super::error::HostError;
use super::fence::Fence;
use super::lifecycle::{self, Control};
use super::logs::LogHub;
use super::protocol::{
    CreateOrUpdate, CreateOutcome, FailedActor, MAX_ACTOR_REASON, ProcPhase, ProcReport,
    ProcStateChanged, RankReport,
};
use super::spawn::Spawner;

/// Capacity of the state-change broadcast; a subscriber that lags further
/// behind is told so and must take a snapshot.
const EVENT_CAPACITY: usize = 8192;

struct Entry {
    req: CreateOrUpdate,
    state: ProcReport,
    control: Option<mpsc::Sender<Control>>,
    ended: watch::Receiver<bool>,
}

#[derive(Default)]
struct Table {
    procs: BTreeMap<String, Entry>,
    address_book: Vec<String>,
    /// The address book's version (0: none, or unnumbered).
    book_version: u64,
    seq: u64,
}

pub(crate) struct Inner {
    pub(crate) identity: AgentIdentity,
    pub(crate) limits: Limits,
    pub(crate) spawner: Spawner,
    pub(crate) stdout: LogHub,
    pub(crate) stderr: LogHub,
    table: Mutex<Table>,
    events: broadcast::Sender<ProcStateChanged>,
    shutting_down: AtomicBool,
    fence: Fence,
}

/// The procs of one host. Cheap to clone; all clones share the table.
#[derive(Clone)]
pub struct ProcManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ProcManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcManager")
            .field("identity", &self.inner.identity)
            .finish_non_exhaustive()
    }
}

impl ProcManager {
    /// A manager forwarding proc output to `stdout` and `stderr`. Must be
    /// called inside a tokio runtime (it starts the spawner thread).
    pub fn new(
        identity: AgentIdentity,
        limits: Limits,
        stdout: LogHub,
        stderr: LogHub,
    ) -> Result<Self, HostError> {
        let spawner =
            Spawner::start().map_err(|e| HostError::io("cannot start the spawner thread", e))?;
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        let fence = Fence::new(identity.host_rank);
        Ok(ProcManager {
            inner: Arc::new(Inner {
                fence,
                identity,
                limits,
                spawner,
                stdout,
                stderr,
                table: Mutex::new(Table::default()),
                events,
                shutting_down: AtomicBool::new(false),
            }),
        })
    }

    /// A manager writing proc output to the agent's own stdout and stderr.
    pub fn with_std_output(identity: AgentIdentity, limits: Limits) -> Result<Self, HostError> {
        let cap = limits.log_buffer_lines;
        let out = LogHub::start("stdout", cap, Box::new(std::io::stdout()))
            .map_err(|e| HostError::io("cannot start the stdout forwarder", e))?;
        let err = LogHub::start("stderr", cap, Box::new(std::io::stderr()))
            .map_err(|e| HostError::io("cannot start the stderr forwarder", e))?;
        Self::new(identity, limits, out, err)
    }

    /// This agent's identity.
    pub fn identity(&self) -> &AgentIdentity {
        &self.inner.identity
    }

    /// This agent's rank epoch and fence.
    pub fn fence(&self) -> &Fence {
        &self.inner.fence
    }

    /// Creates the proc unless the same request was already applied
    /// (invariant 1).
    pub fn create_or_update(&self, req: CreateOrUpdate) -> Result<CreateOutcome, HostError> {
        self.create(req, true)
    }

    /// Starts a proc of the host itself (the Monarch worker): like
    /// [`create_or_update`](Self::create_or_update), but its environment is
    /// the agent's (minus `HOSTMESH_*`) plus the spec's own, without the
    /// proc contract variables.
    pub(crate) fn create_host_proc(&self, req: CreateOrUpdate) -> Result<CreateOutcome, HostError> {
        self.create(req, false)
    }

    fn create(&self, req: CreateOrUpdate, contract_env: bool) -> Result<CreateOutcome, HostError> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(HostError::ShuttingDown);
        }
        if let Some(reason) = self.inner.fence.fenced() {
            return Err(HostError::Fenced { reason });
        }
        env::validate(&req, self.inner.identity.host_rank)?;
        let mut table = self.inner.lock();
        // Checked again under the lock that `shutdown` and `fence_procs`
        // take (invariants 4, 5).
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(HostError::ShuttingDown);
        }
        if let Some(reason) = self.inner.fence.fenced() {
            return Err(HostError::Fenced { reason });
        }
        let outcome = match table.procs.get(&req.name) {
            Some(e) if e.req.rank != req.rank => {
                return Err(HostError::SpecConflict {
                    name: req.name,
                    field: "rank",
                });
            }
            Some(e) if e.req.spec != req.spec => {
                return Err(HostError::SpecConflict {
                    name: req.name,
                    field: "spec",
                });
            }
            Some(e) if req.incarnation <= e.req.incarnation => return Ok(CreateOutcome::Unchanged),
            Some(e) if !e.state.status.is_terminal() => {
                return Err(HostError::StillRunning {
                    name: req.name,
                    incarnation: req.incarnation,
                });
            }
            Some(_) => CreateOutcome::Restarted,
            None => {
                make_room(&mut table, self.inner.limits.max_procs)?;
                CreateOutcome::Created
            }
        };
        let mut env = if contract_env {
            let claim = self.inner.fence.claim();
            env::proc_env(&self.inner.identity, &table.address_book, &req, claim)?
        } else {
            req.spec.env.clone()
        };
        if contract_env {
            // Contract variables first: the epochs go before the spec's own.
            let epochs = self.inner.fence.proc_env(table.address_book.len());
            env.splice(0..0, epochs);
        }
        let (ctl_tx, ctl_rx) = mpsc::channel(8);
        let (ended_tx, ended_rx) = watch::channel(false);
        let mut command = vec![req.spec.command.clone()];
        command.extend(req.spec.args.iter().cloned());
        let state = ProcReport {
            proc_id: format!("tcp:{}/{}", self.inner.identity.addr, req.name),
            name: req.name.clone(),
            rank: req.rank,
            pid: None,
            command,
            status: ProcPhase::Starting,
            started_at_ms: now_ms(),
            restarts: req.incarnation,
            stop_requested: false,
            seq: 0,
            actor_failure: None,
            actor_failures: 0,
            changed_at_ms: now_ms(),
            stderr_head: Vec::new(),
            oom_killed: false,
            stall: None,
        };
        table.procs.insert(
            req.name.clone(),
            Entry {
                req: req.clone(),
                state,
                control: Some(ctl_tx),
                ended: ended_rx,
            },
        );
        self.inner.publish(&mut table, &req.name);
        drop(table);
        tracing::info!(proc = %req.name, rank = req.rank, incarnation = req.incarnation, ?outcome, "creating proc");
        tokio::spawn(lifecycle::run(
            self.inner.clone(),
            req,
            env,
            ctl_rx,
            ended_tx,
        ));
        Ok(outcome)
    }

    /// The rank and status of a proc.
    pub fn rank_status(&self, name: &str) -> Result<RankReport, HostError> {
        let table = self.inner.lock();
        let e = table.procs.get(name).ok_or_else(|| no_such(name))?;
        Ok(RankReport {
            rank: e.req.rank,
            status: e.state.status.clone(),
        })
    }

    /// The full state of a proc.
    pub fn state(&self, name: &str) -> Result<ProcReport, HostError> {
        let table = self.inner.lock();
        table
            .procs
            .get(name)
            .map(|e| e.state.clone())
            .ok_or_else(|| no_such(name))
    }

    /// Every proc's state, by name, and the sequence number it is current at.
    pub fn snapshot(&self) -> (u64, Vec<ProcReport>) {
        let table = self.inner.lock();
        (
            table.seq,
            table.procs.values().map(|e| e.state.clone()).collect(),
        )
    }

    /// What a heartbeat carries: the sequence number, the [`digest`] of
    /// every proc state and how many procs there are, read under the lock
    /// without copying a report.
    pub fn heartbeat(&self) -> (u64, u64, usize) {
        let table = self.inner.lock();
        let d = digest_reports(table.procs.values().map(|e| &e.state));
        (table.seq, d, table.procs.len())
    }

    /// Subscribes to state changes (invariant 2). Take a [`snapshot`]
    /// after subscribing and skip events with a `seq` it already covers.
    ///
    /// [`snapshot`]: ProcManager::snapshot
    pub fn subscribe(&self) -> broadcast::Receiver<ProcStateChanged> {
        self.inner.events.subscribe()
    }

    /// Replaces the address book (host runtime addresses by host rank),
    /// numbered `version` (0: unnumbered).
    pub fn set_address_book(&self, hosts: Vec<String>, version: u64) {
        let mut table = self.inner.lock();
        table.address_book = hosts;
        table.book_version = version;
    }

    /// Applies the changes of a [`PatchAddressBook`] made on top of
    /// version `patch.base`; an agent holding another version (or an
    /// unnumbered book) changes nothing and answers the version it holds.
    ///
    /// [`PatchAddressBook`]: crate::protocol::PatchAddressBook
    pub fn patch_address_book(&self, patch: &crate::protocol::PatchAddressBook) -> Result<(), u64> {
        let mut table = self.inner.lock();
        if table.book_version == 0 || table.book_version != patch.base {
            return Err(table.book_version);
        }
        table.address_book.resize(patch.len, String::new());
        for e in &patch.changes {
            if let Some(slot) = table.address_book.get_mut(e.rank) {
                slot.clone_from(&e.addr);
            }
        }
        table.book_version = patch.version;
        Ok(())
    }

    /// A runtime-aware proc reporting in: it becomes Ready with `addr`.
    pub fn check_in(&self, name: &str, addr: String) -> Result<(), HostError> {
        let control = {
            let table = self.inner.lock();
            let e = table.procs.get(name).ok_or_else(|| no_such(name))?;
            e.control.clone()
        };
        if let Some(c) = control {
            let _ = c.try_send(Control::CheckIn(addr));
        }
        Ok(())
    }

    /// A runtime-aware proc's `mesh` actor reports a failed actor: the
    /// first of the incarnation is kept (its reason bounded), later ones
    /// are counted, and the change is published. Refused for a proc that
    /// is not runtime-aware or has ended.
    pub fn actor_failed(&self, name: &str, actor: String, reason: &str) -> Result<(), HostError> {
        let incarnation = {
            let table = self.inner.lock();
            let e = table.procs.get(name).ok_or_else(|| no_such(name))?;
            if !e.req.spec.runtime_aware || e.state.status.is_terminal() {
                return Err(HostError::NotRuntimeAware {
                    name: name.to_string(),
                });
            }
            e.req.incarnation
        };
        let reason = reason[..reason.floor_char_boundary(MAX_ACTOR_REASON)].to_string();
        tracing::warn!(proc = %name, %actor, %reason, "actor failed");
        self.inner.update(name, incarnation, |st| {
            st.actor_failures = st.actor_failures.saturating_add(1);
            st.actor_failure.get_or_insert(FailedActor {
                actor,
                reason,
                at_ms: now_ms(),
            });
        });
        Ok(())
    }

    /// Stops a proc: TERM to its process group, `grace`, then KILL. Returns
    /// its final status; a proc that already ended just returns its status.
    pub async fn stop(&self, name: &str, grace: Duration) -> Result<ProcPhase, HostError> {
        self.stop_as(name, grace, true).await
    }

    /// [`ProcManager::stop`]; `requested` says whether the end counts as
    /// asked for (false when the fence stops it: a failure).
    async fn stop_as(
        &self,
        name: &str,
        grace: Duration,
        requested: bool,
    ) -> Result<ProcPhase, HostError> {
        let (control, mut ended) = {
            let mut table = self.inner.lock();
            let e = table.procs.get_mut(name).ok_or_else(|| no_such(name))?;
            if e.state.status.is_terminal() {
                return Ok(e.state.status.clone());
            }
            e.state.stop_requested |= requested;
            (e.control.clone(), e.ended.clone())
        };
        if let Some(c) = control {
            let _ = c.try_send(Control::Stop(grace, requested));
        }
        let _ = ended.wait_for(|done| *done).await;
        self.rank_status(name).map(|r| r.status)
    }

    /// Stops every running proc, at most `max_concurrency` at a time, and
    /// refuses new ones from now on (invariant 4).
    pub async fn shutdown(&self, grace: Duration, max_concurrency: usize) {
        let running = self.running_names(true);
        tracing::info!(
            procs = running.len(),
            ?grace,
            max_concurrency,
            "stopping all procs"
        );
        self.stop_all(running, grace, max_concurrency, true).await;
    }

    /// Stops every running proc after the fence tripped (invariant 5):
    /// TERM, the fence's grace, KILL, at most `max_concurrency` at a time.
    pub async fn fence_procs(&self, max_concurrency: usize) {
        let grace = self.inner.fence.policy().grace;
        let running = self.running_names(false);
        tracing::warn!(procs = running.len(), ?grace, "fenced: stopping every proc");
        self.stop_all(running, grace, max_concurrency, false).await;
    }

    /// The procs not ended yet, listed under the table lock so no create
    /// slips in after the list; `shutting_down` also refuses new ones from
    /// then on.
    fn running_names(&self, shutting_down: bool) -> Vec<String> {
        let table = self.inner.lock();
        if shutting_down {
            self.inner.shutting_down.store(true, Ordering::SeqCst);
        }
        table
            .procs
            .iter()
            .filter(|(_, e)| !e.state.status.is_terminal())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Stops `names` (TERM, `grace`, KILL), at most `max_concurrency` at a
    /// time; `requested` as in [`ProcManager::stop_as`].
    async fn stop_all(
        &self,
        names: Vec<String>,
        grace: Duration,
        max_concurrency: usize,
        requested: bool,
    ) {
        futures::stream::iter(names)
            .for_each_concurrent(max_concurrency.clamp(1, 256), |name| async move {
                if let Err(e) = self.stop_as(&name, grace, requested).await {
                    tracing::warn!(proc = %name, error = %e, requested, "stop of every proc");
                }
            })
            .await;
    }

    /// Writes out the proc output still queued (waiting at most 2 s) and
    /// stops forwarding.
    pub async fn close_output(&self) {
        self.inner.stdout.close(Duration::from_secs(2)).await;
        self.inner.stderr.close(Duration::from_secs(2)).await;
    }

    /// Lines of proc output dropped so far (stdout and stderr together).
    pub fn dropped_log_lines(&self) -> u64 {
        self.inner.stdout.dropped() + self.inner.stderr.dropped()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `f` to the proc's state if `incarnation` is still current,
    /// then publishes it (invariant 2).
    pub(crate) fn update(&self, name: &str, incarnation: u32, f: impl FnOnce(&mut ProcReport)) {
        let mut table = self.lock();
        match table.procs.get_mut(name) {
            Some(e) if e.req.incarnation == incarnation => {
                let before = (e.state.status.clone(), e.state.changed_at_ms);
                f(&mut e.state);
                // The agent's clock stamps every status change (the hub
                // orders failures across hosts by it), unless `f` gave the
                // time the change happened.
                if e.state.status != before.0 && e.state.changed_at_ms == before.1 {
                    e.state.changed_at_ms = now_ms();
                }
            }
            _ => return,
        }
        self.publish(&mut table, name);
    }

    /// Marks the incarnation ended: no more control messages.
    pub(crate) fn detach(&self, name: &str, incarnation: u32) {
        let mut table = self.lock();
        if let Some(e) = table.procs.get_mut(name)
            && e.req.incarnation == incarnation
        {
            e.control = None;
        }
    }

    fn publish(&self, table: &mut Table, name: &str) {
        table.seq += 1;
        let seq = table.seq;
        let Some(e) = table.procs.get_mut(name) else {
            return;
        };
        e.state.seq = seq;
        tracing::info!(proc = %name, rank = e.state.rank, status = ?e.state.status, seq, "proc state");
        let _ = self.events.send(ProcStateChanged {
            host_rank: self.identity.host_rank,
            state: e.state.clone(),
        });
    }
}

fn make_room(table: &mut Table, max: usize) -> Result<(), HostError> {
    if table.procs.len() < max {
        return Ok(());
    }
    let oldest = table
        .procs
        .iter()
        .filter(|(_, e)| e.state.status.is_terminal())
        .min_by_key(|(_, e)| e.state.seq)
        .map(|(n, _)| n.clone());
    match oldest {
        Some(n) => {
            tracing::info!(proc = %n, "forgetting the oldest ended proc to stay within --max-procs");
            table.procs.remove(&n);
            Ok(())
        }
        None => Err(HostError::TooManyProcs { limit: max }),
    }
}

fn no_such(name: &str) -> HostError {
    HostError::NoSuchProc {
        name: name.to_owned(),
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// What [`digest`] reads of one proc's state: its name, incarnation,
/// status label, pid and whether it is stalled. A supervisor that keeps
/// these per proc can compute the digest of its own picture
/// ([`digest_entries`]) without keeping the whole reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DigestEntry {
    /// Proc name.
    pub name: String,
    /// Incarnation.
    pub restarts: u32,
    /// [`ProcPhase::label`](crate::protocol::ProcPhase::label).
    pub label: &'static str,
    /// Pid, 0 when none.
    pub pid: u32,
    /// Reported stalled.
    pub stalled: bool,
}

impl DigestEntry {
    /// The entry of one report.
    pub fn of(s: &ProcReport) -> Self {
        DigestEntry {
            name: s.name.clone(),
            restarts: s.restarts,
            label: s.status.label(),
            pid: s.pid.unwrap_or(0),
            stalled: s.stall.is_some(),
        }
    }
}

/// A digest of a set of proc states: FNV-1a over each proc's
/// [`DigestEntry`], in name order. The agent sends it in heartbeats; a
/// supervisor computes it over its own picture and asks for a snapshot when
/// they differ.
pub fn digest(states: &[ProcReport]) -> u64 {
    let mut sorted: Vec<&ProcReport> = states.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    digest_reports(sorted)
}

/// [`digest`] of reports already in name order, without copying them.
fn digest_reports<'a>(sorted: impl IntoIterator<Item = &'a ProcReport>) -> u64 {
    let mut h = Fnv::default();
    for s in sorted {
        h.entry(
            &s.name,
            s.restarts,
            s.status.label(),
            s.pid.unwrap_or(0),
            s.stall.is_some(),
        );
    }
    h.0
}

/// [`digest`] of entries already in name order (a `BTreeMap`'s values).
pub fn digest_entries<'a>(sorted: impl IntoIterator<Item = &'a DigestEntry>) -> u64 {
    let mut h = Fnv::default();
    for s in sorted {
        h.entry(&s.name, s.restarts, s.label, s.pid, s.stalled);
    }
    h.0
}

/// The FNV-1a state of a digest.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn eat(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// One proc's [`DigestEntry`] fields.
    fn entry(&mut self, name: &str, restarts: u32, label: &str, pid: u32, stalled: bool) {
        self.eat(name.as_bytes());
        self.eat(&[0]);
        self.eat(&restarts.to_le_bytes());
        self.eat(label.as_bytes());
        self.eat(&pid.to_le_bytes());
        self.eat(&[u8::from(stalled)]);
    }
}
