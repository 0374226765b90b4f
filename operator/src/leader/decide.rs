//! The pure decision logic of leader election (invariants 2 and 3 of the
//! module): what to do with the Lease given what was last seen and when.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

/// The parts of a Lease the decision looks at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// `holderIdentity`; `None` or empty means released.
    pub holder: Option<String>,
    /// `leaseDurationSeconds`.
    pub duration_seconds: Option<i32>,
    /// `renewTime`, as written (compared for change, never for expiry).
    pub renew_time: Option<Timestamp>,
    /// `leaseTransitions`.
    pub transitions: i32,
}

impl LeaseRecord {
    /// Extracts the record from a Lease.
    pub fn from_lease(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            duration_seconds: spec.lease_duration_seconds,
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }
}

/// What to do with the Lease now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The lease is free or expired: take it (a new transition).
    Acquire,
    /// This replica holds the lease: renew it.
    Renew,
    /// Another replica holds a live lease: wait at most `remaining`.
    Wait {
        /// The holder.
        holder: String,
        /// Time until the lease expires by our clock.
        remaining: Duration,
    },
}

/// Decides from the last seen record, when it was first seen in this form
/// (`observed_at`, invariant 2), and this replica's identity.
pub fn decide(
    record: &LeaseRecord,
    observed_at: Instant,
    now: Instant,
    me: &str,
    default_duration: Duration,
) -> Decision {
    let Some(holder) = record.holder.as_deref() else {
        return Decision::Acquire;
    };
    if holder == me {
        return Decision::Renew;
    }
    let duration = record
        .duration_seconds
        .filter(|s| *s > 0)
        .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)))
        .unwrap_or(default_duration);
    let expires = observed_at + duration;
    if now >= expires {
        Decision::Acquire
    } else {
        Decision::Wait {
            holder: holder.to_owned(),
            remaining: expires - now,
        }
    }
}

/// Whether a leader whose last successful renewal was at `last_renew` must
/// step down (invariant 3).
pub fn should_step_down(last_renew: Instant, now: Instant, renew_deadline: Duration) -> bool {
    now.saturating_duration_since(last_renew) >= renew_deadline
}

/// Builds the Lease spec to write when acquiring or renewing.
pub fn next_spec(
    previous: Option<&LeaseSpec>,
    me: &str,
    lease_duration: Duration,
    now: Timestamp,
) -> LeaseSpec {
    let existed = previous.is_some();
    let previous = previous.cloned().unwrap_or_default();
    let held_by_me = previous.holder_identity.as_deref() == Some(me);
    let seconds = i32::try_from(lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
    LeaseSpec {
        holder_identity: Some(me.to_owned()),
        lease_duration_seconds: Some(seconds),
        acquire_time: if held_by_me {
            previous.acquire_time.clone()
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        // A new holder is a transition, also after a release (as client-go
        // counts); a lease created just now starts at 0.
        lease_transitions: Some(if held_by_me || !existed {
            previous.lease_transitions.unwrap_or(0)
        } else {
            previous.lease_transitions.unwrap_or(0).saturating_add(1)
        }),
        ..previous
    }
}
