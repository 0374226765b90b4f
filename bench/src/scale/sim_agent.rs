//! Simulated agents for the scale suite's `--simulate` mode: each one a
//! runtime proc named `agent` listening at its own loopback address, with a
//! `host[0]` actor that speaks the real agent protocol
//! ([`hostmesh_agent::protocol`]) over TCP with the World's secret, as a
//! real agent does, but keeps its procs in a table instead of running
//! processes. Thousands fit in one process, so the operator's own cost can
//! be measured at 10,000 hosts.
//!
//! What it answers as the real agent does: `Subscribe` (a Snapshot, every
//! change, a heartbeat with the proc digest every second), `CreateOrUpdate`
//! (idempotent; a proc is Ready at once), `Stop` (the proc ends Killed by
//! SIGTERM, asked for), `SetAddressBook` (and every other address book
//! message: counted), `Renew` (judged against its epoch), `GetState`,
//! `GetRankStatus`, `ShutdownHost`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hostmesh_agent::protocol::{
    AgentPush, CreateOrUpdate, CreateOutcome, GetRankStatus, GetState, PatchAddressBook, ProcPhase,
    ProcReport, ProcStateChanged, RankReport, Renew, SetAddressBook, ShutdownHost, Stop, Subscribe,
};
use hostmesh_runtime::{Actor, ActorError, ChannelAddr, Context, Handler, Handlers, Proc};
use tokio::sync::broadcast;

/// Counters every simulated agent of a run adds to.
#[derive(Default, Debug)]
pub(crate) struct SimCounters {
    /// Address book messages received.
    pub(crate) books: AtomicU64,
    /// Address book entries received (hosts in full books, changes in
    /// incremental ones).
    pub(crate) book_entries: AtomicU64,
    /// Renewals received.
    pub(crate) renewals: AtomicU64,
}

struct Table {
    procs: BTreeMap<String, ProcReport>,
    seq: u64,
    /// The address book's version (its entries are only counted).
    book_version: u64,
}

/// One simulated agent; dropping it stops its proc (its address goes
/// silent, as a killed agent's does).
pub(crate) struct SimAgent {
    proc: Proc,
    shared: Arc<Shared>,
}

struct Shared {
    host_rank: usize,
    /// The heartbeat interval its pod asks for (`HOSTMESH_HEARTBEAT_INTERVAL`).
    heartbeat: Duration,
    addr: SocketAddr,
    epoch: u64,
    table: Mutex<Table>,
    changes: broadcast::Sender<ProcStateChanged>,
    counters: Arc<SimCounters>,
    /// The live subscription of each port (a resubscription over the
    /// same port ends the old pusher, as the real agent replaces it).
    subscriptions: Mutex<std::collections::HashMap<String, Arc<AtomicBool>>>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Shared {
    fn change(&self, t: &mut Table, name: &str, f: impl FnOnce(&mut ProcReport)) {
        t.seq += 1;
        let seq = t.seq;
        if let Some(p) = t.procs.get_mut(name) {
            f(p);
            p.seq = seq;
            p.changed_at_ms = now_ms();
            let _ = self.changes.send(ProcStateChanged {
                host_rank: self.host_rank,
                state: p.clone(),
            });
        }
    }

    fn snapshot(&self) -> AgentPush {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        AgentPush::Snapshot {
            host_rank: self.host_rank,
            agent_addr: self.addr.to_string(),
            seq: t.seq,
            procs: t.procs.values().cloned().collect(),
            sent_at_ms: now_ms(),
            epoch: self.epoch,
            fenced: None,
        }
    }

    fn heartbeat(&self) -> AgentPush {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let entries: Vec<hostmesh_agent::DigestEntry> = t
            .procs
            .values()
            .map(hostmesh_agent::DigestEntry::of)
            .collect();
        AgentPush::Heartbeat {
            host_rank: self.host_rank,
            seq: t.seq,
            digest: hostmesh_agent::digest_entries(entries.iter()),
            procs: t.procs.len(),
            sent_at_ms: now_ms(),
            epoch: self.epoch,
            fenced: None,
        }
    }
}

impl SimAgent {
    /// Serves the agent protocol at `addr` for host `host_rank` at
    /// `epoch`, authenticated with `secret`.
    pub(crate) async fn start(
        addr: SocketAddr,
        host_rank: usize,
        epoch: u64,
        secret: &[u8],
        heartbeat: Duration,
        counters: Arc<SimCounters>,
    ) -> anyhow::Result<SimAgent> {
        // Pushes to a subscriber that went away bounce back to the proc;
        // the pusher ends on its own (a resubscription, the agent's end).
        let mut builder = Proc::builder(hostmesh_agent::AGENT_PROC_NAME)
            .listen(ChannelAddr::Tcp(addr))
            .secret(secret.to_vec())
            .supervision_sink(|_| {});
        if epoch > 0 {
            builder = builder.epoch(hostmesh_runtime::channel::epoch::EpochClaim {
                rank: host_rank,
                epoch,
            });
        }
        let proc = builder.build().await?;
        let (changes, _) = broadcast::channel(256);
        let shared = Arc::new(Shared {
            host_rank,
            heartbeat,
            addr,
            epoch,
            table: Mutex::new(Table {
                procs: BTreeMap::new(),
                seq: 0,
                book_version: 0,
            }),
            changes,
            counters,
            subscriptions: Mutex::default(),
        });
        proc.spawn(
            hostmesh_agent::HOST_AGENT_ACTOR,
            HostActor {
                shared: shared.clone(),
            },
        )
        .await?;
        Ok(SimAgent { proc, shared })
    }

    /// Ends the running proc of rank `rank` as killed by `signal`, not
    /// asked for (a proc that crashed); `false` when there is no such
    /// running proc.
    pub(crate) fn kill_rank(&self, rank: usize, signal: i32) -> bool {
        let mut t = self.shared.table.lock().unwrap_or_else(|e| e.into_inner());
        let name = t
            .procs
            .values()
            .find(|p| p.rank == rank && matches!(p.status, ProcPhase::Ready { .. }))
            .map(|p| p.name.clone());
        if let Some(name) = &name {
            self.shared.change(&mut t, name, |p| {
                p.status = ProcPhase::Killed {
                    signal,
                    core_dumped: false,
                    stderr_tail: Vec::new(),
                };
                p.pid = None;
            });
        }
        name.is_some()
    }
}

impl Drop for SimAgent {
    fn drop(&mut self) {
        self.proc.shutdown();
    }
}

/// The `host[0]` actor.
struct HostActor {
    shared: Arc<Shared>,
}

impl Actor for HostActor {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<CreateOrUpdate>()
            .handle::<GetRankStatus>()
            .handle::<GetState>()
            .handle::<Stop>()
            .handle::<ShutdownHost>()
            .handle::<SetAddressBook>()
            .handle::<PatchAddressBook>()
            .handle::<Renew>()
            .handle::<Subscribe>();
    }

    async fn handle_undeliverable(
        &mut self,
        _cx: &Context<Self>,
        _message: hostmesh_runtime::Undeliverable,
    ) -> Result<(), ActorError> {
        Ok(())
    }
}

impl Handler<CreateOrUpdate> for HostActor {
    type Reply = Result<CreateOutcome, String>;
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        m: CreateOrUpdate,
    ) -> Result<Self::Reply, ActorError> {
        let s = &self.shared;
        let mut t = s.table.lock().unwrap_or_else(|e| e.into_inner());
        let pid = 100_000 + m.rank as u32;
        let ready = ProcPhase::Ready { pid, addr: None };
        let outcome = match t.procs.get(&m.name) {
            Some(p) if p.rank != m.rank => return Ok(Err(format!("{}: SpecConflict", m.name))),
            Some(p) if m.incarnation <= p.restarts => CreateOutcome::Unchanged,
            Some(p) if !p.status.is_terminal() => {
                return Ok(Err(format!("{}: StillRunning", m.name)));
            }
            Some(_) => {
                s.change(&mut t, &m.name, |p| {
                    p.status = ready;
                    p.pid = Some(pid);
                    p.restarts = m.incarnation;
                    p.stop_requested = false;
                    p.started_at_ms = now_ms();
                });
                CreateOutcome::Restarted
            }
            None => {
                let report = ProcReport {
                    proc_id: format!("tcp:{}/{}", s.addr, m.name),
                    name: m.name.clone(),
                    rank: m.rank,
                    command: vec![m.spec.command.clone()],
                    restarts: m.incarnation,
                    started_at_ms: now_ms(),
                    ..Default::default()
                };
                t.procs.insert(m.name.clone(), report);
                s.change(&mut t, &m.name, |p| {
                    p.status = ready;
                    p.pid = Some(pid);
                });
                CreateOutcome::Created
            }
        };
        Ok(Ok(outcome))
    }
}

impl Handler<GetRankStatus> for HostActor {
    type Reply = Result<RankReport, String>;
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        m: GetRankStatus,
    ) -> Result<Self::Reply, ActorError> {
        let t = self.shared.table.lock().unwrap_or_else(|e| e.into_inner());
        Ok(t.procs
            .get(&m.name)
            .map(|p| RankReport {
                rank: p.rank,
                status: p.status.clone(),
            })
            .ok_or_else(|| format!("no proc {}", m.name)))
    }
}

impl Handler<GetState> for HostActor {
    type Reply = Result<ProcReport, String>;
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        m: GetState,
    ) -> Result<Self::Reply, ActorError> {
        let t = self.shared.table.lock().unwrap_or_else(|e| e.into_inner());
        Ok(t.procs
            .get(&m.name)
            .cloned()
            .ok_or_else(|| format!("no proc {}", m.name)))
    }
}

impl Handler<Stop> for HostActor {
    type Reply = Result<(), String>;
    async fn handle(&mut self, _cx: &Context<Self>, m: Stop) -> Result<Self::Reply, ActorError> {
        let s = &self.shared;
        let mut t = s.table.lock().unwrap_or_else(|e| e.into_inner());
        let Some(p) = t.procs.get(&m.name) else {
            return Ok(Err(format!("no proc {}", m.name)));
        };
        if !p.status.is_terminal() {
            s.change(&mut t, &m.name, |p| {
                p.status = ProcPhase::Killed {
                    signal: 15,
                    core_dumped: false,
                    stderr_tail: Vec::new(),
                };
                p.pid = None;
                p.stop_requested = true;
            });
        }
        Ok(Ok(()))
    }
}

impl Handler<ShutdownHost> for HostActor {
    type Reply = ();
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        _m: ShutdownHost,
    ) -> Result<Self::Reply, ActorError> {
        let s = &self.shared;
        let mut t = s.table.lock().unwrap_or_else(|e| e.into_inner());
        let names: Vec<String> = t.procs.keys().cloned().collect();
        for name in names {
            if t.procs.get(&name).is_some_and(|p| !p.status.is_terminal()) {
                s.change(&mut t, &name, |p| {
                    p.status = ProcPhase::Killed {
                        signal: 15,
                        core_dumped: false,
                        stderr_tail: Vec::new(),
                    };
                    p.stop_requested = true;
                });
            }
        }
        Ok(())
    }
}

impl Handler<SetAddressBook> for HostActor {
    type Reply = ();
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        m: SetAddressBook,
    ) -> Result<Self::Reply, ActorError> {
        let c = &self.shared.counters;
        c.books.fetch_add(1, Ordering::Relaxed);
        c.book_entries
            .fetch_add(m.hosts.len() as u64, Ordering::Relaxed);
        self.shared
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .book_version = m.version;
        Ok(())
    }
}

impl Handler<PatchAddressBook> for HostActor {
    type Reply = Result<(), u64>;
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        m: PatchAddressBook,
    ) -> Result<Self::Reply, ActorError> {
        let c = &self.shared.counters;
        c.books.fetch_add(1, Ordering::Relaxed);
        c.book_entries
            .fetch_add(m.changes.len() as u64, Ordering::Relaxed);
        let mut t = self.shared.table.lock().unwrap_or_else(|e| e.into_inner());
        if t.book_version == 0 || t.book_version != m.base {
            return Ok(Err(t.book_version));
        }
        t.book_version = m.version;
        Ok(Ok(()))
    }
}

impl Handler<Renew> for HostActor {
    type Reply = hostmesh_agent::EpochVerdict;
    async fn handle(&mut self, _cx: &Context<Self>, m: Renew) -> Result<Self::Reply, ActorError> {
        self.shared
            .counters
            .renewals
            .fetch_add(1, Ordering::Relaxed);
        Ok(hostmesh_agent::judge(self.shared.epoch, m.epoch))
    }
}

impl Handler<Subscribe> for HostActor {
    type Reply = Result<(), String>;
    async fn handle(
        &mut self,
        cx: &Context<Self>,
        m: Subscribe,
    ) -> Result<Self::Reply, ActorError> {
        let shared = self.shared.clone();
        let proc = cx.proc_ref().clone();
        let mut changes = shared.changes.subscribe();
        let port = m.port;
        let live = Arc::new(AtomicBool::new(true));
        if let Some(old) = shared
            .subscriptions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(port.id().to_string(), live.clone())
        {
            old.store(false, Ordering::SeqCst);
        }
        // One pusher per subscription: a Snapshot, then every change and a
        // heartbeat each interval, until a push cannot be sent (the
        // subscriber is gone). A resubscription over the same port gets
        // its own Snapshot; the old pusher ends with its subscriber.
        tokio::spawn(async move {
            let mut seq = 0;
            let snapshot = shared.snapshot();
            if let AgentPush::Snapshot { seq: s, .. } = &snapshot {
                seq = *s;
            }
            if port.send(&proc, &snapshot).await.is_err() {
                return;
            }
            let every = shared.heartbeat;
            let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let push = tokio::select! {
                    ev = changes.recv() => match ev {
                        Ok(c) if c.state.seq <= seq => continue,
                        Ok(c) => {
                            seq = c.state.seq;
                            AgentPush::Changed(c)
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            let s = shared.snapshot();
                            if let AgentPush::Snapshot { seq: n, .. } = &s {
                                seq = *n;
                            }
                            s
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                    _ = beat.tick() => shared.heartbeat(),
                };
                if !live.load(Ordering::SeqCst) || port.send(&proc, &push).await.is_err() {
                    return;
                }
            }
        });
        Ok(Ok(()))
    }
}
