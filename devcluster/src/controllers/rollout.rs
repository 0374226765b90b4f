//! Pure Deployment rollout arithmetic: the pod-template hash, maxSurge /
//! maxUnavailable resolution, how far to scale the new and old ReplicaSets,
//! and the Deployment status and conditions. No client: unit-tested here.
//!
//! Invariants (as in Kubernetes' deployment controller):
//! 1. The hash depends only on the pod template and the collision count.
//! 2. During a rolling update the sum of all ReplicaSets' `spec.replicas`
//!    never exceeds `replicas + maxSurge`, and old ReplicaSets are scaled down
//!    only as far as `replicas - maxUnavailable` available pods allow.
//! 3. `maxSurge` rounds up, `maxUnavailable` rounds down; both 0 means
//!    `maxUnavailable = 1` so a rollout can always progress.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::ControllerError;

/// Label that ties a ReplicaSet and its pods to one pod template.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// Annotation carrying a ReplicaSet's rollout revision.
pub const REVISION: &str = "deployment.kubernetes.io/revision";

/// The `pod-template-hash` of a template (invariant 1): 32-bit FNV-1a of its
/// JSON plus the collision count, written with Kubernetes' safe alphabet.
pub fn template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let json = serde_json::to_vec(template).unwrap_or_default();
    let mut h: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h ^= u32::from(*b);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    feed(&json);
    if let Some(c) = collision_count {
        feed(&c.to_le_bytes());
    }
    safe_encode(&h.to_string())
}

/// Kubernetes' `rand.SafeEncodeString`: no vowels, no confusable digits.
fn safe_encode(s: &str) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    s.bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

/// The rollout strategy after defaults (RollingUpdate 25%/25%).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Kill every old pod, then start the new ones.
    Recreate,
    /// Surge and unavailability bounds, in pods.
    RollingUpdate {
        /// Pods above `replicas` allowed during the rollout.
        max_surge: i32,
        /// Pods below `replicas` allowed during the rollout.
        max_unavailable: i32,
    },
}

/// Resolves `spec.strategy` for `replicas` desired pods (invariant 3).
pub fn strategy(d: &Deployment) -> Result<Strategy, ControllerError> {
    let spec = d.spec.as_ref();
    let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
    let st = spec.and_then(|s| s.strategy.as_ref());
    match st
        .and_then(|s| s.type_.as_deref())
        .unwrap_or("RollingUpdate")
    {
        "Recreate" => Ok(Strategy::Recreate),
        "RollingUpdate" => {
            let ru = st.and_then(|s| s.rolling_update.as_ref());
            let pct25 = IntOrString::String("25%".into());
            let surge = ru.and_then(|r| r.max_surge.as_ref()).unwrap_or(&pct25);
            let unavail = ru
                .and_then(|r| r.max_unavailable.as_ref())
                .unwrap_or(&pct25);
            let max_surge = scaled(
                surge,
                replicas,
                true,
                "spec.strategy.rollingUpdate.maxSurge",
            )?;
            let mut max_unavailable = scaled(
                unavail,
                replicas,
                false,
                "spec.strategy.rollingUpdate.maxUnavailable",
            )?;
            if max_surge == 0 && max_unavailable == 0 {
                max_unavailable = 1;
            }
            Ok(Strategy::RollingUpdate {
                max_surge,
                max_unavailable: max_unavailable.min(replicas),
            })
        }
        other => Err(ControllerError::Invalid(format!(
            "spec.strategy.type: {other:?} is not a strategy: use RollingUpdate or Recreate"
        ))),
    }
}

/// An int, or a percentage of `total` rounded up or down.
fn scaled(
    v: &IntOrString,
    total: i32,
    round_up: bool,
    field: &str,
) -> Result<i32, ControllerError> {
    match v {
        IntOrString::Int(i) if *i >= 0 => Ok(*i),
        IntOrString::Int(i) => Err(ControllerError::Invalid(format!(
            "{field}: {i} is negative: use a count >= 0 or a percentage like \"25%\""
        ))),
        IntOrString::String(s) => {
            let pct: i64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .filter(|p| *p >= 0)
                .ok_or_else(|| {
                    ControllerError::Invalid(format!(
                        "{field}: {s:?} is not a count or a percentage: use e.g. 1 or \"25%\""
                    ))
                })?;
            let num = pct * i64::from(total);
            let v = if round_up {
                (num + 99) / 100
            } else {
                num / 100
            };
            Ok(i32::try_from(v).unwrap_or(i32::MAX))
        }
    }
}

/// What the deployment controller knows about one ReplicaSet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RsView {
    /// `spec.replicas`.
    pub spec: i32,
    /// `status.replicas`.
    pub replicas: i32,
    /// `status.readyReplicas`.
    pub ready: i32,
    /// `status.availableReplicas`.
    pub available: i32,
}

/// The new ReplicaSet's target size during a rolling update (invariant 2).
pub fn rolling_new_size(desired: i32, max_surge: i32, new: &RsView, olds: &[RsView]) -> i32 {
    let old_spec: i32 = olds.iter().map(|r| r.spec).sum();
    if old_spec == 0 || new.spec >= desired {
        // Nothing left to replace: scale straight to the desired size.
        return desired;
    }
    let total = new.spec + old_spec;
    let room = (desired + max_surge - total).max(0);
    (new.spec + room).min(desired)
}

/// How many old pods may go now during a rolling update (invariant 2).
pub fn rolling_old_budget(
    desired: i32,
    max_unavailable: i32,
    new: &RsView,
    olds: &[RsView],
) -> i32 {
    let all: i32 = new.spec + olds.iter().map(|r| r.spec).sum::<i32>();
    let min_available = desired - max_unavailable;
    let new_unavailable = (new.spec - new.available).max(0);
    // Old pods that are not available do not count towards availability:
    // they may go first, as far as the new ReplicaSet's progress allows.
    let old_unavailable: i32 = olds.iter().map(|r| (r.spec - r.available).max(0)).sum();
    let cleanup = old_unavailable.min((all - min_available - new_unavailable).max(0));
    // Then available pods above the minimum.
    let available = new.available + olds.iter().map(|r| r.available).sum::<i32>();
    cleanup + (available - min_available).max(0)
}

/// Scales the old ReplicaSets down by at most `budget`, oldest first
/// (callers order `olds` by revision). Returns the new `spec.replicas` of each.
pub fn scale_down_olds(olds: &[RsView], mut budget: i32) -> Vec<i32> {
    olds.iter()
        .map(|r| {
            let cut = r.spec.min(budget).max(0);
            budget -= cut;
            r.spec - cut
        })
        .collect()
}

/// The Deployment's status from its ReplicaSets; conditions keep their
/// transition time when their status does not change.
pub fn deployment_status(
    d: &Deployment,
    strategy: Strategy,
    new: Option<&RsView>,
    olds: &[RsView],
    now: Time,
) -> DeploymentStatus {
    let desired = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let all: Vec<&RsView> = new.into_iter().chain(olds.iter()).collect();
    let replicas: i32 = all.iter().map(|r| r.replicas).sum();
    let ready: i32 = all.iter().map(|r| r.ready).sum();
    let available: i32 = all.iter().map(|r| r.available).sum();
    let updated = new.map(|r| r.replicas).unwrap_or(0);
    let max_unavailable = match strategy {
        Strategy::Recreate => 0,
        Strategy::RollingUpdate {
            max_unavailable, ..
        } => max_unavailable,
    };
    let old = d
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let is_available = available >= desired - max_unavailable;
    let complete = updated == desired && replicas == desired && available == desired;
    let mut conditions = Vec::new();
    conditions.push(condition(
        &old,
        "Available",
        is_available,
        if is_available {
            (
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.",
            )
        } else {
            (
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            )
        },
        &now,
    ));
    conditions.push(condition(
        &old,
        "Progressing",
        true,
        if complete {
            (
                "NewReplicaSetAvailable",
                "ReplicaSet has successfully progressed.",
            )
        } else {
            ("ReplicaSetUpdated", "ReplicaSet is progressing.")
        },
        &now,
    ));
    DeploymentStatus {
        observed_generation: d.metadata.generation,
        replicas: Some(replicas),
        updated_replicas: Some(updated),
        ready_replicas: Some(ready),
        available_replicas: Some(available),
        unavailable_replicas: Some((desired - available).max(0)),
        conditions: Some(conditions),
        collision_count: d.status.as_ref().and_then(|s| s.collision_count),
        terminating_replicas: None,
    }
}

fn condition(
    old: &[DeploymentCondition],
    type_: &str,
    ok: bool,
    (reason, message): (&str, &str),
    now: &Time,
) -> DeploymentCondition {
    let status = if ok { "True" } else { "False" };
    let prev = old.iter().find(|c| c.type_ == type_);
    let same_status = prev.is_some_and(|c| c.status == status);
    let same_reason = same_status && prev.is_some_and(|c| c.reason.as_deref() == Some(reason));
    DeploymentCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_transition_time: if same_status {
            prev.and_then(|c| c.last_transition_time.clone())
        } else {
            Some(now.clone())
        },
        last_update_time: if same_reason {
            prev.and_then(|c| c.last_update_time.clone())
        } else {
            Some(now.clone())
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy(yaml: &str) -> Deployment {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn rs(spec: i32, available: i32) -> RsView {
        RsView {
            spec,
            replicas: spec,
            ready: available,
            available,
        }
    }

    #[test]
    fn hash_depends_on_template_and_collisions_only() {
        let a: PodTemplateSpec = serde_saphyr::from_str(
            "metadata: {labels: {a: b}}\nspec: {containers: [{name: c, image: x}]}",
        )
        .unwrap();
        let mut b = a.clone();
        assert_eq!(template_hash(&a, None), template_hash(&b, None));
        assert_ne!(template_hash(&a, None), template_hash(&a, Some(1)));
        b.spec.as_mut().unwrap().containers[0].image = Some("y".into());
        assert_ne!(template_hash(&a, None), template_hash(&b, None));
        assert!(
            template_hash(&a, None)
                .chars()
                .all(|c| c.is_ascii_alphanumeric())
        );
    }

    #[test]
    fn strategy_defaults_and_rounding() {
        let d = deploy("spec: {replicas: 10, selector: {}, template: {}}");
        assert_eq!(
            strategy(&d).unwrap(),
            Strategy::RollingUpdate {
                max_surge: 3,
                max_unavailable: 2
            }
        );
        let d = deploy(
            "spec: {replicas: 1, selector: {}, template: {}, strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 0, maxUnavailable: 0}}}",
        );
        assert_eq!(
            strategy(&d).unwrap(),
            Strategy::RollingUpdate {
                max_surge: 0,
                max_unavailable: 1
            }
        );
        let d = deploy("spec: {selector: {}, template: {}, strategy: {type: Recreate}}");
        assert_eq!(strategy(&d).unwrap(), Strategy::Recreate);
    }

    #[test]
    fn bad_strategy_names_the_field() {
        let d = deploy("spec: {selector: {}, template: {}, strategy: {type: Blue}}");
        assert!(
            strategy(&d)
                .unwrap_err()
                .to_string()
                .contains("spec.strategy.type")
        );
        let d = deploy(
            "spec: {selector: {}, template: {}, strategy: {rollingUpdate: {maxSurge: \"x%\"}}}",
        );
        assert!(strategy(&d).unwrap_err().to_string().contains("maxSurge"));
    }

    #[test]
    fn rolling_update_respects_surge_and_availability() {
        // replicas 1, maxSurge 1, maxUnavailable 0 (the chart's strategy).
        let old = [rs(1, 1)];
        let new = rs(0, 0);
        assert_eq!(rolling_new_size(1, 1, &new, &old), 1);
        // New pod not yet available: the old one must stay.
        let new = rs(1, 0);
        assert_eq!(rolling_old_budget(1, 0, &new, &old), 0);
        // New pod available: the old one may go.
        let new = rs(1, 1);
        assert_eq!(rolling_old_budget(1, 0, &new, &old), 1);
        assert_eq!(scale_down_olds(&old, 1), vec![0]);
    }

    #[test]
    fn scale_without_rollout_goes_straight_to_desired() {
        assert_eq!(rolling_new_size(5, 1, &rs(2, 2), &[]), 5);
        assert_eq!(rolling_new_size(1, 1, &rs(3, 3), &[rs(0, 0)]), 1);
    }

    #[test]
    fn status_conditions_follow_availability() {
        let d = deploy(
            "metadata: {generation: 3}\nspec: {replicas: 2, selector: {}, template: {}, strategy: {rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}}",
        );
        let st = strategy(&d).unwrap();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let s = deployment_status(&d, st, Some(&rs(2, 1)), &[], now.clone());
        assert_eq!(s.observed_generation, Some(3));
        let conds = s.conditions.unwrap();
        assert_eq!(conds[0].status, "False");
        assert_eq!(conds[1].reason.as_deref(), Some("ReplicaSetUpdated"));
        let s = deployment_status(&d, st, Some(&rs(2, 2)), &[], now);
        let conds = s.conditions.unwrap();
        assert_eq!(conds[0].status, "True");
        assert_eq!(conds[1].reason.as_deref(), Some("NewReplicaSetAvailable"));
        assert_eq!(s.available_replicas, Some(2));
    }
}
