//! The pure decision logic of leader election (invariants 2, 3 and 5 of the
//! module): what to do with the Lease given what was last seen and when,
//! and what its owner references become when this replica writes it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
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

/// The Pod a replica runs in, which it names as the owner of a Lease it
/// holds (module invariant 5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerPod {
    /// `metadata.name` of the Pod.
    pub name: String,
    /// `metadata.uid` of the Pod.
    pub uid: String,
}

fn is_pod_owner(r: &OwnerReference) -> bool {
    r.api_version == "v1" && r.kind == "Pod"
}

fn pod_owner(pod: &OwnerPod) -> OwnerReference {
    // Not a controller reference, and no blockOwnerDeletion: the Pod does
    // not manage the Lease, and deleting the Pod never waits on it.
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        controller: None,
        block_owner_deletion: None,
    }
}

/// The owner references a Lease gets when this replica (in Pod `me`, or
/// outside any Pod) acquires or renews it: the Pod owner an earlier holder
/// left is replaced in place by `me` (dropped outside a Pod), further Pod
/// owners are dropped, owners of other kinds are kept. A Lease that already
/// names `me` keeps its references as they are, so a renewal never changes
/// them. `None` when the Lease ends up with no owner at all.
pub fn next_owners(
    previous: Option<&[OwnerReference]>,
    me: Option<&OwnerPod>,
) -> Option<Vec<OwnerReference>> {
    let mut owners = Vec::new();
    let mut placed = false;
    for r in previous.unwrap_or_default() {
        if !is_pod_owner(r) {
            owners.push(r.clone());
            continue;
        }
        if let Some(pod) = me
            && !placed
        {
            owners.push(if r.uid == pod.uid {
                r.clone()
            } else {
                pod_owner(pod)
            });
            placed = true;
        }
    }
    if let Some(pod) = me
        && !placed
    {
        owners.push(pod_owner(pod));
    }
    (!owners.is_empty()).then_some(owners)
}
