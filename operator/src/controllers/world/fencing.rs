//! Rank epochs and fenced replacement on the World's side
//! (docs/architecture.md, "Rank epochs and fencing"): the epoch a new host
//! pod gets, what the pod tells its agent (epoch, fence timeout), and when
//! a host pod stuck terminating may be removed without its kubelet.
//!
//! Invariants:
//! 1. A rank's epochs increase: a new pod's epoch is the creation time in
//!    milliseconds, raised above every epoch the operator has seen for the
//!    rank. Only one pod per rank exists at a time (its name is fixed), so
//!    the only older copy that can still run is one whose pod is gone
//!    without its kubelet's word (invariant 3), and that copy has fenced.
//! 2. The fence timeout is `healthTimeout + evictionTimeout`, and at least
//!    [`MIN_FENCE_TIMEOUT`]: an agent fences no earlier than the operator
//!    would itself replace its host, and an operator restart or a leader
//!    failover (a Lease of 15 s, plus start-up) stops no proc even in a
//!    World with short timeouts. It is written into the pod at creation and
//!    read back from it, so a later spec change cannot shorten what a
//!    running agent obeys.
//! 3. A terminating pod whose agent is not heard is force-deleted (grace 0)
//!    only once its agent must have fenced and its procs ended: the last
//!    heartbeat this operator counted (or, never heard, when it started
//!    watching the pod, since a renewal needs a heartbeat), plus the slack
//!    a renewal can take to arrive, the pod's fence timeout and
//!    [`FENCE_GRACE`]. A pod without a fence timeout (an older operator's)
//!    is never force-deleted.

use std::time::Duration;

use hostmesh_agent::contract::{self, FENCE_GRACE};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::desired::{env, host_container_index};
use crate::hub::fence::RENEW_EVERY;

/// Annotation on host pods: the pod's rank epoch.
pub const ANNOTATION_EPOCH: &str = "hostmesh.dev/epoch";

/// How late a renewal can reach an agent after the heartbeat it answers:
/// it waits for the previous renewal call and the pause after it, then
/// takes at most its own call timeout.
pub fn renewal_slack() -> Duration {
    hostmesh_agent::ClientConfig::default().call_timeout * 2 + RENEW_EVERY
}

/// The rank epoch of `pod` (0 for a pod without one).
pub fn pod_epoch(pod: &Pod) -> u64 {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_EPOCH))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The epoch of a new pod created at `now` for a rank whose highest seen
/// epoch is `seen` (invariant 1).
pub fn next_epoch(now: Timestamp, seen: u64) -> u64 {
    let ms = u64::try_from(now.as_millisecond()).unwrap_or(0);
    ms.max(seen.saturating_add(1))
}

/// The shortest fence timeout: an operator restart or leader failover
/// takes well under it.
pub const MIN_FENCE_TIMEOUT: Duration = Duration::from_secs(60);

/// The fence timeout of a World's agents (invariant 2).
pub fn fence_timeout(health_timeout: Duration, eviction_timeout: Duration) -> Duration {
    health_timeout
        .saturating_add(eviction_timeout)
        .max(MIN_FENCE_TIMEOUT)
}

/// Gives a new host pod its epoch and fence settings (annotation and agent
/// environment).
pub fn stamp(pod: &mut Pod, epoch: u64, fence_timeout: Duration) {
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION_EPOCH.to_string(), epoch.to_string());
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    if spec.containers.is_empty() {
        return;
    }
    let idx = host_container_index(&spec.containers);
    let envs = spec.containers[idx].env.get_or_insert_with(Vec::new);
    envs.extend([
        env(contract::env::EPOCH, epoch.to_string()),
        env(
            contract::env::FENCE_TIMEOUT,
            format!("{}ms", fence_timeout.as_millis()),
        ),
        env(
            contract::env::FENCE_GRACE,
            format!("{}ms", FENCE_GRACE.as_millis()),
        ),
    ]);
}

/// The fence timeout `pod`'s agent was started with, if any.
pub fn pod_fence_timeout(pod: &Pod) -> Option<Duration> {
    let spec = pod.spec.as_ref()?;
    let host = spec
        .containers
        .get(host_container_index(&spec.containers))?;
    let v = host
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == contract::env::FENCE_TIMEOUT)?
        .value
        .as_deref()?;
    hostmesh_agent::parse_duration("HOSTMESH_FENCE_TIMEOUT", v).ok()
}

/// What to do with a host pod stuck terminating (invariant 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stuck {
    /// Nothing: not terminating, its agent is heard, or it cannot fence.
    Wait,
    /// Look again at this time.
    Until(Timestamp),
    /// Its agent has fenced: delete the pod with grace 0.
    ForceDelete,
}

/// Whether terminating `pod` may be force-deleted at `now` (invariant 3):
/// `heard` says its agent's heartbeats count now, `last_heard` when the
/// last one did, `watching_since` when this operator started dialing it.
pub fn stuck(
    pod: &Pod,
    heard: bool,
    last_heard: Option<Timestamp>,
    watching_since: Option<Timestamp>,
    now: Timestamp,
) -> Stuck {
    if pod.metadata.deletion_timestamp.is_none() || heard {
        return Stuck::Wait;
    }
    let (Some(timeout), Some(since)) = (pod_fence_timeout(pod), last_heard.or(watching_since))
    else {
        return Stuck::Wait;
    };
    let wait = renewal_slack() + timeout + FENCE_GRACE;
    let at = since + SignedDuration::try_from(wait).unwrap_or(SignedDuration::MAX);
    if now >= at {
        Stuck::ForceDelete
    } else {
        Stuck::Until(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn pod() -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "host".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn epochs_only_grow() {
        let now = ts(0);
        let ms = 1_700_000_000_000;
        assert_eq!(next_epoch(now, 0), ms);
        // Seen a higher one (a clock stepped back): above it.
        assert_eq!(next_epoch(now, ms + 5), ms + 6);
        assert_eq!(next_epoch(ts(1), ms), ms + 1000);
    }

    #[test]
    fn a_stamped_pod_carries_its_epoch_and_fence_timeout() {
        let mut p = pod();
        assert_eq!(pod_epoch(&p), 0);
        assert_eq!(pod_fence_timeout(&p), None);
        let timeout = fence_timeout(Duration::from_secs(10), Duration::from_secs(60));
        assert_eq!(timeout, Duration::from_secs(70));
        let short = fence_timeout(Duration::from_secs(2), Duration::from_secs(3));
        assert_eq!(short, MIN_FENCE_TIMEOUT, "failover-proof");
        stamp(&mut p, 42, timeout);
        assert_eq!(pod_epoch(&p), 42);
        assert_eq!(pod_fence_timeout(&p), Some(Duration::from_secs(70)));
        let env = p.spec.unwrap().containers[0].env.clone().unwrap();
        assert!(
            env.iter()
                .any(|e| e.name == "HOSTMESH_EPOCH" && e.value.as_deref() == Some("42"))
        );
    }

    #[test]
    fn a_stuck_pod_is_removed_only_after_its_agent_must_have_fenced() {
        let mut p = pod();
        stamp(&mut p, 1, Duration::from_secs(13));
        let last = ts(0);
        // Not terminating: never.
        assert_eq!(stuck(&p, false, Some(last), None, ts(1000)), Stuck::Wait);
        p.metadata.deletion_timestamp = Some(Time(ts(20)));
        // Heard: the kubelet will confirm; never forced.
        assert_eq!(stuck(&p, true, Some(last), None, ts(1000)), Stuck::Wait);
        let wait = renewal_slack() + Duration::from_secs(13) + FENCE_GRACE;
        let due = last + SignedDuration::try_from(wait).unwrap();
        assert_eq!(
            stuck(&p, false, Some(last), None, ts(20)),
            Stuck::Until(due)
        );
        assert_eq!(
            stuck(
                &p,
                false,
                Some(last),
                None,
                due - SignedDuration::from_millis(1)
            ),
            Stuck::Until(due)
        );
        assert_eq!(stuck(&p, false, Some(last), None, due), Stuck::ForceDelete);
        // Never heard by this operator: counted from its first dial.
        assert_eq!(
            stuck(&p, false, None, Some(ts(100)), due),
            Stuck::Until(ts(100) + SignedDuration::try_from(wait).unwrap())
        );
        // An agent without a fence timeout never fences: wait for the kubelet.
        let mut old = pod();
        old.metadata.deletion_timestamp = Some(Time(ts(20)));
        assert_eq!(
            stuck(&old, false, Some(last), None, ts(100_000)),
            Stuck::Wait
        );
    }
}
