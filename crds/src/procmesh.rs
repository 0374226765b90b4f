//! The `ProcMesh` resource: P procs on every host of a World, each a process
//! started by the host's agent, with its rank and coordinates in its
//! environment.
//!
//! Invariants:
//! 1. The extent is the World's shape followed by `perHost`; proc rank =
//!    host_rank * perHostSize + local rank.
//! 2. `firstFailure`, once set, is kept until the ProcMesh is restarted as a
//!    whole (the root cause survives later failures); only an earlier
//!    failure (by the agents' corrected clocks) whose report arrived later
//!    replaces it.
//! 3. Status stays bounded at any number of ranks: runs are capped, stderr
//!    (head and tail) is kept for a few failed ranks, each cut to its bound,
//!    and `incidents` is a ring of bounded entries.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::DURATION_PATTERN;
use hostmesh_mesh::shape::{Dim, MAX_DIMS, Shape};
use hostmesh_mesh::{Rank, Run};

/// Default `spawnTimeout`.
pub const DEFAULT_SPAWN_TIMEOUT: &str = "60s";
/// Default `stopTimeout`.
pub const DEFAULT_STOP_TIMEOUT: &str = "30s";
/// Largest number of procs on one host.
pub const MAX_PROCS_PER_HOST: Rank = 1024;
/// Largest number of procs in one ProcMesh.
pub const MAX_PROCS: Rank = 200_000;
/// Most bytes of stderr kept per failed rank in status.
pub const MAX_STDERR_TAIL: usize = 1024;
/// Most bytes of the head of stderr kept per failed rank in status.
pub const MAX_STDERR_HEAD: usize = 512;
/// Most bytes of the command line kept in `firstFailure.command`.
pub const MAX_COMMAND: usize = 512;
/// Longest `progressPattern`, in bytes.
pub const MAX_PROGRESS_PATTERN: usize = 1024;
/// Largest compiled `progressPattern` (the regex crate's size limit), so a
/// pattern cannot make the agent use much memory.
pub const PROGRESS_PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// Desired state of a ProcMesh.
// kube's printcolumn(...) lists trip clippy's duplicated-attribute check.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "hostmesh.dev",
    version = "v1alpha1",
    kind = "ProcMesh",
    namespaced,
    status = "ProcMeshStatus",
    shortname = "pm",
    category = "hostmesh",
    doc = "Procs spawned by the agents of a World: perHost procs on every host.",
    printcolumn(name = "WORLD", type_ = "string", json_path = ".spec.world"),
    printcolumn(name = "EXTENT", type_ = "string", json_path = ".status.extent"),
    printcolumn(name = "RUNNING", type_ = "integer", json_path = ".status.running"),
    printcolumn(name = "FAILED", type_ = "integer", json_path = ".status.failed"),
    printcolumn(name = "RESTARTS", type_ = "integer", json_path = ".status.restarts"),
    printcolumn(name = "PHASE", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "AGE",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ProcMeshSpec {
    /// Name of the World (same namespace) whose hosts run the procs.
    #[schemars(length(min = 1, max = 63))]
    pub world: String,
    /// Per-host dimensions, e.g. `[{name: gpu, size: 8}]`; empty means one
    /// proc per host. Names must differ from the World's dimensions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_DIMS))]
    pub per_host: Vec<Dim>,
    /// Program and its leading arguments.
    #[schemars(length(min = 1))]
    pub command: Vec<String>,
    /// Further arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment for every proc (the rank contract variables win).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Working directory of every proc.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// What happens when procs fail.
    #[serde(default)]
    pub restart_policy: RestartPolicy,
    /// Ranks that have not started this long after the spawn are Timeout.
    /// Default `60s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub spawn_timeout: Option<String>,
    /// Grace period between SIGTERM and SIGKILL when procs stop. Default `30s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub stop_timeout: Option<String>,
    /// When this ProcMesh fails, its World fails too.
    #[serde(default)]
    pub critical: bool,
    /// `MASTER_PORT` given to procs. Default 29500.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub master_port: Option<u16>,
    /// The procs link the hostmesh runtime (`hostmesh_agent::join_host`,
    /// as `examples/echo-proc`): a proc is Running only once it checks in
    /// with its agent (a proc that does not within `spawnTimeout` is
    /// Timeout), and a failure of an actor spawned on it reaches
    /// `status.actorFailures` with the actor's name (docs/agent.md,
    /// "Runtime-aware procs").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub runtime_aware: bool,
    /// Stall detection (off when unset): a running proc that shows no
    /// progress for this long is Stalled. Progress is a line on its stdout
    /// or stderr (only lines matching `progressPattern`, when set), or a
    /// touch of the file named by its `HOSTMESH_PROGRESS_FILE`; CPU time
    /// alone never counts. On a stall the ProcMesh gets `Stalled=True`, an
    /// Event, and the stacks of every rank in ConfigMap `<name>-stacks`;
    /// `restartPolicy.onStall` says whether the stall is also a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub stall_timeout: Option<String>,
    /// With `stallTimeout`: only output lines matching this regular
    /// expression (Rust `regex` syntax, unanchored, at most
    /// 1024 characters) count as progress, e.g. `^step [0-9]+`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_PROGRESS_PATTERN))]
    pub progress_pattern: Option<String>,
    /// Fail the ProcMesh (reason `DeadlineExceeded`) once it has run this
    /// many seconds since its first spawn (`status.startTime`; restarts do
    /// not reset it), stopping its procs gracefully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::world::MAX_DEADLINE_SECONDS))]
    pub active_deadline_seconds: Option<i64>,
    /// When the ProcMesh has succeeded. Default: every rank exited 0. Once
    /// it is met the ProcMesh is `Succeeded` and its remaining ranks are
    /// stopped gracefully (state `Stopped`, never failures).
    #[serde(default, skip_serializing_if = "SuccessPolicy::is_default")]
    pub success_policy: SuccessPolicy,
    /// ProcMeshes on the same World that must reach a condition before this
    /// one spawns anything (a data download, then training). While it
    /// waits its condition `Waiting` is True and names what it waits for;
    /// a dependency that fails fails it (reason `DependencyFailed`). Once
    /// it spawned, its dependencies no longer matter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_DEPENDENCIES))]
    pub depends_on: Vec<Dependency>,
}

/// Most entries of `spec.dependsOn`.
pub const MAX_DEPENDENCIES: usize = 16;

/// A ProcMesh this one waits for ([`ProcMeshSpec::depends_on`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Dependency {
    /// Its name (same namespace, same World).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// `Succeeded` (default): it ended successfully. `Ready`: all its
    /// procs run (or it already succeeded).
    #[serde(default)]
    pub condition: DependencyCondition,
}

/// What a [`Dependency`] must reach.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DependencyCondition {
    /// Its `Ready` condition is True (or it has succeeded).
    Ready,
    /// It is `Succeeded`.
    #[default]
    Succeeded,
}

/// When a ProcMesh has succeeded ([`ProcMeshSpec::success_policy`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SuccessPolicy {
    /// `AllRanks` (default): every rank exited 0. `AnyRank`: one rank did.
    /// `RankZero`: rank 0 did. `Selected`: every rank selected by `dims`
    /// did (implied when `dims` is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<SuccessMode>,
    /// Selects ranks by coordinates of the ProcMesh's extent (the World's
    /// dimensions, then `perHost`), e.g. `{replica: 0}`: every rank whose
    /// `replica` coordinate is 0; several entries must all hold.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub dims: std::collections::BTreeMap<String, u32>,
}

impl SuccessPolicy {
    fn is_default(&self) -> bool {
        *self == SuccessPolicy::default()
    }

    /// The policy in force: `policy`, else `Selected` when `dims` is given,
    /// else `AllRanks`.
    pub fn mode(&self) -> SuccessMode {
        match (self.policy, self.dims.is_empty()) {
            (Some(m), _) => m,
            (None, false) => SuccessMode::Selected,
            (None, true) => SuccessMode::AllRanks,
        }
    }
}

/// Which ranks must exit 0 for a ProcMesh to succeed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum SuccessMode {
    /// Every rank.
    #[default]
    AllRanks,
    /// Any one rank.
    AnyRank,
    /// Rank 0.
    RankZero,
    /// Every rank `dims` selects.
    Selected,
}

impl ProcMeshSpec {
    /// The per-host extent.
    pub fn per_host_shape(&self) -> Shape {
        Shape::new(self.per_host.clone())
    }
}

/// One environment variable.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct EnvVar {
    /// Variable name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Its value.
    #[serde(default)]
    pub value: String,
}

/// What happens when procs fail.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestartPolicy {
    /// Never, OnFailure (per rank) or Gang (every rank).
    #[serde(default)]
    pub policy: RestartMode,
    /// Restarts allowed before the ProcMesh is Failed.
    #[serde(default = "default_max_restarts")]
    #[schemars(range(max = 1000))]
    pub max_restarts: u32,
    /// Delay before the first restart; doubles each restart. Default `1s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub backoff: Option<String>,
    /// Rules, first match wins, deciding what a rank's failure does. With
    /// no match: exit codes 126 and 127 (cannot execute / command not found)
    /// are permanent; every other failure is restarted per `policy`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_RULES))]
    pub rules: Vec<ExitRule>,
    /// What a stall (`spec.stallTimeout`) does. `Failure` (default): a
    /// stalled rank is a failed rank (state `Stalled`), handled by `policy`
    /// like any failure: Never fails the ProcMesh, OnFailure restarts the
    /// rank, Gang every rank, within `maxRestarts`. `Report`: only the
    /// `Stalled` condition, an Event and the stacks; the procs keep running
    /// (to attach a debugger).
    #[serde(default)]
    pub on_stall: StallAction,
    /// With `OnFailure`: a failed rank restarts the slice of the extent it
    /// belongs to along this dimension (every rank that shares its
    /// coordinates up to and including it, over the World's dimensions then
    /// `perHost`: for `[replica: 2, host: 4, gpu: 8]` and `host`, the 8
    /// ranks of its host), counted as one restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub scope: Option<String>,
}

/// What a stall does ([`RestartPolicy::on_stall`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum StallAction {
    /// The stalled rank counts as failed (state `Stalled`): the restart
    /// policy handles it.
    #[default]
    Failure,
    /// Reported only; the procs keep running.
    Report,
}

fn default_max_restarts() -> u32 {
    3
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            policy: RestartMode::default(),
            max_restarts: default_max_restarts(),
            backoff: None,
            rules: Vec::new(),
            on_stall: StallAction::default(),
            scope: None,
        }
    }
}

/// Restart mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum RestartMode {
    /// A failed proc stays failed; the ProcMesh fails.
    #[default]
    Never,
    /// A failed rank restarts alone, in place.
    OnFailure,
    /// Any failure restarts every rank.
    Gang,
}

/// Most rules in `restartPolicy.rules` or `failurePolicy.rules`.
pub const MAX_RULES: usize = 32;

/// A rule on a rank's failure. It matches when every kind of condition it
/// gives holds: its exit (an exit code in `exitCodes` or a signal in
/// `signals`), one of its `reasons`, and its `stderrPattern`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExitRule {
    /// Names the rule in status (`ruleFired`) and Events; default
    /// `rules[<index>]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub name: Option<String>,
    /// `Restart` (counted toward `maxRestarts`; `Retry` is the same),
    /// `RestartWithoutCounting` (infrastructure faults: a lost host must not
    /// burn the restart budget), `Fail` (permanent), `Ignore` (the rank's
    /// end is accepted: it stays down, `Stopped`, and is no failure).
    pub action: ExitAction,
    /// Exit codes this rule matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exit_codes: Vec<i32>,
    /// Signal numbers this rule matches (e.g. 9 for SIGKILL).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signals: Vec<i32>,
    /// Why the rank failed, besides how it exited: `OOMKilled`, `HostLost`
    /// (its host failed, expired or was deleted), `Timeout` (not running
    /// within `spawnTimeout`), `Stalled`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<RankReason>,
    /// Whose fault the failure was, as the rank's `cause` in status says:
    /// `Infrastructure` (its host lost, evicted, preempted or deleted from
    /// outside, a device Unhealthy, the agent gone), `User` (its own exit,
    /// a signal it raised, a traceback), `Unknown`. The obvious use:
    /// `{action: RestartWithoutCounting, causes: [Infrastructure]}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<crate::cause::FailureCause>,
    /// A regular expression (Rust `regex` syntax, unanchored, at most 1024
    /// bytes) over the rank's stderr (the tail status keeps, and its head),
    /// e.g. `NCCL error|CUDA error: an illegal memory access`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_PROGRESS_PATTERN))]
    pub stderr_pattern: Option<String>,
}

/// Action of an [`ExitRule`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ExitAction {
    /// Restart per the restart policy (the same as `Restart`; kept for
    /// manifests written before `Restart`).
    Retry,
    /// Restart per the restart policy, counted toward `maxRestarts`.
    Restart,
    /// Restart per the restart policy without counting toward
    /// `maxRestarts` (and without backoff).
    RestartWithoutCounting,
    /// Permanent: fail without retrying.
    Fail,
    /// Accept the rank's end: it is no failure and is not restarted.
    Ignore,
}

/// A reason a rank failed, for [`ExitRule::reasons`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RankReason {
    /// Killed by the kernel's OOM killer.
    OOMKilled,
    /// Its host failed, expired or was deleted (state `Lost`).
    HostLost,
    /// Not running within `spawnTimeout` (state `Timeout`).
    Timeout,
    /// No progress for `stallTimeout` (state `Stalled`).
    Stalled,
}

/// The failure rule that fired last: which, what it did and on what.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuleFired {
    /// The rule's `name`, or `rules[<index>]`.
    pub name: String,
    /// Its action.
    pub action: String,
    /// The rank (of the proc, or of the host for a World) it matched.
    pub rank: Rank,
    /// What failed, in words.
    pub reason: String,
    /// When it fired.
    pub time: Time,
}

/// Observed state of a ProcMesh.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProcMeshStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ProcMeshPhase>,
    /// The full extent, e.g. `replica=2,host=4,gpu=8`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extent: Option<String>,
    /// Procs running.
    #[serde(default)]
    pub running: Rank,
    /// Procs that exited 0.
    #[serde(default)]
    pub succeeded: Rank,
    /// Procs that failed (exit code, signal, timeout, lost host), the
    /// collateral ones included.
    #[serde(default)]
    pub failed: Rank,
    /// Of the failed procs, those that failed within the cascade of an
    /// earlier failure (their rank status says `causedBy`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub collateral: Rank,
    /// Per-rank proc state as runs of equal state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<Run<RankStatus>>,
    /// True when `ranks` was cut at its bound and covers a prefix only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ranks_truncated: bool,
    /// The first failure: the root cause, kept when later ranks fail too.
    /// The earliest failure as the agents observed it (their clocks,
    /// corrected), not the first report to arrive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<FirstFailure>,
    /// Actors that failed inside runtime-aware procs (`spec.runtimeAware`),
    /// the earliest first, at most [`MAX_ACTOR_FAILURES`]: one entry per
    /// rank and incarnation (its first actor failure). An actor failure
    /// does not fail the rank; its process keeps running.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actor_failures: Vec<ActorFailure>,
    /// The last failures and their recoveries, oldest first (at most
    /// 16, bounded in bytes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incidents: Vec<crate::incident::Incident>,
    /// Ready, Progressing, Degraded, Failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Restarts performed so far.
    #[serde(default)]
    pub restarts: u32,
    /// When the last restart happened (drives the backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restart_time: Option<Time>,
    /// Per-rank incarnation the operator asked for (bumped by each restart
    /// of the rank), as runs; empty while every rank is at 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incarnations: Vec<Run<Incarnation>>,
    /// When deletion started stopping the procs (drives `stopTimeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping_since: Option<Time>,
    /// When the current spawn started (drives `spawnTimeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawn_time: Option<Time>,
    /// When the mesh first spawned in this generation (restarts keep it;
    /// a suspended World resets it): `activeDeadlineSeconds` counts from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// The `restartPolicy.rules` entry that fired last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_fired: Option<RuleFired>,
}

/// Phase of a ProcMesh.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ProcMeshPhase {
    /// Waiting for its World (or the spec is invalid).
    Pending,
    /// Procs are being created.
    Spawning,
    /// Every proc is running.
    Running,
    /// Every proc exited 0.
    Succeeded,
    /// Failed beyond its restart policy.
    Failed,
    /// Procs are being stopped (deletion).
    Stopping,
}

impl ProcMeshPhase {
    /// The phase as written in status.
    pub fn as_str(self) -> &'static str {
        match self {
            ProcMeshPhase::Pending => "Pending",
            ProcMeshPhase::Spawning => "Spawning",
            ProcMeshPhase::Running => "Running",
            ProcMeshPhase::Succeeded => "Succeeded",
            ProcMeshPhase::Failed => "Failed",
            ProcMeshPhase::Stopping => "Stopping",
        }
    }
}

/// A rank's requested incarnation (in status runs).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub struct Incarnation {
    /// Restarts asked for this rank so far.
    pub incarnation: u32,
}

/// State of one proc (one run of procs) in status.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RankStatus {
    /// Proc state.
    pub state: ProcState,
    /// Exit code, for procs that exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Signal number, for Killed procs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why, when the agent or operator said so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Last bytes of stderr (bounded), for failed ranks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<String>,
    /// First bytes of stderr that the tail lost (bounded), for failed ranks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_head: Option<String>,
    /// For a collateral failure: the rank whose failure began the cascade
    /// (this rank failed within the cascade window after it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caused_by: Option<Rank>,
    /// For a failed rank: whose fault it was (`crate::cause`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<crate::cause::FailureCause>,
}

fn is_zero(n: &Rank) -> bool {
    *n == 0
}

/// State of one proc.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
pub enum ProcState {
    /// Not asked for yet.
    #[default]
    Pending,
    /// Spawned, not ready yet.
    Starting,
    /// Running.
    Running,
    /// Being stopped.
    Stopping,
    /// Ended because a stop was asked for (deletion, a failed mesh, a gang
    /// restart): not a failure.
    Stopped,
    /// Exited with code 0.
    Succeeded,
    /// Exited with a non-zero code, or the agent could not start it.
    Failed,
    /// Killed by a signal.
    Killed,
    /// Did not start within `spawnTimeout`.
    Timeout,
    /// Its host is gone (failed, evicted, deleted).
    Lost,
    /// Its host's agent is silent (the host `Expired`) and the World has
    /// not evicted it yet: the proc may still be running. No failure:
    /// nothing is restarted or counted unless the World evicts the host.
    Unreachable,
    /// Alive but without progress for `stallTimeout`, with
    /// `restartPolicy.onStall: Failure`.
    Stalled,
}

impl ProcState {
    /// Whether this state counts as a failure.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            ProcState::Failed
                | ProcState::Killed
                | ProcState::Timeout
                | ProcState::Lost
                | ProcState::Stalled
        )
    }
}

/// Most entries of `status.actorFailures`.
pub const MAX_ACTOR_FAILURES: usize = 16;

/// An actor that failed inside a runtime-aware proc.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActorFailure {
    /// Proc rank.
    pub rank: Rank,
    /// Host rank.
    pub host: Rank,
    /// The actor (`<proc>/<name>[<index>]` as the runtime prints it).
    pub actor: String,
    /// Why it failed (at most [`MAX_REASON`] bytes).
    pub reason: String,
    /// When the proc's agent learnt of it (the agent's clock).
    pub time: Time,
    /// The proc's incarnation (its restarts so far).
    pub incarnation: u32,
    /// How many actors of that proc incarnation failed so far.
    pub count: u32,
}

/// Most failed ranks that keep their stderr tail in status.
pub const MAX_STDERR_RANKS: usize = 16;
/// Most bytes of a reason kept in status.
pub const MAX_REASON: usize = 256;
/// Most bytes of `firstFailure.reason`.
pub const MAX_FIRST_FAILURE_REASON: usize = 1024;

/// The longest proc name an agent takes: a runtime proc name
/// (`hostmesh_runtime::id::check_name`, `[A-Za-z0-9._-]{1,128}`).
pub const MAX_PROC_NAME: usize = 128;
/// What a proc name adds to its ProcMesh's name besides the rank:
/// `<name>.<uid, 8>-<spec hash, 8>.<rank>` (the operator's
/// `procmesh::desired::mesh_id` and `hub::proc_name`).
pub const PROC_NAME_OVERHEAD: usize = 1 + 8 + 1 + 8 + 1;

/// The longest ProcMesh name whose proc names (largest rank
/// `largest_rank`) an agent takes: [`MAX_PROC_NAME`] less
/// [`PROC_NAME_OVERHEAD`] and the rank's digits.
pub fn max_name(largest_rank: Rank) -> usize {
    MAX_PROC_NAME - PROC_NAME_OVERHEAD - largest_rank.to_string().len()
}

/// Most bytes of one string of `spec.command`, `spec.args` and `spec.env`
/// (`NAME=value`): Linux's limit for one `execve` argument or variable
/// (`MAX_ARG_STRLEN`, 32 pages, with its terminating NUL).
pub const MAX_ARG_BYTES: usize = 128 * 1024 - 1;
/// Most bytes of `spec.command`, `spec.args` and `spec.env` together: well
/// within `execve`'s total (a quarter of the default 8 MiB stack), and
/// leaving the object room for its status under the API server's 1.5 MiB
/// object limit.
pub const MAX_COMMAND_BYTES: usize = 256 * 1024;

/// The marker [`bounded`] ends a cut text with.
pub const TRUNCATED: &str = "... [truncated]";

/// `s` cut to at most `max` bytes (on a character boundary), ending with
/// [`TRUNCATED`] when cut, so status shows that text is missing.
pub fn bounded(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return std::borrow::Cow::Borrowed(s);
    }
    let keep = head(s, max.saturating_sub(TRUNCATED.len()));
    std::borrow::Cow::Owned(format!("{keep}{}", &TRUNCATED[..TRUNCATED.len().min(max)]))
}

/// Truncates `s` to its first `max` bytes (on a character boundary).
pub fn head(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// Truncates `s` to its last `max` bytes (on a character boundary).
pub fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = s.len() - max;
    while !s.is_char_boundary(cut) {
        cut += 1;
    }
    s[cut..].to_string()
}

/// Encodes per-rank proc states (rank order) as bounded runs: stderr tails
/// cut to [`MAX_STDERR_TAIL`] bytes and heads to [`MAX_STDERR_HEAD`], kept
/// for the first
/// [`MAX_STDERR_RANKS`] failed ranks only, reasons cut to [`MAX_REASON`],
/// at most [`hostmesh_mesh::runs::MAX_RUNS`] runs. Returns the runs and whether they
/// were truncated.
pub fn rank_runs(values: impl IntoIterator<Item = RankStatus>) -> (Vec<Run<RankStatus>>, bool) {
    let mut with_stderr = 0usize;
    let bounded = values.into_iter().map(|mut v| {
        let head = v.stderr_head.take();
        if let Some(s) = v.stderr_tail.take()
            && with_stderr < MAX_STDERR_RANKS
        {
            with_stderr += 1;
            v.stderr_tail = Some(crate::procmesh::tail(&s, MAX_STDERR_TAIL));
            v.stderr_head = head.map(|h| crate::procmesh::head(&h, MAX_STDERR_HEAD).to_string());
        }
        if let Some(r) = v.reason.as_mut()
            && r.len() > MAX_REASON
        {
            *r = bounded(r, MAX_REASON).into_owned();
        }
        v
    });
    hostmesh_mesh::runs::encode_bounded(bounded, hostmesh_mesh::runs::MAX_RUNS)
}

/// The root cause of a ProcMesh failure.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FirstFailure {
    /// Proc rank.
    pub rank: Rank,
    /// Host rank (pod `<world>-host-<host>`).
    pub host: Rank,
    /// When it failed: the agent's clock corrected by its estimated offset
    /// (for a lost host, when its agent was last heard; for a spawn timeout,
    /// when the operator noticed), to
    /// the microsecond.
    pub time: MicroTime,
    /// State it failed with.
    pub state: ProcState,
    /// Human-readable reason (exit code, signal, timeout, ...).
    pub reason: String,
    /// Exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Signal, when killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Last bytes of its stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<String>,
    /// First bytes of its stderr that the tail lost (at most
    /// [`MAX_STDERR_HEAD`]): an exception is often printed first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_head: Option<String>,
    /// Killed by the kernel's OOM killer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oom_killed: bool,
    /// The command line that ran (quoted as a shell would take it, at most
    /// [`MAX_COMMAND`] bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Whose fault it was: `Infrastructure`, `User` or `Unknown`
    /// (`crate::cause`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<crate::cause::FailureCause>,
    /// The fact `cause` was read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<crate::cause::Evidence>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_bytes_on_a_char_boundary() {
        assert_eq!(tail("héllo", 4), "llo");
        assert_eq!(tail("abc", 4), "abc");
        assert_eq!(head("hél", 2), "h");
        assert_eq!(head("abc", 4), "abc");
    }

    fn running() -> RankStatus {
        RankStatus {
            state: ProcState::Running,
            ..Default::default()
        }
    }

    #[test]
    fn ten_thousand_ranks_one_failure_is_a_handful_of_runs() {
        let mut v = vec![running(); 10_000];
        v[7777] = RankStatus {
            state: ProcState::Failed,
            exit_code: Some(3),
            reason: Some("exit code 3".into()),
            stderr_tail: Some("x".repeat(100_000)),
            ..Default::default()
        };
        let (runs, truncated) = rank_runs(v);
        assert!(!truncated);
        assert_eq!(runs.len(), 3);
        assert_eq!(
            runs[1].value.stderr_tail.as_ref().unwrap().len(),
            MAX_STDERR_TAIL
        );
        let bytes = serde_json::to_vec(&runs).unwrap().len();
        assert!(bytes < 2 * 1024, "{bytes} bytes");
    }

    #[test]
    fn a_cascade_over_ten_thousand_ranks_stays_compact() {
        // Rank 5 is killed; every other rank exits 1 in its wake, each with
        // its own stderr.
        let v = (0..10_000u64).map(|r| {
            if r == 5 {
                RankStatus {
                    state: ProcState::Killed,
                    signal: Some(9),
                    stderr_head: Some("Traceback".repeat(1000)),
                    stderr_tail: Some("e".repeat(10_000)),
                    ..Default::default()
                }
            } else {
                RankStatus {
                    state: ProcState::Failed,
                    exit_code: Some(1),
                    stderr_head: Some(format!("rank {r} head")),
                    stderr_tail: Some(format!("rank {r}: connection reset")),
                    caused_by: Some(5),
                    ..Default::default()
                }
            }
        });
        let (runs, truncated) = rank_runs(v);
        assert!(!truncated);
        // 16 ranks keep their stderr (one run each), then one run for the
        // rest of the collateral ranks.
        assert_eq!(runs.len(), MAX_STDERR_RANKS + 1);
        assert_eq!(
            runs[5].value.stderr_head.as_ref().unwrap().len(),
            MAX_STDERR_HEAD
        );
        assert_eq!(runs.last().unwrap().value.caused_by, Some(5));
        let bytes = serde_json::to_vec(&runs).unwrap().len();
        assert!(bytes < 32 * 1024, "{bytes} bytes");
    }

    #[test]
    fn worst_case_status_stays_far_below_the_object_limit() {
        // Every rank fails differently, with long stderr and reasons.
        let v = (0..10_000).map(|i| RankStatus {
            state: ProcState::Failed,
            exit_code: Some(i),
            signal: None,
            reason: Some("r".repeat(10_000)),
            stderr_tail: Some("e".repeat(10_000)),
            stderr_head: Some("h".repeat(10_000)),
            caused_by: Some(3),
            cause: Some(crate::cause::FailureCause::User),
        });
        let (runs, truncated) = rank_runs(v);
        assert!(truncated);
        assert_eq!(runs.len(), hostmesh_mesh::runs::MAX_RUNS);
        let incident = |i: Rank| crate::incident::Incident {
            failed_at: MicroTime(k8s_openapi::jiff::Timestamp::now()),
            detected_at: MicroTime(k8s_openapi::jiff::Timestamp::now()),
            decided_at: None,
            pods_ready_at: None,
            procs_running_at: None,
            action: None,
            rank: i,
            root_cause: "c".repeat(100_000),
            collateral: i,
            cause: Some(crate::cause::FailureCause::Infrastructure),
            evidence: Some(crate::cause::Evidence {
                reason: "DeviceUnhealthy".into(),
                message: "m".repeat(100_000),
            }),
        };
        let mut incidents = Vec::new();
        for i in 0..100 {
            crate::incident::push(&mut incidents, incident(i));
        }
        let status = ProcMeshStatus {
            ranks: runs,
            ranks_truncated: truncated,
            incidents,
            first_failure: Some(FirstFailure {
                rank: 1,
                host: 1,
                time: MicroTime(k8s_openapi::jiff::Timestamp::now()),
                state: ProcState::Killed,
                reason: "r".repeat(MAX_REASON),
                exit_code: None,
                signal: Some(9),
                stderr_tail: Some("e".repeat(MAX_STDERR_TAIL)),
                stderr_head: Some("h".repeat(MAX_STDERR_HEAD)),
                oom_killed: true,
                command: Some("c".repeat(MAX_COMMAND)),
                cause: Some(crate::cause::FailureCause::Infrastructure),
                evidence: Some(crate::cause::Evidence {
                    reason: "DeviceUnhealthy".into(),
                    message: "m".repeat(crate::cause::MAX_EVIDENCE),
                }),
            }),
            ..Default::default()
        };
        let bytes = serde_json::to_vec(&status).unwrap().len();
        // etcd's default request limit is 1.5 MiB; stay well under half.
        assert!(bytes < 512 * 1024, "{bytes} bytes");
    }
}
