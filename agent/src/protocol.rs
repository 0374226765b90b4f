//! The host agent's messages and the data they carry (docs/architecture.md,
//! "Agent protocol"; docs/agent.md). Plain serde types, no I/O.
//!
//! Invariants:
//! 1. A [`ProcSpec`] is compared whole: two `CreateOrUpdate`s of one name are
//!    the same request exactly when rank, spec and incarnation are equal.
//! 2. [`ProcPhase::is_terminal`] statuses never change again for the same
//!    incarnation of a proc.
//! 3. Every [`ProcStateChanged`] carries the proc's full state, so a
//!    subscriber never needs an earlier message to interpret a later one.

use hostmesh_mesh::Rank;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One named dimension of a proc mesh's extent, such as `gpu=8`: the mesh
/// crate's, as in the API types.
pub use hostmesh_mesh::Dim;

/// What to run for one proc, and where it sits in its proc mesh.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProcSpec {
    /// Executable: a path, or a name looked up in `PATH`.
    pub command: String,
    /// Arguments after the executable.
    pub args: Vec<String>,
    /// Extra environment, applied after the contract variables (so a user
    /// may override them, on purpose).
    pub env: Vec<(String, String)>,
    /// Working directory; the agent's own when absent.
    pub working_dir: Option<String>,
    /// Name of the proc mesh (`HOSTMESH_PROC_MESH`).
    pub proc_mesh: String,
    /// Full extent of the proc mesh: the World's shape followed by the
    /// per-host dimensions.
    pub extent: Vec<Dim>,
    /// How many trailing dimensions of `extent` are per-host (`perHost`).
    pub per_host_dims: usize,
    /// `MASTER_PORT` for the proc; 29500 when absent.
    pub master_port: Option<u16>,
    /// The proc links the runtime and must check in with the agent to be
    /// Ready; otherwise it is Ready once spawned.
    pub runtime_aware: bool,
    /// How long a runtime-aware proc has to check in, in milliseconds; the
    /// agent's default when absent.
    pub spawn_timeout_ms: Option<u64>,
    /// Stall detection (`stall.rs`): a Ready proc without progress for
    /// this many milliseconds is reported stalled; off when absent.
    pub stall_timeout_ms: Option<u64>,
    /// Only output lines matching this regular expression count as
    /// progress (all lines when absent).
    pub progress_pattern: Option<String>,
}

impl ProcSpec {
    /// A plain command in a one-proc mesh, the usual start for tests and
    /// tools; adjust fields afterwards.
    pub fn command(command: impl Into<String>, args: &[&str]) -> Self {
        ProcSpec {
            command: command.into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: Vec::new(),
            working_dir: None,
            proc_mesh: "default".to_owned(),
            extent: vec![Dim::new("host", 1), Dim::new("proc", 1)],
            per_host_dims: 1,
            master_port: None,
            runtime_aware: false,
            spawn_timeout_ms: None,
            stall_timeout_ms: None,
            progress_pattern: None,
        }
    }

    /// Number of procs in the whole mesh.
    pub fn world_size(&self) -> Rank {
        self.extent.iter().map(|d| d.size as Rank).product()
    }

    /// Number of procs on each host.
    pub fn local_world_size(&self) -> usize {
        let n = self.extent.len();
        self.extent[n.saturating_sub(self.per_host_dims)..]
            .iter()
            .map(|d| d.size as usize)
            .product()
    }
}

/// Create the named proc if it does not exist (idempotent).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CreateOrUpdate {
    /// Proc name, unique on the host (`[A-Za-z0-9._-]`, at most 128 bytes; it is
    /// also the proc's runtime name).
    pub name: String,
    /// The proc's global rank in its mesh.
    pub rank: Rank,
    /// What to run.
    pub spec: ProcSpec,
    /// The operator's restart counter for this proc. A higher incarnation of
    /// a terminated proc with the same spec restarts it; equal is a no-op.
    pub incarnation: u32,
}

/// What `CreateOrUpdate` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CreateOutcome {
    /// A new proc was started.
    Created,
    /// A terminated proc was started again under a new incarnation.
    Restarted,
    /// The same request had already been applied: nothing changed.
    Unchanged,
}

/// The lifecycle state of one proc (DESIGN.md, "Runtime and supervision").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProcPhase {
    /// Being spawned, or spawned and waiting for a runtime-aware check-in.
    #[default]
    Starting,
    /// Running.
    Ready {
        /// OS process id.
        pid: u32,
        /// Runtime address of a runtime-aware proc.
        addr: Option<String>,
    },
    /// A stop was requested: TERM was sent, KILL follows after the grace.
    Stopping {
        /// OS process id.
        pid: u32,
    },
    /// Exited by itself or after a stop, with an exit code.
    Stopped {
        /// The exit code.
        exit_code: i32,
        /// Last lines of stderr (bounded in lines and bytes).
        stderr_tail: Vec<String>,
    },
    /// Ended by a signal.
    Killed {
        /// Signal number.
        signal: i32,
        /// Whether a core was dumped.
        core_dumped: bool,
        /// Last lines of stderr (bounded in lines and bytes).
        stderr_tail: Vec<String>,
    },
    /// Could not be started (for example, the executable does not exist).
    Failed {
        /// Why.
        reason: String,
    },
    /// A runtime-aware proc that did not check in within its spawn timeout;
    /// the agent stopped it.
    Timeout {
        /// The timeout that elapsed, in milliseconds.
        after_ms: u64,
    },
}

impl ProcPhase {
    /// Whether the proc has ended (no process is running for it).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            ProcPhase::Stopped { .. }
                | ProcPhase::Killed { .. }
                | ProcPhase::Failed { .. }
                | ProcPhase::Timeout { .. }
        )
    }

    /// A short label (`Ready`, `Stopped`, ...), for logs and digests.
    pub fn label(&self) -> &'static str {
        match self {
            ProcPhase::Starting => "Starting",
            ProcPhase::Ready { .. } => "Ready",
            ProcPhase::Stopping { .. } => "Stopping",
            ProcPhase::Stopped { .. } => "Stopped",
            ProcPhase::Killed { .. } => "Killed",
            ProcPhase::Failed { .. } => "Failed",
            ProcPhase::Timeout { .. } => "Timeout",
        }
    }
}

/// `GetRankStatus` answer: the proc's rank and status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankReport {
    /// The proc's rank.
    pub rank: Rank,
    /// Where the proc is in its life: starting, ready, stopping, or how
    /// it ended.
    pub status: ProcPhase,
}

/// `GetState` answer, and the content of every push.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcReport {
    /// The proc's runtime id: `tcp:<agent address>/<name>`.
    pub proc_id: String,
    /// The proc name.
    pub name: String,
    /// Its global rank.
    pub rank: Rank,
    /// OS process id of the current incarnation, once spawned.
    pub pid: Option<u32>,
    /// The command line that was run (executable and arguments).
    pub command: Vec<String>,
    /// Current status.
    pub status: ProcPhase,
    /// Start time of the current incarnation, milliseconds since the Unix
    /// epoch.
    pub started_at_ms: u64,
    /// How many times the proc was restarted (its incarnation).
    pub restarts: u32,
    /// Whether the end was asked for (Stop, ShutdownHost): such an end is not
    /// a failure.
    pub stop_requested: bool,
    /// Agent-wide sequence number of this state, increasing with every change.
    pub seq: u64,
    /// The first actor failure of this incarnation of a runtime-aware
    /// proc, as its `mesh` actor reported it ([`ActorFailed`]).
    pub actor_failure: Option<FailedActor>,
    /// How many actors of this incarnation failed.
    pub actor_failures: u32,
    /// When `status` last changed, on the agent's wall clock (milliseconds
    /// since the Unix epoch): for an ended proc, when it ended. The hub
    /// corrects it by the agent's clock offset ([`AgentPush::Heartbeat`]).
    pub changed_at_ms: u64,
    /// First lines of stderr that are not in the tail (bounded in lines and
    /// bytes), once the proc has ended: the exception line is often here.
    pub stderr_head: Vec<String>,
    /// Ended by SIGKILL while its cgroup's OOM-kill count rose: the kernel's
    /// OOM killer took it.
    pub oom_killed: bool,
    /// Set while the proc is stalled (alive, no progress for its
    /// `stall_timeout_ms`); cleared when progress resumes.
    pub stall: Option<Stall>,
}

/// An actor that failed inside a runtime-aware proc.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedActor {
    /// The actor's id, as text.
    pub actor: String,
    /// Why it failed (at most [`MAX_ACTOR_REASON`] bytes).
    pub reason: String,
    /// When the agent learnt of it, milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// Most bytes of an actor failure's reason an agent keeps.
pub const MAX_ACTOR_REASON: usize = 1024;

/// `ActorFailed {name, actor, reason}`: a runtime-aware proc's `mesh`
/// actor reports that an actor it spawned failed. Sent by the proc to its
/// agent; the agent records it in the proc's state and pushes the change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorFailed {
    /// The proc name (`HOSTMESH_PROC_NAME`).
    pub name: String,
    /// The failed actor's id, as text.
    pub actor: String,
    /// Why it failed.
    pub reason: String,
}

/// A stall of a running proc, as the agent saw it start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stall {
    /// When the proc last showed progress, milliseconds since the Unix
    /// epoch (agent clock).
    pub last_progress_ms: u64,
    /// The stall timeout that elapsed, in milliseconds.
    pub after_ms: u64,
    /// CPU time (user + system, main process) the proc used between its
    /// last progress and the detection, in milliseconds: near 0 means
    /// blocked (a hung collective, a deadlock), near the wall time means
    /// spinning. `None` when /proc could not be read.
    pub cpu_ms: Option<u64>,
}

/// `CaptureStacks {names, max_bytes, reply}`: capture the stacks of the
/// named procs (py-spy when on the proc's PATH, else the kernel's view)
/// and send them to `reply`. Answered at once; the capture is bounded in
/// time and bytes.
#[derive(Debug, Serialize, Deserialize)]
pub struct CaptureStacks {
    /// The procs.
    pub names: Vec<String>,
    /// Most bytes of stack text per proc (clamped to 64 KiB).
    pub max_bytes: u64,
    /// Where the [`ProcStacks`] go (one message with all of them).
    pub reply: hostmesh_runtime::OncePortRef<Vec<ProcStacks>>,
}

/// The stacks of one proc.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcStacks {
    /// The proc name.
    pub name: String,
    /// Its rank.
    pub rank: Rank,
    /// How they were taken: `py-spy`, `kernel` (`/proc/<pid>/task/*/stack`),
    /// `wchan` (wait channel and system call), or `none` (no process).
    pub method: String,
    /// The stack text, at most the asked bytes.
    pub text: String,
    /// Whether `text` was cut at the byte bound.
    pub truncated: bool,
}

/// A push to subscribers: one proc changed state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcStateChanged {
    /// The host's rank.
    pub host_rank: Rank,
    /// The proc's new state.
    pub state: ProcReport,
}

/// Grace period on the wire, in milliseconds.
pub fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What the agent pushes to a subscriber.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentPush {
    /// Every proc's state, sent first on (re)subscribe and whenever the
    /// subscriber fell behind: it replaces the subscriber's picture.
    Snapshot {
        /// The host's rank.
        host_rank: Rank,
        /// The agent's runtime address.
        agent_addr: String,
        /// Sequence number the snapshot is current at.
        seq: u64,
        /// All procs (running and ended) the agent holds.
        procs: Vec<ProcReport>,
        /// The agent's wall clock when it sent this, milliseconds since the
        /// Unix epoch (a clock-offset sample for the hub).
        sent_at_ms: u64,
        /// The agent's rank epoch (`HOSTMESH_EPOCH`; 0 when it has none).
        epoch: u64,
        /// Why the agent fenced itself, once it has: it runs no procs and
        /// accepts none (docs/architecture.md, "Rank epochs and fencing").
        fenced: Option<String>,
    },
    /// One proc changed state (sent at once).
    Changed(ProcStateChanged),
    /// Sent every heartbeat interval: silence means the agent or the path
    /// to it is gone.
    Heartbeat {
        /// The host's rank.
        host_rank: Rank,
        /// Latest sequence number.
        seq: u64,
        /// [`digest`](crate::digest) of all proc states.
        digest: u64,
        /// Number of procs held.
        procs: usize,
        /// The agent's wall clock when it sent this, milliseconds since the
        /// Unix epoch: the hub estimates the agent's clock offset from it.
        sent_at_ms: u64,
        /// The agent's rank epoch.
        epoch: u64,
        /// Why the agent fenced itself, once it has.
        fenced: Option<String>,
    },
}

/// `GetRankStatus {name}`: the proc's rank and status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetRankStatus {
    /// The proc name.
    pub name: String,
}

/// `GetState {name}`: the proc's full state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetState {
    /// The proc name.
    pub name: String,
}

/// `Stop {name, grace}`: TERM, grace, KILL. Answered at once; the final
/// status arrives as a push.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stop {
    /// The proc name.
    pub name: String,
    /// Grace between TERM and KILL, in milliseconds.
    pub grace_ms: u64,
}

/// `ShutdownHost {grace, max_concurrency}`: stop every proc, then the agent
/// exits. Answered at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShutdownHost {
    /// Grace between TERM and KILL, in milliseconds.
    pub grace_ms: u64,
    /// Procs stopped at once (clamped to 1..=256).
    pub max_concurrency: usize,
}

/// `SetAddressBook {hosts, epochs, version}`: every host's agent address,
/// indexed by host rank (`ip:port`); host 0's IP is `MASTER_ADDR`. It
/// replaces the agent's book whole; later changes come as
/// [`PatchAddressBook`]s on top of its `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAddressBook {
    /// Agent addresses by host rank.
    pub hosts: Vec<String>,
    /// Rank epochs by host rank (empty: not known). An agent whose own
    /// rank is at a newer epoch here than its own has been replaced and
    /// fences itself at once.
    pub epochs: Vec<u64>,
    /// The book's version (0: unnumbered, no patch applies on top of it).
    pub version: u64,
}

/// `PatchAddressBook {base, version, len, changes}`: the entries of the
/// address book that changed since version `base`, so a change of one
/// host costs one entry per agent, not the whole book. Applied only on
/// top of `base` exactly: an agent holding another version answers
/// `Err(its version)` and changes nothing (the sender then sends the whole
/// book with [`SetAddressBook`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchAddressBook {
    /// The version the patch applies to.
    pub base: u64,
    /// The version the book has after it.
    pub version: u64,
    /// The book's length (host ranks) after it.
    pub len: usize,
    /// The changed entries; one of a rank that left has an empty address.
    pub changes: Vec<BookEntry>,
}

/// One host's entry in an address book.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BookEntry {
    /// Host rank.
    pub rank: Rank,
    /// The agent's address (`ip:port`); empty when the host has none.
    pub addr: String,
    /// The host's rank epoch (0: not known). As in [`SetAddressBook`], a
    /// newer epoch for the agent's own rank fences it.
    pub epoch: u64,
}

/// `Renew {epoch}`: the operator still hears this agent. The operator sends
/// it only after heartbeats of this agent reached it, so an agent that gets
/// none for its fence timeout knows the operator may replace it and fences
/// itself. An `epoch` newer than the agent's own means the agent was
/// replaced: it fences at once. Answered with the agent's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renew {
    /// The rank epoch the operator holds for this host.
    pub epoch: u64,
}

/// `Rekey {secret, lineage}`: the World's secret was rotated. The agent
/// authenticates connections made from now on with `secret` (the key it
/// derives from the `<world>-agent` Secret's new token), issues its procs'
/// credentials from the proc issuer of the new runtime key with `lineage`
/// (text of `hostmesh_runtime::channel::credential::Lineage`, leading to
/// that issuer: procs issued before the rotation and after it admit each
/// other), and reissues its desk's. Connections already established,
/// this one included, keep their session. Idempotent. Answered with why
/// not, when not.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rekey {
    /// The World's new secret.
    pub secret: Vec<u8>,
    /// The new issuer's lineage, as text (empty: none).
    pub lineage: String,
}

impl std::fmt::Debug for Rekey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret stays out of logs.
        f.debug_struct("Rekey")
            .field("lineage", &self.lineage.len())
            .finish_non_exhaustive()
    }
}

/// `Subscribe {port}`: push a snapshot, then every change and a heartbeat
/// every interval, to `port`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Subscribe {
    /// Where the pushes go.
    pub port: hostmesh_runtime::PortRef<AgentPush>,
}

/// `CheckIn {name, addr}`: a runtime-aware proc reports that it runs and
/// where it listens; it becomes Ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckIn {
    /// The proc name (`HOSTMESH_PROC_NAME`).
    pub name: String,
    /// The proc's runtime address.
    pub addr: String,
}

impl From<&ProcPhase> for hostmesh_runtime::supervision::ProcStatus {
    /// The runtime's view of a proc's status, for
    /// [`actor_status_for_proc`](hostmesh_runtime::supervision::actor_status_for_proc).
    fn from(s: &ProcPhase) -> Self {
        use hostmesh_runtime::supervision::ProcStatus as R;
        match s {
            ProcPhase::Starting => R::Starting,
            ProcPhase::Ready { .. } => R::Ready,
            ProcPhase::Stopping { .. } => R::Stopping,
            ProcPhase::Stopped {
                exit_code,
                stderr_tail,
            } => R::Stopped {
                exit_code: *exit_code,
                stderr_tail: stderr_tail.clone(),
            },
            ProcPhase::Killed { signal, .. } => R::Killed { signal: *signal },
            ProcPhase::Failed { reason } => R::Failed {
                reason: reason.clone(),
            },
            ProcPhase::Timeout { .. } => R::Timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostmesh_runtime::supervision::{ActorStatus, actor_status_for_proc};

    #[test]
    fn agent_status_maps_to_actor_status() {
        let status = |s: &ProcPhase| actor_status_for_proc(Some(&s.into()));
        assert_eq!(
            status(&ProcPhase::Ready { pid: 1, addr: None }),
            ActorStatus::Running
        );
        assert!(matches!(
            status(&ProcPhase::Stopped {
                exit_code: 0,
                stderr_tail: vec![]
            }),
            ActorStatus::Stopped(_)
        ));
        assert!(
            status(&ProcPhase::Killed {
                signal: 9,
                core_dumped: false,
                stderr_tail: vec![]
            })
            .is_failure()
        );
        assert!(status(&ProcPhase::Timeout { after_ms: 5 }).is_failure());
    }
}
