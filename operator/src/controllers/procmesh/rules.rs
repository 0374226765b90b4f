//! `restartPolicy.rules`: what a rank's failure does, as plain data.
//!
//! Invariants:
//! 1. The first rule that matches decides; a rule matches when each kind
//!    of condition it gives holds (its exit: an exit code or a signal it
//!    lists; one of its reasons; one of its causes, whose fault the failure
//!    was as status names it (`shared::cause`); its stderr pattern).
//! 2. With no rule matching, exit codes 126 and 127 are permanent (`Fail`)
//!    and every other failure is restarted, counted (`Restart`), as before
//!    rules had more than exit codes and signals.
//! 3. `Retry` is `Restart`: manifests written for the first rules keep
//!    their meaning.

use hostmesh_crds::ProcMesh;
use hostmesh_crds::cause::Attribution;
use hostmesh_crds::procmesh::{ExitAction, ExitRule, ProcState, RankReason, RankStatus};

/// Exit codes that are permanent failures unless a rule says otherwise
/// (cannot execute, command not found).
pub const PERMANENT_EXIT_CODES: &[i32] = &[126, 127];

/// What a rank's failure does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The action (`Retry` is read as `Restart`).
    pub action: ExitAction,
    /// The rule that decided (`name` or `rules[i]`); `None`: no rule
    /// matched (invariant 2).
    pub rule: Option<String>,
}

impl Decision {
    /// `(rule NAME: ACTION)` for messages, empty without a rule.
    pub fn note(&self) -> String {
        match &self.rule {
            Some(r) => format!(" (rule {r}: {:?})", self.action),
            None => String::new(),
        }
    }
}

/// A ProcMesh's rules, their patterns compiled once per plan.
pub struct Rules<'a> {
    rules: Vec<(&'a ExitRule, Option<regex::Regex>)>,
}

impl<'a> Rules<'a> {
    /// Compiles `pm`'s rules (a pattern that does not compile, which
    /// validation refuses, matches nothing).
    pub fn new(pm: &'a ProcMesh) -> Self {
        let rules = pm
            .spec
            .restart_policy
            .rules
            .iter()
            .map(|r| {
                let re = r
                    .stderr_pattern
                    .as_deref()
                    .and_then(|p| hostmesh_crds::validate::progress_regex(p).ok());
                (r, re)
            })
            .collect();
        Rules { rules }
    }

    /// What the failure `s` does (invariants 1-3); `host` is what its
    /// host's attribution says, if anything (`status.hosts[].cause`).
    pub fn decide(&self, s: &RankStatus, host: Option<&Attribution>) -> Decision {
        let cause = crate::controllers::shared::cause::of_rank(s, false, host).cause;
        for (i, (rule, re)) in self.rules.iter().enumerate() {
            let cause_ok = rule.causes.is_empty() || rule.causes.contains(&cause);
            if cause_ok && matches(rule, re.as_ref(), s) {
                let action = match rule.action {
                    ExitAction::Retry => ExitAction::Restart,
                    a => a,
                };
                return Decision {
                    action,
                    rule: Some(rule.name.clone().unwrap_or_else(|| format!("rules[{i}]"))),
                };
            }
        }
        let permanent = s.state == ProcState::Failed
            && s.exit_code
                .is_some_and(|c| PERMANENT_EXIT_CODES.contains(&c));
        Decision {
            action: if permanent {
                ExitAction::Fail
            } else {
                ExitAction::Restart
            },
            rule: None,
        }
    }
}

fn matches(rule: &ExitRule, re: Option<&regex::Regex>, s: &RankStatus) -> bool {
    let exit_given = !rule.exit_codes.is_empty() || !rule.signals.is_empty();
    let exit_ok = !exit_given
        || s.exit_code.is_some_and(|c| rule.exit_codes.contains(&c))
        || s.signal.is_some_and(|g| rule.signals.contains(&g));
    let reason_ok = rule.reasons.is_empty()
        || rule.reasons.iter().any(|r| match r {
            RankReason::OOMKilled => s.reason.as_deref() == Some(super::exit::OOM_KILLED),
            RankReason::HostLost => s.state == ProcState::Lost,
            RankReason::Timeout => s.state == ProcState::Timeout,
            RankReason::Stalled => s.state == ProcState::Stalled,
        });
    let pattern_ok = match (&rule.stderr_pattern, re) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(_), Some(re)) => [&s.stderr_head, &s.stderr_tail]
            .into_iter()
            .flatten()
            .any(|t| re.is_match(t)),
    };
    exit_ok && reason_ok && pattern_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::procmesh::desired::tests::mk_pm;

    fn failed(code: i32, stderr: &str) -> RankStatus {
        RankStatus {
            state: ProcState::Failed,
            exit_code: Some(code),
            stderr_tail: Some(stderr.into()),
            ..Default::default()
        }
    }

    #[test]
    fn first_match_wins_and_every_condition_of_a_rule_must_hold() {
        let pm = mk_pm(
            ", restartPolicy: {rules: [\
             {name: nccl, action: RestartWithoutCounting, stderrPattern: 'NCCL (error|timeout)'},\
             {action: Fail, exitCodes: [3], stderrPattern: 'bad input'},\
             {action: Retry, exitCodes: [3]},\
             {name: lost, action: RestartWithoutCounting, reasons: [HostLost]},\
             {action: Ignore, signals: [15]},\
             {action: Fail, reasons: [OOMKilled]}]}",
        );
        let rules = Rules::new(&pm);
        let d = rules.decide(&failed(1, "... NCCL timeout on rank 3"), None);
        assert_eq!(
            (d.action, d.rule.as_deref()),
            (ExitAction::RestartWithoutCounting, Some("nccl"))
        );
        assert_eq!(d.note(), " (rule nccl: RestartWithoutCounting)");
        let d = rules.decide(&failed(3, "bad input file"), None);
        assert_eq!(
            (d.action, d.rule.as_deref()),
            (ExitAction::Fail, Some("rules[1]"))
        );
        // Exit code 3 without the pattern: the next rule; Retry reads as
        // Restart.
        let d = rules.decide(&failed(3, "other"), None);
        assert_eq!(
            (d.action, d.rule.as_deref()),
            (ExitAction::Restart, Some("rules[2]"))
        );
        let lost = RankStatus {
            state: ProcState::Lost,
            ..Default::default()
        };
        assert_eq!(rules.decide(&lost, None).rule.as_deref(), Some("lost"));
        let killed = RankStatus {
            state: ProcState::Killed,
            signal: Some(15),
            ..Default::default()
        };
        assert_eq!(rules.decide(&killed, None).action, ExitAction::Ignore);
        let oom = RankStatus {
            state: ProcState::Killed,
            signal: Some(9),
            reason: Some(crate::controllers::procmesh::exit::OOM_KILLED.into()),
            ..Default::default()
        };
        assert_eq!(rules.decide(&oom, None).action, ExitAction::Fail);
        // No match: 127 is permanent, anything else is restarted.
        let d = rules.decide(&failed(127, ""), None);
        assert_eq!((d.action, d.rule), (ExitAction::Fail, None));
        let d = rules.decide(&failed(1, ""), None);
        assert_eq!((d.action, d.rule), (ExitAction::Restart, None));
    }

    /// A rule on `causes` matches whose fault the failure was, as status
    /// says it: the rank's own end, or its host's infrastructure evidence.
    #[test]
    fn causes_match_whose_fault_it_was() {
        use hostmesh_crds::cause::FailureCause;
        let pm = mk_pm(
            ", restartPolicy: {rules: [\
             {name: infra, action: RestartWithoutCounting, causes: [Infrastructure]},\
             {name: user-nccl, action: Fail, causes: [User], stderrPattern: NCCL}]}",
        );
        let rules = Rules::new(&pm);
        assert_eq!(
            pm.spec.restart_policy.rules[0].causes,
            [FailureCause::Infrastructure]
        );
        // Its own exit is the user's: not the infrastructure rule.
        let d = rules.decide(&failed(1, "NCCL error"), None);
        assert_eq!(d.rule.as_deref(), Some("user-nccl"));
        let d = rules.decide(&failed(1, "boom"), None);
        assert_eq!((d.action, d.rule), (ExitAction::Restart, None));
        // The same exit on a host whose device went Unhealthy: the
        // infrastructure's.
        let device =
            Attribution::infrastructure("DeviceUnhealthy", "nvidia.com/gpu=GPU-1 Unhealthy");
        let d = rules.decide(&failed(1, "NCCL error"), Some(&device));
        assert_eq!(
            (d.action, d.rule.as_deref()),
            (ExitAction::RestartWithoutCounting, Some("infra"))
        );
        // A lost host is the infrastructure's, evidence or not.
        let lost = RankStatus {
            state: ProcState::Lost,
            ..Default::default()
        };
        assert_eq!(rules.decide(&lost, None).rule.as_deref(), Some("infra"));
        // A SIGKILL from outside is nobody's known fault: no rule.
        let killed = RankStatus {
            state: ProcState::Killed,
            signal: Some(9),
            ..Default::default()
        };
        assert_eq!(rules.decide(&killed, None).rule, None);
    }
}
