//! Leader election with a `coordination.k8s.io/v1` Lease, so two or more
//! operator replicas are safe: exactly one leads (runs the controllers, see
//! `ops`), the others stand by and take over when the leader releases its
//! lease or the lease expires.
//!
//! The decision logic ([`decide`], [`should_step_down`]) is pure; [`LeaderElector`]
//! runs it in a loop against the API server.
//!
//! Invariants:
//! 1. A replica becomes leader only through a write that carried the
//!    resourceVersion it read (optimistic concurrency): of two racing
//!    candidates, the API server lets exactly one win (409 for the other).
//! 2. Expiry of another holder's lease is judged on this replica's monotonic
//!    clock, from the moment it last saw the lease record change, never from
//!    `renewTime` (clocks of two nodes may disagree).
//! 3. A leader that has not renewed for `renewDeadline` (< `leaseDuration`)
//!    publishes `is_leader = false` before any standby can consider the lease
//!    expired, and its controllers stop writing.
//! 4. On shutdown a leader releases the lease (empty holder, 1 s duration),
//!    so a standby takes over at its next retry instead of waiting a full
//!    `leaseDuration`.
//! 5. In a Pod (`POD_UID`), every write that makes or keeps this replica
//!    the holder also makes its Pod the Lease's one Pod owner (replacing the
//!    previous holder's; outside a Pod, dropping it), in the same update. So
//!    the garbage collector deletes the Lease once its holder's Pod is gone,
//!    also when the release of invariant 4 could not be written (on `helm
//!    uninstall` the chart's RBAC goes with the Pod), and never while a live
//!    holder's Pod owns it: a new holder re-points the owner before the old
//!    Pod goes, and the collector's delete carries the resourceVersion it
//!    judged.

mod config;
mod decide;
mod elector;
#[cfg(test)]
mod tests;

use tokio::sync::watch;

pub use config::{LeaderElectionArgs, LeaseConfig, parse_duration};
pub use decide::{
    Decision, LeaseRecord, OwnerPod, decide, next_owners, next_spec, should_step_down,
};
pub use elector::LeaderElector;

/// Errors from configuring leader election.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// A timing flag is inconsistent with another.
    #[error("invalid leader election timing: {0}")]
    Timing(String),
    /// A required setting is missing.
    #[error("leader election needs {field}: {fix}")]
    Missing {
        /// The flag that is missing.
        field: &'static str,
        /// How to provide it.
        fix: &'static str,
    },
}

/// This replica's role, as published on the role channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Has not yet read the Lease.
    Starting,
    /// Holds the Lease: controllers may write.
    Leader,
    /// Another replica (or nobody, while acquiring) holds the Lease; this
    /// replica keeps its caches warm and is ready to take over.
    Standby {
        /// The current holder, when known.
        holder: Option<String>,
    },
}

/// Handle to a running election: the `is_leader` and role channels.
#[derive(Debug, Clone)]
pub struct LeaderHandle {
    pub(super) is_leader: watch::Receiver<bool>,
    pub(super) role: watch::Receiver<Role>,
}

impl LeaderHandle {
    /// A handle for a replica that runs without election: always leader.
    pub fn always_leader() -> Self {
        let (_tx, is_leader) = watch::channel(true);
        let (_rtx, role) = watch::channel(Role::Leader);
        Self { is_leader, role }
    }

    /// Whether this replica may write now.
    pub fn is_leader(&self) -> bool {
        *self.is_leader.borrow()
    }

    /// A channel that changes when leadership is gained or lost.
    pub fn is_leader_channel(&self) -> watch::Receiver<bool> {
        self.is_leader.clone()
    }

    /// A channel of the detailed role (for readiness).
    pub fn role_channel(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }
}
