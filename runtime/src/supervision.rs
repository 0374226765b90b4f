//! Supervision: actor statuses, supervision events, undeliverable messages,
//! and the mapping from a process's status to an actor status.
//!
//! Invariants:
//! 1. A handler that returns an error or panics stops its actor with
//!    `Failed(reason)`; the panic message is part of the reason.
//! 2. When an actor stops, one [`SupervisionEvent`] goes to its parent (for
//!    children), else to its owner port (actors spawned on a mesh), else,
//!    for failures, to the proc's supervision sink.
//! 3. A parent that does not handle a child's failure fails itself, with the
//!    child's event as the cause: failures climb until handled or until they
//!    reach the proc's sink.
//! 4. An undeliverable message returns to its sender: to the waiting caller
//!    for a call, else to the sending actor's `handle_undeliverable`, whose
//!    default fails the actor (so it becomes a supervision event); undeliverables
//!    for senders that are gone, or for the proc itself, go to the sink.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::id::{ActorId, PortId};

/// The state of an actor.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ActorStatus {
    /// Running (started and not stopped).
    Running,
    /// Stopped without failing, with the reason.
    Stopped(String),
    /// Failed, with the reason.
    Failed(String),
}

impl ActorStatus {
    /// Whether this is a failure.
    pub fn is_failure(&self) -> bool {
        matches!(self, ActorStatus::Failed(_))
    }

    /// Whether the actor is no longer running.
    pub fn is_terminal(&self) -> bool {
        !matches!(self, ActorStatus::Running)
    }
}

impl fmt::Display for ActorStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ActorStatus::Running => f.write_str("running"),
            ActorStatus::Stopped(r) => write!(f, "stopped: {r}"),
            ActorStatus::Failed(r) => write!(f, "failed: {r}"),
        }
    }
}

/// An actor changed to a terminal status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SupervisionEvent {
    /// The actor whose status changed.
    pub actor: ActorId,
    /// Its new status.
    pub status: ActorStatus,
    /// The event that caused this one (a child's unhandled failure).
    pub cause: Option<Box<SupervisionEvent>>,
}

impl SupervisionEvent {
    /// The innermost cause (the root failure).
    pub fn root_cause(&self) -> &SupervisionEvent {
        let mut e = self;
        while let Some(c) = &e.cause {
            e = c;
        }
        e
    }
}

impl fmt::Display for SupervisionEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.actor, self.status)?;
        if let Some(c) = &self.cause {
            write!(f, " (caused by {c})")?;
        }
        Ok(())
    }
}

/// A message that could not be delivered, returned to its sender.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Undeliverable {
    /// Where the message was going.
    pub dest: PortId,
    /// Why it could not be delivered.
    pub reason: String,
}

impl fmt::Display for Undeliverable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "message to {} undeliverable: {}", self.dest, self.reason)
    }
}

/// The status of a proc's process, as the reference's mapping sees it (the
/// host agent's richer `hostmesh_agent::protocol::ProcStatus` converts into it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProcStatus {
    /// Spawned, not yet ready.
    Starting,
    /// Running and ready.
    Ready,
    /// Asked to stop (TERM sent), not yet exited.
    Stopping,
    /// Exited with a code.
    Stopped {
        /// The exit code.
        exit_code: i32,
        /// The last lines of its standard error.
        stderr_tail: Vec<String>,
    },
    /// Killed by a signal.
    Killed {
        /// The signal number.
        signal: i32,
    },
    /// Could not be run or failed otherwise.
    Failed {
        /// What went wrong.
        reason: String,
    },
    /// Did not report in time.
    Timeout,
}

impl ProcStatus {
    /// The status of a process that exited.
    pub fn from_exit(status: std::process::ExitStatus, stderr_tail: Vec<String>) -> ProcStatus {
        use std::os::unix::process::ExitStatusExt as _;
        match (status.code(), status.signal()) {
            (Some(exit_code), _) => ProcStatus::Stopped {
                exit_code,
                stderr_tail,
            },
            (None, Some(signal)) => ProcStatus::Killed { signal },
            (None, None) => ProcStatus::Failed {
                reason: format!("process ended with unknown status {status}"),
            },
        }
    }
}

/// The status of the actors of a proc given its process's status (the
/// reference's mapping): exit 0 is a clean stop, a non-zero exit or a signal
/// is a failure, stopping is not a failure, and no status at all counts as
/// stopped. Starting and ready processes keep their actors running.
pub fn actor_status_for_proc(status: Option<&ProcStatus>) -> ActorStatus {
    match status {
        None => ActorStatus::Stopped("no status received from the process".into()),
        Some(ProcStatus::Starting | ProcStatus::Ready) => ActorStatus::Running,
        Some(ProcStatus::Stopping) => ActorStatus::Stopped("process is stopping".into()),
        Some(ProcStatus::Stopped { exit_code: 0, .. }) => {
            ActorStatus::Stopped("process exited cleanly".into())
        }
        Some(ProcStatus::Stopped { exit_code, .. }) => {
            ActorStatus::Failed(format!("process exited with non-zero code {exit_code}"))
        }
        Some(ProcStatus::Killed { signal }) => {
            ActorStatus::Failed(format!("process was killed by signal {signal}"))
        }
        Some(ProcStatus::Failed { reason }) => {
            ActorStatus::Failed(format!("process failed: {reason}"))
        }
        Some(ProcStatus::Timeout) => ActorStatus::Failed("process did not report in time".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_zero_is_a_clean_stop() {
        let s = actor_status_for_proc(Some(&ProcStatus::Stopped {
            exit_code: 0,
            stderr_tail: vec![],
        }));
        assert!(
            matches!(s, ActorStatus::Stopped(ref m) if m.contains("cleanly")),
            "{s:?}"
        );
    }

    #[test]
    fn non_zero_exit_is_a_failure() {
        let s = actor_status_for_proc(Some(&ProcStatus::Stopped {
            exit_code: 3,
            stderr_tail: vec!["boom".into()],
        }));
        assert!(
            matches!(s, ActorStatus::Failed(ref m) if m.contains("code 3")),
            "{s:?}"
        );
    }

    #[test]
    fn signal_is_a_failure() {
        let s = actor_status_for_proc(Some(&ProcStatus::Killed { signal: 9 }));
        assert!(
            matches!(s, ActorStatus::Failed(ref m) if m.contains("signal 9")),
            "{s:?}"
        );
    }

    #[test]
    fn stopping_is_not_a_failure() {
        let s = actor_status_for_proc(Some(&ProcStatus::Stopping));
        assert!(
            matches!(s, ActorStatus::Stopped(ref m) if m.contains("stopping")),
            "{s:?}"
        );
    }

    #[test]
    fn no_status_is_stopped() {
        assert!(matches!(
            actor_status_for_proc(None),
            ActorStatus::Stopped(_)
        ));
    }

    #[test]
    fn failed_and_timeout_are_failures_and_live_is_running() {
        let f = ProcStatus::Failed {
            reason: "no such file".into(),
        };
        assert!(actor_status_for_proc(Some(&f)).is_failure());
        assert!(actor_status_for_proc(Some(&ProcStatus::Timeout)).is_failure());
        assert_eq!(
            actor_status_for_proc(Some(&ProcStatus::Ready)),
            ActorStatus::Running
        );
    }

    #[test]
    fn real_exit_statuses_map() {
        let out = std::process::Command::new("sh")
            .args(["-c", "exit 4"])
            .status()
            .unwrap();
        assert_eq!(
            ProcStatus::from_exit(out, vec![]),
            ProcStatus::Stopped {
                exit_code: 4,
                stderr_tail: vec![]
            }
        );
        let out = std::process::Command::new("sh")
            .args(["-c", "kill -9 $$"])
            .status()
            .unwrap();
        assert_eq!(
            ProcStatus::from_exit(out, vec![]),
            ProcStatus::Killed { signal: 9 }
        );
    }

    #[test]
    fn root_cause_walks_the_chain() {
        let a: ActorId = "unbound:1/p/a[0]".parse().unwrap();
        let b: ActorId = "unbound:1/p/b[0]".parse().unwrap();
        let inner = SupervisionEvent {
            actor: b,
            status: ActorStatus::Failed("x".into()),
            cause: None,
        };
        let outer = SupervisionEvent {
            actor: a,
            status: ActorStatus::Failed("child failed".into()),
            cause: Some(Box::new(inner.clone())),
        };
        assert_eq!(outer.root_cause(), &inner);
        assert!(outer.to_string().contains("caused by"));
    }
}
