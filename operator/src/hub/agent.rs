//! What the hub needs from host agents, as a small trait: dial an agent
//! with the World's secret, send it requests, receive its pushes. The real
//! implementation wraps the runtime's agent client; tests and benchmarks use
//! in-memory agents.

use hostmesh_crds::Rank;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
pub use hostmesh_agent::protocol::{self, CreateOrUpdate};
use hostmesh_crds::procmesh::ProcState;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::mpsc;

use super::clock::{AgentClock, ClockSample};

/// A World, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorldKey {
    /// The object's namespace.
    pub namespace: String,
    /// The object's name (a World's or a ProcMesh's).
    pub name: String,
}

/// One host agent of a World.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostKey {
    /// Its World.
    pub world: WorldKey,
    /// Host rank.
    pub rank: Rank,
}

/// Where to dial an agent and how to authenticate.
#[derive(Clone)]
pub struct AgentTarget {
    /// The host.
    pub host: HostKey,
    /// UID of the pod the agent runs in (a replaced pod is a new agent).
    pub pod_uid: String,
    /// Agent address (pod IP and World port).
    pub addr: SocketAddr,
    /// The World's secret.
    pub secret: Arc<[u8]>,
    /// While the World's secret is rotated: the previous one, which
    /// agents that did not take the new one yet still hold.
    pub previous: Option<Arc<[u8]>>,
    /// The pod's rank epoch: pushes from an agent of an older one are
    /// refused.
    pub epoch: u64,
    /// Silence on the agent's subscription after which the link
    /// resubscribes ([`silence_bound`]).
    pub silence: Duration,
}

/// The silence after which a subscription to agents that send a heartbeat
/// every `interval` counts as lost: three missed heartbeats, and never less
/// than the client's default (5 s, which fits the default 1 s interval).
pub fn silence_bound(interval: Duration) -> Duration {
    hostmesh_agent::ClientConfig::default()
        .heartbeat_timeout
        .max(interval.saturating_mul(3))
}

impl std::fmt::Debug for AgentTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret stays out of logs.
        f.debug_struct("AgentTarget")
            .field("host", &self.host)
            .field("pod_uid", &self.pod_uid)
            .field("addr", &self.addr)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

/// A proc's state as the hub summarizes an agent's report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcObs {
    /// Host rank that reported it.
    pub host: Rank,
    /// The API state the agent's report maps to (Running, Failed, ...).
    pub state: ProcState,
    /// Exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Signal, when killed.
    pub signal: Option<i32>,
    /// Reason, when given.
    pub reason: Option<String>,
    /// Last lines of stderr.
    pub stderr_tail: Option<String>,
    /// First lines of stderr that the tail lost.
    pub stderr_head: Option<String>,
    /// Killed by the kernel's OOM killer (SIGKILL while its cgroup's
    /// OOM-kill count rose).
    pub oom_killed: bool,
    /// For a failure: when it happened, on the agent's clock corrected to
    /// the hub's ([`super::clock`]).
    pub failed_at: Option<Timestamp>,
    /// For a failure: when this hub first received it (wall clock).
    pub detected_at: Option<Timestamp>,
    /// Incarnation the state belongs to.
    pub incarnation: u32,
    /// The first actor failure of this incarnation (runtime-aware procs).
    pub actor_failure: Option<protocol::FailedActor>,
    /// How many actors of this incarnation failed.
    pub actor_failures: u32,
    /// Set while the agent reports the proc stalled (`spec.stallTimeout`).
    pub stall: Option<protocol::Stall>,
    /// The runtime address a runtime-aware proc checked in with (`None`
    /// for plain procs): what `<procmesh>-runtime` publishes.
    pub addr: Option<Box<str>>,
}

impl ProcObs {
    /// Summarizes an agent's proc state reported by host `host`.
    pub fn from_agent(host: Rank, s: &protocol::ProcReport) -> Self {
        use protocol::ProcPhase as S;
        let tail = |lines: &Vec<String>| (!lines.is_empty()).then(|| lines.join("\n"));
        let mut o = ProcObs {
            host,
            state: ProcState::Starting,
            exit_code: None,
            signal: None,
            reason: None,
            stderr_tail: None,
            stderr_head: (!s.stderr_head.is_empty()).then(|| s.stderr_head.join("\n")),
            oom_killed: s.oom_killed,
            failed_at: None,
            detected_at: None,
            incarnation: s.restarts,
            actor_failure: s.actor_failure.clone(),
            actor_failures: s.actor_failures,
            stall: s.stall.clone().filter(|_| !s.status.is_terminal()),
            addr: None,
        };
        match &s.status {
            S::Starting => {}
            S::Ready { addr, .. } => {
                o.state = ProcState::Running;
                o.addr = addr.as_deref().map(Into::into);
            }
            S::Stopping { .. } => o.state = ProcState::Stopping,
            S::Stopped {
                exit_code,
                stderr_tail,
            } => {
                o.exit_code = Some(*exit_code);
                o.stderr_tail = tail(stderr_tail);
                o.state = match (*exit_code, s.stop_requested) {
                    (0, _) => ProcState::Succeeded,
                    (_, true) => ProcState::Stopped,
                    _ => ProcState::Failed,
                };
            }
            S::Killed {
                signal,
                stderr_tail,
                ..
            } => {
                o.signal = Some(*signal);
                o.stderr_tail = tail(stderr_tail);
                o.state = if s.stop_requested {
                    ProcState::Stopped
                } else {
                    ProcState::Killed
                };
            }
            S::Failed { reason } => {
                o.state = ProcState::Failed;
                o.reason = Some(reason.clone());
            }
            S::Timeout { after_ms } => {
                o.state = ProcState::Timeout;
                o.reason = Some(format!("did not check in within {after_ms} ms"));
            }
        }
        o
    }

    /// Stamps a failure with its corrected time (the agent's `changed_at_ms`
    /// through `clock`) and when the hub received it; a report of the same
    /// failure seen before (`prev`) keeps its first receipt time.
    pub fn stamp(
        mut self,
        s: &protocol::ProcReport,
        clock: &AgentClock,
        received: Timestamp,
        prev: Option<&ProcObs>,
    ) -> Self {
        if self.state.is_failure() {
            let same = prev.filter(|p| p.incarnation == self.incarnation && p.state == self.state);
            self.detected_at = same.and_then(|p| p.detected_at).or(Some(received));
            // The same failure keeps the time settled when first heard.
            self.failed_at = same
                .and_then(|p| p.failed_at)
                .or_else(|| clock.to_hub(s.changed_at_ms, received))
                .or(Some(received));
        }
        self
    }
}

/// What agents push to the hub.
// Nearly every report is a proc state moved once through the push channel:
// boxing it would allocate for almost every report, for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum HostReport {
    /// Periodic heartbeat.
    Heartbeat {
        /// From.
        host: HostKey,
        /// Pod UID of the agent.
        pod_uid: String,
        /// The agent's send time and the receipt time, when the agent said.
        clock: Option<ClockSample>,
        /// [`hostmesh_agent::digest`] of every proc the agent holds, when
        /// it said: the hub compares it with its own picture of the host.
        digest: Option<u64>,
    },
    /// A proc changed state.
    ProcState {
        /// From.
        host: HostKey,
        /// Pod UID of the agent (a report from a pod that is gone or
        /// replaced does not count).
        pod_uid: String,
        /// Its full new state.
        state: protocol::ProcReport,
    },
    /// Every proc the agent has, sent when (re)subscribing.
    Snapshot {
        /// From.
        host: HostKey,
        /// Pod UID of the agent.
        pod_uid: String,
        /// Every proc's state.
        procs: Vec<protocol::ProcReport>,
        /// The agent's send time and the receipt time, when the agent said.
        clock: Option<ClockSample>,
    },
    /// The agent's pushes are refused: it is of an older rank epoch than
    /// its pod, or it fenced itself. No heartbeat of it counts.
    Refused {
        /// From.
        host: HostKey,
        /// Pod UID it was dialed for.
        pod_uid: String,
        /// Why.
        reason: String,
    },
    /// The agent took the World's rotated token over its current link
    /// ([`super::trust`]).
    Rekeyed {
        /// From.
        host: HostKey,
    },
    /// The connection dropped, or could not be made.
    Disconnected {
        /// From.
        host: HostKey,
        /// Why (the dial's or the subscription's error: an unreachable
        /// address, a refused handshake, silence).
        reason: String,
    },
}

/// Why a request to a host's agent failed: the hub-to-agent boundary.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The hub has no live connection to that host's agent (yet).
    #[error("host {0} has no agent connection yet")]
    NotConnected(Rank),
    /// Dialing the agent failed (unreachable, or the handshake refused).
    #[error("cannot connect to the agent at {addr}: {reason}")]
    Connect {
        /// The agent's address.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
    /// The request did not complete, or the agent refused it.
    #[error(transparent)]
    Client(#[from] hostmesh_agent::ClientError),
    /// The agent refused the request (a simulated agent's answer).
    #[error("the agent refused: {0}")]
    Refused(String),
    /// The hub stopped taking the agent's pushes (the operator is stopping).
    #[error("the supervision hub is gone")]
    HubGone,
}

/// An address book for one agent ([`super::book`]): host ranks with their
/// agent address and rank epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BookUpdate {
    /// The whole book, numbered `version`.
    Full {
        /// The book's version.
        version: u64,
        /// Every host: rank, agent address, rank epoch.
        hosts: Vec<(Rank, SocketAddr, u64)>,
    },
    /// The changes after version `base`.
    Patch {
        /// The version the agent must hold.
        base: u64,
        /// The version after the patch.
        version: u64,
        /// The book's length (host ranks) after the patch.
        len: usize,
        /// Changed hosts: rank, agent address (`None`: it has none now),
        /// rank epoch.
        changes: Vec<(Rank, Option<SocketAddr>, u64)>,
    },
}

impl BookUpdate {
    /// The version the agent holds once it applied the update.
    pub fn version(&self) -> u64 {
        match self {
            BookUpdate::Full { version, .. } | BookUpdate::Patch { version, .. } => *version,
        }
    }

    /// Host entries it carries (the cost of sending it).
    pub fn entries(&self) -> usize {
        match self {
            BookUpdate::Full { hosts, .. } => hosts.len(),
            BookUpdate::Patch { changes, .. } => changes.len(),
        }
    }
}

/// How an agent took an address book.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BookAck {
    /// It holds the update's version now.
    Applied,
    /// A patch on another version than the agent's: it holds this one
    /// (0: none), unchanged.
    Holds(u64),
}

/// A connected agent.
pub trait AgentLink: Send + Sync {
    /// Creates a proc, or restarts an ended one under a higher incarnation
    /// (idempotent).
    fn create_or_update(&self, req: CreateOrUpdate) -> BoxFuture<'_, Result<(), LinkError>>;
    /// Stops the proc `name`: TERM, then KILL after `grace`.
    fn stop(&self, name: String, grace: Duration) -> BoxFuture<'_, Result<(), LinkError>>;
    /// Sends the World's address book, whole or as the changes since a
    /// version the agent holds ([`super::book`]).
    fn send_book(&self, update: BookUpdate) -> BoxFuture<'_, Result<BookAck, LinkError>>;
    /// The stacks of the named procs, each at most `max_bytes`, waiting at
    /// most `timeout` (default: refused, for agents that cannot).
    fn capture_stacks(
        &self,
        _names: Vec<String>,
        _max_bytes: usize,
        _timeout: Duration,
    ) -> BoxFuture<'_, Result<Vec<protocol::ProcStacks>, LinkError>> {
        Box::pin(async {
            Err(LinkError::Refused(
                "this agent cannot capture stacks".into(),
            ))
        })
    }
    /// `Rekey {secret, lineage}`: the World's token was rotated; the
    /// agent takes the new key and its issuer's lineage
    /// ([`super::trust`]). The default (a simulated agent) takes anything.
    fn rekey(
        &self,
        _secret: Arc<[u8]>,
        _lineage: Arc<str>,
    ) -> BoxFuture<'_, Result<(), LinkError>> {
        Box::pin(async { Ok(()) })
    }
    /// `Renew {epoch}`: this hub hears the agent, which should be of
    /// `epoch`; the default (a simulated agent) does nothing.
    fn renew(&self, _epoch: u64) -> BoxFuture<'_, Result<hostmesh_agent::EpochVerdict, LinkError>> {
        Box::pin(async { Ok(hostmesh_agent::EpochVerdict::Current) })
    }
    /// Asks the agent for a fresh Snapshot (the hub's picture of it does
    /// not match its heartbeat's digest); the snapshot arrives as a push.
    /// Never blocks. The default does nothing.
    fn resync(&self) {}
}

/// Dials agents.
pub trait AgentConnector: Send + Sync + 'static {
    /// Dials `target`, authenticates with its secret and subscribes; the
    /// agent's pushes go to `pushes` (a Snapshot first).
    fn connect(
        &self,
        target: AgentTarget,
        pushes: mpsc::Sender<HostReport>,
    ) -> BoxFuture<'static, Result<Arc<dyn AgentLink>, LinkError>>;

    /// Stops watching a host that left its World (default: nothing to do).
    fn forget_host(&self, _host: &HostKey) {}

    /// Drops everything held for a deleted World (default: nothing to do).
    fn forget_world(&self, _world: &WorldKey) {}
}
