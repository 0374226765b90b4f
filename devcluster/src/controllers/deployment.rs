//! The Deployment controller: one ReplicaSet per pod template (named
//! `<deployment>-<pod-template-hash>`), rolled per `spec.strategy`, old ones
//! pruned to `revisionHistoryLimit`, and `status` computed from them.
//!
//! Invariants:
//! 1. The new ReplicaSet is the owned one whose `pod-template-hash` label is
//!    the hash of the current template; every other owned one is old.
//! 2. Every ReplicaSet it creates has a controller ownerReference to the
//!    Deployment, the hash in its selector, template labels and name, and
//!    the next `deployment.kubernetes.io/revision`.
//! 3. Recreate scales the new ReplicaSet up only once no old pod is left.
//! 4. A paused Deployment is not rolled, only its status is reported.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use serde_json::json;
use tracing::info;

use super::replicaset::{controller_ref, controller_uid};
use super::rollout::{self, POD_TEMPLATE_HASH, REVISION, RsView, Strategy};
use super::{ControllerError, Ctx};

/// Reconciles one Deployment.
pub(super) async fn reconcile(
    d: Arc<Deployment>,
    ctx: Arc<Ctx>,
) -> Result<Action, ControllerError> {
    if d.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = d.namespace().unwrap_or_default();
    let name = d.name_any();
    let key = format!("{ns}/{name}");
    let spec = d
        .spec
        .as_ref()
        .ok_or_else(|| ControllerError::Invalid(format!("deployment {key}: spec is missing")))?;
    let strategy = rollout::strategy(&d)
        .map_err(|e| ControllerError::Invalid(format!("deployment {key}: {e}")))?;
    let desired = spec.replicas.unwrap_or(1);
    let api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = d.metadata.uid.clone().unwrap_or_default();
    let mut owned: Vec<ReplicaSet> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|rs| controller_uid(&rs.metadata) == Some(uid.as_str()))
        .filter(|rs| rs.metadata.deletion_timestamp.is_none())
        .collect();
    owned.sort_by_key(revision);
    let hash = rollout::template_hash(
        &spec.template,
        d.status.as_ref().and_then(|s| s.collision_count),
    );
    let (news, olds): (Vec<ReplicaSet>, Vec<ReplicaSet>) = owned
        .into_iter()
        .partition(|rs| rs.labels().get(POD_TEMPLATE_HASH) == Some(&hash));
    let mut new = news.into_iter().next();
    let paused = spec.paused == Some(true);
    let mut old_views: Vec<RsView> = olds.iter().map(view).collect();
    if !paused {
        if new.is_none() {
            let next_rev = olds.iter().map(revision).max().unwrap_or(0) + 1;
            let initial = match strategy {
                Strategy::Recreate => 0,
                Strategy::RollingUpdate { max_surge, .. } => {
                    rollout::rolling_new_size(desired, max_surge, &RsView::default(), &old_views)
                }
            };
            let rs = new_replicaset(&d, &hash, next_rev, initial);
            let created = match api.create(&PostParams::default(), &rs).await {
                Ok(rs) => rs,
                Err(kube::Error::Api(e)) if e.code == 409 => api.get(&rs.name_any()).await?,
                Err(e) => return Err(e.into()),
            };
            if controller_uid(&created.metadata) != Some(uid.as_str()) {
                return Err(ControllerError::Invalid(format!(
                    "deployment {key}: replicaset {} exists and is not owned by it: delete it",
                    created.name_any()
                )));
            }
            info!(deployment = %key, replicaset = %created.name_any(), revision = next_rev, "created replicaset");
            new = Some(created);
        }
        let new_rs = new.as_ref().ok_or_else(|| {
            ControllerError::Invalid(format!("deployment {key}: no new replicaset"))
        })?;
        let new_view = view(new_rs);
        let (new_size, old_sizes) = match strategy {
            Strategy::Recreate => {
                let size = if old_pods_left(&ctx, &ns, &olds).await? {
                    0
                } else {
                    desired
                };
                (size, vec![0; old_views.len()])
            }
            Strategy::RollingUpdate {
                max_surge,
                max_unavailable,
            } => {
                let size = rollout::rolling_new_size(desired, max_surge, &new_view, &old_views);
                let grown = RsView {
                    spec: size,
                    ..new_view.clone()
                };
                let budget =
                    rollout::rolling_old_budget(desired, max_unavailable, &grown, &old_views);
                (size, rollout::scale_down_olds(&old_views, budget))
            }
        };
        if new_size != new_view.spec {
            scale(&api, new_rs, new_size, desired, &key).await?;
        }
        for ((rs, v), size) in olds.iter().zip(old_views.iter_mut()).zip(old_sizes) {
            if size != v.spec {
                scale(&api, rs, size, desired, &key).await?;
                v.spec = size;
            }
        }
        prune_history(&api, &d, &olds, &old_views).await?;
    }
    let status = rollout::deployment_status(
        &d,
        strategy,
        new.as_ref().map(view).as_ref(),
        &old_views,
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let dapi: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    dapi.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": status })),
    )
    .await?;
    // Terminating old pods wake no one when they go: poll while rolling.
    let rolling = old_views.iter().any(|v| v.spec > 0 || v.replicas > 0)
        || new
            .as_ref()
            .map(view)
            .is_some_and(|v| v.spec != desired || v.available != desired);
    if rolling && !paused {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// Whether any pod of an old ReplicaSet still exists, terminating or not
/// (invariant 3); finished pods do not count.
async fn old_pods_left(ctx: &Ctx, ns: &str, olds: &[ReplicaSet]) -> Result<bool, ControllerError> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for rs in olds {
        let Some(sel) = rs.spec.as_ref().map(|s| &s.selector) else {
            continue;
        };
        let Ok(sel) = super::replicaset::selector_string(sel) else {
            continue;
        };
        let uid = rs.metadata.uid.as_deref();
        let left = pods
            .list(&ListParams::default().labels(&sel))
            .await?
            .items
            .iter()
            .filter(|p| controller_uid(&p.metadata) == uid)
            .any(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                !matches!(phase, Some("Succeeded" | "Failed"))
            });
        if left {
            return Ok(true);
        }
    }
    Ok(false)
}

fn view(rs: &ReplicaSet) -> RsView {
    let st = rs.status.as_ref();
    RsView {
        spec: rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        replicas: st.map(|s| s.replicas).unwrap_or(0),
        ready: st.and_then(|s| s.ready_replicas).unwrap_or(0),
        available: st.and_then(|s| s.available_replicas).unwrap_or(0),
    }
}

fn revision(rs: &ReplicaSet) -> i64 {
    rs.annotations()
        .get(REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// The ReplicaSet for the current template (invariant 2).
fn new_replicaset(d: &Deployment, hash: &str, revision: i64, replicas: i32) -> ReplicaSet {
    let spec = d.spec.clone().unwrap_or_default();
    let mut template = spec.template;
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(POD_TEMPLATE_HASH.into(), hash.into());
    let mut selector = spec.selector;
    selector
        .match_labels
        .get_or_insert_with(BTreeMap::new)
        .insert(POD_TEMPLATE_HASH.into(), hash.into());
    let mut labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(POD_TEMPLATE_HASH.into(), hash.into());
    let desired = spec.replicas.unwrap_or(1);
    ReplicaSet {
        metadata: ObjectMeta {
            name: Some(format!("{}-{hash}", d.name_any())),
            namespace: d.namespace(),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([
                (REVISION.to_string(), revision.to_string()),
                (
                    "deployment.kubernetes.io/desired-replicas".into(),
                    desired.to_string(),
                ),
            ])),
            owner_references: Some(vec![controller_ref(d)]),
            ..ObjectMeta::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(replicas),
            min_ready_seconds: spec.min_ready_seconds,
            selector,
            template: Some(template),
        }),
        status: None,
    }
}

async fn scale(
    api: &Api<ReplicaSet>,
    rs: &ReplicaSet,
    replicas: i32,
    desired: i32,
    key: &str,
) -> Result<(), ControllerError> {
    let patch = json!({
        "metadata": {"annotations": {"deployment.kubernetes.io/desired-replicas": desired.to_string()}},
        "spec": {"replicas": replicas},
    });
    api.patch(
        &rs.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    info!(deployment = %key, replicaset = %rs.name_any(), replicas, "scaled replicaset");
    Ok(())
}

/// Deletes the oldest fully scaled-down ReplicaSets beyond
/// `revisionHistoryLimit` (default 10).
async fn prune_history(
    api: &Api<ReplicaSet>,
    d: &Deployment,
    olds: &[ReplicaSet],
    views: &[RsView],
) -> Result<(), ControllerError> {
    let limit = d
        .spec
        .as_ref()
        .and_then(|s| s.revision_history_limit)
        .unwrap_or(10)
        .max(0);
    let idle: Vec<&ReplicaSet> = olds
        .iter()
        .zip(views)
        .filter(|(_, v)| v.spec == 0 && v.replicas == 0)
        .map(|(rs, _)| rs)
        .collect();
    let excess = idle
        .len()
        .saturating_sub(usize::try_from(limit).unwrap_or(0));
    for rs in idle.into_iter().take(excess) {
        match api
            .delete(&rs.name_any(), &DeleteParams::background())
            .await
        {
            Ok(_) => info!(replicaset = %rs.name_any(), "pruned old replicaset"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
