//! The World's decisions as a pure function: from the World, its pods and
//! the hub's liveness view, which pods to create or delete, which Events to
//! emit and the whole new status.
//!
//! Invariants:
//! 1. A host that is still starting (unschedulable, pulling its image) is
//!    reported, never restarted.
//! 2. A failed host is restarted per `failurePolicy` (one host, the slice
//!    of its `scope` dimension, or the whole gang) after an exponential
//!    backoff, one restart per decision however many hosts it recreates; beyond `maxRestarts` the World is
//!    Failed with the reason, and Failed is kept until the spec changes.
//! 3. An Expired host is acted on only after it has been Expired for
//!    `evictionTimeout` (so a host is replaced `healthTimeout +
//!    evictionTimeout` after its last heartbeat), its pod deleted with a
//!    1 s grace period ([`Plan::quick`]); at once when its agent is known
//!    to have fenced itself (reason `AgentFenced: ...`). A host whose pod has been
//!    Ready for `healthTimeout` while its agent never heartbeated (the
//!    operator cannot reach it: a refused handshake after lost credentials,
//!    an unreachable address) is Expired too, with the connection's error
//!    as its reason, never an endless `Starting`. Both clocks start no
//!    earlier than this operator's first dial of the host: a new leader
//!    keeps a Ready host Ready until its agent is heard or `healthTimeout`
//!    has passed, never Degraded or Expired from the pod's age.
//! 4. Pods whose template hash differs from the desired one are recreated
//!    (template changes roll) per `updatePolicy`: all at once (`Recreate`),
//!    at most `maxUnavailable` hosts down at a time (`RollingUpdate`), or
//!    only when next recreated anyway (`OnNextRestart`); those left are
//!    `status.staleHosts`. Pods are otherwise never patched.
//! 5. No pod is created for a rank whose previous pod is still terminating
//!    (one stuck terminating is force-deleted once its agent must have
//!    fenced: `fencing.rs`).
//! 6. Suspending (`spec.suspend`) first writes the Suspended phase, and only
//!    on the next pass deletes the host pods, so ProcMeshes see the World
//!    suspended before their procs go and do not count them as failures.
//!    Suspend and resume keep `restarts`; a resume, like a `RecreateGang`
//!    restart, is a new `attempt`.
//! 7. A [`Hold`] (Kueue has not admitted the World, or evicted it) takes
//!    the same path as `spec.suspend`, with its own reason and message, and
//!    is never a failure. The `Ready` condition is first written by a pass
//!    that runs the World, so a World held since its creation has none, and
//!    its first start (its first admission) is attempt 0, not a resume.
//! 8. A host pod mounting another agent token than the Secret's (see its
//!    `hostmesh.dev/secret-hash`) is replaced, not counted as a restart,
//!    unless that token was rotated in place (its agent took the new one
//!    over the operator's link: `secret.rs` invariant 5).
//! 9. A finished World (phase `Succeeded`, or `Failed` in this generation)
//!    stays finished: nothing is created, suspends and Kueue holds are
//!    ignored, and its host pods are deleted (a `Failed` one keeps them
//!    with `keepFailedHosts`). With `finishWhen: ProcMeshesFinished` it
//!    finishes once it has ProcMeshes and all of them ended
//!    ([`finish`]); `ttlSecondsAfterFinished` after `finishedAt` the
//!    World itself is deleted ([`Plan::delete_world`]).
//! 10. A run starts (`startTime`) at the World's first pass that is not
//!     suspended, and again after each suspension (resume, admission) and
//!     after a failure the spec cleared; `activeDeadlineSeconds` after it
//!     the World fails (`DeadlineExceeded`), as it does after
//!     `readyDeadlineSeconds` when it was not Ready in time
//!     (`ReadyDeadlineExceeded`, naming the hosts that were not).

use hostmesh_crds::Rank;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hostmesh_crds::conditions::{self, DEGRADED, FAILED, PROGRESSING, READY, SUSPENDED};
use hostmesh_crds::validate::WorldTimings;
use hostmesh_crds::world::{
    FailureAction, HostAction, HostState, HostStatus, UpdatePolicy, UpdateType, WorldPhase,
    WorldStatus,
};
use hostmesh_crds::{World, runs};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::desired::ANNOTATION_TEMPLATE_HASH;
use super::observe::observe_pod;
use crate::controllers::shared::{PlannedEvent, Severity, backoff_delay, event};
use crate::hub::{Liveness, fence};
use hostmesh_agent::protocol::ProcReport;

/// Everything the plan is computed from.
pub struct PlanInput<'a> {
    /// The World, with its current status.
    pub world: &'a World,
    /// Parsed timings of its spec.
    pub timings: WorldTimings,
    /// Its pods by host rank.
    pub pods: &'a BTreeMap<Rank, Arc<Pod>>,
    /// Pods whose rank label is outside the shape (to delete).
    pub extra_pods: Vec<String>,
    /// The hub's view of each rank's agent.
    pub liveness: &'a dyn Fn(Rank) -> Liveness,
    /// When each Expired rank expired.
    pub expired_since: &'a dyn Fn(Rank) -> Option<Timestamp>,
    /// Why the operator's last connection to each rank's agent failed, if
    /// no heartbeat came since.
    pub link_error: &'a dyn Fn(Rank) -> Option<String>,
    /// Since when this operator has been dialing each rank's agent (in its
    /// current pod); `None` before it has.
    pub watching_since: &'a dyn Fn(Rank) -> Option<Timestamp>,
    /// Hash of the agent token the pods must mount
    /// ([`super::desired::secret_hash`]).
    pub secret_hash: &'a str,
    /// Hashes of earlier tokens that were rotated in place
    /// (`secret.rs` invariant 5): a pod made with one holds the current
    /// token since its agent took the `Rekey`, and is not replaced for it.
    pub rotated_hashes: &'a [String],
    /// Why the token changed, when the operator replaced a lost one.
    pub credentials_note: Option<String>,
    /// The desired template hash.
    pub hash: &'a str,
    /// Set when a critical ProcMesh of this World failed.
    pub critical_failure: Option<String>,
    /// The wall-clock time the plan is computed at: eviction and backoff
    /// deadlines are compared with it.
    pub now: Timestamp,
    /// Set when something outside the spec (Kueue) holds the World
    /// suspended (invariant 7).
    pub hold: Option<Hold>,
    /// Who let the World run (`admitted by ClusterQueue ...`), said in the
    /// `Suspended=False` condition when it leaves a hold.
    pub admitted: Option<String>,
    /// Each rank's Monarch worker as its agent last reported it (a World
    /// with `spec.monarch`; see [`super::worker`]).
    pub monarch_worker: &'a dyn Fn(Rank) -> Option<ProcReport>,
    /// The ProcMeshes on the World (`finishWhen`, invariant 9).
    pub meshes: &'a Meshes,
}

/// The ProcMeshes on a World, as `finishWhen: ProcMeshesFinished` reads
/// them (those being deleted left out).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meshes {
    /// How many there are.
    pub total: usize,
    /// The names of those that succeeded.
    pub succeeded: Vec<String>,
    /// Those that failed, with the message of their `Failed` condition.
    pub failed: Vec<(String, String)>,
    /// When the oldest of them was made: the issuer lineage of a rotated
    /// token is kept while one from before the rotation exists
    /// (`secret.rs` invariant 6).
    pub oldest: Option<Timestamp>,
}

/// Why the World is held suspended though `spec.suspend` is false.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// Reason of the `Suspended` condition (`AwaitingAdmission`,
    /// `KueueNotInstalled`, Kueue's eviction reason, ...).
    pub reason: String,
    /// Its message.
    pub message: String,
}

/// What the reconcile must do.
#[derive(Debug, Default)]
pub struct Plan {
    /// Ranks to create pods for.
    pub create: Vec<Rank>,
    /// Pod names to delete.
    pub delete: Vec<String>,
    /// Of `delete`, the pods of Expired hosts: their agent no longer
    /// answers, so they are deleted with a grace period of 1 s rather than
    /// the pod's own (invariant 3). The kubelet still confirms the
    /// deletion, so two pods of one rank never both run.
    pub quick: std::collections::BTreeSet<String>,
    /// Events to publish.
    pub events: Vec<PlannedEvent>,
    /// The new status, written whole.
    pub status: WorldStatus,
    /// Reconcile again after this long (backoff, eviction timeout).
    pub requeue_after: Option<Duration>,
    /// `ttlSecondsAfterFinished` has passed: delete the World (invariant 9).
    pub delete_world: bool,
    /// Write the status at once: it records hosts this pass deletes as
    /// `Terminating`, which tells a later pass that the operator deleted
    /// them (a rule on `Deleted` pods must not take them for someone
    /// else's deletion).
    pub urgent: bool,
    /// The causes of the hosts that newly failed in this pass, for
    /// `hostmesh_failures_total` once the status is written
    /// (`cause.rs` invariant 4).
    pub failures: Vec<hostmesh_crds::cause::FailureCause>,
}

/// `updatePolicy.maxUnavailable` as a number of hosts of `n`: a number, or
/// a percentage rounded down; at least 1 (default 1).
pub fn max_unavailable(policy: &UpdatePolicy, n: Rank) -> Rank {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let v = match &policy.max_unavailable {
        None => 1,
        Some(IntOrString::Int(i)) => usize::try_from(*i).unwrap_or(1),
        Some(IntOrString::String(p)) => p
            .strip_suffix('%')
            .and_then(|x| x.parse::<usize>().ok())
            .map_or(1, |pct| n.saturating_mul(pct) / 100),
    };
    v.max(1)
}

fn sd(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

/// This operator took over host `rank`'s Ready pod (the pod was Ready
/// before it started watching it) less than `healthTimeout` ago: until the
/// agent's first heartbeat, its recorded state stands (invariant 3).
fn taking_over(input: &PlanInput<'_>, rank: Rank, pod: &Pod) -> bool {
    let (Some(ready), Some(watching)) = (ready_since(pod), (input.watching_since)(rank)) else {
        return false;
    };
    ready < watching && input.now < watching + sd(input.timings.health_timeout)
}

/// Since when `pod` has been Ready, if it is.
fn ready_since(pod: &Pod) -> Option<Timestamp> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?;
    Some(c.last_transition_time.as_ref()?.0)
}

impl PlanInput<'_> {
    /// Whether a pod annotated with token hash `held` holds the World's
    /// current agent token (made with it, or rotated to it in place).
    pub fn holds_current_token(&self, held: &str) -> bool {
        held == self.secret_hash || self.rotated_hashes.iter().any(|h| h == held)
    }
}

/// Computes the plan (invariants 1-5), phase by phase: observe every host,
/// carry a recorded or critical failure over, act on failed and evicted
/// hosts per `failurePolicy`, roll stale pods and create missing ones, then
/// derive the phase, the conditions and the status.
pub fn plan(input: &PlanInput<'_>) -> Plan {
    let mut w = Working::new(input);
    // Invariant 9: what finished stays finished.
    if w.was_succeeded {
        return w.ended(WorldPhase::Succeeded);
    }
    if w.was_failed {
        w.carry_failure();
        return w.ended(WorldPhase::Failed);
    }
    if input.world.spec.suspend {
        return w.suspend("SpecSuspended", "spec.suspend is true", true);
    }
    if let Some(h) = &input.hold {
        return w.suspend(&h.reason, &h.message, false);
    }
    w.replace_for_credentials();
    w.expire_silent();
    w.resume();
    w.announce_expired();
    w.carry_failure();
    if w.failure.is_none() {
        w.meshes_finished();
    }
    if w.failure.is_none() && !w.succeeded {
        w.deadlines();
    }
    if w.failure.is_none() && !w.succeeded {
        w.act_on_failed_hosts();
    }
    if w.failure.is_none() && !w.succeeded {
        w.roll_and_create();
    }
    let phase = w.phase();
    if matches!(phase, WorldPhase::Succeeded | WorldPhase::Failed) {
        return w.ended(phase);
    }
    w.finish(phase)
}

mod finish;

/// The plan being computed: what the phases of [`plan`] read and write.
struct Working<'i, 'a> {
    input: &'i PlanInput<'a>,
    prev: WorldStatus,
    generation: Option<i64>,
    now_t: Time,
    /// Hosts of the World.
    n: Rank,
    /// The World already failed in this generation.
    was_failed: bool,
    /// The World already succeeded (final, whatever the generation).
    was_succeeded: bool,
    /// Every ProcMesh succeeded in this pass (`finishWhen`).
    succeeded: bool,
    /// The failure rule that fired last.
    rule_fired: Option<hostmesh_crds::procmesh::RuleFired>,
    /// Host pods left on an older template (`updatePolicy`).
    stale: Rank,
    /// When the current run started and was first Ready (invariant 10).
    start_time: Option<Time>,
    ready_time: Option<Time>,
    /// The World was up (Running or Degraded) in this generation: a host
    /// that is not Ready now is a loss being recovered, not a creation.
    was_up: bool,
    restarts: u32,
    last_restart: Option<Time>,
    attempt: u32,
    hosts: Vec<HostStatus>,
    /// Hosts Expired without ever heartbeating, and since when (invariant 3).
    silent: BTreeMap<Rank, Timestamp>,
    /// The World fails: the `Failed` condition's reason and message.
    failure: Option<(String, String)>,
    progressing: Option<(&'static str, String)>,
    waiting_backoff: bool,
    out: Plan,
}

impl<'i, 'a> Working<'i, 'a> {
    /// Observes every host; a spec change clears a terminal failure and the
    /// restart count.
    fn new(input: &'i PlanInput<'a>) -> Self {
        let world = input.world;
        let prev = world.status.clone().unwrap_or_default();
        let generation = world.metadata.generation;
        let n = world.spec.full_shape().num_ranks();
        let same_gen = prev.observed_generation == generation;
        // Suspending and resuming change the spec but not the run: the
        // restart count carries over (invariant 6).
        let carry = same_gen
            || world.spec.suspend
            || input.hold.is_some()
            || prev.phase == Some(WorldPhase::Suspended);
        // Invariant 10: a resume, or a new run after a failure the spec
        // cleared, starts the clocks again.
        let same_run = prev.phase != Some(WorldPhase::Suspended)
            && (same_gen || prev.phase != Some(WorldPhase::Failed));
        let hosts = (0..n)
            .map(|r| {
                let h = observe_pod(input.pods.get(&r).map(|p| &**p), (input.liveness)(r));
                // Not ready yet is not "no longer ready": a host that was
                // never Ready in status is still starting.
                let was_up = runs::get(&prev.hosts, r)
                    .is_some_and(|p| matches!(p.state, HostState::Ready | HostState::NotReady));
                let was_ready =
                    runs::get(&prev.hosts, r).is_some_and(|p| p.state == HostState::Ready);
                if h.reason.as_deref() == Some("AwaitingHeartbeat")
                    && was_ready
                    && input.pods.get(&r).is_some_and(|p| taking_over(input, r, p))
                {
                    // A new operator has not heard this agent yet: what
                    // status recorded stands (invariant 3).
                    HostStatus::new(HostState::Ready, None)
                } else if h.state == HostState::NotReady && !was_up {
                    HostStatus::new(HostState::Starting, Some("AwaitingReadiness".into()))
                } else {
                    h
                }
            })
            .enumerate()
            .map(|(r, h)| match &world.spec.monarch {
                Some(m) => super::worker::host_status(
                    h,
                    (input.monarch_worker)(r).as_ref(),
                    m.port(),
                    input.now,
                ),
                None => h,
            })
            .collect();
        Working {
            input,
            generation,
            now_t: Time(input.now),
            n,
            was_failed: same_gen && prev.phase == Some(WorldPhase::Failed),
            was_succeeded: prev.phase == Some(WorldPhase::Succeeded),
            succeeded: false,
            rule_fired: prev.rule_fired.clone().filter(|_| carry),
            stale: 0,
            start_time: prev.start_time.clone().filter(|_| same_run),
            ready_time: prev.ready_time.clone().filter(|_| same_run),
            was_up: same_gen
                && matches!(prev.phase, Some(WorldPhase::Running | WorldPhase::Degraded)),
            restarts: if carry { prev.restarts } else { 0 },
            last_restart: prev.last_restart_time.clone().filter(|_| carry),
            attempt: prev.attempt,
            hosts,
            silent: BTreeMap::new(),
            failure: None,
            progressing: None,
            waiting_backoff: false,
            out: Plan {
                delete: input.extra_pods.clone(),
                ..Default::default()
            },
            prev,
        }
    }

    /// `spec.suspend` or a [`Hold`]: the Suspended phase first, then every
    /// host pod goes (invariants 6, 7); nothing is created and no failure is
    /// acted on. `always_count` says the pod count in the message even at 0.
    fn suspend(mut self, reason: &str, why: &str, always_count: bool) -> Plan {
        let input = self.input;
        let first = self.prev.phase != Some(WorldPhase::Suspended);
        let mut live = 0;
        for p in input.pods.values() {
            if p.metadata.deletion_timestamp.is_none()
                && let Some(name) = &p.metadata.name
            {
                live += 1;
                if !first && !self.out.delete.contains(name) {
                    self.out.delete.push(name.clone());
                }
            }
        }
        let remaining = input.pods.len();
        if first {
            let note = if live == 0 {
                why.to_string()
            } else {
                format!("{why}: deleting {live} host pods; their agents stop the procs first")
            };
            self.out
                .events
                .push(event(Severity::Normal, "Suspended", note));
            // The pods go on the next pass, once the phase is written.
            self.requeue_within(Duration::from_millis(100));
        }
        let message = match remaining {
            0 if always_count => format!("{why}; no host pods"),
            0 => why.to_string(),
            n => format!("{why}; {n} host pods still terminating"),
        };
        let mut conds = self.prev.conditions.clone();
        let set = |c: &mut Vec<_>, t: &str, s: bool, r: &str, m: &str| {
            conditions::set(c, t, s, r, m, self.generation, &self.now_t)
        };
        set(&mut conds, SUSPENDED, true, reason, &message);
        // Invariant 7: a World that never ran gets no Ready condition yet.
        if conditions::get(&conds, READY).is_some() {
            set(&mut conds, READY, false, "Suspended", &message);
            set(&mut conds, PROGRESSING, false, "Suspended", &message);
            set(&mut conds, DEGRADED, false, "Suspended", "");
            set(&mut conds, FAILED, false, "NotFailed", "");
        }
        let n = self.n;
        self.mark_deleting();
        let (host_runs, truncated) = runs::encode_bounded(self.hosts, runs::MAX_RUNS);
        self.out.status = WorldStatus {
            phase: Some(WorldPhase::Suspended),
            ready: Some(format!("0/{n}")),
            ready_hosts: 0,
            desired_hosts: n,
            hosts: host_runs,
            hosts_truncated: truncated,
            conditions: conds,
            observed_generation: self.generation,
            restarts: self.restarts,
            last_restart_time: self.last_restart,
            degraded_since: None,
            attempt: self.attempt,
            first_failure: self.prev.first_failure.clone(),
            finished_at: None,
            start_time: None,
            ready_time: None,
            rule_fired: self.rule_fired,
            stale_hosts: 0,
            monarch: None,
        };
        self.out
    }

    /// Coming back from Suspended is a new attempt (invariant 6), unless the
    /// World never ran (invariant 7).
    fn resume(&mut self) {
        if self.prev.phase != Some(WorldPhase::Suspended) {
            return;
        }
        let ran = conditions::get(&self.prev.conditions, READY).is_some();
        if ran {
            self.attempt += 1;
        }
        let why = match &self.input.admitted {
            Some(a) => a.clone(),
            None => "spec.suspend is false".to_string(),
        };
        let note = if ran {
            format!("{why}: creating the hosts again (attempt {})", self.attempt)
        } else {
            format!("{why}: creating the hosts")
        };
        let reason = if self.input.admitted.is_some() {
            "Admitted"
        } else {
            "Resumed"
        };
        self.out.events.push(event(Severity::Normal, reason, note));
    }

    fn ranks_in(&self, state: HostState) -> Vec<Rank> {
        (0..self.n)
            .filter(|r| self.hosts[*r].state == state)
            .collect()
    }

    /// Hosts of a World that was up are not all Ready: it is recovering
    /// (Degraded), not being created.
    fn recovering(&self) -> bool {
        self.was_up && self.ready() < self.n
    }

    fn troubled(&self) -> bool {
        self.hosts.iter().any(|h| {
            matches!(
                h.state,
                HostState::Failed | HostState::Expired | HostState::NotReady
            )
        })
    }

    /// Pods that mount another agent token than the Secret's (a lost
    /// Secret was replaced, or its token changed) go, so their
    /// replacements mount the current one (invariant 8). Pods without the
    /// annotation (made by an older operator) are left alone.
    fn replace_for_credentials(&mut self) {
        let input = self.input;
        let mut stale = Vec::new();
        for p in input.pods.values() {
            let held = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(super::desired::ANNOTATION_SECRET_HASH));
            if held.is_some_and(|h| !input.holds_current_token(h))
                && p.metadata.deletion_timestamp.is_none()
                && let Some(name) = &p.metadata.name
                && !self.out.delete.contains(name)
            {
                stale.push(name.clone());
            }
        }
        if stale.is_empty() {
            return;
        }
        let why = match &input.credentials_note {
            Some(note) => format!("{note}: replacing {} host pods", stale.len()),
            None => format!(
                "the agent token in the Secret changed: replacing {} host pods whose agents hold the old one",
                stale.len()
            ),
        };
        self.out.delete.extend(stale);
        self.out
            .events
            .push(event(Severity::Warning, "CredentialsReplaced", why.clone()));
        self.progressing = Some(("CredentialsReplaced", why));
    }

    /// Hosts whose pod has been Ready for `healthTimeout` without a single
    /// heartbeat reaching the operator are Expired, with the connection's
    /// error as the reason (invariant 3).
    fn expire_silent(&mut self) {
        let input = self.input;
        let health = sd(input.timings.health_timeout);
        for r in 0..self.n {
            // A host kept Ready through a takeover is looked at again when
            // its grace ends.
            if let Some(p) = input.pods.get(&r)
                && matches!((input.liveness)(r), Liveness::Unknown)
                && taking_over(input, r, p)
                && let Some(watching) = (input.watching_since)(r)
                && let Ok(left) = Duration::try_from((watching + health).duration_since(input.now))
            {
                self.requeue_within(left);
            }
            let h = &self.hosts[r];
            if h.state != HostState::Starting || h.reason.as_deref() != Some("AwaitingHeartbeat") {
                continue;
            }
            let (Some(ready), Some(watching)) = (
                input.pods.get(&r).and_then(|p| ready_since(p)),
                (input.watching_since)(r),
            ) else {
                continue;
            };
            let at = ready.max(watching) + health;
            if at > input.now {
                if let Ok(left) = Duration::try_from(at.duration_since(input.now)) {
                    self.requeue_within(left);
                }
                continue;
            }
            let why = match (input.link_error)(r) {
                Some(e) => format!("Unreachable: the operator cannot reach the agent: {e}"),
                None => {
                    "Unreachable: no heartbeat from the agent since the pod became Ready".into()
                }
            };
            self.hosts[r] = HostStatus::new(
                HostState::Expired,
                Some(hostmesh_crds::procmesh::head(&why, 320).to_string()),
            );
            self.silent.insert(r, at);
        }
    }

    /// Tells users when a host goes silent (once per transition).
    fn announce_expired(&mut self) {
        for r in self.ranks_in(HostState::Expired) {
            if runs::get(&self.prev.hosts, r).is_none_or(|p| p.state != HostState::Expired) {
                let note = format!("host {r}: no agent heartbeat within healthTimeout");
                self.out
                    .events
                    .push(event(Severity::Warning, "HostExpired", note));
            }
        }
    }

    /// A failure recorded in this generation stands; a critical ProcMesh's
    /// failure fails the World.
    fn carry_failure(&mut self) {
        if self.was_failed {
            self.failure = conditions::get(&self.prev.conditions, FAILED)
                .map(|c| (c.reason.clone(), c.message.clone()));
        }
        if let Some(why) = &self.input.critical_failure {
            if self.failure.is_none() {
                self.out
                    .events
                    .push(event(Severity::Warning, "WorldFailed", why.clone()));
            }
            self.failure
                .get_or_insert_with(|| ("CriticalProcMeshFailed".into(), why.clone()));
        }
    }

    /// Hosts to act on now: failed ones, those Expired for longer than
    /// `evictionTimeout`, and Expired ones whose agent fenced itself
    /// (invariant 3); each restart waits out the backoff
    /// and counts toward `maxRestarts`.
    fn act_on_failed_hosts(&mut self) {
        let input = self.input;
        let mut act_on = self.ranks_in(HostState::Failed);
        for r in self.ranks_in(HostState::Expired) {
            // An agent known to have fenced itself ended its procs: nothing
            // is left to wait for.
            if let Some(e) = (input.link_error)(r).filter(|e| e.starts_with(fence::FENCED)) {
                self.hosts[r].reason = Some(format!(
                    "AgentFenced: {}",
                    hostmesh_crds::procmesh::head(&e, 300)
                ));
                act_on.push(r);
                continue;
            }
            let since = (input.expired_since)(r)
                .or_else(|| self.silent.get(&r).copied())
                .unwrap_or(input.now);
            let at = since + sd(input.timings.eviction_timeout);
            if at <= input.now {
                act_on.push(r);
            } else if let Ok(left) = Duration::try_from(at.duration_since(input.now)) {
                self.requeue_within(left);
            }
        }
        act_on.sort_unstable();
        // `failurePolicy.rules` (rules.rs): each host's verdict; a rule may
        // also act on hosts still starting or whose pod is going.
        let (act_on, counted) = self.apply_rules(act_on);
        if act_on.is_empty() || self.failure.is_some() {
            return;
        }
        let describe = act_on
            .iter()
            .take(5)
            .map(|r| {
                let h = &self.hosts[*r];
                format!(
                    "host {r} {:?} ({})",
                    h.state,
                    h.reason.as_deref().unwrap_or("no reason")
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let fp = &input.world.spec.failure_policy;
        if counted && self.restarts >= fp.max_restarts {
            let why = format!("{describe}; restart limit {} reached", fp.max_restarts);
            self.out
                .events
                .push(event(Severity::Warning, "GaveUp", why.clone()));
            self.failure = Some(("RestartLimitReached".into(), why));
            return;
        }
        let delay = if self.restarts == 0 || !counted {
            Duration::ZERO
        } else {
            backoff_delay(
                input.timings.backoff,
                input.timings.max_backoff,
                self.restarts - 1,
            )
        };
        let next = self
            .last_restart
            .as_ref()
            .filter(|_| counted)
            .map_or(input.now, |t| t.0 + sd(delay));
        if next > input.now {
            self.waiting_backoff = true;
            let left = Duration::try_from(next.duration_since(input.now)).unwrap_or_default();
            self.requeue_within(left);
            self.progressing = Some((
                "BackoffWaiting",
                format!("{describe}; restarting in {}s", left.as_secs()),
            ));
            return;
        }
        if counted {
            self.restarts += 1;
            self.last_restart = Some(self.now_t.clone());
        }
        let shape = input.world.spec.full_shape();
        let scope = fp.scope.as_deref();
        let victims: Vec<Rank> = match fp.action {
            FailureAction::ReplaceHost => {
                crate::controllers::shared::scope::widen(&shape, &act_on, scope)
            }
            FailureAction::RecreateGang => {
                self.attempt += 1;
                (0..self.n).collect()
            }
        };
        let slices: Vec<String> = match scope {
            Some(dim) if fp.action == FailureAction::ReplaceHost => {
                let mut named: Vec<String> = act_on
                    .iter()
                    .map(|r| crate::controllers::shared::scope::describe(&shape, *r, dim))
                    .collect();
                named.dedup();
                named
            }
            _ => Vec::new(),
        };
        for r in victims {
            if let Some(p) = input.pods.get(&r)
                && p.metadata.deletion_timestamp.is_none()
                && let Some(name) = &p.metadata.name
            {
                self.out.delete.push(name.clone());
                if self.hosts[r].state == HostState::Expired {
                    self.out.quick.insert(name.clone());
                }
            }
        }
        let what = match fp.action {
            FailureAction::ReplaceHost if !slices.is_empty() => format!(
                "recreating the hosts of {} (scope {})",
                slices.join("; "),
                scope.unwrap_or_default()
            ),
            FailureAction::ReplaceHost => "replacing the failed hosts".to_string(),
            FailureAction::RecreateGang => "recreating the whole World".to_string(),
        };
        self.out.events.push(event(
            Severity::Warning,
            "HostFailed",
            if counted {
                format!(
                    "{describe}; {what} (restart {} of {})",
                    self.restarts, fp.max_restarts
                )
            } else {
                format!(
                    "{describe}; {what} (not counted: {} of {} so far)",
                    self.restarts, fp.max_restarts
                )
            },
        ));
        self.progressing = Some(("Restarting", format!("{describe}; {what}")));
    }

    /// `failurePolicy.rules` over the hosts to act on (failed, or expired
    /// past `evictionTimeout`) and, when a rule may act on them, hosts
    /// still unschedulable or whose pod someone else is deleting. Returns
    /// the hosts to restart and whether the restart counts (a host no rule
    /// matched, or a `Restart` rule); a `FailWorld` rule fails the World,
    /// an `Ignore` leaves the host be. The rule that fired goes to
    /// `status.ruleFired` and an Event.
    fn apply_rules(&mut self, act_on: Vec<Rank>) -> (Vec<Rank>, bool) {
        let input = self.input;
        let rules = super::rules::HostRules::new(input.world);
        if rules.is_empty() {
            let counted = !act_on.is_empty();
            return (act_on, counted);
        }
        let watch_going = [
            hostmesh_crds::world::HostReason::Deleted,
            hostmesh_crds::world::HostReason::Preempted,
            hostmesh_crds::world::HostReason::NodeLost,
        ]
        .into_iter()
        .any(|r| rules.watches(r))
            || rules.watches_infrastructure();
        let watch_unschedulable = rules.watches(hostmesh_crds::world::HostReason::Unschedulable);
        let host_container = super::cause::host_container(input);
        let causes: Vec<_> = (0..self.n)
            .map(|r| {
                super::cause::of_host(
                    input,
                    &self.prev,
                    r,
                    &self.hosts[r],
                    &self.out.delete,
                    &host_container,
                )
            })
            .collect();
        // Deleted by someone else: seen terminating, or already gone when
        // this pass first looks (a quick deletion between two passes), as
        // `cause.rs` attributes it.
        let deleted: Vec<bool> = (0..self.n)
            .map(|r| {
                let state = self.hosts[r].state;
                self.going_by_someone_else(r)
                    && (state == HostState::Terminating
                        || (state == HostState::Pending
                            && causes[r].as_ref().is_some_and(|a| {
                                a.evidence.reason == hostmesh_crds::cause::reasons::POD_DELETED
                            })))
            })
            .collect();
        let mut candidates = act_on.clone();
        for (r, gone) in deleted.iter().enumerate() {
            let going = watch_going && *gone;
            let starting = watch_unschedulable && self.hosts[r].state == HostState::Starting;
            if (going || starting) && !candidates.contains(&r) {
                candidates.push(r);
            }
        }
        candidates.sort_unstable();
        let mut restart = Vec::new();
        let mut counted = false;
        for r in candidates {
            let facts = super::rules::HostFacts {
                host: &self.hosts[r],
                pod: input.pods.get(&r).map(|p| &**p),
                deleted: deleted[r],
                cause: causes[r].as_ref().map(|a| a.cause),
            };
            let decision = rules.decide(&facts, input.now);
            let unschedulable_since =
                super::rules::reasons(&facts)
                    .into_iter()
                    .find_map(|(why, since)| {
                        (why == hostmesh_crds::world::HostReason::Unschedulable)
                            .then_some(since)
                            .flatten()
                    });
            let deleted = facts.deleted;
            if decision.is_none()
                && let Some(due) = unschedulable_since.and_then(|t| rules.unschedulable_due(t))
                && due > input.now
                && let Ok(left) = Duration::try_from(due.duration_since(input.now))
            {
                self.requeue_within(left);
            }
            let what = {
                let h = &self.hosts[r];
                format!(
                    "host {r} {:?} ({})",
                    h.state,
                    h.reason
                        .as_deref()
                        .unwrap_or(if deleted { "Deleted" } else { "no reason" })
                )
            };
            match decision {
                None if act_on.contains(&r) => {
                    restart.push(r);
                    counted = true;
                }
                None => {}
                Some(d) => {
                    self.fire(r, &d, &what);
                    match d.action {
                        HostAction::Restart => {
                            restart.push(r);
                            counted = true;
                        }
                        HostAction::RestartWithoutCounting => restart.push(r),
                        HostAction::Ignore => {}
                        HostAction::FailWorld => {
                            if self.failure.is_none() {
                                let why = format!("{what}{}", d.note());
                                self.out.events.push(event(
                                    Severity::Warning,
                                    "WorldFailed",
                                    why.clone(),
                                ));
                                self.failure = Some(("FailurePolicyRule".into(), why));
                            }
                        }
                    }
                }
            }
        }
        // A pod already going is not deleted again: only counted, once.
        (restart, counted)
    }

    /// With a rule on pods that go (`Deleted`, `Preempted`, `NodeLost`):
    /// the hosts whose pods this pass deletes are recorded `Terminating`
    /// at once, urgently ([`Plan::urgent`]), so a later pass knows the
    /// operator deleted them.
    fn mark_deleting(&mut self) {
        let watched = self.input.world.spec.failure_policy.rules.iter().any(|r| {
            r.reasons.iter().any(|why| {
                matches!(
                    why,
                    hostmesh_crds::world::HostReason::Deleted
                        | hostmesh_crds::world::HostReason::Preempted
                        | hostmesh_crds::world::HostReason::NodeLost
                )
            })
        });
        if !watched || self.out.delete.is_empty() {
            return;
        }
        for (r, p) in self.input.pods {
            if p.metadata
                .name
                .as_ref()
                .is_some_and(|n| self.out.delete.contains(n))
                && let Some(h) = self.hosts.get_mut(*r)
            {
                h.state = HostState::Terminating;
                self.out.urgent = true;
            }
        }
    }

    /// Host `r`'s pod is being deleted and the operator did not do it: its
    /// recorded state was not `Terminating` (the operator records the hosts
    /// it deletes as `Terminating` in the same pass, see [`Plan::urgent`]).
    fn going_by_someone_else(&self, r: Rank) -> bool {
        runs::get(&self.prev.hosts, r)
            .is_some_and(|p| !matches!(p.state, HostState::Terminating | HostState::Pending))
    }

    /// Records the rule that fired (kept with its first time while the same
    /// rule holds the same host), with an Event the first time.
    fn fire(&mut self, rank: Rank, d: &super::rules::Decision, what: &str) {
        let action = format!("{:?}", d.action);
        let same = self
            .rule_fired
            .as_ref()
            .is_some_and(|f| f.name == d.rule && f.rank == rank && f.reason == what);
        if same {
            return;
        }
        self.out.events.push(event(
            Severity::Warning,
            "RuleFired",
            format!("rule {} ({action}) matched: {what}", d.rule),
        ));
        self.rule_fired = Some(hostmesh_crds::procmesh::RuleFired {
            name: d.rule.clone(),
            action,
            rank,
            reason: what.to_string(),
            time: self.now_t.clone(),
        });
    }

    fn requeue_within(&mut self, left: Duration) {
        self.out.requeue_after = Some(self.out.requeue_after.map_or(left, |d| d.min(left)));
    }

    /// Rolls pods with a stale template; creates missing ones (not while a
    /// restart waits out its backoff).
    fn roll_and_create(&mut self) {
        let input = self.input;
        let mut stale: Vec<(Rank, &String)> = Vec::new();
        for (rank, p) in input.pods.iter() {
            let hash = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_TEMPLATE_HASH));
            if hash.map(String::as_str) != Some(input.hash)
                && p.metadata.deletion_timestamp.is_none()
                && let Some(name) = &p.metadata.name
                && !self.out.delete.contains(name)
                && *rank < self.n
            {
                stale.push((*rank, name));
            }
        }
        // Invariant 4, per `updatePolicy`.
        let policy = &input.world.spec.update_policy;
        let roll: Vec<(Rank, &String)> = match policy.type_ {
            UpdateType::Recreate => stale.clone(),
            UpdateType::OnNextRestart => Vec::new(),
            UpdateType::RollingUpdate => {
                let budget = max_unavailable(policy, self.n);
                let down = self
                    .hosts
                    .iter()
                    .filter(|h| h.state != HostState::Ready)
                    .count()
                    + self.out.delete.len();
                // Stale hosts already down go first: recreating them takes
                // nothing more down; then Ready ones while the budget lasts.
                let (down_stale, up_stale): (Vec<_>, Vec<_>) = stale
                    .iter()
                    .copied()
                    .partition(|(r, _)| self.hosts[*r].state != HostState::Ready);
                let room = budget.saturating_sub(down);
                down_stale
                    .into_iter()
                    .chain(up_stale.into_iter().take(room))
                    .collect()
            }
        };
        self.stale = stale.len() - roll.len();
        let rolled = roll.len();
        for (_, name) in roll {
            self.out.delete.push(name.clone());
        }
        if self.stale > 0 {
            let was = self.prev.stale_hosts;
            let note = match policy.type_ {
                UpdateType::OnNextRestart => format!(
                    "{} host pods run an older template; each takes the new one when it is next recreated (updatePolicy OnNextRestart)",
                    self.stale
                ),
                _ => format!(
                    "{} host pods left to recreate with the new template (updatePolicy RollingUpdate)",
                    self.stale
                ),
            };
            if was == 0 && policy.type_ == UpdateType::OnNextRestart {
                self.out
                    .events
                    .push(event(Severity::Normal, "TemplateChanged", note.clone()));
            }
            if policy.type_ == UpdateType::RollingUpdate {
                self.progressing.get_or_insert(("RollingUpdate", note));
                self.requeue_within(Duration::from_secs(1));
            }
        }
        if rolled > 0 {
            self.out.events.push(event(
                Severity::Normal,
                "RollingHosts",
                format!("template changed: recreating {rolled} host pods"),
            ));
            self.progressing
                .get_or_insert(("TemplateChanged", format!("recreating {rolled} host pods")));
        }
        if !self.waiting_backoff {
            self.out.create = (0..self.n)
                .filter(|r| !input.pods.contains_key(r))
                .collect();
        }
        if !self.out.create.is_empty() {
            self.progressing.get_or_insert((
                "CreatingHosts",
                format!("creating {} host pods", self.out.create.len()),
            ));
        }
    }

    fn ready(&self) -> Rank {
        self.hosts
            .iter()
            .filter(|h| h.state == HostState::Ready)
            .count()
    }

    /// The World's phase from its hosts and the decision.
    fn phase(&self) -> WorldPhase {
        if self.failure.is_some() {
            WorldPhase::Failed
        } else if self.succeeded {
            WorldPhase::Succeeded
        } else if self.troubled() || self.recovering() {
            WorldPhase::Degraded
        } else if self.ready() == self.n {
            WorldPhase::Running
        } else {
            WorldPhase::Creating
        }
    }

    /// The conditions and the status.
    fn finish(mut self, phase: WorldPhase) -> Plan {
        let n = self.n;
        let ready = self.ready();
        if phase == WorldPhase::Running && self.prev.phase != Some(WorldPhase::Running) {
            self.out.events.push(event(
                Severity::Normal,
                "Running",
                format!("all {n} hosts ready"),
            ));
        }
        let degraded_since = if self.troubled() || self.recovering() {
            self.prev
                .degraded_since
                .clone()
                .or_else(|| Some(self.now_t.clone()))
        } else {
            None
        };
        let conds = self.conditions(phase);
        self.out.failures =
            super::cause::attribute(self.input, &self.prev, &mut self.hosts, &self.out.delete);
        let first_failure = self.first_failure();
        self.mark_deleting();
        let (host_runs, truncated) = runs::encode_bounded(self.hosts, runs::MAX_RUNS);
        self.out.status = WorldStatus {
            phase: Some(phase),
            ready: Some(format!("{ready}/{n}")),
            ready_hosts: ready,
            desired_hosts: n,
            hosts: host_runs,
            hosts_truncated: truncated,
            conditions: conds,
            observed_generation: self.generation,
            restarts: self.restarts,
            last_restart_time: self.last_restart,
            degraded_since,
            attempt: self.attempt,
            first_failure,
            finished_at: None,
            start_time: self.start_time,
            ready_time: self.ready_time,
            rule_fired: self.rule_fired,
            stale_hosts: self.stale,
            monarch: None,
        };
        self.out
    }

    /// The World's `firstFailure` after this pass (worker invariant 3).
    fn first_failure(&self) -> Option<hostmesh_crds::world::HostFailure> {
        let world = self.input.world;
        let name = kube::ResourceExt::name_any(world);
        // A failed host, one whose agent went silent (Expired, as of when
        // it expired), or one whose pod went without the operator asking
        // (attributed: cause.rs), lowest rank first.
        let failures = (0..self.n)
            .filter(|r| {
                let h = &self.hosts[*r];
                matches!(h.state, HostState::Failed | HostState::Expired)
                    || (matches!(h.state, HostState::Terminating | HostState::Pending)
                        && h.cause.is_some())
            })
            .map(|r| {
                let report = world
                    .spec
                    .monarch
                    .as_ref()
                    .and_then(|_| (self.input.monarch_worker)(r));
                let at = match self.hosts[r].state {
                    HostState::Expired => (self.input.expired_since)(r).map(Time),
                    _ => None,
                };
                let mut f = super::worker::failure(
                    r,
                    super::desired::pod_name(&name, r),
                    &self.hosts[r],
                    report.as_ref(),
                    at.as_ref().unwrap_or(&self.now_t),
                );
                // A host container that ended (the agent crashed, was
                // killed or OOM-killed): its code, signal, log tail and
                // command, as for a worker.
                let container = (self.hosts[r].state == HostState::Failed
                    && f.exit_code.is_none()
                    && f.signal.is_none())
                .then(|| {
                    self.input
                        .pods
                        .get(&r)
                        .and_then(|p| super::observe::failed_container(p))
                })
                .flatten();
                if let Some(c) = container {
                    super::worker::fill_from_container(&mut f, c);
                }
                f
            })
            .collect();
        let mut first = super::worker::first_failure(&self.prev, failures)?;
        // A host first seen failing by its symptom (its agent went silent
        // the moment it was killed) is named by its cause once the kubelet
        // reports how its container ended, which a real kubelet does a
        // moment later, when the pod may already be terminating: the same
        // pod (created before the failure) with an ended container.
        if first.exit_code.is_none() && first.signal.is_none() {
            let ended = self
                .input
                .pods
                .get(&first.rank)
                .filter(|p| {
                    p.metadata.name.as_deref() == Some(first.pod.as_str())
                        && p.metadata
                            .creation_timestamp
                            .as_ref()
                            .is_some_and(|t| t.0 <= first.time.0)
                })
                .and_then(|p| super::observe::failed_container(p));
            if let Some(c) = ended {
                first.reason = c.describe();
                // The symptom (a silent agent) gives way to the cause.
                if first
                    .evidence
                    .as_ref()
                    .is_none_or(|e| e.reason == hostmesh_crds::cause::reasons::AGENT_UNREACHABLE)
                {
                    let a = crate::controllers::shared::cause::of_container_end(
                        &c,
                        &super::cause::host_container_name(&world.spec),
                    );
                    first.cause = Some(a.cause);
                    first.evidence = Some(a.evidence);
                }
                super::worker::fill_from_container(&mut first, c);
            }
        }
        Some(first)
    }

    /// Ready, Progressing, Degraded and Failed.
    fn conditions(&self, phase: WorldPhase) -> Vec<Condition> {
        let (n, ready) = (self.n, self.ready());
        let mut conds = self.prev.conditions.clone();
        let starting: Vec<String> = self
            .hosts
            .iter()
            .enumerate()
            .filter(|(_, h)| h.state == HostState::Starting && h.reason.is_some())
            .take(3)
            .map(|(r, h)| format!("host {r}: {}", h.reason.as_deref().unwrap_or_default()))
            .collect();
        let ready_msg = if starting.is_empty() {
            format!("{ready}/{n} hosts ready")
        } else {
            format!("{ready}/{n} hosts ready; {}", starting.join(", "))
        };
        let set = |c: &mut Vec<_>, t: &str, s: bool, r: &str, m: &str| {
            conditions::set(c, t, s, r, m, self.generation, &self.now_t)
        };
        set(
            &mut conds,
            READY,
            phase == WorldPhase::Running,
            if phase == WorldPhase::Running {
                "AllHostsReady"
            } else {
                "HostsNotReady"
            },
            &ready_msg,
        );
        match &self.progressing {
            Some((r, m)) => set(&mut conds, PROGRESSING, true, r, m),
            None if phase == WorldPhase::Creating => {
                set(&mut conds, PROGRESSING, true, "HostsStarting", &ready_msg)
            }
            None => set(&mut conds, PROGRESSING, false, "Stable", "nothing to do"),
        }
        if self.troubled() {
            let bad: Vec<String> = self
                .hosts
                .iter()
                .enumerate()
                .filter(|(_, h)| {
                    matches!(
                        h.state,
                        HostState::Failed | HostState::Expired | HostState::NotReady
                    )
                })
                .take(5)
                .map(|(r, h)| {
                    format!(
                        "host {r} {:?} ({})",
                        h.state,
                        h.reason.as_deref().unwrap_or("no reason")
                    )
                })
                .collect();
            set(
                &mut conds,
                DEGRADED,
                true,
                "HostsUnhealthy",
                &bad.join(", "),
            );
        } else if self.recovering() {
            let waiting: Vec<String> = self
                .hosts
                .iter()
                .enumerate()
                .filter(|(_, h)| h.state != HostState::Ready)
                .take(5)
                .map(|(r, h)| format!("host {r} {:?}", h.state))
                .collect();
            set(
                &mut conds,
                DEGRADED,
                true,
                "HostsRecovering",
                &format!("{}/{n} hosts ready; {}", ready, waiting.join(", ")),
            );
        } else {
            set(&mut conds, DEGRADED, false, "AllHostsHealthy", "");
        }
        match &self.failure {
            Some((reason, why)) => set(&mut conds, FAILED, true, reason, why),
            None => set(&mut conds, FAILED, false, "NotFailed", ""),
        }
        if conditions::get(&conds, SUSPENDED).is_some() {
            let (reason, message) = match &self.input.admitted {
                Some(a) => ("Admitted", format!("{a}; attempt {}", self.attempt)),
                None => ("Resumed", format!("attempt {}", self.attempt)),
            };
            set(&mut conds, SUSPENDED, false, reason, &message);
        }
        conds
    }
}

#[cfg(test)]
mod cause_tests;
#[cfg(test)]
mod tests;
