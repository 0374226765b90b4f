//! The `World` resource: a mesh of host pods shaped by named dimensions, each
//! running the hostmesh agent.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::DURATION_PATTERN;
use hostmesh_mesh::shape::{Dim, MAX_DIMS, Shape};
use hostmesh_mesh::{Rank, Run};

/// Default agent port.
pub const DEFAULT_PORT: u16 = 26602;
/// Default `healthTimeout`.
pub const DEFAULT_HEALTH_TIMEOUT: &str = "10s";
/// Default `evictionTimeout`.
pub const DEFAULT_EVICTION_TIMEOUT: &str = "60s";
/// Largest number of hosts in one World.
pub const MAX_HOSTS: Rank = 10_000;

/// Desired state of a World.
// kube's printcolumn(...) lists trip clippy's duplicated-attribute check.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "hostmesh.dev",
    version = "v1alpha1",
    kind = "World",
    namespaced,
    status = "WorldStatus",
    shortname = "world",
    category = "hostmesh",
    doc = "A mesh of host pods shaped by named dimensions, each running the hostmesh agent.",
    printcolumn(
        name = "READY",
        type_ = "string",
        json_path = ".status.ready",
        description = "ready/desired hosts"
    ),
    printcolumn(name = "PHASE", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "RESTARTS", type_ = "integer", json_path = ".status.restarts"),
    printcolumn(
        name = "AGE",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct WorldSpec {
    /// Ordered dimensions of the mesh, e.g. `[{name: replica, size: 2},
    /// {name: host, size: 4}]`. Give either `shape` or `hosts`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_DIMS))]
    pub shape: Vec<Dim>,
    /// Shorthand for a one-dimensional shape `[{name: host, size: hosts}]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_HOSTS))]
    pub hosts: Option<u32>,
    /// Pod template for host pods (image, resources, node selectors,
    /// tolerations). The operator adds the agent; user labels and annotations
    /// are kept.
    #[schemars(schema_with = "crate::preserve_unknown_object")]
    pub template: PodTemplateSpec,
    /// Agent (runtime protocol) port on every host pod.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// What a failed host does.
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    /// No agent heartbeat for this long: the host is Expired and the World
    /// Degraded. Default `10s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub health_timeout: Option<String>,
    /// Degraded for this long: the failure policy acts (or the World fails).
    /// Default `60s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub eviction_timeout: Option<String>,
    /// How the agent gets into the host pods.
    #[serde(default)]
    pub agent: AgentSpec,
    /// Suspend the World, with Job semantics: the host pods are deleted
    /// (their agents stop the procs gracefully first), the status is kept
    /// and the `Suspended` condition is True; ProcMeshes on it wait.
    /// Setting it back to false recreates the hosts (a new `status.attempt`)
    /// and the ProcMeshes spawn their procs again. Restarts are not counted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
    /// The controller that runs this World. The hostmesh operator runs
    /// Worlds with the default, `hostmesh.dev/operator`, and leaves any
    /// other value alone (e.g. `kueue.x-k8s.io/multikueue`, whose MultiKueue
    /// dispatches the World to a worker cluster and copies its status back);
    /// for such a World it maintains only the Kueue Workload. Immutable: it
    /// is defaulted at creation and a change is refused.
    #[serde(default = "default_managed_by")]
    #[schemars(schema_with = "managed_by_schema")]
    pub managed_by: String,
    /// How the host pods are scheduled (docs/scheduling.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<SchedulingSpec>,
    /// Run a Monarch worker on every host, supervised by the agent and
    /// labelled as Monarch's `KubernetesJob` expects (docs/monarch.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monarch: Option<crate::monarch::MonarchSpec>,
    /// Size of a memory-backed `emptyDir` mounted at `/dev/shm` in the host
    /// container (NCCL and data loaders need more than a runtime's default
    /// 64 MiB), e.g. `16Gi`. It counts toward the pod's memory. Unset: the
    /// runtime's default `/dev/shm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = crate::shm::QUANTITY_PATTERN))]
    pub shared_memory_size: Option<String>,
    /// When the World is done. `Never` (default): a long-lived host mesh
    /// that runs until it is deleted (Monarch's reserve-once model).
    /// `ProcMeshesFinished`: once the World has at least one ProcMesh and
    /// every ProcMesh on it has finished, the World finishes: `Succeeded`
    /// (condition `Complete=True`) when all succeeded, else `Failed`; its
    /// host pods are deleted and a Kueue Workload is `Finished`.
    #[serde(default, skip_serializing_if = "FinishWhen::is_never")]
    pub finish_when: FinishWhen,
    /// Delete the World (and its ProcMeshes) this many seconds after it
    /// finished (`Succeeded`, or `Failed`), as a Job's TTL. Unset: kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
    /// Keep the host pods of a `Failed` World for inspection (logs, exec)
    /// instead of deleting them. Default false: a finished World frees its
    /// hosts whichever way it ended.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_failed_hosts: bool,
    /// Fail the World (reason `ReadyDeadlineExceeded`, naming the hosts
    /// that were not Ready and why) when it has not been Ready this many
    /// seconds after it started: its creation, or the admission or resume
    /// that ended a suspension (`status.startTime`). Once Ready, it no
    /// longer applies to the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_DEADLINE_SECONDS))]
    pub ready_deadline_seconds: Option<i64>,
    /// Fail the World (reason `DeadlineExceeded`) once it has run this many
    /// seconds since `status.startTime`, as a Job's `activeDeadlineSeconds`:
    /// the failure frees its hosts, whose agents stop the procs gracefully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_DEADLINE_SECONDS))]
    pub active_deadline_seconds: Option<i64>,
    /// What a change of the host pods' template (or anything else that
    /// changes `hostmesh.dev/template-hash`) does to running hosts.
    #[serde(default, skip_serializing_if = "UpdatePolicy::is_default")]
    pub update_policy: UpdatePolicy,
}

/// How a World's running hosts take a changed template
/// ([`WorldSpec::update_policy`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdatePolicy {
    /// `Recreate` (default): every stale host pod is recreated at once.
    /// `OnNextRestart`: stale hosts keep running and take the new template
    /// only when they are next recreated (a failure, a gang restart);
    /// `status.staleHosts` says how many are left. `RollingUpdate`: stale
    /// hosts are recreated a few at a time, at most `maxUnavailable` hosts
    /// down at once (for long-lived Worlds).
    #[serde(default, rename = "type")]
    pub type_: UpdateType,
    /// With `RollingUpdate`: how many hosts may be unavailable (not Ready,
    /// or being recreated) at once: a number, or a percentage of the hosts
    /// (rounded down); at least 1. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
}

impl UpdatePolicy {
    fn is_default(&self) -> bool {
        *self == UpdatePolicy::default()
    }
}

/// The kind of [`UpdatePolicy`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum UpdateType {
    /// Recreate every stale host pod at once.
    #[default]
    Recreate,
    /// Apply the change only when a host is next recreated.
    OnNextRestart,
    /// Recreate stale hosts at most `maxUnavailable` at a time.
    RollingUpdate,
}

/// The longest deadline in seconds (366 days, the longest duration).
pub const MAX_DEADLINE_SECONDS: i64 = 366 * 24 * 3600;

/// When a World finishes ([`WorldSpec::finish_when`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum FinishWhen {
    /// Never: the World runs until it is deleted (or fails).
    #[default]
    Never,
    /// When every ProcMesh on it has finished (there is at least one).
    ProcMeshesFinished,
}

impl FinishWhen {
    fn is_never(&self) -> bool {
        *self == FinishWhen::Never
    }
}

/// Scheduling of the host pods.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingSpec {
    /// Gang scheduling: every host pod is bound, or none is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<GangSpec>,
    /// Topology placement: the hosts that share a coordinate of a dimension
    /// (and of every dimension before it) go to one topology domain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub topology: Vec<TopologySpec>,
}

/// Puts each group of hosts (all hosts with equal coordinates up to and
/// including `dimension`; for `replica=2,host=4` and `replica`, the 4
/// hosts of each replica) on nodes that share the value of node label
/// `key`, as pod affinity (and Kueue topology-aware-scheduling requests
/// when the World is queued).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologySpec {
    /// A dimension of `shape` (`host` for the `hosts` shorthand).
    #[schemars(length(min = 1, max = 57))]
    pub dimension: String,
    /// Node label whose value is the domain, e.g.
    /// `topology.kubernetes.io/rack` or an NVLink-domain label.
    #[schemars(length(min = 1, max = 316))]
    pub key: String,
    /// `Required` (default): the scheduler must co-locate the group;
    /// `Preferred`: it tries to.
    #[serde(default)]
    pub mode: TopologyMode,
    /// One group per domain: no host of another group (of any World that
    /// groups by the same dimension name) shares the domain, as JobSet's
    /// exclusive placement.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exclusive: bool,
}

/// Whether a [`TopologySpec`] binds the scheduler.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum TopologyMode {
    /// `requiredDuringSchedulingIgnoredDuringExecution`.
    #[default]
    Required,
    /// `preferredDuringSchedulingIgnoredDuringExecution` (weight 100).
    Preferred,
}

/// A gang scheduler for the host pods: the operator creates the provider's
/// group object (owned by the World, `minMember` = hosts) and gives every
/// host pod the scheduler name, labels and annotations the provider reads.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GangSpec {
    /// `SchedulerPlugins` (coscheduling `PodGroup`,
    /// `scheduling.x-k8s.io/v1alpha1`), `Volcano` (`PodGroup`,
    /// `scheduling.volcano.sh/v1beta1`) or `Kubernetes` (the Workload API's
    /// `PodGroup`, `scheduling.k8s.io/v1beta1`, Kubernetes 1.37).
    pub provider: GangProvider,
    /// The scheduler that places the pods. Default:
    /// `scheduler-plugins-scheduler`, `volcano`, or the cluster's default
    /// scheduler for `Kubernetes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub scheduler_name: Option<String>,
    /// `SchedulerPlugins`: seconds a gang may wait for room before its pods
    /// are rejected and retried (`scheduleTimeoutSeconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub schedule_timeout_seconds: Option<i32>,
    /// `Volcano`: the Volcano queue of the PodGroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub queue: Option<String>,
}

/// A gang scheduling provider.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum GangProvider {
    /// kubernetes-sigs/scheduler-plugins coscheduling.
    SchedulerPlugins,
    /// Volcano.
    Volcano,
    /// Kubernetes' own gang scheduling (Workload API `PodGroup`).
    Kubernetes,
}

/// `spec.managedBy` of Worlds the hostmesh operator runs.
pub const MANAGED_BY_HOSTMESH: &str = "hostmesh.dev/operator";

/// Label naming the Kueue LocalQueue a World is queued in (Kueue's own
/// label, as on Jobs).
pub const LABEL_QUEUE_NAME: &str = "kueue.x-k8s.io/queue-name";

/// Label naming the Kueue `WorkloadPriorityClass` of a World (Kueue's own
/// label); without it the host pods' `priorityClassName` is used.
pub const LABEL_PRIORITY_CLASS: &str = "kueue.x-k8s.io/priority-class";

fn default_managed_by() -> String {
    MANAGED_BY_HOSTMESH.to_string()
}

/// `managedBy` is a string (a domain-prefixed path, at most 63 characters as
/// for Jobs) that is defaulted at creation and may never change: the CEL
/// transition rule `self == oldSelf` refuses an update that changes it, and
/// the default makes it present on every stored World, so the rule always
/// applies (it is only evaluated when the old object has the field).
fn managed_by_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "default": MANAGED_BY_HOSTMESH,
        "maxLength": 63,
        "x-kubernetes-validations": [{
            "rule": "self == oldSelf",
            "message": "spec.managedBy is immutable",
        }],
    })
}

fn default_port() -> u16 {
    DEFAULT_PORT
}

impl WorldSpec {
    /// Whether the hostmesh operator runs this World (`spec.managedBy`).
    pub fn managed_by_hostmesh(&self) -> bool {
        self.managed_by == MANAGED_BY_HOSTMESH
    }

    /// The World's shape (`shape`, or `host=<hosts>` for the shorthand).
    pub fn full_shape(&self) -> Shape {
        match (self.shape.is_empty(), self.hosts) {
            (true, Some(n)) => Shape::new(vec![Dim::new("host", n)]),
            _ => Shape::new(self.shape.clone()),
        }
    }
}

/// How the agent binary reaches host pods.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSpec {
    /// The host image already contains `hostmesh` on its PATH; no init
    /// container is added.
    #[serde(default)]
    pub image_has_agent: bool,
    /// How often each agent sends the operator a heartbeat. Default `1s`:
    /// about 2,000 heartbeats a second are the operator's budget, so a
    /// World of more than 2,000 hosts sets about one second per 2,000
    /// hosts (`5s` at 10,000) and a `healthTimeout` of at least twice it.
    /// A proc's exit is pushed at once whatever the interval; only a host
    /// that goes silent is noticed later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub heartbeat_interval: Option<String>,
}

/// What the operator does when a host fails.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailurePolicy {
    /// `ReplaceHost` recreates only the failed host's pod; `RecreateGang`
    /// recreates every host pod of the World.
    #[serde(default)]
    pub action: FailureAction,
    /// Restarts allowed before the World is Failed.
    #[serde(default = "default_max_restarts")]
    #[schemars(range(max = 1000))]
    pub max_restarts: u32,
    /// Delay before the first restart; doubles each restart. Default `1s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub backoff: Option<String>,
    /// Upper bound of the restart delay. Default `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub max_backoff: Option<String>,
    /// With `ReplaceHost`: a failed host recreates the slice of the World
    /// it belongs to along this dimension (every host that shares its
    /// coordinates up to and including it: for `[replica: 4, host: 8]` and
    /// `replica`, the 8 hosts of its replica), counted as one restart. The
    /// last dimension is one host, the first a whole first-level group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub scope: Option<String>,
    /// Rules, first match wins, deciding what a host's failure does. With
    /// no match a failed or expired host is restarted (counted); a host
    /// still starting, or one whose pod was deleted, is waited for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::procmesh::MAX_RULES))]
    pub rules: Vec<HostRule>,
}

/// A rule on a host's failure. It matches when every kind of condition it
/// gives holds: the host container's exit (an exit code in `exitCodes` or a
/// signal in `signals`), one of its `reasons`, and its `stderrPattern`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostRule {
    /// Names the rule in status (`ruleFired`) and Events; default
    /// `rules[<index>]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub name: Option<String>,
    /// `Restart` (per `action`, counted toward `maxRestarts`),
    /// `RestartWithoutCounting` (infrastructure faults: a lost node must not
    /// burn the restart budget; no backoff), `FailWorld`, `Ignore` (leave
    /// the host as it is).
    pub action: HostAction,
    /// Exit codes of the host container this rule matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exit_codes: Vec<i32>,
    /// Signals that ended the host container this rule matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signals: Vec<i32>,
    /// Pod-level reasons: `Evicted`, `OOMKilled`, `DeadlineExceeded`,
    /// `Preempted`, `NodeLost`, `Unschedulable` (for `unschedulableFor`),
    /// `Deleted` (someone else deleted the pod), `NoHeartbeat` (the agent
    /// went silent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<HostReason>,
    /// Whose fault the host's failure was, as its `cause` in status says:
    /// `Infrastructure` (evicted, preempted, deleted from outside, its node
    /// lost, a device Unhealthy, the agent gone), `User` (the host
    /// container's own exit), `Unknown`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<crate::cause::FailureCause>,
    /// With `Unschedulable`: how long a host pod stays unschedulable
    /// before the rule matches. Default `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub unschedulable_for: Option<String>,
    /// A regular expression (Rust `regex` syntax, unanchored, at most 1024
    /// bytes) over the end of the host container's log the kubelet kept (or
    /// a Monarch worker's stderr).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::procmesh::MAX_PROGRESS_PATTERN))]
    pub stderr_pattern: Option<String>,
}

/// Action of a [`HostRule`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum HostAction {
    /// Restart per `failurePolicy.action`, counted.
    Restart,
    /// Restart per `failurePolicy.action`, not counted, no backoff.
    RestartWithoutCounting,
    /// The World fails.
    FailWorld,
    /// Leave the host as it is: no restart, no failure of the World.
    Ignore,
}

/// A pod-level reason a host failed, for [`HostRule::reasons`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum HostReason {
    /// The kubelet evicted the pod (node pressure).
    Evicted,
    /// The host container was OOM-killed.
    OOMKilled,
    /// The pod's `activeDeadlineSeconds` passed.
    DeadlineExceeded,
    /// The scheduler preempted the pod (`DisruptionTarget`,
    /// `PreemptionByScheduler`).
    Preempted,
    /// The pod's node is unreachable (Ready `Unknown`, `NodeLost`, or a
    /// taint eviction).
    NodeLost,
    /// The pod could not be scheduled for `unschedulableFor`.
    Unschedulable,
    /// Someone other than the operator deleted the pod.
    Deleted,
    /// No heartbeat from the agent for `healthTimeout` (+
    /// `evictionTimeout` before it is acted on).
    NoHeartbeat,
}

fn default_max_restarts() -> u32 {
    3
}

impl Default for FailurePolicy {
    fn default() -> Self {
        FailurePolicy {
            action: FailureAction::default(),
            max_restarts: default_max_restarts(),
            backoff: None,
            max_backoff: None,
            scope: None,
            rules: Vec::new(),
        }
    }
}

/// The action of a [`FailurePolicy`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum FailureAction {
    /// Recreate the failed host only.
    #[default]
    ReplaceHost,
    /// Recreate every host of the World.
    RecreateGang,
}

/// Observed state of a World.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorldStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<WorldPhase>,
    /// `ready/desired` for display, e.g. `3/4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    /// Hosts whose pod is Ready and whose agent heartbeats.
    #[serde(default)]
    pub ready_hosts: Rank,
    /// Hosts the World asks for.
    #[serde(default)]
    pub desired_hosts: Rank,
    /// Per-rank host state as runs of equal state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<Run<HostStatus>>,
    /// True when `hosts` was cut at its bound and covers a prefix only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hosts_truncated: bool,
    /// Ready, Progressing, Degraded, Failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Host restarts performed so far (a gang recreation counts once).
    #[serde(default)]
    pub restarts: u32,
    /// When the last restart happened (drives the backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restart_time: Option<Time>,
    /// Since when the World has been Degraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded_since: Option<Time>,
    /// How many times the whole World was brought up again: each resume
    /// after `suspend` and each `RecreateGang` restart adds one. Procs see
    /// it as `HOSTMESH_ATTEMPT` (0 on the first run).
    #[serde(default)]
    pub attempt: u32,
    /// The first host failure since the World last became Ready (a failed
    /// host, or one whose agent went silent past `healthTimeout`): which
    /// host, when, why and, for a Monarch worker, how it exited. Kept when
    /// more hosts fail after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<HostFailure>,
    /// When the World finished (phase `Succeeded` or `Failed`); drives
    /// `ttlSecondsAfterFinished`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// When the current run started: the World's first pass, or the
    /// admission or resume that ended a suspension. The deadlines count
    /// from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When every host was first Ready since `startTime`
    /// (`readyDeadlineSeconds` no longer applies after it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_time: Option<Time>,
    /// The `failurePolicy.rules` entry that fired last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_fired: Option<crate::procmesh::RuleFired>,
    /// Host pods built from an older template than the spec's (with
    /// `updatePolicy` `OnNextRestart` or `RollingUpdate`, until they are
    /// recreated).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stale_hosts: Rank,
    /// What Monarch clients of a `spec.monarch.transport: Tls` World
    /// mount: the Secret with their certificate and the World's CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monarch: Option<crate::monarch::MonarchStatus>,
}

fn is_zero(n: &Rank) -> bool {
    *n == 0
}

/// A failed host: the root cause a user reads without logs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostFailure {
    /// Host rank.
    pub rank: Rank,
    /// The host pod.
    pub pod: String,
    /// When it was observed.
    pub time: Time,
    /// Human-readable reason (the pod's reason, a Monarch worker's exit
    /// code or signal, ...).
    pub reason: String,
    /// Exit code, when a process exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Signal, when a process was killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Last bytes of the failed process's stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<String>,
    /// The command line that ran.
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

/// Phase of a World.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum WorldPhase {
    /// Accepted, nothing created yet (or the spec is invalid).
    Pending,
    /// Host pods are being created or are starting.
    Creating,
    /// Every host is ready.
    Running,
    /// Some host failed or expired; the failure policy is acting.
    Degraded,
    /// Beyond the restart limit, a deadline passed, a critical ProcMesh
    /// failed, or (`finishWhen: ProcMeshesFinished`) a ProcMesh failed.
    Failed,
    /// `finishWhen: ProcMeshesFinished` and every ProcMesh succeeded: the
    /// host pods are deleted.
    Succeeded,
    /// `spec.suspend` is true: no host pods, status kept.
    Suspended,
    /// Being deleted.
    Terminating,
}

impl WorldPhase {
    /// The phase as written in status.
    pub fn as_str(self) -> &'static str {
        match self {
            WorldPhase::Pending => "Pending",
            WorldPhase::Creating => "Creating",
            WorldPhase::Running => "Running",
            WorldPhase::Degraded => "Degraded",
            WorldPhase::Failed => "Failed",
            WorldPhase::Succeeded => "Succeeded",
            WorldPhase::Suspended => "Suspended",
            WorldPhase::Terminating => "Terminating",
        }
    }
}

/// State of one host (one run of hosts) in status.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostStatus {
    /// Host state.
    pub state: HostState,
    /// Pod-level reason when there is one (Unschedulable, ImagePullBackOff,
    /// OOMKilled, Evicted, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For a host that failed or is gone, or one whose failures would be
    /// the infrastructure's (a device reported Unhealthy): whose fault
    /// (`crate::cause`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<crate::cause::FailureCause>,
    /// The fact `cause` was read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<crate::cause::Evidence>,
}

impl HostStatus {
    /// A host in `state`, for `reason`, with no cause attributed.
    pub fn new(state: HostState, reason: Option<String>) -> Self {
        HostStatus {
            state,
            reason,
            cause: None,
            evidence: None,
        }
    }
}

/// State of one host.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum HostState {
    /// No pod yet.
    Pending,
    /// Pod exists and is starting (scheduling, pulling, agent not ready).
    Starting,
    /// Pod Ready and agent heartbeating.
    Ready,
    /// Pod was Ready but its readiness probe now fails.
    NotReady,
    /// No agent heartbeat for `healthTimeout`.
    Expired,
    /// The pod failed (container exited, evicted, OOM-killed, deleted).
    Failed,
    /// The pod is being deleted.
    Terminating,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quickstart_yaml_parses_with_defaults() {
        let w: WorldSpec = serde_saphyr::from_str(
            "shape: [{name: replica, size: 2}, {name: host, size: 2}]\n\
             template:\n  spec:\n    containers:\n    - name: host\n      image: busybox\n",
        )
        .unwrap();
        assert_eq!(w.port, DEFAULT_PORT);
        assert_eq!(w.failure_policy.max_restarts, 3);
        assert_eq!(w.failure_policy.action, FailureAction::ReplaceHost);
        assert_eq!(w.full_shape().to_string(), "replica=2,host=2");
        let short: WorldSpec =
            serde_saphyr::from_str("hosts: 3\ntemplate: {spec: {containers: []}}\n").unwrap();
        assert_eq!(short.full_shape().to_string(), "host=3");
    }
}
