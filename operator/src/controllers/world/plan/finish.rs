//! How a World ends (plan invariant 9): `finishWhen: ProcMeshesFinished`
//! read from its ProcMeshes, and the status, pod deletions, Events and
//! TTL of a World that finished (`Succeeded`, or `Failed` for any reason).

use std::time::Duration;

use hostmesh_crds::conditions::{self, COMPLETE, DEGRADED, FAILED, PROGRESSING, READY};
use hostmesh_crds::runs;
use hostmesh_crds::world::{FinishWhen, HostState, WorldPhase, WorldStatus};

use k8s_openapi::jiff::SignedDuration;

use super::{Plan, Working, sd};
use crate::controllers::shared::{Severity, event};

/// Most ProcMeshes named in a message.
const NAMED: usize = 5;

/// `a, b, c and 4 more`.
fn names<'n>(list: impl ExactSizeIterator<Item = &'n str>) -> String {
    let n = list.len();
    let mut shown: Vec<&str> = list.take(NAMED).collect();
    shown.sort_unstable();
    let mut out = shown.join(", ");
    if n > NAMED {
        out.push_str(&format!(" and {} more", n - NAMED));
    }
    out
}

impl Working<'_, '_> {
    /// Invariant 10: the run's clocks, and the deadlines they arm.
    pub(super) fn deadlines(&mut self) {
        let now = self.input.now;
        let start = self.start_time.get_or_insert_with(|| self.now_t.clone()).0;
        if self.ready() == self.n {
            self.ready_time.get_or_insert_with(|| self.now_t.clone());
        }
        let spec = &self.input.world.spec;
        let due = |secs: i64| start.checked_add(SignedDuration::from_secs(secs)).ok();
        if let Some(secs) = spec.active_deadline_seconds
            && let Some(at) = due(secs)
        {
            if at <= now {
                let why = format!(
                    "the World ran for {secs}s since it started, its activeDeadlineSeconds"
                );
                self.out
                    .events
                    .push(event(Severity::Warning, "DeadlineExceeded", why.clone()));
                self.failure = Some(("DeadlineExceeded".into(), why));
                return;
            }
            self.requeue_until(at);
        }
        if self.ready_time.is_some() {
            return;
        }
        if let Some(secs) = spec.ready_deadline_seconds
            && let Some(at) = due(secs)
        {
            if at > now {
                self.requeue_until(at);
                return;
            }
            let not_ready: Vec<String> = self
                .hosts
                .iter()
                .enumerate()
                .filter(|(_, h)| h.state != HostState::Ready)
                .take(NAMED)
                .map(|(r, h)| match &h.reason {
                    Some(why) => format!("host {r} {:?} ({why})", h.state),
                    None => format!("host {r} {:?}", h.state),
                })
                .collect();
            let why = format!(
                "not Ready {secs}s after it started (readyDeadlineSeconds): {}/{} hosts ready; {}",
                self.ready(),
                self.n,
                not_ready.join(", ")
            );
            self.out.events.push(event(
                Severity::Warning,
                "ReadyDeadlineExceeded",
                why.clone(),
            ));
            self.failure = Some(("ReadyDeadlineExceeded".into(), why));
        }
    }

    fn requeue_until(&mut self, at: k8s_openapi::jiff::Timestamp) {
        if let Ok(left) = Duration::try_from(at.duration_since(self.input.now)) {
            self.requeue_within(left + Duration::from_millis(50));
        }
    }

    /// `finishWhen: ProcMeshesFinished`: the World has ProcMeshes and every
    /// one of them ended; it succeeds when all succeeded, else it fails
    /// naming the ProcMeshes that failed.
    pub(super) fn meshes_finished(&mut self) {
        let world = self.input.world;
        let m = self.input.meshes;
        if world.spec.finish_when != FinishWhen::ProcMeshesFinished
            || m.total == 0
            || m.succeeded.len() + m.failed.len() < m.total
        {
            return;
        }
        if m.failed.is_empty() {
            self.succeeded = true;
            return;
        }
        let what: Vec<String> = m
            .failed
            .iter()
            .take(NAMED)
            .map(|(name, why)| format!("ProcMesh {name} failed: {why}"))
            .collect();
        let mut why = what.join("; ");
        if m.failed.len() > NAMED {
            why.push_str(&format!("; {} more failed", m.failed.len() - NAMED));
        }
        self.out
            .events
            .push(event(Severity::Warning, "WorldFailed", why.clone()));
        self.failure = Some(("ProcMeshesFailed".into(), why));
    }

    /// The plan of a finished World (invariant 9): its host pods go
    /// (unless it failed and `keepFailedHosts`), nothing is created,
    /// `finishedAt` is kept from the pass that finished it, and the World
    /// is deleted `ttlSecondsAfterFinished` after that.
    pub(super) fn ended(mut self, phase: WorldPhase) -> Plan {
        let input = self.input;
        let spec = &input.world.spec;
        let newly = !(self.was_succeeded || self.was_failed);
        let keep = phase == WorldPhase::Failed && spec.keep_failed_hosts;
        let mut deleting = 0usize;
        if !keep {
            for p in input.pods.values() {
                if p.metadata.deletion_timestamp.is_none()
                    && let Some(name) = &p.metadata.name
                {
                    deleting += 1;
                    if !self.out.delete.contains(name) {
                        self.out.delete.push(name.clone());
                    }
                }
            }
        }
        self.out.create.clear();
        let m = input.meshes;
        let complete_msg = if self.was_succeeded {
            conditions::get(&self.prev.conditions, COMPLETE)
                .map(|c| c.message.clone())
                .unwrap_or_default()
        } else {
            format!(
                "all {} ProcMeshes succeeded: {}",
                m.succeeded.len(),
                names(m.succeeded.iter().map(String::as_str))
            )
        };
        if newly {
            let pods = match (keep, deleting) {
                (true, _) => "keeping the host pods (spec.keepFailedHosts)".to_string(),
                (false, 0) => "no host pod left".to_string(),
                (false, n) => format!("deleting {n} host pods"),
            };
            match phase {
                WorldPhase::Succeeded => self.out.events.push(event(
                    Severity::Normal,
                    "Completed",
                    format!("{complete_msg}: {pods}"),
                )),
                _ => self.out.events.push(event(
                    Severity::Normal,
                    "Finished",
                    format!("the World failed: {pods}"),
                )),
            }
        }
        let finished_at = match (&self.prev.finished_at, newly) {
            (Some(t), false) => t.clone(),
            _ => self.now_t.clone(),
        };
        if let Some(ttl) = spec.ttl_seconds_after_finished {
            let ttl = Duration::from_secs(u64::try_from(ttl).unwrap_or(0));
            let at = finished_at.0 + sd(ttl);
            if at <= input.now {
                self.out.delete_world = true;
                self.out.events.push(event(
                    Severity::Normal,
                    "TTLExpired",
                    format!(
                        "ttlSecondsAfterFinished ({}s) passed since the World finished: deleting it",
                        ttl.as_secs()
                    ),
                ));
            } else if let Ok(left) = Duration::try_from(at.duration_since(input.now)) {
                self.requeue_within(left);
            }
        }
        // The hosts go: look again soon (the Workload's Finished report
        // reads this status on the next pass).
        if newly {
            self.requeue_within(Duration::from_millis(500));
        }
        let n = self.n;
        let ready = self.ready();
        let remaining = input
            .pods
            .values()
            .filter(|p| !keep || p.metadata.deletion_timestamp.is_some())
            .count();
        let hosts_note = match (keep, remaining) {
            (true, _) => "its host pods are kept (spec.keepFailedHosts)".to_string(),
            (false, 0) => "its host pods are deleted".to_string(),
            (false, left) => format!("{left} host pods still terminating"),
        };
        let mut conds = self.prev.conditions.clone();
        let set = |c: &mut Vec<_>, t: &str, s: bool, r: &str, msg: &str| {
            conditions::set(c, t, s, r, msg, self.generation, &self.now_t)
        };
        let (ready_msg, failure) = match phase {
            WorldPhase::Succeeded => (format!("the World succeeded; {hosts_note}"), None),
            _ => {
                let (reason, why) = self
                    .failure
                    .clone()
                    .unwrap_or_else(|| ("Failed".into(), "the World failed".into()));
                (
                    format!("the World failed; {hosts_note}"),
                    Some((reason, why)),
                )
            }
        };
        set(&mut conds, READY, false, "Finished", &ready_msg);
        set(&mut conds, PROGRESSING, false, "Finished", &ready_msg);
        set(&mut conds, DEGRADED, false, "Finished", "");
        match &failure {
            None => {
                set(
                    &mut conds,
                    COMPLETE,
                    true,
                    "ProcMeshesSucceeded",
                    &complete_msg,
                );
                set(&mut conds, FAILED, false, "NotFailed", "");
            }
            Some((reason, why)) => set(&mut conds, FAILED, true, reason, why),
        }
        let first_failure = self.first_failure();
        self.mark_deleting();
        // Hosts whose pods are gone read Pending: say why.
        let hosts = std::mem::take(&mut self.hosts)
            .into_iter()
            .map(|mut h| {
                if h.state == HostState::Pending && h.reason.is_none() {
                    h.reason = Some("WorldFinished".into());
                }
                h
            })
            .collect::<Vec<_>>();
        let (host_runs, truncated) = runs::encode_bounded(hosts, runs::MAX_RUNS);
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
            last_restart_time: self.last_restart.clone(),
            degraded_since: None,
            attempt: self.attempt,
            first_failure,
            finished_at: Some(finished_at),
            start_time: self.start_time.clone(),
            ready_time: self.ready_time.clone(),
            rule_fired: self.rule_fired.clone(),
            stale_hosts: 0,
            monarch: None,
        };
        self.out
    }
}
