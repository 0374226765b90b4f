//! The ProcMesh's decisions as a pure function: per-rank state from the
//! agents' reports, spawn timeouts, restarts per `restartPolicy` (in place,
//! by bumping a rank's spec incarnation), the first failure, and the whole
//! new status.
//!
//! Invariants:
//! 1. Agents are the source of truth: a rank's incarnation is the highest of
//!    what its agent reports and the gang base (`status.restarts` under
//!    Gang), so a restarted operator neither restarts nor duplicates procs.
//! 2. `firstFailure` is set once per generation and never overwritten.
//! 3. Restarts stop at `maxRestarts` (total); a permanent failure (a rule
//!    says Fail, or exit code 126/127 by default) or `Never` fails at once.
//! 4. Ranks that are not running `spawnTimeout` after their spawn (counted
//!    while the World is Running) are Timeout, a failure like any other. The
//!    clock of a rank starts no earlier than this operator's first report
//!    from its host's agent: a rank not heard from yet (a new leader before
//!    the agent's Snapshot) is unknown and keeps its recorded state; it is
//!    never timed out from the original spawn time.
//! 5. A live proc whose host is gone (Expired, Failed, Terminating) is Lost,
//!    a failure; after its restart it is Starting until the new host runs it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use hostmesh_crds::conditions::{self, DEGRADED, FAILED, PROGRESSING, READY};
use hostmesh_crds::procmesh::{
    self, ExitAction, FirstFailure, Incarnation, ProcMeshPhase, ProcMeshStatus, ProcState,
    RankStatus, RestartMode,
};
use hostmesh_crds::validate::ProcMeshTimings;
use hostmesh_crds::world::WorldPhase;
use hostmesh_crds::{ProcMesh, runs};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::controllers::shared::{PlannedEvent, Severity, backoff_delay};
use crate::hub::ProcObs;

/// Exit codes that are permanent failures unless a rule says otherwise
/// (cannot execute, command not found).
pub const PERMANENT_EXIT_CODES: &[i32] = &[126, 127];

/// Everything the plan is computed from.
pub struct PlanInput<'a> {
    /// The ProcMesh with its current status.
    pub pm: &'a ProcMesh,
    /// Parsed timings.
    pub timings: ProcMeshTimings,
    /// Phase of its World.
    pub world_phase: Option<WorldPhase>,
    /// Hosts of the World.
    pub hosts: u64,
    /// The full extent (World shape then perHost), for display.
    pub extent: String,
    /// Agents' reports by rank.
    pub states: &'a BTreeMap<u64, ProcObs>,
    /// Hosts that are gone (Expired, Failed, Terminating), with their state.
    pub lost_hosts: &'a BTreeMap<u64, String>,
    /// Hosts whose agent has reported its procs to this operator, and since
    /// when (invariant 4).
    pub reported: &'a BTreeMap<u64, Timestamp>,
    /// Now.
    pub now: Timestamp,
}

/// Desired incarnation per rank: a base plus per-rank overrides.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Incarnations {
    /// Incarnation of every rank without an override.
    pub base: u32,
    /// Per-rank incarnations.
    pub per_rank: HashMap<u64, u32>,
}

impl Incarnations {
    /// Incarnation of `rank`.
    pub fn get(&self, rank: u64) -> u32 {
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
}

fn sd(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

/// Whether a failure is worth retrying (invariant 3).
pub fn retryable(pm: &ProcMesh, s: &RankStatus) -> bool {
    for rule in &pm.spec.restart_policy.rules {
        let hit = s.exit_code.is_some_and(|c| rule.exit_codes.contains(&c))
            || s.signal.is_some_and(|g| rule.signals.contains(&g));
        if hit {
            return rule.action == ExitAction::Retry;
        }
    }
    !(s.state == ProcState::Failed
        && s.exit_code
            .is_some_and(|c| PERMANENT_EXIT_CODES.contains(&c)))
}

fn describe(rank: u64, s: &RankStatus) -> String {
    let what = match (s.state, s.exit_code, s.signal) {
        (_, _, Some(sig)) => format!("killed by signal {sig}"),
        (ProcState::Timeout, _, _) => "did not start within spawnTimeout".to_string(),
        (ProcState::Lost, _, _) => "its host was lost".to_string(),
        (_, Some(code), _) => format!("exited with code {code}"),
        (st, None, None) => format!("{st:?}"),
    };
    match &s.reason {
        Some(r) if !r.is_empty() => format!("rank {rank} {what}: {r}"),
        _ => format!("rank {rank} {what}"),
    }
}

/// Computes the plan (invariants 1-4).
pub fn plan(input: &PlanInput<'_>) -> Plan {
    let pm = input.pm;
    let generation = pm.metadata.generation;
    let prev = pm.status.clone().unwrap_or_default();
    let same_gen = prev.observed_generation == generation;
    let now_t = Time(input.now);
    let per_host = pm.spec.per_host_shape().num_ranks();
    let total = input.hosts.saturating_mul(per_host);
    let policy = &pm.spec.restart_policy;
    let mut out = Plan::default();
    let mut restarts = if same_gen { prev.restarts } else { 0 };
    let mut last_restart = if same_gen {
        prev.last_restart_time.clone()
    } else {
        None
    };
    let mut spawn_time = prev.spawn_time.clone();
    let mut first_failure = if same_gen {
        prev.first_failure.clone()
    } else {
        None
    };
    let was_terminal = same_gen
        && matches!(
            prev.phase,
            Some(ProcMeshPhase::Failed | ProcMeshPhase::Succeeded)
        );
    let world_running = input.world_phase == Some(WorldPhase::Running);

    // Incarnations: gang base, then what agents report (invariant 1).
    let base = if policy.policy == RestartMode::Gang {
        restarts
    } else {
        0
    };
    let mut inc = Incarnations {
        base,
        per_rank: HashMap::new(),
    };
    if same_gen {
        for run in &prev.incarnations {
            if run.value.incarnation > base {
                for r in run.start..run.end().min(total) {
                    inc.per_rank.insert(r, run.value.incarnation);
                }
            }
        }
    }
    for (rank, obs) in input.states {
        if obs.incarnation > inc.get(*rank) {
            inc.per_rank.insert(*rank, obs.incarnation);
        }
    }

    if spawn_time.is_none() && world_running && !was_terminal {
        spawn_time = Some(now_t.clone());
    }
    // The spawn clock only runs while the World is up, and for a rank only
    // once its agent has reported to this operator (invariant 4).
    let deadline = |spawn: Option<&Time>, host: u64| {
        let heard = input.reported.get(&host)?;
        Some(spawn?.0.max(*heard) + sd(input.timings.spawn_timeout))
    };
    let spawned = spawn_time.clone();
    let timed_out = |host: u64| {
        world_running && deadline(spawned.as_ref(), host).is_some_and(|d| d <= input.now)
    };
    let unheard = |host: u64| !input.reported.contains_key(&host);

    let mut ranks: Vec<RankStatus> = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    for rank in 0..total {
        let want = inc.get(rank);
        let host = rank / per_host.max(1);
        let s = match input.states.get(&rank) {
            Some(o)
                if o.incarnation >= want
                    && !o.state.is_failure()
                    && input.lost_hosts.contains_key(&o.host) =>
            {
                RankStatus {
                    state: ProcState::Lost,
                    reason: Some(format!("host {} is {}", o.host, input.lost_hosts[&o.host])),
                    ..Default::default()
                }
            }
            Some(o) if o.incarnation >= want => RankStatus {
                state: o.state,
                exit_code: o.exit_code,
                signal: o.signal,
                reason: o.reason.clone(),
                stderr_tail: o.stderr_tail.clone(),
            },
            Some(_) => RankStatus {
                state: ProcState::Starting,
                reason: Some("Restarting".into()),
                ..Default::default()
            },
            // Not heard from yet: what status last recorded stands.
            None if same_gen && unheard(host) && !prev.ranks.is_empty() => {
                runs::get(&prev.ranks, rank).cloned().unwrap_or(RankStatus {
                    state: ProcState::Starting,
                    ..Default::default()
                })
            }
            None if spawn_time.is_some() => RankStatus {
                state: ProcState::Starting,
                reason: unheard(host).then(|| format!("waiting for host {host}'s agent to report")),
                ..Default::default()
            },
            None => RankStatus::default(),
        };
        let s = if timed_out(host) && matches!(s.state, ProcState::Starting) && !was_terminal {
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
        };
        ranks.push(s);
    }

    let failed: Vec<u64> = (0..total)
        .filter(|r| ranks[*r as usize].state.is_failure())
        .collect();
    let mut failure_reason: Option<String> = None;
    let mut progressing: Option<(&str, String)> = None;
    let mut retrying = false;
    if was_terminal {
        failure_reason = (prev.phase == Some(ProcMeshPhase::Failed)).then(|| {
            conditions::get(&prev.conditions, FAILED)
                .map(|c| c.message.clone())
                .unwrap_or_default()
        });
    } else if !failed.is_empty() {
        let first = failed[0];
        if first_failure.is_none() {
            let s = &ranks[first as usize];
            first_failure = Some(FirstFailure {
                rank: first,
                host: first / per_host,
                time: now_t.clone(),
                state: s.state,
                reason: describe(first, s),
                exit_code: s.exit_code,
                signal: s.signal,
                stderr_tail: s
                    .stderr_tail
                    .as_deref()
                    .map(|t| hostmesh_crds::procmesh::tail(t, procmesh::MAX_STDERR_TAIL)),
            });
            out.events.push(PlannedEvent {
                severity: Severity::Warning,
                reason: "ProcFailed",
                note: describe(first, s),
            });
        }
        let summary = failed
            .iter()
            .take(3)
            .map(|r| describe(*r, &ranks[*r as usize]))
            .collect::<Vec<_>>()
            .join("; ");
        let permanent = failed.iter().find(|r| !retryable(pm, &ranks[**r as usize]));
        let needed = match policy.policy {
            RestartMode::Gang => 1,
            _ => failed.len() as u32,
        };
        if policy.policy == RestartMode::Never {
            failure_reason = Some(format!("{summary} (restartPolicy Never)"));
        } else if let Some(r) = permanent {
            failure_reason = Some(format!(
                "{} (permanent failure, not retried)",
                describe(*r, &ranks[*r as usize])
            ));
        } else if restarts.saturating_add(needed) > policy.max_restarts {
            failure_reason = Some(format!(
                "{summary}; restart limit {} reached",
                policy.max_restarts
            ));
        } else {
            retrying = true;
            let delay = if restarts == 0 {
                Duration::ZERO
            } else {
                backoff_delay(
                    input.timings.backoff,
                    Duration::from_secs(300),
                    restarts - 1,
                )
            };
            let next = last_restart.as_ref().map_or(input.now, |t| t.0 + sd(delay));
            if next > input.now {
                let left = Duration::try_from(next.duration_since(input.now)).unwrap_or_default();
                out.requeue_after = Some(left);
                progressing = Some((
                    "BackoffWaiting",
                    format!("{summary}; restarting in {}s", left.as_secs()),
                ));
            } else {
                match policy.policy {
                    RestartMode::Gang => {
                        restarts += 1;
                        inc.base = restarts;
                        inc.per_rank.retain(|_, v| *v > restarts);
                    }
                    _ => {
                        restarts += needed;
                        for r in &failed {
                            let next_inc = inc.get(*r) + 1;
                            inc.per_rank.insert(*r, next_inc);
                        }
                    }
                }
                last_restart = Some(now_t.clone());
                spawn_time = Some(now_t.clone());
                for r in &failed {
                    ranks[*r as usize] = RankStatus {
                        state: ProcState::Starting,
                        reason: Some("Restarting".into()),
                        ..Default::default()
                    };
                }
                if policy.policy == RestartMode::Gang {
                    for s in ranks.iter_mut() {
                        *s = RankStatus {
                            state: ProcState::Starting,
                            reason: Some("Restarting".into()),
                            ..Default::default()
                        };
                    }
                }
                out.events.push(PlannedEvent {
                    severity: Severity::Warning,
                    reason: "Restarting",
                    note: format!("{summary}; restart {restarts} of {}", policy.max_restarts),
                });
                progressing = Some(("Restarting", summary.clone()));
            }
        }
        if let Some(why) = &failure_reason {
            out.events.push(PlannedEvent {
                severity: Severity::Warning,
                reason: "GaveUp",
                note: why.clone(),
            });
        }
    }

    let count = |f: &dyn Fn(ProcState) -> bool| ranks.iter().filter(|s| f(s.state)).count() as u64;
    let running = count(&|s| s == ProcState::Running);
    let succeeded = count(&|s| s == ProcState::Succeeded);
    let failed_n = count(&|s| s.is_failure());
    let phase = if failure_reason.is_some() {
        ProcMeshPhase::Failed
    } else if total > 0 && succeeded == total {
        ProcMeshPhase::Succeeded
    } else if total > 0 && running + succeeded == total && running > 0 {
        ProcMeshPhase::Running
    } else if spawn_time.is_some() {
        ProcMeshPhase::Spawning
    } else {
        ProcMeshPhase::Pending
    };
    if phase == ProcMeshPhase::Running && prev.phase != Some(ProcMeshPhase::Running) {
        out.events.push(PlannedEvent {
            severity: Severity::Normal,
            reason: "Running",
            note: format!("all {total} procs running"),
        });
    }
    if phase == ProcMeshPhase::Failed && !was_terminal {
        out.stop = true;
    }
    if !matches!(
        phase,
        ProcMeshPhase::Failed | ProcMeshPhase::Succeeded | ProcMeshPhase::Pending
    ) && world_running
    {
        out.spawn = Some(inc.clone());
    }
    let incarnations = if inc.per_rank.values().any(|v| *v > inc.base) {
        runs::encode((0..total).map(|r| Incarnation {
            incarnation: inc.get(r),
        }))
    } else {
        Vec::new()
    };
    if phase == ProcMeshPhase::Spawning && out.requeue_after.is_none() {
        let left = (0..input.hosts)
            .filter_map(|h| deadline(spawn_time.as_ref(), h))
            .filter(|d| *d > input.now)
            .min()
            .and_then(|d| Duration::try_from(d.duration_since(input.now)).ok());
        out.requeue_after = left.map(|l| l + Duration::from_millis(100));
    }
    // A host whose agent has not reported yet: look again soon (its
    // Snapshot need not name this mesh, so it may not trigger us).
    if world_running && !was_terminal && (0..input.hosts).any(unheard) {
        let soon = Duration::from_secs(1);
        out.requeue_after = Some(out.requeue_after.map_or(soon, |d| d.min(soon)));
    }

    let mut conds = prev.conditions.clone();
    let set = |c: &mut Vec<_>, t: &str, s: bool, r: &str, m: &str| {
        conditions::set(c, t, s, r, m, generation, &now_t)
    };
    let counts = format!("{running}/{total} running, {succeeded} succeeded, {failed_n} failed");
    let ready_reason = match phase {
        ProcMeshPhase::Running => "AllProcsRunning",
        ProcMeshPhase::Pending if !world_running => "WaitingForWorld",
        _ => "ProcsNotRunning",
    };
    let ready_msg = if ready_reason == "WaitingForWorld" {
        format!("World {} is not Running yet", pm.spec.world)
    } else {
        counts.clone()
    };
    set(
        &mut conds,
        READY,
        phase == ProcMeshPhase::Running,
        ready_reason,
        &ready_msg,
    );
    match (&progressing, phase) {
        (Some((r, m)), _) => set(&mut conds, PROGRESSING, true, r, m),
        (None, ProcMeshPhase::Spawning) => set(&mut conds, PROGRESSING, true, "Spawning", &counts),
        (None, _) => set(&mut conds, PROGRESSING, false, "Stable", ""),
    }
    set(
        &mut conds,
        DEGRADED,
        retrying,
        if retrying { "Restarting" } else { "NoFailures" },
        if retrying { &counts } else { "" },
    );
    match &failure_reason {
        Some(why) => set(&mut conds, FAILED, true, "ProcsFailed", why),
        None => set(&mut conds, FAILED, false, "NotFailed", ""),
    }

    let (rank_runs, truncated) = procmesh::rank_runs(ranks);
    out.status = ProcMeshStatus {
        phase: Some(phase),
        extent: Some(input.extent.clone()),
        running,
        succeeded,
        failed: failed_n,
        ranks: rank_runs,
        ranks_truncated: truncated,
        first_failure,
        conditions: conds,
        observed_generation: generation,
        restarts,
        last_restart_time: last_restart,
        incarnations,
        stopping_since: None,
        spawn_time,
    };
    out
}

#[cfg(test)]
mod tests;
