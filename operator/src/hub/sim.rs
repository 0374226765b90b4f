//! Simulated agents for tests and benchmarks: an in-memory connector whose
//! agents keep procs the way the real agent does (idempotent CreateOrUpdate,
//! restart of an ended proc under a higher incarnation, stop) and push every
//! state change, without running processes.

use hostmesh_crds::Rank;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::mpsc;

use super::agent::{
    AgentConnector, AgentLink, AgentTarget, BookAck, BookUpdate, CreateOrUpdate, HostKey,
    HostReport, LinkError, protocol,
};
use super::clock::ClockSample;

/// A request a simulated agent received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimRequest {
    /// CreateOrUpdate.
    Create(Box<CreateOrUpdate>),
    /// Stop.
    Stop(String),
    /// An address book arrived: the whole book the agent holds after it
    /// (rank, address and epoch of each host).
    Book(Vec<(Rank, SocketAddr, u64)>),
    /// A rotated World token arrived (`Rekey`), with its lineage.
    Rekey(String),
}

/// An address book as a simulated agent holds it: its version, and each
/// host rank's agent address and rank epoch.
pub type SimBook = (u64, std::collections::BTreeMap<Rank, (SocketAddr, u64)>);

/// Connector to simulated agents.
#[derive(Default)]
pub struct SimConnector {
    /// Requests per host, in arrival order.
    pub requests: Mutex<HashMap<HostKey, Vec<SimRequest>>>,
    /// Addresses that refuse connections.
    pub refuse: Mutex<Vec<SocketAddr>>,
    /// Procs each agent holds, by host then name.
    pub procs: Mutex<HashMap<HostKey, HashMap<String, protocol::ProcReport>>>,
    /// Heartbeat period of every agent (none: only the Snapshot on connect).
    pub heartbeat: Option<Duration>,
    /// Pod UIDs whose agent is dead: it stops heartbeating.
    pub dead: Mutex<Vec<String>>,
    /// Hosts whose agent is hung (SIGSTOPped): calls to it never answer.
    pub hung: Mutex<Vec<HostKey>>,
    /// Hosts whose agent refuses the next SetAddressBook (its actor not up
    /// yet); each refusal takes one entry.
    pub refuse_book: Mutex<Vec<HostKey>>,
    /// Hosts whose agent's clock is off the hub's by this many ms (its
    /// snapshots and heartbeats are stamped with it).
    pub clock_skew_ms: Mutex<HashMap<HostKey, i64>>,
    /// Hosts whose agent was asked for a fresh snapshot, in order.
    pub resyncs: Mutex<Vec<HostKey>>,
    /// The address book each agent holds: its version and entries.
    pub books: Mutex<HashMap<HostKey, SimBook>>,
    /// Address book messages received by all agents, and the host
    /// entries they carried.
    pub book_traffic: Mutex<(u64, u64)>,
    /// The pod each host's agent was last dialed in (its pushes carry it).
    pub uids: Mutex<HashMap<HostKey, String>>,
    /// The World secret each host's agent admits, as the real agent does:
    /// a dial holding neither it as its secret nor as its previous one is
    /// refused, and `Rekey` replaces it. A host not listed admits any.
    pub keys: Mutex<HashMap<HostKey, Vec<u8>>>,
}

impl SimConnector {
    /// Agents that heartbeat every `every`.
    pub fn with_heartbeat(every: Duration) -> Self {
        SimConnector {
            heartbeat: Some(every),
            ..Default::default()
        }
    }

    /// Kills the agent in pod `pod_uid`: it goes silent.
    pub fn kill(&self, pod_uid: &str) {
        self.dead
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(pod_uid.to_string());
    }

    /// The clock of `host`'s agent now, in ms since the epoch.
    pub fn agent_now_ms(&self, host: &HostKey) -> u64 {
        let skew = self
            .clock_skew_ms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(host)
            .copied()
            .unwrap_or(0);
        now_ms().saturating_add_signed(skew)
    }

    /// The pod `host`'s agent was last dialed in.
    fn uid_of(&self, host: &HostKey) -> String {
        self.uids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(host)
            .cloned()
            .unwrap_or_default()
    }

    fn is_dead(&self, pod_uid: &str) -> bool {
        self.dead
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|d| d == pod_uid)
    }

    /// Requests received by `host`.
    pub fn requests_of(&self, host: &HostKey) -> Vec<SimRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(host)
            .cloned()
            .unwrap_or_default()
    }

    /// Reports that actor `actor` of proc `name` on `host` failed, as a
    /// runtime-aware proc's agent does, and returns the push to send.
    pub fn fail_actor(
        &self,
        host: &HostKey,
        name: &str,
        actor: &str,
        reason: &str,
    ) -> Option<HostReport> {
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        let p = procs.get_mut(host)?.get_mut(name)?;
        p.actor_failures += 1;
        p.actor_failure.get_or_insert(protocol::FailedActor {
            actor: actor.to_string(),
            reason: reason.to_string(),
            at_ms: 1_700_000_000_000,
        });
        p.seq += 1;
        Some(HostReport::ProcState {
            host: host.clone(),
            pod_uid: self.uid_of(host),
            state: p.clone(),
        })
    }

    /// The agent of `host` (in pod `pod_uid`)'s Snapshot of its procs.
    fn snapshot(&self, host: &HostKey, pod_uid: &str) -> HostReport {
        let procs: Vec<protocol::ProcReport> = {
            let all = self.procs.lock().unwrap_or_else(|e| e.into_inner());
            all.get(host)
                .map(|h| h.values().cloned().collect())
                .unwrap_or_default()
        };
        HostReport::Snapshot {
            host: host.clone(),
            pod_uid: pod_uid.to_string(),
            procs,
            clock: Some(ClockSample::now(self.agent_now_ms(host))),
        }
    }

    /// [`hostmesh_agent::digest`] of the procs `host`'s agent holds (what
    /// its heartbeats carry).
    pub fn digest_of(&self, host: &HostKey) -> u64 {
        let all = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        let procs: Vec<protocol::ProcReport> = all
            .get(host)
            .map(|h| h.values().cloned().collect())
            .unwrap_or_default();
        hostmesh_agent::digest(&procs)
    }

    /// Sets proc `name` on `host` to `status` and returns the push to send.
    pub fn set_status(
        &self,
        host: &HostKey,
        name: &str,
        status: protocol::ProcPhase,
    ) -> Option<HostReport> {
        let at = self.agent_now_ms(host);
        self.set_status_at(host, name, status, at)
    }

    /// Like [`SimConnector::set_status`], with the change stamped at
    /// `changed_at_ms` on the agent's clock (a failure that happened
    /// earlier than it is reported).
    pub fn set_status_at(
        &self,
        host: &HostKey,
        name: &str,
        status: protocol::ProcPhase,
        changed_at_ms: u64,
    ) -> Option<HostReport> {
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        let p = procs.get_mut(host)?.get_mut(name)?;
        p.status = status;
        p.changed_at_ms = changed_at_ms;
        p.seq += 1;
        Some(HostReport::ProcState {
            host: host.clone(),
            pod_uid: self.uid_of(host),
            state: p.clone(),
        })
    }
}

fn new_state(req: &CreateOrUpdate) -> protocol::ProcReport {
    protocol::ProcReport {
        proc_id: format!("sim,{}", req.name),
        name: req.name.clone(),
        rank: req.rank,
        pid: Some(1),
        command: vec![req.spec.command.clone()],
        // A runtime-aware proc checks in with its runtime address.
        status: protocol::ProcPhase::Ready {
            pid: 1,
            addr: req
                .spec
                .runtime_aware
                .then(|| format!("tcp:10.9.{}.{}:4000", req.rank / 250, req.rank % 250)),
        },
        started_at_ms: 0,
        restarts: req.incarnation,
        stop_requested: false,
        seq: 0,
        actor_failure: None,
        actor_failures: 0,
        changed_at_ms: now_ms(),
        stderr_head: Vec::new(),
        oom_killed: false,
        stall: None,
    }
}

/// The wall clock in milliseconds since the epoch (simulated agents share
/// the hub's clock).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, protocol::duration_ms)
}

struct SimLink {
    sim: Arc<SimConnector>,
    host: HostKey,
    pod_uid: String,
    pushes: mpsc::Sender<HostReport>,
}

impl SimLink {
    /// Whether this host's agent is hung: calls to it never answer.
    fn hung(&self) -> bool {
        self.sim
            .hung
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&self.host)
    }

    fn record(&self, r: SimRequest) {
        let mut reqs = self.sim.requests.lock().unwrap_or_else(|e| e.into_inner());
        reqs.entry(self.host.clone()).or_default().push(r);
    }

    async fn push(&self, state: protocol::ProcReport) -> Result<(), LinkError> {
        let push = HostReport::ProcState {
            host: self.host.clone(),
            pod_uid: self.pod_uid.clone(),
            state,
        };
        self.pushes.send(push).await.map_err(|_| LinkError::HubGone)
    }
}

impl AgentLink for SimLink {
    fn rekey(&self, secret: Arc<[u8]>, lineage: Arc<str>) -> BoxFuture<'_, Result<(), LinkError>> {
        Box::pin(async move {
            if self.hung() {
                return futures::future::pending().await;
            }
            self.record(SimRequest::Rekey(lineage.to_string()));
            self.sim
                .keys
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(self.host.clone(), secret.to_vec());
            Ok(())
        })
    }

    fn resync(&self) {
        self.sim
            .resyncs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.host.clone());
        let snap = self.sim.snapshot(&self.host, &self.pod_uid);
        let pushes = self.pushes.clone();
        tokio::spawn(async move {
            let _ = pushes.send(snap).await;
        });
    }

    fn create_or_update(&self, req: CreateOrUpdate) -> BoxFuture<'_, Result<(), LinkError>> {
        Box::pin(async move {
            self.record(SimRequest::Create(Box::new(req.clone())));
            let changed = {
                let mut procs = self.sim.procs.lock().unwrap_or_else(|e| e.into_inner());
                let host = procs.entry(self.host.clone()).or_default();
                match host.get(&req.name) {
                    Some(p) if p.restarts >= req.incarnation => None,
                    Some(p) if !p.status.is_terminal() => {
                        return Err(LinkError::Refused("StillRunning".to_string()));
                    }
                    _ => {
                        let s = new_state(&req);
                        host.insert(req.name.clone(), s.clone());
                        Some(s)
                    }
                }
            };
            match changed {
                Some(s) => self.push(s).await,
                None => Ok(()),
            }
        })
    }

    fn stop(&self, name: String, _grace: Duration) -> BoxFuture<'_, Result<(), LinkError>> {
        Box::pin(async move {
            self.record(SimRequest::Stop(name.clone()));
            let stopped = {
                let mut procs = self.sim.procs.lock().unwrap_or_else(|e| e.into_inner());
                procs
                    .get_mut(&self.host)
                    .and_then(|h| h.get_mut(&name))
                    .filter(|p| !p.status.is_terminal())
                    .map(|p| {
                        p.status = protocol::ProcPhase::Killed {
                            signal: 15,
                            core_dumped: false,
                            stderr_tail: vec![],
                        };
                        p.stop_requested = true;
                        p.clone()
                    })
            };
            match stopped {
                Some(s) => self.push(s).await,
                None => Ok(()),
            }
        })
    }

    fn send_book(&self, update: BookUpdate) -> BoxFuture<'_, Result<BookAck, LinkError>> {
        Box::pin(async move {
            if self.hung() {
                return futures::future::pending().await;
            }
            {
                let mut refuse = self
                    .sim
                    .refuse_book
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if let Some(i) = refuse.iter().position(|h| *h == self.host) {
                    refuse.remove(i);
                    return Err(LinkError::Refused("no actor host[0] on this proc".into()));
                }
            }
            {
                let mut t = self
                    .sim
                    .book_traffic
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                t.0 += 1;
                t.1 += update.entries() as u64;
            }
            let held = {
                let mut books = self.sim.books.lock().unwrap_or_else(|e| e.into_inner());
                let book = books.entry(self.host.clone()).or_default();
                match update {
                    BookUpdate::Full { version, hosts } => {
                        book.0 = version;
                        book.1 = hosts.into_iter().map(|(r, a, e)| (r, (a, e))).collect();
                    }
                    BookUpdate::Patch {
                        base,
                        version,
                        changes,
                        ..
                    } => {
                        // As the agent: only on top of the version it holds.
                        if book.0 == 0 || book.0 != base {
                            return Ok(BookAck::Holds(book.0));
                        }
                        for (r, a, e) in changes {
                            match a {
                                Some(a) => book.1.insert(r, (a, e)),
                                None => book.1.remove(&r),
                            };
                        }
                        book.0 = version;
                    }
                }
                book.1.iter().map(|(r, (a, e))| (*r, *a, *e)).collect()
            };
            self.record(SimRequest::Book(held));
            Ok(BookAck::Applied)
        })
    }
}

/// The connector as the hub takes it.
pub fn connector(sim: &Arc<SimConnector>) -> Arc<dyn AgentConnector> {
    Arc::new(SimHandle(sim.clone()))
}

struct SimHandle(Arc<SimConnector>);

impl AgentConnector for SimHandle {
    fn connect(
        &self,
        target: AgentTarget,
        pushes: mpsc::Sender<HostReport>,
    ) -> BoxFuture<'static, Result<Arc<dyn AgentLink>, LinkError>> {
        let sim = self.0.clone();
        Box::pin(async move {
            if sim
                .refuse
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&target.addr)
            {
                return Err(LinkError::Connect {
                    addr: target.addr,
                    reason: "connection refused".to_string(),
                });
            }
            let admitted = sim
                .keys
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&target.host)
                .is_none_or(|k| {
                    **k == *target.secret || target.previous.as_deref() == Some(k.as_slice())
                });
            if !admitted {
                return Err(LinkError::Connect {
                    addr: target.addr,
                    reason: "authentication failed: it does not hold our shared secret".into(),
                });
            }
            sim.uids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(target.host.clone(), target.pod_uid.clone());
            let snap = sim.snapshot(&target.host, &target.pod_uid);
            pushes.send(snap).await.map_err(|_| LinkError::HubGone)?;
            if let Some(every) = sim.heartbeat {
                let (sim, host, uid, pushes) = (
                    sim.clone(),
                    target.host.clone(),
                    target.pod_uid.clone(),
                    pushes.clone(),
                );
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(every).await;
                        if sim.is_dead(&uid) {
                            return;
                        }
                        let beat = HostReport::Heartbeat {
                            host: host.clone(),
                            pod_uid: uid.clone(),
                            clock: Some(ClockSample::now(sim.agent_now_ms(&host))),
                            digest: Some(sim.digest_of(&host)),
                        };
                        if pushes.send(beat).await.is_err() {
                            return;
                        }
                    }
                });
            }
            let link: Arc<dyn AgentLink> = Arc::new(SimLink {
                sim,
                host: target.host,
                pod_uid: target.pod_uid,
                pushes,
            });
            Ok(link)
        })
    }
}
