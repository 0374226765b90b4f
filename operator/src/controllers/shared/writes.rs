//! Status-write pacing per object: a change a user must see (a phase or a
//! condition status flips, e.g. the first failure) is written at once, and
//! so is a restart counted (the pass that counts it also deletes its
//! evidence, the failed pod or proc, so a later pass could not count it
//! again); other changes (counts, runs, messages) at most once per interval
//! per object, however often reconciles run. The hub paces its triggers the same
//! way; this covers reconciles triggered by watches (pods, Worlds).
//!
//! [`write_status`] is the one status writer of the World, ProcMesh and
//! MonarchMesh controllers; each kind says what its status is and what is
//! urgent in it through [`PacedStatus`].
//!
//! Invariants:
//! 1. A deferred write is never lost: the caller requeues after the returned
//!    delay and recomputes the whole status then. Only what a later pass
//!    derives again is deferred: a new `restarts` count is urgent.
//! 2. Urgent writes are never delayed.
//! 3. A status is replaced whole, guarded by the resourceVersion it was
//!    computed from: a write based on a stale read fails with 409 and is
//!    recomputed, never merged into a newer one.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::context::ControllerContext;
use crate::OperatorError;

/// A namespaced resource whose status [`write_status`] writes.
pub trait PacedStatus:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
{
    /// The status type.
    type Status: Clone + PartialEq + Default;
    /// The first part of the pacer's key (`world`, `procmesh`, ...).
    const KIND: &'static str;
    /// The object's current status.
    fn status(&self) -> Option<&Self::Status>;
    /// Replaces the object's status.
    fn set_status(&mut self, status: Self::Status);
    /// Whether going from `old` to `new` is a change a user must see at once
    /// (usually [`urgent`] on phase and conditions, and a new first failure).
    fn is_urgent(old: &Self::Status, new: &Self::Status) -> bool;
}

/// Implements [`PacedStatus`] for a kind whose status has `phase`,
/// `conditions`, `firstFailure` and `restarts`: urgent when the phase or a
/// condition's status flips ([`urgent`]), the first failure changes or a
/// restart was counted (invariant 1).
macro_rules! paced_status {
    ($kind:ty, $status:ty, $key:expr) => {
        impl $crate::controllers::shared::writes::PacedStatus for $kind {
            type Status = $status;
            const KIND: &'static str = $key;
            fn status(&self) -> Option<&$status> {
                self.status.as_ref()
            }
            fn set_status(&mut self, status: $status) {
                self.status = Some(status);
            }
            fn is_urgent(old: &$status, new: &$status) -> bool {
                old.first_failure != new.first_failure
                    || old.restarts != new.restarts
                    || $crate::controllers::shared::writes::urgent(
                        old.phase,
                        new.phase,
                        &old.conditions,
                        &new.conditions,
                    )
            }
        }
    };
}
pub(crate) use paced_status;

/// The pacer's key of the object `name` in `ns`.
pub fn pacer_key<K: PacedStatus>(ns: &str, name: &str) -> String {
    format!("{}/{ns}/{name}", K::KIND)
}

/// Writes `status` whole through the status subresource when it changed,
/// paced per object (`force` skips the pacing). Returns the delay after which
/// to retry a deferred write (invariant 1).
pub async fn write_status<K: PacedStatus>(
    obj: &K,
    ctx: &ControllerContext,
    status: K::Status,
    force: bool,
) -> Result<Option<Duration>, OperatorError> {
    if obj.status() == Some(&status) {
        return Ok(None);
    }
    let old = obj.status().cloned().unwrap_or_default();
    let urgent = force || K::is_urgent(&old, &status);
    let ns = obj.namespace().unwrap_or_default();
    let key = pacer_key::<K>(&ns, &obj.name_any());
    if let Some(wait) = ctx.pacer.admit(&key, urgent, Instant::now()) {
        return Ok(Some(wait));
    }
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &ns);
    let mut replaced = obj.clone();
    replaced.set_status(status);
    api.replace_status(&obj.name_any(), &PostParams::default(), &replaced)
        .await?;
    Ok(None)
}

/// Paces status writes per object key.
#[derive(Debug)]
pub struct StatusPacer {
    interval: Duration,
    last: Mutex<HashMap<String, Instant>>,
}

impl StatusPacer {
    /// A pacer allowing one non-urgent write per `interval` per object.
    pub fn new(interval: Duration) -> Self {
        StatusPacer {
            interval,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// `None`: write now (and it is recorded). `Some(d)`: defer by `d`.
    pub fn admit(&self, key: &str, urgent: bool, now: Instant) -> Option<Duration> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(prev) = last.get(key)
            && !urgent
        {
            let next = *prev + self.interval;
            if next > now {
                return Some(next - now);
            }
        }
        last.insert(key.to_string(), now);
        None
    }

    /// Forgets `key` (object deleted).
    pub fn forget(&self, key: &str) {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

/// Whether going from (`old_phase`, `old`) to (`new_phase`, `new`) is a
/// change a user must see at once: the phase or a condition's status flips.
pub fn urgent<P: PartialEq>(
    old_phase: Option<P>,
    new_phase: Option<P>,
    old: &[Condition],
    new: &[Condition],
) -> bool {
    if old_phase != new_phase {
        return true;
    }
    new.iter().any(|c| {
        old.iter()
            .find(|o| o.type_ == c.type_)
            .is_none_or(|o| o.status != c.status)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urgent_writes_pass_others_wait_for_the_interval() {
        let p = StatusPacer::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(p.admit("w", false, t0), None);
        assert_eq!(
            p.admit("w", false, t0 + Duration::from_millis(300)),
            Some(Duration::from_millis(700))
        );
        assert_eq!(p.admit("other", false, t0), None, "per object");
        assert_eq!(p.admit("w", true, t0 + Duration::from_millis(400)), None);
        assert!(
            p.admit("w", false, t0 + Duration::from_millis(500))
                .is_some()
        );
        assert_eq!(p.admit("w", false, t0 + Duration::from_millis(1400)), None);
        p.forget("w");
        assert_eq!(p.admit("w", false, t0 + Duration::from_millis(1500)), None);
    }

    fn c(t: &str, s: &str) -> Condition {
        Condition {
            type_: t.into(),
            status: s.into(),
            reason: "R".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }
    }

    /// Invariant 1: a counted restart is written at once, with or without
    /// a phase change; a count that a later pass derives again waits.
    #[test]
    fn a_counted_restart_is_urgent() {
        use hostmesh_crds::World;
        use hostmesh_crds::world::{WorldPhase, WorldStatus};
        let old = WorldStatus {
            phase: Some(WorldPhase::Degraded),
            ready_hosts: 1,
            ..Default::default()
        };
        let more_ready = WorldStatus {
            ready_hosts: 2,
            ..old.clone()
        };
        assert!(!<World as PacedStatus>::is_urgent(&old, &more_ready));
        let restarted = WorldStatus {
            restarts: 1,
            ..old.clone()
        };
        assert!(<World as PacedStatus>::is_urgent(&old, &restarted));
    }

    #[test]
    fn phase_and_condition_flips_are_urgent() {
        let a = [c("Ready", "True"), c("Degraded", "False")];
        let b = [c("Ready", "False"), c("Degraded", "True")];
        assert!(!urgent(Some(1), Some(1), &a, &a));
        assert!(urgent(Some(1), Some(1), &a, &b));
        assert!(urgent(Some(1), Some(2), &a, &a));
        assert!(urgent(Some(1), Some(1), &[], &a), "a new condition");
    }
}
