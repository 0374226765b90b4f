//! Whose fault a failure was: `cause` (`Infrastructure`, `User`,
//! `Unknown`) and the `evidence` it was read from, carried by every
//! `firstFailure` (ProcMesh and World), incident, failed rank and troubled
//! host (docs/api.md, "Failure cause").
//!
//! Invariants:
//! 1. A cause is never guessed: `Infrastructure` and `User` each name the
//!    fact they were read from in `evidence` (its `reason` a fixed label
//!    from [`reasons`], its `message` the words); where no fact says
//!    whose fault it was (a SIGKILL from outside, a spawn timeout, a
//!    stall) the cause is `Unknown`.
//! 2. Infrastructure evidence wins over user evidence on the same
//!    failure: a proc that exits 1 with a traceback on a host whose device
//!    is Unhealthy is `Infrastructure` (the device failed first; the
//!    traceback is its symptom).
//! 3. Evidence is bounded: its message is cut to [`MAX_EVIDENCE`] bytes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most bytes of an evidence message.
pub const MAX_EVIDENCE: usize = 256;

/// Whose fault a failure was.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum FailureCause {
    /// The platform failed the workload: its node NotReady or lost, its host
    /// pod evicted, preempted or deleted from outside, a device reported
    /// Unhealthy, the hostmesh agent crashed or killed.
    Infrastructure,
    /// The workload failed by itself: a non-zero exit, a signal it raised
    /// (SIGSEGV, SIGABRT, ...), a Python traceback, its memory limit.
    User,
    /// Nothing says whose fault it was (a SIGKILL from outside, a spawn
    /// timeout, a stall).
    Unknown,
}

impl FailureCause {
    /// The cause as written in status and in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureCause::Infrastructure => "Infrastructure",
            FailureCause::User => "User",
            FailureCause::Unknown => "Unknown",
        }
    }

    /// Every cause, in a fixed order (metric labels are pre-registered).
    pub const ALL: [FailureCause; 3] = [
        FailureCause::Infrastructure,
        FailureCause::User,
        FailureCause::Unknown,
    ];
}

/// The fact a cause was read from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Evidence {
    /// A fixed label (one of [`reasons`]): what a failure rule or a
    /// dashboard matches on.
    pub reason: String,
    /// What happened, in words (at most [`MAX_EVIDENCE`] bytes).
    pub message: String,
}

/// A cause with its evidence (invariant 1).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Attribution {
    /// Whose fault.
    pub cause: FailureCause,
    /// Why we say so.
    pub evidence: Evidence,
}

impl Attribution {
    /// `cause` because of `reason` (a label of [`reasons`]): `message`,
    /// bounded (invariant 3).
    pub fn new(cause: FailureCause, reason: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        Attribution {
            cause,
            evidence: Evidence {
                reason: reason.to_string(),
                message: crate::procmesh::head(&message, MAX_EVIDENCE).to_string(),
            },
        }
    }

    /// An infrastructure failure.
    pub fn infrastructure(reason: &str, message: impl Into<String>) -> Self {
        Self::new(FailureCause::Infrastructure, reason, message)
    }

    /// A user failure.
    pub fn user(reason: &str, message: impl Into<String>) -> Self {
        Self::new(FailureCause::User, reason, message)
    }

    /// No fact says whose fault.
    pub fn unknown(reason: &str, message: impl Into<String>) -> Self {
        Self::new(FailureCause::Unknown, reason, message)
    }

    /// The better supported of two attributions of one failure: an
    /// infrastructure one over anything (invariant 2), then a user one over
    /// an unknown one; `self` on a tie.
    pub fn or(self, other: Option<Attribution>) -> Attribution {
        let rank = |c: FailureCause| match c {
            FailureCause::Infrastructure => 2,
            FailureCause::User => 1,
            FailureCause::Unknown => 0,
        };
        match other {
            Some(o) if rank(o.cause) > rank(self.cause) => o,
            _ => self,
        }
    }
}

/// The evidence labels (`evidence.reason`).
pub mod reasons {
    /// The host's agent stopped answering (it crashed or was killed, its
    /// node is NotReady or lost, or the network is cut).
    pub const AGENT_UNREACHABLE: &str = "AgentUnreachable";
    /// The host container (the hostmesh agent) ended: crashed or killed.
    pub const AGENT_EXITED: &str = "AgentExited";
    /// The host pod was deleted by someone other than hostmesh.
    pub const POD_DELETED: &str = "PodDeleted";
    /// The host pod was evicted (node pressure, the Eviction API, a drain).
    pub const EVICTED: &str = "Evicted";
    /// The host pod was preempted by the scheduler.
    pub const PREEMPTED: &str = "Preempted";
    /// The host pod's node is NotReady, unreachable or gone.
    pub const NODE_LOST: &str = "NodeLost";
    /// A device allocated to the host container is reported Unhealthy
    /// (`allocatedResourcesStatus`).
    pub const DEVICE_UNHEALTHY: &str = "DeviceUnhealthy";
    /// The host pod failed for a reason of its own (a failed init
    /// container, an image that cannot start the agent).
    pub const POD_FAILED: &str = "PodFailed";
    /// The proc's host was lost (one of the above, on the World).
    pub const HOST_LOST: &str = "HostLost";
    /// A Python traceback in the proc's stderr.
    pub const PYTHON_TRACEBACK: &str = "PythonTraceback";
    /// The proc exited with a non-zero code.
    pub const NON_ZERO_EXIT: &str = "NonZeroExit";
    /// The proc raised a signal itself (SIGSEGV, SIGABRT, SIGBUS, ...).
    pub const SIGNAL_RAISED: &str = "SignalRaised";
    /// The proc (or its container) went over its memory limit.
    pub const OOM_KILLED: &str = "OOMKilled";
    /// The command could not be started (not found, not executable).
    pub const START_FAILED: &str = "StartFailed";
    /// The proc was killed by a signal sent from outside, by someone
    /// unknown.
    pub const KILLED: &str = "Killed";
    /// The proc did not start within `spawnTimeout`.
    pub const SPAWN_TIMEOUT: &str = "SpawnTimeout";
    /// The proc stalled (`stallTimeout`).
    pub const STALLED: &str = "Stalled";
    /// Nothing more is known.
    pub const UNKNOWN: &str = "Unknown";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infrastructure_evidence_wins_then_user_then_unknown() {
        let user = Attribution::user(reasons::PYTHON_TRACEBACK, "ValueError: x");
        let infra = Attribution::infrastructure(reasons::DEVICE_UNHEALTHY, "gpu-0");
        let unknown = Attribution::unknown(reasons::KILLED, "SIGKILL");
        assert_eq!(user.clone().or(Some(infra.clone())), infra);
        assert_eq!(infra.clone().or(Some(user.clone())), infra);
        assert_eq!(unknown.clone().or(Some(user.clone())), user);
        assert_eq!(user.clone().or(Some(unknown)), user);
        assert_eq!(user.clone().or(None), user);
    }

    #[test]
    fn evidence_is_bounded() {
        let a = Attribution::user(reasons::NON_ZERO_EXIT, "é".repeat(1000));
        assert!(a.evidence.message.len() <= MAX_EVIDENCE);
        let json = serde_json::to_value(&a.evidence).unwrap();
        assert_eq!(json["reason"], "NonZeroExit");
        assert_eq!(
            serde_json::to_value(FailureCause::Infrastructure).unwrap(),
            "Infrastructure"
        );
    }
}
