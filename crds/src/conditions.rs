//! Conditions in the `metav1.Condition` shape, keyed by `type`.
//!
//! Invariants:
//! 1. At most one condition per type; [`set`] replaces in place and keeps the
//!    order of first appearance.
//! 2. `lastTransitionTime` changes only when `status` changes, so writing a
//!    recomputed status whole does not churn it.
//! 3. Messages are truncated to the API's 32 KiB limit, ending with
//!    [`crate::procmesh::TRUNCATED`]; reasons are the CamelCase words the
//!    API accepts.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The whole gang (World) or every proc (ProcMesh) is up.
pub const READY: &str = "Ready";
/// The controller is creating, restarting or rolling something.
pub const PROGRESSING: &str = "Progressing";
/// Something failed and is being handled (or waits on its backoff).
pub const DEGRADED: &str = "Degraded";
/// Terminal failure; the message says why.
pub const FAILED: &str = "Failed";
/// A World that finishes (`finishWhen`) finished successfully: every
/// ProcMesh on it succeeded (Job's condition name, so `kubectl wait
/// --for=condition=Complete` works).
pub const COMPLETE: &str = "Complete";
/// The API server refused to create a host pod (admission: PodSecurity,
/// quota, a webhook); the message is the server's, as on a ReplicaSet.
pub const REPLICA_FAILURE: &str = "ReplicaFailure";
/// The operator could not write the World's NetworkPolicy (it writes one
/// per World with `--network-policy`, the chart's `networkPolicy.enabled`):
/// True with the API server's refusal (`NetworkPolicyForbidden`,
/// `NetworkPolicyRefused`, ...); the World runs on without it. False once
/// a later write succeeds or the operator no longer writes policies.
pub const NETWORK_POLICY_FAILURE: &str = "NetworkPolicyFailure";
/// The World is suspended (`spec.suspend`): its host pods are deleted and
/// its ProcMeshes wait, as a suspended Job's pods are.
pub const SUSPENDED: &str = "Suspended";
/// Reasons of the World's `Suspended` condition while Kueue holds it
/// (`kueue.x-k8s.io/queue-name`): waiting for admission, Kueue's API not
/// served, and, after an eviction, Kueue's own `Evicted` reason (`Preempted`,
/// `PodsReadyTimeout`, `Deactivated`, ...).
pub const AWAITING_ADMISSION: &str = "AwaitingAdmission";
/// See [`AWAITING_ADMISSION`].
pub const KUEUE_NOT_INSTALLED: &str = "KueueNotInstalled";

/// A ProcMesh with `dependsOn` waits for its dependencies (True, the
/// message naming them) or no longer does (False, `DependenciesMet`).
pub const WAITING: &str = "Waiting";

/// With `spec.scheduling.gang`: True once every host pod is bound to a
/// node; False while the gang waits on its scheduler, or when the
/// provider's API is missing (the message names it).
pub const GANG_SCHEDULED: &str = "GangScheduled";

const MAX_MESSAGE: usize = 32 * 1024;

/// Sets condition `type_` to `status` with `reason`/`message`, keeping the
/// last transition time when the status is unchanged (invariant 2).
pub fn set(
    conds: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let message = crate::procmesh::bounded(message, MAX_MESSAGE).into_owned();
    let new = |ltt: Time| Condition {
        type_: type_.to_string(),
        status: status.clone(),
        reason: reason.to_string(),
        message: message.clone(),
        observed_generation: generation,
        last_transition_time: ltt,
    };
    match conds.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let ltt = if c.status == status {
                c.last_transition_time.clone()
            } else {
                now.clone()
            };
            *c = new(ltt);
        }
        None => conds.push(new(now.clone())),
    }
}

/// The condition of type `type_`.
pub fn get<'a>(conds: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conds.iter().find(|c| c.type_ == type_)
}

/// Whether condition `type_` is present and True.
pub fn is_true(conds: &[Condition], type_: &str) -> bool {
    get(conds, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn t(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_kept_when_status_unchanged() {
        let mut c = Vec::new();
        set(
            &mut c,
            READY,
            false,
            "Creating",
            "0/2 hosts ready",
            Some(1),
            &t(10),
        );
        set(
            &mut c,
            READY,
            false,
            "Creating",
            "1/2 hosts ready",
            Some(1),
            &t(20),
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].last_transition_time, t(10));
        assert_eq!(c[0].message, "1/2 hosts ready");
        set(&mut c, READY, true, "AllHostsReady", "2/2", Some(2), &t(30));
        assert_eq!(c[0].last_transition_time, t(30));
        assert_eq!(c[0].observed_generation, Some(2));
        assert!(is_true(&c, READY));
        set(&mut c, FAILED, false, "NoFailure", "", Some(2), &t(30));
        assert_eq!(c.len(), 2);
        assert!(!is_true(&c, FAILED));
        assert!(!is_true(&c, DEGRADED));
    }

    #[test]
    fn long_messages_are_truncated_on_char_boundary() {
        let mut c = Vec::new();
        let msg = "é".repeat(MAX_MESSAGE);
        set(&mut c, FAILED, true, "X", &msg, None, &t(1));
        assert!(c[0].message.len() <= MAX_MESSAGE);
    }
}
