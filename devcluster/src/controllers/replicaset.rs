//! The ReplicaSet controller: keeps `spec.replicas` pods from the template
//! running, owned by the ReplicaSet, and reports `status`.
//!
//! Invariants:
//! 1. Only pods whose controller ownerReference is this ReplicaSet (by UID)
//!    and that match its selector are counted; pods are listed from the API
//!    server at each reconcile, so a slow watch never causes extra pods.
//! 2. Active pods are neither terminating nor finished; surplus pods go in
//!    the order unscheduled, pending, not ready, then newest first.
//! 3. A pod is available once Ready for `minReadySeconds`.
//! 4. A terminating ReplicaSet is left to the garbage collector.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info};

use super::{ControllerError, Ctx};

/// Reconciles one ReplicaSet.
pub(super) async fn reconcile(
    rs: Arc<ReplicaSet>,
    ctx: Arc<Ctx>,
) -> Result<Action, ControllerError> {
    if rs.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = rs.namespace().unwrap_or_default();
    let name = rs.name_any();
    let spec = rs.spec.as_ref().ok_or_else(|| {
        ControllerError::Invalid(format!("replicaset {ns}/{name}: spec is missing"))
    })?;
    let selector = selector_string(&spec.selector)
        .map_err(|e| ControllerError::Invalid(format!("replicaset {ns}/{name}: {e}")))?;
    let template_labels = spec
        .template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    if !selector_matches(&spec.selector, &template_labels) {
        // Pods it created would not be counted: it would create forever.
        return Err(ControllerError::Invalid(format!(
            "replicaset {ns}/{name}: spec.selector does not match spec.template.metadata.labels: make the template carry the selected labels"
        )));
    }
    let desired = spec.replicas.unwrap_or(1);
    let min_ready = i64::from(spec.min_ready_seconds.unwrap_or(0));
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = rs.metadata.uid.clone().unwrap_or_default();
    let pods = pods_api
        .list(&ListParams::default().labels(&selector))
        .await?;
    let mut active: Vec<Pod> = pods
        .items
        .into_iter()
        .filter(|p| controller_uid(&p.metadata) == Some(uid.as_str()))
        .filter(is_active)
        .collect();
    let diff = desired - i32::try_from(active.len()).unwrap_or(i32::MAX);
    if diff > 0 {
        let template = spec.template.clone().unwrap_or_default();
        for _ in 0..diff {
            let pod = pod_from_template(&rs, &template);
            pods_api.create(&PostParams::default(), &pod).await?;
        }
        info!(replicaset = %format!("{ns}/{name}"), created = diff, "created pods");
    } else if diff < 0 {
        active.sort_by_key(deletion_rank);
        let surplus = usize::try_from(-diff).unwrap_or(0);
        for pod in active.drain(..surplus) {
            let pod_name = pod.name_any();
            match pods_api.delete(&pod_name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        info!(replicaset = %format!("{ns}/{name}"), deleted = -diff, "deleted pods");
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    let ready: Vec<&Pod> = active.iter().filter(|p| ready_since(p).is_some()).collect();
    let available = ready
        .iter()
        .filter(|p| ready_since(p).is_some_and(|t| now.as_second() - t.as_second() >= min_ready))
        .count();
    let labels_match = |p: &&Pod| {
        let want = spec
            .template
            .as_ref()
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.labels.as_ref());
        want.is_none_or(|w| w.iter().all(|(k, v)| p.labels().get(k) == Some(v)))
    };
    let replicas = if diff > 0 {
        active.len() as i64 + i64::from(diff)
    } else {
        active.len() as i64
    };
    let status = json!({"status": {
        "replicas": replicas,
        "fullyLabeledReplicas": active.iter().filter(labels_match).count(),
        "readyReplicas": ready.len(),
        "availableReplicas": available,
        "observedGeneration": rs.metadata.generation,
    }});
    let rs_api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &ns);
    rs_api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    debug!(replicaset = %format!("{ns}/{name}"), replicas, ready = ready.len(), available, "status");
    // A pod that is ready but not yet available becomes available with no
    // event to wake us: come back when it should be.
    if available < ready.len() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// A label selector as the `labelSelector` query string.
pub(super) fn selector_string(sel: &LabelSelector) -> Result<String, String> {
    let mut parts: Vec<String> = sel
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            other => {
                return Err(format!(
                    "spec.selector.matchExpressions[{i}].operator: {other:?} is not one of In, NotIn, Exists, DoesNotExist"
                ));
            }
        });
    }
    if parts.is_empty() {
        return Err("spec.selector is empty: it must select the template's labels".into());
    }
    Ok(parts.join(","))
}

/// Whether `labels` satisfy `sel` (an empty selector matches nothing here:
/// a controller must select its own pods).
pub(crate) fn selector_matches(
    sel: &LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let exprs = sel.match_expressions.iter().flatten();
    let has_terms = sel.match_labels.as_ref().is_some_and(|m| !m.is_empty())
        || sel
            .match_expressions
            .as_ref()
            .is_some_and(|e| !e.is_empty());
    has_terms
        && sel
            .match_labels
            .iter()
            .flatten()
            .all(|(k, v)| labels.get(k) == Some(v))
        && exprs.into_iter().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            let got = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => got.is_some_and(|v| values.contains(v)),
                "NotIn" => got.is_none_or(|v| !values.contains(v)),
                "Exists" => got.is_some(),
                "DoesNotExist" => got.is_none(),
                _ => false,
            }
        })
}

/// The UID of the controller ownerReference, if any.
pub(super) fn controller_uid(meta: &ObjectMeta) -> Option<&str> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// An ownerReference marking `owner` as the controller.
pub(super) fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    let mut r = owner.controller_owner_ref(&()).unwrap_or_default();
    r.block_owner_deletion = Some(true);
    r
}

fn pod_from_template(
    rs: &ReplicaSet,
    template: &k8s_openapi::api::core::v1::PodTemplateSpec,
) -> Pod {
    let tm = template.metadata.clone().unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", rs.name_any())),
            namespace: rs.namespace(),
            labels: tm.labels,
            annotations: tm.annotations,
            finalizers: tm.finalizers,
            owner_references: Some(vec![controller_ref(rs)]),
            ..ObjectMeta::default()
        },
        spec: template.spec.clone(),
        status: None,
    }
}

fn is_active(p: &Pod) -> bool {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    p.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// When the pod's Ready condition became True, if it is True.
fn ready_since(p: &Pod) -> Option<k8s_openapi::jiff::Timestamp> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .map(|c| {
            c.last_transition_time
                .as_ref()
                .map(|t| t.0)
                .unwrap_or_default()
        })
}

/// Sort key: pods that should go first sort first (invariant 2).
fn deletion_rank(
    p: &Pod,
) -> (
    u8,
    u8,
    u8,
    std::cmp::Reverse<Option<k8s_openapi::jiff::Timestamp>>,
) {
    let unscheduled = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none();
    let pending = p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running");
    let not_ready = ready_since(p).is_none();
    (
        u8::from(!unscheduled),
        u8::from(!pending),
        u8::from(!not_ready),
        std::cmp::Reverse(p.metadata.creation_timestamp.as_ref().map(|t| t.0)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_strings() {
        let s: LabelSelector = serde_saphyr::from_str(
            "matchLabels: {app: a}\nmatchExpressions: [{key: tier, operator: In, values: [x, y]}, {key: z, operator: DoesNotExist}]",
        )
        .unwrap();
        assert_eq!(selector_string(&s).unwrap(), "app=a,tier in (x,y),!z");
        let bad: LabelSelector =
            serde_saphyr::from_str("matchExpressions: [{key: t, operator: Near}]").unwrap();
        assert!(
            selector_string(&bad)
                .unwrap_err()
                .contains("matchExpressions[0].operator")
        );
        assert!(
            selector_string(&LabelSelector::default())
                .unwrap_err()
                .contains("spec.selector")
        );
    }

    #[test]
    fn selector_must_match_the_template() {
        let s: LabelSelector = serde_saphyr::from_str(
            "matchLabels: {app: a}\nmatchExpressions: [{key: tier, operator: NotIn, values: [x]}]",
        )
        .unwrap();
        let labels = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(selector_matches(&s, &labels(&[("app", "a")])));
        assert!(!selector_matches(
            &s,
            &labels(&[("app", "a"), ("tier", "x")])
        ));
        assert!(!selector_matches(&s, &labels(&[("app", "b")])));
        assert!(!selector_matches(
            &LabelSelector::default(),
            &labels(&[("app", "a")])
        ));
    }

    #[test]
    fn surplus_pods_go_unready_first() {
        let ready: Pod = serde_saphyr::from_str(
            "metadata: {name: r}\nspec: {nodeName: n, containers: []}\nstatus: {phase: Running, conditions: [{type: Ready, status: \"True\"}]}",
        )
        .unwrap();
        let pending: Pod = serde_saphyr::from_str(
            "metadata: {name: p}\nspec: {nodeName: n, containers: []}\nstatus: {phase: Pending}",
        )
        .unwrap();
        let mut pods = [ready, pending];
        pods.sort_by_key(deletion_rank);
        assert_eq!(pods[0].name_any(), "p");
    }
}
