//! The ProcMesh's decisions as a pure function: per-rank state from the
//! agents' reports, spawn timeouts, restarts per `restartPolicy` (in place,
//! by bumping a rank's spec incarnation), the first failure, and the whole
//! new status.
//!
//! Invariants:
//! 1. Agents are the source of truth: a rank's incarnation is the highest of
//!    what its agent reports and the gang base (`status.restarts` under
//!    Gang), so a restarted operator neither restarts nor duplicates procs.
//! 2. `firstFailure` is set once per generation and is replaced only by an
//!    earlier failure (agents' corrected clocks) whose report came later:
//!    it is the root cause, not the first report ([`super::causal`]).
//!    Later failures of other ranks within the cascade window of the open
//!    incident's root are collateral (`causedBy`), counted apart.
//! 3. Restarts stop at `maxRestarts` (total, counted per incident: the
//!    failures one restart handles count once, however many ranks they
//!    hit, and however many passes their reports take to arrive: failures
//!    that happened before the open incident's restart was decided, and
//!    join it, restart uncounted); a permanent failure (a rule says Fail, or exit code 126/127 by
//!    default) or `Never` fails at once. Each rank's own restarts are its
//!    incarnation. `restartPolicy.rules` ([`super::rules`]) decide each
//!    failure: a restart only `RestartWithoutCounting` rules asked for is
//!    not counted (nor backed off), and a rank a rule `Ignore`s is
//!    `Stopped`, no failure; the rule that fired is `status.ruleFired`.
//! 4. Ranks that are not running `spawnTimeout` after their spawn (counted
//!    while the World is Running) are Timeout, a failure like any other. The
//!    clock of a rank starts no earlier than this operator's first report
//!    from its host's agent: a rank not heard from yet (a new leader before
//!    the agent's Snapshot) is unknown and keeps its recorded state; it is
//!    never timed out from the original spawn time. A rank an agent reports
//!    alive (running or stopping, whatever its incarnation: an older one
//!    that a restart is waiting to replace, on a pod still terminating) and
//!    a rank of a host that is gone are never timed out, whatever the
//!    clocks say: the clock of a replaced host's ranks starts at its new
//!    agent's first report.
//! 5. A live proc whose host is gone (Failed, Terminating, no pod) is Lost,
//!    a failure, whether or not its report is still held (a gone host's
//!    reports go with it: a rank status recorded running is enough); after
//!    its restart it is Starting until the new host runs it. So is a proc
//!    status recorded alive that its host's agent, heard again, no longer
//!    reports (the agent or its kubelet restarted, or the pod was replaced
//!    between two passes): every respawn is counted, and the hosts one
//!    crash hit, whose agents come back one by one, are one incident and
//!    one restart (`incidents` invariant 4).
//!    A live proc whose host is only Expired (its agent silent, not
//!    evicted yet) is
//!    Unreachable: no failure, nothing restarted or counted; heard again,
//!    it is what its agent reports, and Lost once the World evicts it.
//!    Once the mesh has ended, a rank without a current report keeps its
//!    recorded state: nothing is starting on a replaced host.
//! 6. On a suspended World (its `spec.suspend`, or its Suspended phase) the
//!    mesh waits: its procs go with the hosts as Stopped, not as failures,
//!    nothing is spawned or counted, and the spawn clock restarts when the
//!    World runs again. A mesh that already ended stays ended. Resumed, it
//!    keeps waiting until the World runs again (reason `WorldResuming`):
//!    what the suspended hosts' agents still report while their pods go is
//!    of the stopped procs, never a failure.
//! 7. Every failure opens or joins an incident in `status.incidents`
//!    ([`super::incidents`]), whose phases are stamped as the plan sees
//!    them; the durations completed by this plan are in [`Plan::recovery`].
//! 8. A stalled rank (`stall.rs`) is `Stalled`, a failure like any
//!    other, when `restartPolicy.onStall` is `Failure`.
//! 9. A mesh on a World that finished (failed, or succeeded with
//!    `finishWhen`) fails too (reason `WorldFinished`): its procs are
//!    stopped. A mesh that ended keeps its phase and its ranks' recorded
//!    states when its World's hosts go: only a proc still alive is Lost.
//! 10. `activeDeadlineSeconds` counts from `startTime`, the first spawn of
//!     the generation (restarts keep it, a suspended World resets it); past
//!     it the mesh fails (`DeadlineExceeded`) and its procs are stopped.
//! 11. `successPolicy`: once it is met (a rank, rank 0, or every selected
//!     rank exited 0) the mesh is `Succeeded` and its other ranks are
//!     stopped; a rank of a succeeded mesh that has not succeeded is
//!     `Stopped` (reason `SuccessPolicyMet`), never a failure, and no failure
//!     is recorded for it.
//! 12. With `dependsOn` the mesh spawns nothing until its dependencies are
//!     met ([`super::deps`]): phase `Pending`, condition `Waiting=True`
//!     naming them; a failed dependency fails it (`DependencyFailed`). Once
//!     it has spawned in its generation (`startTime`), they are not read.
//! 13. Every failed rank, `firstFailure` and incident carries whose fault
//!     it was (`shared::cause`): the rank's own end, unless its host
//!     carries infrastructure evidence. A `firstFailure` first read as the
//!     user's or unknown (or as a bare `HostLost`) takes its host's
//!     infrastructure evidence when that arrives later for the same failure
//!     (a device's health is reported after the crash it caused).

use hostmesh_crds::Rank;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use hostmesh_crds::conditions::{self, DEGRADED, FAILED, PROGRESSING, READY};
use hostmesh_crds::procmesh::{
    self, ExitAction, FirstFailure, Incarnation, ProcMeshPhase, ProcMeshStatus, ProcState,
    RankStatus, RestartMode,
};
use hostmesh_crds::validate::ProcMeshTimings;
use hostmesh_crds::world::{HostState, WorldPhase};
use hostmesh_crds::{ProcMesh, runs};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use hostmesh_crds::cause::{Attribution, FailureCause};
use hostmesh_crds::incident::{Incident, IncidentAction};

use super::causal::{self, Failure};
use super::incidents::{self, PhaseTime};
use crate::controllers::shared::{PlannedEvent, Severity, backoff_delay};
use crate::hub::ProcObs;

/// The ranks of `shape` whose coordinates match every entry of `dims`
/// (a dimension the shape lacks matches nothing).
pub fn selected_ranks(
    shape: &hostmesh_crds::Shape,
    dims: &std::collections::BTreeMap<String, u32>,
) -> Vec<Rank> {
    let Ok(extent) = shape.extent() else {
        return Vec::new();
    };
    (0..extent.num_ranks())
        .filter(|r| {
            extent
                .point(*r)
                .is_ok_and(|p| dims.iter().all(|(d, c)| p.coord(d) == Some(*c as usize)))
        })
        .collect()
}

pub use super::rules::PERMANENT_EXIT_CODES;

/// Everything the plan is computed from.
pub struct PlanInput<'a> {
    /// The ProcMesh with its current status.
    pub pm: &'a ProcMesh,
    /// Parsed timings.
    pub timings: ProcMeshTimings,
    /// Phase of its World.
    pub world_phase: Option<WorldPhase>,
    /// Its World is suspended (`spec.suspend` or phase Suspended).
    pub world_suspended: bool,
    /// Hosts of the World.
    pub hosts: Rank,
    /// The full extent (World shape then perHost), for display.
    pub extent: String,
    /// The same extent as dimensions (`successPolicy.dims`, restart
    /// scope).
    pub shape: hostmesh_crds::Shape,
    /// Agents' reports by rank.
    pub states: &'a BTreeMap<Rank, ProcObs>,
    /// Hosts that are gone (Expired, Failed, Terminating, no pod), with
    /// their state.
    pub lost_hosts: &'a BTreeMap<Rank, HostState>,
    /// Hosts whose agent has reported its procs to this operator, and since
    /// when (invariant 4).
    pub reported: &'a BTreeMap<Rank, Timestamp>,
    /// For lost hosts: when the operator last heard their agent (their
    /// procs' failure time, which no agent reports).
    pub last_heard: &'a BTreeMap<Rank, Timestamp>,
    /// The wall-clock time the plan is computed at: spawn timeouts and
    /// restart backoff are compared with it.
    pub now: Timestamp,
    /// Set when the World finished (`Failed`, or `Succeeded`): a mesh that
    /// has not ended fails with this message (invariant 9).
    pub world_ended: Option<String>,
    /// What `dependsOn` lets the mesh do (invariant 12).
    pub deps: super::deps::Deps,
    /// Whose fault a failure on each host would be, as its World reports
    /// it (`status.hosts[].cause`): a lost host, a device reported
    /// Unhealthy (invariant 13).
    pub host_causes: &'a BTreeMap<Rank, Attribution>,
}

/// Desired incarnation per rank: a base plus per-rank overrides.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Incarnations {
    /// Incarnation of every rank without an override.
    pub base: u32,
    /// Per-rank incarnations.
    pub per_rank: HashMap<Rank, u32>,
}

impl Incarnations {
    /// Incarnation of `rank`.
    pub fn get(&self, rank: Rank) -> u32 {
        self.per_rank
            .get(&rank)
            .copied()
            .unwrap_or(self.base)
            .max(self.base)
    }
}

/// What the reconcile must do.
#[derive(Debug, Default)]
pub struct Plan {
    /// Send CreateOrUpdate for every rank with these incarnations.
    pub spawn: Option<Incarnations>,
    /// Stop every proc (the ProcMesh is Failed).
    pub stop: bool,
    /// Events to publish.
    pub events: Vec<PlannedEvent>,
    /// The new status.
    pub status: ProcMeshStatus,
    /// Reconcile again after this long.
    pub requeue_after: Option<Duration>,
    /// Recovery phases this plan completed, for
    /// `hostmesh_recovery_seconds{phase}` (once the status is written).
    pub recovery: Vec<PhaseTime>,
    /// The causes of the incidents this plan opened, for
    /// `hostmesh_failures_total` (once the status is written).
    pub failures: Vec<FailureCause>,
}

fn sd(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

/// A rank's failure in words: the signal by name, the exit code with what
/// it means ([`super::exit`]), naming `program` where the code is about it;
/// at most [`procmesh::MAX_FIRST_FAILURE_REASON`] bytes, whatever the
/// agent's reason holds.
fn describe(rank: Rank, s: &RankStatus, program: &str) -> String {
    let text = describe_unbounded(rank, s, program);
    procmesh::bounded(&text, procmesh::MAX_FIRST_FAILURE_REASON).into_owned()
}

fn describe_unbounded(rank: Rank, s: &RankStatus, program: &str) -> String {
    if s.signal == Some(9) && s.reason.as_deref() == Some(super::exit::OOM_KILLED) {
        return format!("rank {rank} {}", super::exit::oom_killed());
    }
    let what = match (s.state, s.exit_code, s.signal) {
        (_, _, Some(sig)) => super::exit::killed(sig),
        (ProcState::Timeout, _, _) => "did not start within spawnTimeout".to_string(),
        (ProcState::Lost, _, _) => "its host was lost".to_string(),
        (_, Some(code), _) => super::exit::exited(code, program),
        (st, None, None) => format!("{st:?}"),
    };
    match &s.reason {
        Some(r) if !r.is_empty() => format!("rank {rank} {what}: {r}"),
        _ => format!("rank {rank} {what}"),
    }
}

/// A rank's status from its agent's report (an OOM kill says so in its
/// reason).
fn status_of(o: &ProcObs) -> RankStatus {
    RankStatus {
        state: o.state,
        exit_code: o.exit_code,
        signal: o.signal,
        reason: if o.oom_killed {
            Some(super::exit::OOM_KILLED.to_string())
        } else {
            o.reason.clone()
        },
        stderr_tail: o.stderr_tail.clone(),
        stderr_head: o.stderr_head.clone(),
        caused_by: None,
        cause: None,
    }
}

/// Computes the plan (invariants 1-4), phase by phase: carry over what the
/// current generation recorded, settle each rank's incarnation, observe
/// every rank, decide on failures and restarts, then derive the phase,
/// the conditions and the status.
pub fn plan(input: &PlanInput<'_>) -> Plan {
    let mut w = Working::carry_over(input);
    if input.world_suspended && !w.was_terminal {
        return w.wait_suspended(false);
    }
    if w.resuming() {
        return w.wait_suspended(true);
    }
    if let super::deps::Deps::Waiting(why) = &input.deps
        && !w.was_terminal
        && w.start_time.is_none()
    {
        return w.wait_for_deps(why);
    }
    w.settle_incarnations();
    w.start_spawn_clock();
    w.observe_ranks();
    if !w.success_policy_met() {
        w.decide_failures();
    }
    let phase = w.phase();
    w.finish(phase)
}

/// The plan being computed: what the phases of [`plan`] read and write.
struct Working<'i, 'a> {
    input: &'i PlanInput<'a>,
    prev: ProcMeshStatus,
    generation: Option<i64>,
    same_gen: bool,
    now_t: Time,
    per_host: Rank,
    total: Rank,
    world_running: bool,
    /// The mesh already ended in this generation (Failed or Succeeded).
    was_terminal: bool,
    restarts: u32,
    last_restart: Option<Time>,
    spawn_time: Option<Time>,
    /// The first spawn of the generation (invariant 10).
    start_time: Option<Time>,
    first_failure: Option<FirstFailure>,
    incidents: Vec<Incident>,
    inc: Incarnations,
    ranks: Vec<RankStatus>,
    failure_reason: Option<String>,
    /// The `Failed` condition's reason with `failure_reason`.
    failure_kind: String,
    /// The success policy was met in this pass: why (invariant 11).
    success: Option<String>,
    /// Failed ranks a rule ignored (invariant 3).
    ignored: Rank,
    /// The rule that fired last.
    rule_fired: Option<hostmesh_crds::procmesh::RuleFired>,
    progressing: Option<(&'static str, String)>,
    retrying: bool,
    /// What fails now joined an open incident whose restart was already
    /// decided (and counted): its ranks restart uncounted (invariant 3).
    joined_restart: bool,
    out: Plan,
}

impl<'i, 'a> Working<'i, 'a> {
    /// What the current generation recorded carries over; a spec change
    /// starts afresh (invariant 2: `firstFailure` once per generation).
    fn carry_over(input: &'i PlanInput<'a>) -> Self {
        let pm = input.pm;
        let generation = pm.metadata.generation;
        let prev = pm.status.clone().unwrap_or_default();
        let same_gen = prev.observed_generation == generation;
        let per_host = pm.spec.per_host_shape().num_ranks();
        let was_terminal = same_gen
            && matches!(
                prev.phase,
                Some(ProcMeshPhase::Failed | ProcMeshPhase::Succeeded)
            );
        Working {
            input,
            generation,
            same_gen,
            now_t: Time(input.now),
            per_host,
            total: input.hosts.saturating_mul(per_host),
            world_running: input.world_phase == Some(WorldPhase::Running),
            was_terminal,
            restarts: if same_gen { prev.restarts } else { 0 },
            last_restart: prev.last_restart_time.clone().filter(|_| same_gen),
            spawn_time: prev.spawn_time.clone(),
            start_time: prev.start_time.clone().filter(|_| same_gen),
            first_failure: prev.first_failure.clone().filter(|_| same_gen),
            incidents: if same_gen {
                prev.incidents.clone()
            } else {
                Vec::new()
            },
            inc: Incarnations::default(),
            ranks: Vec::new(),
            failure_reason: None,
            failure_kind: "ProcsFailed".into(),
            success: None,
            ignored: 0,
            rule_fired: prev.rule_fired.clone().filter(|_| same_gen),
            progressing: None,
            retrying: false,
            joined_restart: false,
            out: Plan::default(),
            prev,
        }
    }

    /// Incarnations: the gang base, what status recorded, then what agents
    /// report (invariant 1).
    fn settle_incarnations(&mut self) {
        let base = if self.input.pm.spec.restart_policy.policy == RestartMode::Gang {
            self.restarts
        } else {
            0
        };
        self.inc = Incarnations {
            base,
            per_rank: HashMap::new(),
        };
        if self.same_gen {
            for run in &self.prev.incarnations {
                if run.value.incarnation > base {
                    for r in run.start..run.end().min(self.total) {
                        self.inc.per_rank.insert(r, run.value.incarnation);
                    }
                }
            }
        }
        for (rank, obs) in self.input.states {
            if obs.incarnation > self.inc.get(*rank) {
                self.inc.per_rank.insert(*rank, obs.incarnation);
            }
        }
    }

    /// Whether the World resumed from a suspension this mesh waited out,
    /// and does not run yet (invariant 6).
    fn resuming(&self) -> bool {
        self.same_gen
            && !self.was_terminal
            && !self.world_running
            && conditions::get(&self.prev.conditions, READY)
                .is_some_and(|c| matches!(c.reason.as_str(), "WorldSuspended" | "WorldResuming"))
    }

    /// The World is suspended, or resumed but not running yet (invariant
    /// 6): every rank Stopped, nothing spawned or counted, the conditions
    /// say why.
    fn wait_suspended(mut self, resuming: bool) -> Plan {
        let input = self.input;
        let world = &input.pm.spec.world;
        let (reason, message) = if resuming {
            (
                "WorldResuming",
                format!("World {world} resumed: its procs spawn again once its hosts run"),
            )
        } else {
            (
                "WorldSuspended",
                format!(
                    "World {world} is suspended (spec.suspend): its procs were stopped with its hosts and spawn again when it resumes"
                ),
            )
        };
        let was = conditions::get(&self.prev.conditions, READY).is_some_and(|c| c.reason == reason);
        if !was {
            self.out.events.push(PlannedEvent {
                severity: Severity::Normal,
                reason,
                note: message.clone(),
            });
        }
        let stopped = RankStatus {
            state: ProcState::Stopped,
            reason: Some("WorldSuspended".into()),
            ..Default::default()
        };
        let ranks: Vec<RankStatus> = (0..self.total).map(|_| stopped.clone()).collect();
        let mut conds = self.prev.conditions.clone();
        let set = |c: &mut Vec<_>, t: &str, s: bool, r: &str, m: &str| {
            conditions::set(c, t, s, r, m, self.generation, &self.now_t)
        };
        set(&mut conds, READY, false, reason, &message);
        set(&mut conds, PROGRESSING, false, reason, &message);
        set(&mut conds, DEGRADED, false, "NoFailures", "");
        set(&mut conds, FAILED, false, "NotFailed", "");
        let (rank_runs, truncated) = procmesh::rank_runs(ranks);
        let prev = self.prev;
        self.out.status = ProcMeshStatus {
            phase: Some(ProcMeshPhase::Pending),
            extent: Some(input.extent.clone()),
            running: 0,
            succeeded: 0,
            failed: 0,
            collateral: 0,
            ranks: rank_runs,
            ranks_truncated: truncated,
            first_failure: self.first_failure,
            actor_failures: prev.actor_failures,
            incidents: self.incidents,
            conditions: conds,
            observed_generation: self.generation,
            restarts: self.restarts,
            last_restart_time: self.last_restart,
            incarnations: prev.incarnations,
            stopping_since: None,
            spawn_time: None,
            start_time: None,
            rule_fired: self.rule_fired,
        };
        self.out
    }

    /// `dependsOn` not met yet (invariant 12): nothing spawned, every rank
    /// `Pending`, condition `Waiting=True` naming what it waits for.
    fn wait_for_deps(mut self, why: &str) -> Plan {
        let input = self.input;
        let was = conditions::get(&self.prev.conditions, conditions::WAITING)
            .is_some_and(|c| c.status == "True");
        if !was {
            self.out.events.push(PlannedEvent {
                severity: Severity::Normal,
                reason: "Waiting",
                note: why.to_string(),
            });
        }
        let mut conds = self.prev.conditions.clone();
        let set = |c: &mut Vec<_>, t: &str, s: bool, r: &str, m: &str| {
            conditions::set(c, t, s, r, m, self.generation, &self.now_t)
        };
        set(
            &mut conds,
            conditions::WAITING,
            true,
            "DependenciesNotReady",
            why,
        );
        set(&mut conds, READY, false, "Waiting", why);
        set(&mut conds, PROGRESSING, false, "Waiting", why);
        set(&mut conds, DEGRADED, false, "NoFailures", "");
        set(&mut conds, FAILED, false, "NotFailed", "");
        let ranks: Vec<RankStatus> = (0..self.total).map(|_| RankStatus::default()).collect();
        let (rank_runs, truncated) = procmesh::rank_runs(ranks);
        let prev = self.prev;
        // Dependencies change through their own status: look again now and
        // then besides the watch.
        self.out.requeue_after = Some(Duration::from_secs(10));
        self.out.status = ProcMeshStatus {
            phase: Some(ProcMeshPhase::Pending),
            extent: Some(input.extent.clone()),
            ranks: rank_runs,
            ranks_truncated: truncated,
            first_failure: self.first_failure,
            actor_failures: Vec::new(),
            incidents: self.incidents,
            conditions: conds,
            observed_generation: self.generation,
            restarts: self.restarts,
            last_restart_time: self.last_restart,
            incarnations: prev
                .incarnations
                .into_iter()
                .filter(|_| self.same_gen)
                .collect(),
            ..Default::default()
        };
        self.out
    }

    /// The spawn clock starts once the World runs.
    fn start_spawn_clock(&mut self) {
        if matches!(self.input.deps, super::deps::Deps::Failed(_)) && self.start_time.is_none() {
            return;
        }
        if self.world_running && !self.was_terminal {
            self.start_time.get_or_insert_with(|| self.now_t.clone());
        }
        if self.spawn_time.is_none() && self.world_running && !self.was_terminal {
            self.spawn_time = Some(self.now_t.clone());
        }
    }

    /// When the ranks of `host` time out: the spawn clock runs while the
    /// World is up, and for a rank only once its agent has reported to this
    /// operator (invariant 4).
    fn deadline(&self, host: Rank) -> Option<Timestamp> {
        let heard = self.input.reported.get(&host)?;
        let spawn = self.spawn_time.as_ref()?;
        Some(spawn.0.max(*heard) + sd(self.input.timings.spawn_timeout))
    }

    /// When `rank` times out: its host's deadline, plus `stopTimeout` while
    /// its agent still holds an older incarnation, which the restart stops
    /// (up to `stopTimeout`) before it sends the new one (invariant 4).
    fn rank_deadline(&self, rank: Rank, host: Rank) -> Option<Timestamp> {
        let d = self.deadline(host)?;
        let replacing = self
            .input
            .states
            .get(&rank)
            .is_some_and(|o| o.incarnation < self.inc.get(rank));
        Some(if replacing {
            d + sd(self.input.timings.stop_timeout)
        } else {
            d
        })
    }

    /// The first word of the command (what exit codes 126/127 are about).
    fn program(&self) -> &str {
        self.input
            .pm
            .spec
            .command
            .first()
            .map_or("", String::as_str)
    }

    /// Whether an agent reports a live process for `rank`, of any
    /// incarnation (invariant 4: such a rank is never timed out).
    fn reported_alive(&self, rank: Rank) -> bool {
        self.input
            .states
            .get(&rank)
            .is_some_and(|o| matches!(o.state, ProcState::Running | ProcState::Stopping))
    }

    fn unheard(&self, host: Rank) -> bool {
        !self.input.reported.contains_key(&host)
    }

    /// Every rank's status from its agent's report, its host's state and
    /// the spawn clock (invariants 4-5).
    fn observe_ranks(&mut self) {
        let input = self.input;
        self.ranks = Vec::with_capacity(self.total);
        for rank in 0..self.total {
            let host = rank / self.per_host.max(1);
            let s = self.observe_rank(rank, host);
            let timed_out = self.world_running
                && self
                    .rank_deadline(rank, host)
                    .is_some_and(|d| d <= input.now)
                && matches!(s.state, ProcState::Starting)
                && !self.was_terminal
                && !input.lost_hosts.contains_key(&host)
                && !self.reported_alive(rank);
            self.ranks.push(if timed_out {
                RankStatus {
                    state: ProcState::Timeout,
                    reason: Some(format!(
                        "not running {}s after spawn",
                        input.timings.spawn_timeout.as_secs()
                    )),
                    ..Default::default()
                }
            } else {
                s
            });
        }
    }

    /// A rank whose host is in `lost_hosts` (invariant 5): Unreachable
    /// while the host is only Expired and the proc was `alive` (an ended
    /// mesh starts no wait), else Lost.
    fn lost_or_unreachable(&self, host: Rank, alive: bool) -> RankStatus {
        let state = self.input.lost_hosts[&host];
        if state == HostState::Expired && alive && !self.was_terminal {
            return RankStatus {
                state: ProcState::Unreachable,
                reason: Some(format!(
                    "host {host} is Expired (its agent is silent): the proc may still be running"
                )),
                ..Default::default()
            };
        }
        RankStatus {
            state: ProcState::Lost,
            reason: Some(format!("host {host} is {state:?}")),
            ..Default::default()
        }
    }

    fn observe_rank(&self, rank: Rank, host: Rank) -> RankStatus {
        let input = self.input;
        let want = self.inc.get(rank);
        if let Some(s) = self.vanished(rank, host) {
            return s;
        }
        match input.states.get(&rank) {
            Some(o)
                if o.incarnation >= want
                    && !o.state.is_failure()
                    // An ended mesh: only a proc still alive is lost with
                    // its host (invariant 9).
                    && (!self.was_terminal
                        || matches!(
                            o.state,
                            ProcState::Starting | ProcState::Running | ProcState::Stopping
                        ))
                    && input.lost_hosts.contains_key(&o.host) =>
            {
                self.lost_or_unreachable(
                    o.host,
                    matches!(
                        o.state,
                        ProcState::Starting | ProcState::Running | ProcState::Stopping
                    ),
                )
            }
            Some(o) if o.incarnation >= want => super::stall::observed(input.pm, o, status_of(o)),
            // An ended mesh starts nothing: a rank with no current report
            // (its host was replaced since) keeps what status recorded.
            _ if self.was_terminal => {
                runs::get(&self.prev.ranks, rank)
                    .cloned()
                    .unwrap_or(RankStatus {
                        state: ProcState::Stopped,
                        ..Default::default()
                    })
            }
            Some(_) => RankStatus {
                state: ProcState::Starting,
                reason: Some("Restarting".into()),
                ..Default::default()
            },
            // No report, but status recorded the rank running on a host
            // that is gone since (its reports went with its pod): Lost.
            None if input.lost_hosts.contains_key(&host)
                && runs::get(&self.prev.ranks, rank).is_some_and(|s| {
                    matches!(
                        s.state,
                        ProcState::Running | ProcState::Stopping | ProcState::Unreachable
                    )
                }) =>
            {
                self.lost_or_unreachable(host, true)
            }
            // Not heard from yet: what status last recorded stands.
            None if self.same_gen && self.unheard(host) && !self.prev.ranks.is_empty() => {
                runs::get(&self.prev.ranks, rank)
                    .cloned()
                    .unwrap_or(RankStatus {
                        state: ProcState::Starting,
                        ..Default::default()
                    })
            }
            None if self.spawn_time.is_some() => RankStatus {
                state: ProcState::Starting,
                reason: self
                    .unheard(host)
                    .then(|| format!("waiting for host {host}'s agent to report")),
                ..Default::default()
            },
            None => RankStatus::default(),
        }
    }

    /// A rank with no report from a host whose agent has reported (same
    /// generation, mesh not ended, host not lost): the agent no longer has
    /// its proc (its container or its kubelet restarted, or its pod was
    /// replaced between two passes; the hub says so itself when it saw the
    /// proc before, hub invariant 11). Alive in status (or lost and not
    /// restarted yet): Lost, a failure counted and decided like any other.
    /// Ended in status: it stays as recorded, never run again. Starting:
    /// `None`, it is spawned as usual.
    fn vanished(&self, rank: Rank, host: Rank) -> Option<RankStatus> {
        let input = self.input;
        if input.states.contains_key(&rank)
            || !self.same_gen
            || self.was_terminal
            || self.unheard(host)
            || input.lost_hosts.contains_key(&host)
        {
            return None;
        }
        let recorded = runs::get(&self.prev.ranks, rank)?;
        match recorded.state {
            ProcState::Pending | ProcState::Starting => None,
            ProcState::Running | ProcState::Stopping | ProcState::Unreachable | ProcState::Lost => {
                Some(RankStatus {
                    state: ProcState::Lost,
                    reason: Some(format!(
                        "host {host}'s agent no longer has the proc (the agent restarted, or its pod was replaced)"
                    )),
                    ..Default::default()
                })
            }
            _ => Some(recorded.clone()),
        }
    }

    /// The root cause and the collateral failures, then give up or restart
    /// per `restartPolicy` (invariants 2-3, 7).
    fn decide_failures(&mut self) {
        let rules = super::rules::Rules::new(self.input.pm);
        let mut failed: Vec<Rank> = (0..self.total)
            .filter(|r| self.ranks[*r].state.is_failure())
            .collect();
        if !self.was_terminal {
            failed.retain(|r| !self.ignore(*r, &rules));
        }
        let root = self.find_root_cause(&failed);
        if self.was_terminal {
            if self.prev.phase == Some(ProcMeshPhase::Failed) {
                let c = conditions::get(&self.prev.conditions, FAILED);
                self.failure_reason = Some(c.map(|c| c.message.clone()).unwrap_or_default());
                if let Some(c) = c.filter(|c| !c.reason.is_empty()) {
                    self.failure_kind = c.reason.clone();
                }
            }
            return;
        }
        if let Some(why) = &self.input.world_ended {
            self.failure_kind = "WorldFinished".into();
            self.give_up(why.clone());
            return;
        }
        if let super::deps::Deps::Failed(why) = &self.input.deps
            && self.start_time.is_none()
        {
            self.failure_kind = "DependencyFailed".into();
            self.give_up(why.clone());
            return;
        }
        if self.deadline_passed() {
            return;
        }
        if failed.is_empty() {
            return;
        }
        let pm = self.input.pm;
        let policy = &pm.spec.restart_policy;
        // The root first, then other independent failures; the collateral
        // ones are counted, not listed.
        let mut order: Vec<Rank> = failed
            .iter()
            .copied()
            .filter(|r| self.ranks[*r].caused_by.is_none())
            .collect();
        order.sort_by_key(|r| (root != Some(*r), *r));
        let collateral = failed.len() - order.len();
        let mut summary = order
            .iter()
            .take(3)
            .map(|r| describe(*r, &self.ranks[*r], self.program()))
            .collect::<Vec<_>>()
            .join("; ");
        if let Some(root_rank) = root.filter(|_| collateral > 0) {
            summary.push_str(&format!(
                "; {collateral} collateral (failed after rank {root_rank})"
            ));
        }
        // Root first, then by rank: the first permanent failure or rule
        // named is the root's when it has one.
        let mut by_root = failed.clone();
        by_root.sort_by_key(|r| (root != Some(*r), *r));
        let decisions: Vec<(Rank, super::rules::Decision)> = by_root
            .into_iter()
            .map(|r| (r, rules.decide(&self.ranks[r], self.host_cause(r))))
            .collect();
        let permanent = decisions.iter().find(|(_, d)| d.action == ExitAction::Fail);
        if let Some((r, d)) = permanent
            .filter(|(_, d)| d.rule.is_some())
            .or_else(|| decisions.iter().find(|(_, d)| d.rule.is_some()))
        {
            let what = describe(*r, &self.ranks[*r], self.program());
            self.fire(*r, d, &what);
            summary.push_str(&d.note());
        }
        // A restart counts once per incident, however many ranks it restarts
        // (a lost host with 8 procs is one restart, as a gang restart is),
        // and not at all when only `RestartWithoutCounting` rules asked.
        // Ranks whose failures joined an incident whose restart was already
        // counted (reports of one crash arriving over several passes) are
        // restarted with it, uncounted.
        let needed = u32::from(
            !self.joined_restart
                && decisions
                    .iter()
                    .any(|(_, d)| d.action == ExitAction::Restart),
        );
        if policy.policy == RestartMode::Never {
            self.failure_reason = Some(format!("{summary} (restartPolicy Never)"));
        } else if let Some((r, d)) = permanent {
            self.failure_reason = Some(format!(
                "{} (permanent failure, not retried){}",
                describe(*r, &self.ranks[*r], self.program()),
                d.note()
            ));
        } else if self.restarts.saturating_add(needed) > policy.max_restarts {
            self.failure_reason = Some(format!(
                "{summary}; restart limit {} reached",
                policy.max_restarts
            ));
        } else {
            self.retrying = true;
            self.restart_after_backoff(&failed, needed, summary);
        }
        if let Some(why) = self.failure_reason.clone() {
            self.give_up(why);
        }
    }

    /// A failed rank a rule `Ignore`s is accepted as ended: `Stopped`, no
    /// failure (invariant 3). Returns whether it was.
    fn ignore(&mut self, r: Rank, rules: &super::rules::Rules<'_>) -> bool {
        let d = rules.decide(&self.ranks[r], self.host_cause(r));
        if d.action != ExitAction::Ignore {
            return false;
        }
        let what = describe(r, &self.ranks[r], self.program());
        let before = runs::get(&self.prev.ranks, r)
            .and_then(|p| p.reason.clone())
            .unwrap_or_default();
        let reason = format!("ignored{}: {what}", d.note());
        if before != reason {
            self.fire(r, &d, &what);
        }
        let s = &self.ranks[r];
        self.ranks[r] = RankStatus {
            state: ProcState::Stopped,
            exit_code: s.exit_code,
            signal: s.signal,
            reason: Some(reason),
            ..Default::default()
        };
        self.ignored += 1;
        true
    }

    /// Records the rule that fired (kept with its first time while the same
    /// rule holds the same rank), with an Event the first time.
    fn fire(&mut self, rank: Rank, d: &super::rules::Decision, what: &str) {
        let Some(name) = d.rule.clone() else {
            return;
        };
        let action = format!("{:?}", d.action);
        let same = self
            .rule_fired
            .as_ref()
            .is_some_and(|f| f.name == name && f.rank == rank && f.reason == what);
        if same {
            return;
        }
        self.out.events.push(PlannedEvent {
            severity: Severity::Warning,
            reason: "RuleFired",
            note: format!("rule {name} ({action}) matched: {what}"),
        });
        self.rule_fired = Some(hostmesh_crds::procmesh::RuleFired {
            name,
            action,
            rank,
            reason: procmesh::head(what, procmesh::MAX_REASON).to_string(),
            time: self.now_t.clone(),
        });
    }

    /// Invariant 10: past `activeDeadlineSeconds` the mesh fails; before,
    /// look again when it comes. Returns whether it passed.
    fn deadline_passed(&mut self) -> bool {
        let (Some(secs), Some(start)) = (
            self.input.pm.spec.active_deadline_seconds,
            self.start_time.as_ref(),
        ) else {
            return false;
        };
        let Ok(at) = start.0.checked_add(SignedDuration::from_secs(secs)) else {
            return false;
        };
        if at > self.input.now {
            if let Ok(left) = Duration::try_from(at.duration_since(self.input.now)) {
                let left = left + Duration::from_millis(50);
                self.out.requeue_after = Some(self.out.requeue_after.map_or(left, |d| d.min(left)));
            }
            return false;
        }
        self.failure_kind = "DeadlineExceeded".into();
        self.give_up(format!(
            "the ProcMesh ran for {secs}s since its first spawn, its activeDeadlineSeconds: its procs are stopped"
        ));
        true
    }

    /// Invariant 11: whether `successPolicy` is met (in this pass, or the
    /// mesh already succeeded); the ranks that did not succeed are
    /// stopped, not failed.
    fn success_policy_met(&mut self) -> bool {
        use hostmesh_crds::procmesh::SuccessMode;
        let done = |s: &RankStatus| s.state == ProcState::Succeeded;
        let already = self.was_terminal && self.prev.phase == Some(ProcMeshPhase::Succeeded);
        if !already {
            if self.was_terminal || self.ranks.is_empty() {
                return false;
            }
            let policy = &self.input.pm.spec.success_policy;
            let why = match policy.mode() {
                SuccessMode::AllRanks => None,
                SuccessMode::AnyRank => self
                    .ranks
                    .iter()
                    .position(done)
                    .map(|r| format!("rank {r} succeeded (successPolicy AnyRank)")),
                SuccessMode::RankZero => done(&self.ranks[0])
                    .then(|| "rank 0 succeeded (successPolicy RankZero)".to_string()),
                SuccessMode::Selected => {
                    let selected = selected_ranks(&self.input.shape, &policy.dims);
                    let sel = || selected.iter().filter(|r| **r < self.ranks.len());
                    (sel().next().is_some() && sel().all(|r| done(&self.ranks[*r]))).then(|| {
                        let dims: Vec<String> = policy
                            .dims
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect();
                        format!(
                            "the {} ranks with {} succeeded (successPolicy)",
                            selected.len(),
                            dims.join(",")
                        )
                    })
                }
            };
            let Some(why) = why else {
                return false;
            };
            let others = self.ranks.iter().filter(|s| !done(s)).count();
            let note = if others == 0 {
                why.clone()
            } else {
                format!("{why}: stopping the {others} other ranks")
            };
            self.out.events.push(PlannedEvent {
                severity: Severity::Normal,
                reason: "Succeeded",
                note,
            });
            self.success = Some(why);
        }
        // A rank the policy stopped stays stopped, even if it exited 0 on
        // its TERM.
        let prev_ranks = &self.prev.ranks;
        let stopped_by_policy = |r: Rank| {
            already
                && runs::get(prev_ranks, r)
                    .is_some_and(|p| p.reason.as_deref() == Some("SuccessPolicyMet"))
        };
        for (r, s) in self.ranks.iter_mut().enumerate() {
            if done(s) && !stopped_by_policy(r) {
                continue;
            }
            let live = matches!(
                s.state,
                ProcState::Starting | ProcState::Running | ProcState::Stopping
            );
            if live {
                self.out.stop = true;
            }
            *s = RankStatus {
                state: if live {
                    ProcState::Stopping
                } else {
                    ProcState::Stopped
                },
                reason: Some("SuccessPolicyMet".into()),
                ..Default::default()
            };
        }
        true
    }

    /// The mesh fails with `why`: the incident is decided as given up and
    /// an Event says so.
    fn give_up(&mut self, why: String) {
        let done =
            incidents::on_decision(&mut self.incidents, IncidentAction::GaveUp, self.input.now);
        self.out.recovery.extend(done);
        self.out.events.push(PlannedEvent {
            severity: Severity::Warning,
            reason: "GaveUp",
            note: why.clone(),
        });
        self.failure_reason = Some(why);
    }

    /// What is failing now: the failed ranks, and failures a restart has
    /// already superseded whose reports still come in (a root reported
    /// after its collateral, which a gang restart answered already).
    fn failures(&self, failed: &[Rank]) -> Vec<Failure> {
        let now = self.input.now;
        let mut out = Vec::with_capacity(failed.len());
        for &r in failed {
            let obs = self
                .input
                .states
                .get(&r)
                .filter(|o| o.incarnation >= self.inc.get(r) && o.state.is_failure());
            let timed = obs.and_then(|o| Some((o.failed_at?, o.detected_at.unwrap_or(now))));
            // A lost host's procs died after its agent was last heard.
            let untimed_at = match self.ranks[r].state {
                ProcState::Lost => self
                    .input
                    .last_heard
                    .get(&(r / self.per_host.max(1)))
                    .map_or(now, |t| (*t).min(now)),
                _ => now,
            };
            out.push(Failure {
                rank: r,
                at: timed.map_or(untimed_at, |t| t.0),
                detected: timed.map_or(now, |t| t.1),
                timed: timed.is_some(),
                status: self.ranks[r].clone(),
                oom_killed: obs.is_some_and(|o| o.oom_killed),
            });
        }
        for (r, o) in self.input.states {
            if o.incarnation < self.inc.get(*r)
                && o.state.is_failure()
                && let Some(at) = o.failed_at
            {
                out.push(Failure {
                    rank: *r,
                    at,
                    detected: o.detected_at.unwrap_or(now),
                    timed: true,
                    status: status_of(o),
                    oom_killed: o.oom_killed,
                });
            }
        }
        out
    }

    /// Finds the root of what is failing ([`causal`]), records it in the
    /// incident timeline and `firstFailure`, and marks the collateral
    /// ranks. Returns the rank at the root of the incident.
    fn find_root_cause(&mut self, failed: &[Rank]) -> Option<Rank> {
        let failures = self.failures(failed);
        let root = causal::root(&failures)?.clone();
        let cause = describe(root.rank, &root.status, self.program());
        let last = |ring: &[Incident]| ring.last().map(|i| (i.detected_at.clone(), i.rank));
        let before = last(&self.incidents);
        // When the last incident's restart was decided, if it was (it may
        // have closed since: a late report of its crash joins it,
        // incidents invariant 4).
        let restart_decided = self
            .incidents
            .last()
            .filter(|i| {
                matches!(
                    i.action,
                    Some(IncidentAction::RestartRanks | IncidentAction::RestartGang)
                )
            })
            .and_then(|i| i.decided_at.as_ref().map(|t| t.0));
        let (root_rank, root_at) =
            incidents::on_failure(&mut self.incidents, &root, &cause, 0, !self.was_terminal)
                .unwrap_or((root.rank, root.at));
        // Invariant 9: the incident's cause is its root's, set when it
        // opens or its root changes.
        let attribution = self.attribution(&root);
        let after = last(&self.incidents);
        let opened = after.as_ref().map(|a| &a.0) != before.as_ref().map(|b| &b.0);
        // Failures that happened before that decision, reported since,
        // are of the crash it answered; a restarted rank failing again is
        // a new failure.
        self.joined_restart = !opened
            && restart_decided.is_some_and(|decided| {
                failures
                    .iter()
                    .filter(|f| failed.binary_search(&f.rank).is_ok())
                    .all(|f| f.at <= decided)
            });
        if let Some(i) = self.incidents.last_mut().filter(|i| i.rank == root.rank)
            && (after != before || i.cause.is_none())
        {
            i.cause = Some(attribution.cause);
            i.evidence = Some(attribution.evidence.clone());
        }
        if opened {
            self.out.failures.push(attribution.cause);
        }
        // Collateral: counted over every failure of the cascade (some may
        // be restarting already), marked on the ranks still failed.
        let mut collateral: Rank = 0;
        for f in &failures {
            if causal::is_collateral(root_rank, root_at, f) {
                collateral += 1;
                if failed.binary_search(&f.rank).is_ok() {
                    self.ranks[f.rank].caused_by = Some(root_rank);
                }
            }
        }
        if let Some(i) = self.incidents.last_mut().filter(|i| i.rank == root_rank) {
            i.collateral = i.collateral.max(collateral);
        }
        self.record_first_failure(&root);
        Some(root_rank)
    }

    /// `firstFailure`: set at the first failure, replaced only by an
    /// earlier failure of another rank that was reported later
    /// (invariant 2).
    fn record_first_failure(&mut self, root: &Failure) {
        let attribution = self.attribution(root);
        let replaces = match &mut self.first_failure {
            None => false,
            Some(ff) if ff.rank != root.rank && root.at < ff.time.0 => true,
            Some(ff) => {
                // Invariant 9: the same failure, its host's evidence late.
                if ff.rank == root.rank
                    && ff.time.0 == incidents::micro(root.at)
                    && attribution.cause == FailureCause::Infrastructure
                    && (ff.cause != Some(FailureCause::Infrastructure)
                        || ff
                            .evidence
                            .as_ref()
                            .is_some_and(|e| e.reason == hostmesh_crds::cause::reasons::HOST_LOST))
                {
                    ff.cause = Some(attribution.cause);
                    ff.evidence = Some(attribution.evidence);
                }
                return;
            }
        };
        let s = &root.status;
        let reason = describe(root.rank, s, self.program());
        self.first_failure = Some(FirstFailure {
            rank: root.rank,
            host: root.rank / self.per_host.max(1),
            time: MicroTime(incidents::micro(root.at)),
            state: s.state,
            reason: reason.clone(),
            exit_code: s.exit_code,
            signal: s.signal,
            stderr_tail: s
                .stderr_tail
                .as_deref()
                .map(|t| hostmesh_crds::procmesh::tail(t, procmesh::MAX_STDERR_TAIL)),
            stderr_head: s
                .stderr_head
                .as_deref()
                .map(|t| hostmesh_crds::procmesh::head(t, procmesh::MAX_STDERR_HEAD).to_string()),
            oom_killed: root.oom_killed,
            command: Some(super::exit::command_line(
                &self.input.pm.spec.command,
                &self.input.pm.spec.args,
                procmesh::MAX_COMMAND,
            )),
            cause: Some(attribution.cause),
            evidence: Some(attribution.evidence),
        });
        self.out.events.push(PlannedEvent {
            severity: Severity::Warning,
            reason: "ProcFailed",
            note: if replaces {
                format!("{reason} (the root cause: it failed first, its report came later)")
            } else {
                reason
            },
        });
    }

    /// Restarts the failed ranks (or the gang) once the backoff since the
    /// last restart has passed; until then, says when.
    fn restart_after_backoff(&mut self, failed: &[Rank], needed: u32, summary: String) {
        let input = self.input;
        let delay = if self.restarts == 0 || needed == 0 {
            Duration::ZERO
        } else {
            backoff_delay(
                input.timings.backoff,
                Duration::from_secs(300),
                self.restarts - 1,
            )
        };
        let next = self
            .last_restart
            .as_ref()
            .map_or(input.now, |t| t.0 + sd(delay));
        if next > input.now {
            let left = Duration::try_from(next.duration_since(input.now)).unwrap_or_default();
            self.out.requeue_after = Some(left);
            self.progressing = Some((
                "BackoffWaiting",
                format!("{summary}; restarting in {}s", left.as_secs()),
            ));
            return;
        }
        let gang = input.pm.spec.restart_policy.policy == RestartMode::Gang;
        // `restartPolicy.scope`: the slices the failed ranks belong to.
        let scope = input.pm.spec.restart_policy.scope.as_deref();
        let widened = crate::controllers::shared::scope::widen(&input.shape, failed, scope);
        let failed: &[Rank] = if gang { failed } else { &widened };
        let summary = match scope {
            Some(dim) if !gang && widened.len() > 1 => {
                let mut named: Vec<String> = failed
                    .iter()
                    .map(|r| crate::controllers::shared::scope::describe(&input.shape, *r, dim))
                    .collect();
                named.dedup();
                format!(
                    "{summary}; restarting the ranks of {} (scope {dim})",
                    named.join("; ")
                )
            }
            _ => summary,
        };
        if gang && needed == 0 {
            // Not counted: every rank's own incarnation moves, the gang
            // base (the restart count) stays.
            for r in 0..self.total {
                let next_inc = self.inc.get(r) + 1;
                self.inc.per_rank.insert(r, next_inc);
            }
        } else if gang {
            self.restarts += 1;
            self.inc.base = self.restarts;
            let restarts = self.restarts;
            self.inc.per_rank.retain(|_, v| *v > restarts);
        } else {
            self.restarts += needed;
            for r in failed {
                let next_inc = self.inc.get(*r) + 1;
                self.inc.per_rank.insert(*r, next_inc);
            }
        }
        self.last_restart = Some(self.now_t.clone());
        let action = if gang {
            IncidentAction::RestartGang
        } else {
            IncidentAction::RestartRanks
        };
        let done = incidents::on_decision(&mut self.incidents, action, input.now);
        self.out.recovery.extend(done);
        self.spawn_time = Some(self.now_t.clone());
        let restarting = RankStatus {
            state: ProcState::Starting,
            reason: Some("Restarting".into()),
            ..Default::default()
        };
        if gang {
            self.ranks.iter_mut().for_each(|s| *s = restarting.clone());
        } else {
            for r in failed {
                if let Some(s) = self.ranks.get_mut(*r) {
                    *s = restarting.clone();
                }
            }
        }
        self.out.events.push(PlannedEvent {
            severity: Severity::Warning,
            reason: "Restarting",
            note: format!(
                "{summary}; restart {} of {}",
                self.restarts, input.pm.spec.restart_policy.max_restarts
            ),
        });
        self.progressing = Some(("Restarting", summary));
    }

    /// Whose fault `f` was (invariant 13).
    fn attribution(&self, f: &Failure) -> Attribution {
        let host = f.rank / self.per_host.max(1);
        crate::controllers::shared::cause::of_rank(
            &f.status,
            f.oom_killed,
            self.input.host_causes.get(&host),
        )
    }

    /// What the World attributed to the host of `rank`, if anything.
    fn host_cause(&self, rank: Rank) -> Option<&'a hostmesh_crds::cause::Attribution> {
        self.input.host_causes.get(&(rank / self.per_host.max(1)))
    }

    /// Every failed rank's cause (invariant 13).
    fn attribute_ranks(&mut self) {
        let per_host = self.per_host.max(1);
        for (rank, s) in self.ranks.iter_mut().enumerate() {
            s.cause = s.state.is_failure().then(|| {
                crate::controllers::shared::cause::of_rank(
                    s,
                    false,
                    self.input.host_causes.get(&(rank / per_host)),
                )
                .cause
            });
        }
    }

    fn count(&self, f: impl Fn(ProcState) -> bool) -> Rank {
        self.ranks.iter().filter(|s| f(s.state)).count()
    }

    /// The mesh's phase from its ranks and the decision.
    fn phase(&self) -> ProcMeshPhase {
        let running = self.count(|s| s == ProcState::Running);
        let succeeded = self.count(|s| s == ProcState::Succeeded);
        let total = self.total;
        if self.failure_reason.is_some() {
            ProcMeshPhase::Failed
        } else if self.success.is_some()
            || (self.was_terminal && self.prev.phase == Some(ProcMeshPhase::Succeeded))
            || (total > 0 && succeeded == total)
        {
            ProcMeshPhase::Succeeded
        } else if total > 0
            && running + succeeded + self.ignored + self.count(|s| s == ProcState::Unreachable)
                == total
            && running > 0
        {
            // Unreachable ranks may still run (invariant 5): Running, not
            // Ready.
            ProcMeshPhase::Running
        } else if self.spawn_time.is_some() {
            ProcMeshPhase::Spawning
        } else {
            ProcMeshPhase::Pending
        }
    }

    /// What to do (spawn, stop, requeue), the conditions and the status.
    fn finish(mut self, phase: ProcMeshPhase) -> Plan {
        let input = self.input;
        let total = self.total;
        if phase == ProcMeshPhase::Running && self.prev.phase != Some(ProcMeshPhase::Running) {
            self.out.events.push(PlannedEvent {
                severity: Severity::Normal,
                reason: "Running",
                note: format!("all {total} procs running"),
            });
        }
        if phase == ProcMeshPhase::Failed && !self.was_terminal {
            self.out.stop = true;
        }
        if !matches!(
            phase,
            ProcMeshPhase::Failed | ProcMeshPhase::Succeeded | ProcMeshPhase::Pending
        ) && self.world_running
        {
            self.out.spawn = Some(self.inc.clone());
        }
        self.schedule_requeue(phase);
        let conds = self.conditions(phase);
        let incarnations = if self.inc.per_rank.values().any(|v| *v > self.inc.base) {
            runs::encode((0..total).map(|r| Incarnation {
                incarnation: self.inc.get(r),
            }))
        } else {
            Vec::new()
        };
        if !self.was_terminal {
            let hosts_ready = self.world_running && input.lost_hosts.is_empty();
            let all_running =
                phase == ProcMeshPhase::Running && self.count(|s| s == ProcState::Unreachable) == 0;
            let done =
                incidents::on_progress(&mut self.incidents, hosts_ready, all_running, input.now);
            self.out.recovery.extend(done);
        }
        let running = self.count(|s| s == ProcState::Running);
        let succeeded = self.count(|s| s == ProcState::Succeeded);
        let failed = self.count(|s| s.is_failure());
        let collateral = self.ranks.iter().filter(|s| s.caused_by.is_some()).count();
        self.attribute_ranks();
        let (rank_runs, truncated) = procmesh::rank_runs(self.ranks);
        let prev_actors = if self.same_gen {
            self.prev.actor_failures.as_slice()
        } else {
            &[]
        };
        let (actor_failures, fresh) = super::actors::merge(prev_actors, input.states);
        for f in fresh {
            self.out.events.push(PlannedEvent {
                severity: Severity::Warning,
                reason: "ActorFailed",
                note: format!(
                    "actor {} on rank {} (host {}) failed: {}",
                    f.actor, f.rank, f.host, f.reason
                ),
            });
        }
        self.out.status = ProcMeshStatus {
            phase: Some(phase),
            extent: Some(input.extent.clone()),
            running,
            succeeded,
            failed,
            collateral,
            ranks: rank_runs,
            ranks_truncated: truncated,
            first_failure: self.first_failure,
            actor_failures,
            incidents: self.incidents,
            conditions: conds,
            observed_generation: self.generation,
            restarts: self.restarts,
            last_restart_time: self.last_restart,
            incarnations,
            stopping_since: None,
            spawn_time: self.spawn_time,
            start_time: self.start_time,
            rule_fired: self.rule_fired,
        };
        self.out
    }

    /// Look again when the next rank times out, and soon while an agent
    /// has not reported (its Snapshot need not name this mesh, so it may
    /// not trigger us).
    fn schedule_requeue(&mut self, phase: ProcMeshPhase) {
        let now = self.input.now;
        if phase == ProcMeshPhase::Spawning {
            // A rank being replaced times out `stopTimeout` after its host.
            let stop = sd(self.input.timings.stop_timeout);
            let left = (0..self.input.hosts)
                .filter_map(|h| self.deadline(h))
                .flat_map(|d| [d, d + stop])
                .filter(|d| *d > now)
                .min()
                .and_then(|d| Duration::try_from(d.duration_since(now)).ok())
                .map(|l| l + Duration::from_millis(100));
            if let Some(l) = left {
                self.out.requeue_after = Some(self.out.requeue_after.map_or(l, |d| d.min(l)));
            }
        }
        if self.world_running
            && !self.was_terminal
            && (0..self.input.hosts).any(|h| self.unheard(h))
        {
            let soon = Duration::from_secs(1);
            self.out.requeue_after = Some(self.out.requeue_after.map_or(soon, |d| d.min(soon)));
        }
    }

    /// Ready, Progressing, Degraded and Failed.
    fn conditions(&self, phase: ProcMeshPhase) -> Vec<Condition> {
        let running = self.count(|s| s == ProcState::Running);
        let succeeded = self.count(|s| s == ProcState::Succeeded);
        let failed = self.count(|s| s.is_failure());
        let total = self.total;
        let mut conds = self.prev.conditions.clone();
        let set = |c: &mut Vec<_>, t: &str, s: bool, r: &str, m: &str| {
            conditions::set(c, t, s, r, m, self.generation, &self.now_t)
        };
        let unreachable = self.count(|s| s == ProcState::Unreachable);
        let mut counts =
            format!("{running}/{total} running, {succeeded} succeeded, {failed} failed");
        if unreachable > 0 {
            counts.push_str(&format!(
                ", {unreachable} unreachable (their host's agent is silent; they may still be running and are not restarted unless the World evicts the host)"
            ));
        }
        let ready_reason = match phase {
            _ if unreachable > 0 && self.failure_reason.is_none() => "RanksUnreachable",
            ProcMeshPhase::Running => "AllProcsRunning",
            ProcMeshPhase::Succeeded => "Succeeded",
            ProcMeshPhase::Pending if !self.world_running => "WaitingForWorld",
            _ => "ProcsNotRunning",
        };
        let ready_msg = if ready_reason == "WaitingForWorld" {
            format!("World {} is not Running yet", self.input.pm.spec.world)
        } else if let Some(why) = &self.success {
            format!("{why}; {counts}")
        } else {
            counts.clone()
        };
        set(
            &mut conds,
            READY,
            phase == ProcMeshPhase::Running && unreachable == 0,
            ready_reason,
            &ready_msg,
        );
        match (&self.progressing, phase) {
            (Some((r, m)), _) => set(&mut conds, PROGRESSING, true, r, m),
            (None, ProcMeshPhase::Spawning) => {
                set(&mut conds, PROGRESSING, true, "Spawning", &counts)
            }
            (None, _) => set(&mut conds, PROGRESSING, false, "Stable", ""),
        }
        // Degraded tells whether some ranks are down: restarting, or down
        // for good next to Failed (never "NoFailures" beside Failed=True).
        match (&self.failure_reason, self.retrying) {
            (Some(_), _) => set(&mut conds, DEGRADED, true, "ProcsFailed", &counts),
            (None, true) => set(&mut conds, DEGRADED, true, "Restarting", &counts),
            (None, false) if unreachable > 0 => {
                set(&mut conds, DEGRADED, true, "RanksUnreachable", &counts)
            }
            (None, false) => set(&mut conds, DEGRADED, false, "NoFailures", ""),
        }
        match &self.failure_reason {
            Some(why) => set(&mut conds, FAILED, true, &self.failure_kind, why),
            None => set(&mut conds, FAILED, false, "NotFailed", ""),
        }
        if !self.input.pm.spec.depends_on.is_empty() && self.start_time.is_some() {
            set(
                &mut conds,
                conditions::WAITING,
                false,
                "DependenciesMet",
                "the dependencies were met",
            );
        }
        conds
    }
}

#[cfg(test)]
mod cause_tests;
#[cfg(test)]
mod tests;
