//! `failurePolicy.rules`: what a host's failure does, from its pod, as
//! plain data.
//!
//! Invariants:
//! 1. The first rule that matches decides; a rule matches when each kind
//!    of condition it gives holds (the host container's exit: an exit code
//!    or a signal it lists; one of its reasons; one of its causes, whose
//!    fault the host's failure was (`cause.rs`); its stderr pattern over
//!    the log tail the kubelet kept).
//! 2. Reasons are read from the pod as a real cluster reports them:
//!    `Evicted` and `DeadlineExceeded` from `status.reason`, `OOMKilled`
//!    from the host container's end, `Preempted` and `NodeLost` from the
//!    `DisruptionTarget` condition (`PreemptionByScheduler`,
//!    `DeletionByTaintManager`; `NodeLost` also from a Ready condition
//!    `Unknown` or the old `status.reason`), `Unschedulable` from
//!    `PodScheduled=False` (matched once it lasted `unschedulableFor`),
//!    `NoHeartbeat` from an Expired host, `Deleted` from a pod someone else
//!    deleted.
//! 3. No rule matching leaves the default to the plan: a failed or
//!    expired host is restarted (counted); anything else is waited for.

use std::time::Duration;

use hostmesh_crds::World;
use hostmesh_crds::world::{HostAction, HostReason, HostRule, HostState, HostStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::observe::failed_container;

/// Default `unschedulableFor`.
pub const DEFAULT_UNSCHEDULABLE_FOR: Duration = Duration::from_secs(300);

/// What a rule decided for a host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The rule's action.
    pub action: HostAction,
    /// The rule (`name` or `rules[i]`).
    pub rule: String,
}

impl Decision {
    /// `(rule NAME: ACTION)` for messages.
    pub fn note(&self) -> String {
        format!(" (rule {}: {:?})", self.rule, self.action)
    }
}

/// What is known of one host's failure.
pub struct HostFacts<'a> {
    /// Its state and reason as observed.
    pub host: &'a HostStatus,
    /// Its pod, if any.
    pub pod: Option<&'a Pod>,
    /// Its pod was deleted by someone else than the operator.
    pub deleted: bool,
    /// Whose fault its failure is, where the World attributes it.
    pub cause: Option<hostmesh_crds::cause::FailureCause>,
}

/// A World's rules, their patterns compiled once per plan.
pub struct HostRules<'a> {
    rules: Vec<(&'a HostRule, Option<regex::Regex>, Duration)>,
}

impl<'a> HostRules<'a> {
    /// Compiles `world`'s rules (what validation refuses matches nothing).
    pub fn new(world: &'a World) -> Self {
        let rules = world
            .spec
            .failure_policy
            .rules
            .iter()
            .map(|r| {
                let re = r
                    .stderr_pattern
                    .as_deref()
                    .and_then(|p| hostmesh_crds::validate::progress_regex(p).ok());
                let unschedulable_for = r
                    .unschedulable_for
                    .as_deref()
                    .and_then(|t| hostmesh_crds::duration::parse("unschedulableFor", t).ok())
                    .unwrap_or(DEFAULT_UNSCHEDULABLE_FOR);
                (r, re, unschedulable_for)
            })
            .collect();
        HostRules { rules }
    }

    /// Whether there are no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether a rule may act on a host that is still starting
    /// (`Unschedulable`) or whose pod is going (`Deleted`, `Preempted`,
    /// `NodeLost`): such hosts are then looked at, not only failed ones.
    pub fn watches(&self, reason: HostReason) -> bool {
        self.rules
            .iter()
            .any(|(r, _, _)| r.reasons.contains(&reason))
    }

    /// Whether a rule may act on an infrastructure failure (a pod deleted
    /// from outside, preempted, its node lost: hosts whose pod is going).
    pub fn watches_infrastructure(&self) -> bool {
        self.rules.iter().any(|(r, _, _)| {
            r.causes
                .contains(&hostmesh_crds::cause::FailureCause::Infrastructure)
        })
    }

    /// The first rule matching `facts` at `now` (invariant 1), if any.
    pub fn decide(&self, facts: &HostFacts<'_>, now: Timestamp) -> Option<Decision> {
        let reasons = reasons(facts);
        let container = facts.pod.and_then(failed_container);
        for (i, (rule, re, unschedulable_for)) in self.rules.iter().enumerate() {
            let exit_given = !rule.exit_codes.is_empty() || !rule.signals.is_empty();
            let exit_ok = !exit_given
                || container.as_ref().is_some_and(|c| {
                    rule.exit_codes.contains(&c.exit_code)
                        || c.signal.is_some_and(|g| rule.signals.contains(&g))
                });
            let reason_ok = rule.reasons.is_empty()
                || rule.reasons.iter().any(|want| {
                    reasons.iter().any(|(have, since)| {
                        have == want
                            && (*have != HostReason::Unschedulable
                                || since.is_some_and(|t| {
                                    t + SignedDuration::try_from(*unschedulable_for)
                                        .unwrap_or(SignedDuration::MAX)
                                        <= now
                                }))
                    })
                });
            let pattern_ok = match (&rule.stderr_pattern, re) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(_), Some(re)) => container
                    .as_ref()
                    .and_then(|c| c.message.as_deref())
                    .is_some_and(|m| re.is_match(m)),
            };
            let cause_ok =
                rule.causes.is_empty() || facts.cause.is_some_and(|c| rule.causes.contains(&c));
            if exit_ok && reason_ok && cause_ok && pattern_ok {
                return Some(Decision {
                    action: rule.action,
                    rule: rule.name.clone().unwrap_or_else(|| format!("rules[{i}]")),
                });
            }
        }
        None
    }

    /// When an `Unschedulable` rule would match a host unschedulable since
    /// `since`: the plan looks again then.
    pub fn unschedulable_due(&self, since: Timestamp) -> Option<Timestamp> {
        self.rules
            .iter()
            .filter(|(r, _, _)| r.reasons.contains(&HostReason::Unschedulable))
            .map(|(_, _, d)| since + SignedDuration::try_from(*d).unwrap_or(SignedDuration::MAX))
            .min()
    }
}

/// The pod-level reasons of a host's state (invariant 2), each with since
/// when it holds where that matters (`Unschedulable`).
pub fn reasons(facts: &HostFacts<'_>) -> Vec<(HostReason, Option<Timestamp>)> {
    let mut out = Vec::new();
    if facts.host.state == HostState::Expired {
        out.push((HostReason::NoHeartbeat, None));
    }
    if facts.deleted {
        out.push((HostReason::Deleted, None));
    }
    let Some(pod) = facts.pod else {
        return out;
    };
    let status = pod.status.as_ref();
    match status.and_then(|s| s.reason.as_deref()) {
        Some("Evicted") => out.push((HostReason::Evicted, None)),
        Some("DeadlineExceeded") => out.push((HostReason::DeadlineExceeded, None)),
        Some("NodeLost") => out.push((HostReason::NodeLost, None)),
        Some("Preempting") => out.push((HostReason::Preempted, None)),
        _ => {}
    }
    if failed_container(pod).is_some_and(|c| c.reason.as_deref() == Some("OOMKilled")) {
        out.push((HostReason::OOMKilled, None));
    }
    for c in status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
    {
        match (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()) {
            ("DisruptionTarget", "True", Some("PreemptionByScheduler")) => {
                out.push((HostReason::Preempted, None))
            }
            ("DisruptionTarget", "True", Some("DeletionByTaintManager"))
            | ("Ready", "Unknown", _) => out.push((HostReason::NodeLost, None)),
            ("PodScheduled", "False", Some("Unschedulable")) => out.push((
                HostReason::Unschedulable,
                c.last_transition_time.as_ref().map(|t| t.0),
            )),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::world::observe::tests::mk_pod;

    fn world(rules: &str) -> World {
        serde_saphyr::from_str(&format!(
            "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {{name: w}}\n\
             spec: {{hosts: 2, failurePolicy: {{rules: [{rules}]}}, template: {{spec: {{containers: [{{name: host, image: x}}]}}}}}}\n"
        ))
        .unwrap()
    }

    fn failed() -> HostStatus {
        HostStatus {
            state: HostState::Failed,
            reason: None,
            cause: None,
            evidence: None,
        }
    }

    #[test]
    fn pod_reasons_exits_and_logs_select_the_rule() {
        let w = world(
            "{name: infra, action: RestartWithoutCounting, reasons: [Evicted, NodeLost, Preempted, Deleted]},\
             {name: oom, action: FailWorld, reasons: [OOMKilled]},\
             {action: Ignore, exitCodes: [3], stderrPattern: 'nothing to do'},\
             {name: stuck, action: FailWorld, reasons: [Unschedulable], unschedulableFor: 1m}",
        );
        let rules = HostRules::new(&w);
        let now = Timestamp::from_second(1000).unwrap();
        let decide = |pod: &Pod, host: &HostStatus, deleted: bool| {
            rules.decide(
                &HostFacts {
                    host,
                    pod: Some(pod),
                    deleted,
                    cause: None,
                },
                now,
            )
        };
        let evicted = mk_pod("  phase: Failed\n  reason: Evicted\n");
        let d = decide(&evicted, &failed(), false).unwrap();
        assert_eq!(
            (d.action, d.rule.as_str()),
            (HostAction::RestartWithoutCounting, "infra")
        );
        let oom = mk_pod(
            "  phase: Failed\n  containerStatuses: [{name: host, image: x, imageID: '', ready: false, restartCount: 0, state: {terminated: {exitCode: 137, reason: OOMKilled}}}]\n",
        );
        assert_eq!(decide(&oom, &failed(), false).unwrap().rule, "oom");
        let done = mk_pod(
            "  phase: Failed\n  containerStatuses: [{name: host, image: x, imageID: '', ready: false, restartCount: 0, state: {terminated: {exitCode: 3, reason: Error, message: 'nothing to do here'}}}]\n",
        );
        let d = decide(&done, &failed(), false).unwrap();
        assert_eq!(
            (d.action, d.rule.as_str()),
            (HostAction::Ignore, "rules[2]")
        );
        // Code 3 without the log line matches no rule: the plan's default.
        let other = mk_pod(
            "  phase: Failed\n  containerStatuses: [{name: host, image: x, imageID: '', ready: false, restartCount: 0, state: {terminated: {exitCode: 3, reason: Error, message: 'boom'}}}]\n",
        );
        assert_eq!(decide(&other, &failed(), false), None);
        let running = mk_pod("  phase: Running\n");
        let terminating = HostStatus {
            state: HostState::Terminating,
            reason: None,
            cause: None,
            evidence: None,
        };
        assert_eq!(decide(&running, &terminating, true).unwrap().rule, "infra");
        let preempted = mk_pod(
            "  phase: Running\n  conditions: [{type: DisruptionTarget, status: 'True', reason: PreemptionByScheduler}]\n",
        );
        assert_eq!(
            decide(&preempted, &terminating, false).unwrap().rule,
            "infra"
        );
        // Unschedulable only matches once it lasted unschedulableFor.
        let pending = |since: &str| {
            mk_pod(&format!(
                "  phase: Pending\n  conditions: [{{type: PodScheduled, status: 'False', reason: Unschedulable, lastTransitionTime: '{since}'}}]\n"
            ))
        };
        let starting = HostStatus {
            state: HostState::Starting,
            reason: Some("Unschedulable".into()),
            cause: None,
            evidence: None,
        };
        assert_eq!(
            decide(&pending("1970-01-01T00:16:00Z"), &starting, false),
            None
        );
        assert_eq!(
            decide(&pending("1970-01-01T00:15:00Z"), &starting, false)
                .unwrap()
                .rule,
            "stuck"
        );
        assert_eq!(
            rules.unschedulable_due(Timestamp::from_second(960).unwrap()),
            Some(Timestamp::from_second(1020).unwrap())
        );
        assert!(rules.watches(HostReason::Deleted));
        assert!(!rules.watches(HostReason::NoHeartbeat));
    }

    /// A rule on `causes` matches whose fault the host's failure was.
    #[test]
    fn causes_select_the_rule() {
        use hostmesh_crds::cause::FailureCause;
        let w = world(
            "{name: infra, action: RestartWithoutCounting, causes: [Infrastructure]},\
             {name: mine, action: FailWorld, causes: [User], exitCodes: [3]}",
        );
        let rules = HostRules::new(&w);
        let now = Timestamp::from_second(1000).unwrap();
        let exited = mk_pod(
            "  phase: Failed\n  containerStatuses: [{name: host, image: x, imageID: '', ready: false, restartCount: 0, state: {terminated: {exitCode: 3, reason: Error}}}]\n",
        );
        let decide = |cause| {
            rules
                .decide(
                    &HostFacts {
                        host: &failed(),
                        pod: Some(&exited),
                        deleted: false,
                        cause,
                    },
                    now,
                )
                .map(|d| d.rule)
        };
        assert_eq!(
            decide(Some(FailureCause::Infrastructure)).as_deref(),
            Some("infra")
        );
        assert_eq!(decide(Some(FailureCause::User)).as_deref(), Some("mine"));
        assert_eq!(decide(Some(FailureCause::Unknown)), None);
        assert_eq!(decide(None), None, "nothing attributed: no cause rule");
    }
}
