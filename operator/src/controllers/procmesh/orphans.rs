//! ProcMeshes do not outlive their World by accident (issue 30: churn left
//! 78 ProcMeshes of deleted Worlds behind).
//!
//! A World's own deletion deletes its ProcMeshes first (World invariant 4),
//! but only once the World controller has put its finalizer on it: a World
//! deleted before that (right after its creation, or with its finalizer
//! removed by hand) went at once and left its ProcMeshes waiting for it
//! forever. So:
//!
//! 1. **Owner reference.** The first reconcile that finds a ProcMesh's
//!    World makes the World an owner of the ProcMesh (not its controller,
//!    `blockOwnerDeletion: true`): from then on Kubernetes' garbage
//!    collector deletes the ProcMesh with its World, whoever deletes the
//!    World and however (background, or foreground: the World waits for
//!    it), even while the operator is down.
//! 2. **Deleted before that.** The ProcMesh controller's World watch
//!    records every World it sees deleted ([`DeletedWorlds`], kept
//!    [`KEEP`]). A ProcMesh whose World is missing (read live) and was seen
//!    deleted after the ProcMesh was created is deleted at once, as the
//!    owner reference would have had it, with the Event `WorldDeleted`.
//! 3. A ProcMesh whose World never existed (or whose deletion this operator
//!    did not see: it was not running) waits for it, `InvalidSpec` naming
//!    `spec.world`, as before: applying the World runs it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hostmesh_crds::{ProcMesh, World};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::watcher;
use kube::{Api, Resource as _, ResourceExt as _};
use tracing::info;

use crate::OperatorError;
use crate::controllers::shared::ControllerContext;
use crate::hub::WorldKey;

/// How long a seen deletion is remembered (invariant 2).
pub const KEEP: Duration = Duration::from_secs(600);

/// Worlds this operator saw deleted, and when (its clock).
#[derive(Debug, Default)]
pub struct DeletedWorlds {
    seen: Mutex<HashMap<WorldKey, Timestamp>>,
}

impl DeletedWorlds {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<WorldKey, Timestamp>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records what a World watch event says: a deletion, or a World of
    /// that name that exists (again).
    pub fn observe(&self, event: &watcher::Event<World>) {
        self.observe_at(event, Timestamp::now());
    }

    fn observe_at(&self, event: &watcher::Event<World>, now: Timestamp) {
        let key = |w: &World| WorldKey {
            namespace: w.namespace().unwrap_or_default(),
            name: w.name_any(),
        };
        let mut seen = self.lock();
        match event {
            watcher::Event::Delete(w) => {
                let keep = SignedDuration::try_from(KEEP).unwrap_or(SignedDuration::MAX);
                seen.retain(|_, at| *at + keep > now);
                seen.insert(key(w), now);
            }
            watcher::Event::Apply(w) | watcher::Event::InitApply(w) => {
                seen.remove(&key(w));
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// Whether the World `key` was seen deleted (within [`KEEP`]) no
    /// earlier than `created` (invariant 2).
    pub fn deleted_after(&self, key: &WorldKey, created: Timestamp) -> bool {
        let keep = SignedDuration::try_from(KEEP).unwrap_or(SignedDuration::MAX);
        self.lock()
            .get(key)
            .is_some_and(|at| *at >= created && *at + keep > Timestamp::now())
    }
}

/// The owner reference a ProcMesh gets to its World (invariant 1).
pub fn owner_reference(world: &World) -> Option<OwnerReference> {
    let mut r = world.owner_ref(&())?;
    r.block_owner_deletion = Some(true);
    Some(r)
}

/// Makes `world` an owner of `pm` unless it is one (invariant 1): a merge
/// patch of the whole list, guarded by the resourceVersion it was read at
/// (a stale object gets 409 and is retried). Returns the patched object,
/// `None` when nothing changed.
pub async fn ensure_owner(
    pm: &ProcMesh,
    world: &World,
    ctx: &ControllerContext,
) -> Result<Option<ProcMesh>, OperatorError> {
    let Some(owner) = owner_reference(world) else {
        return Ok(None);
    };
    let owners = pm.owner_references();
    if owners.iter().any(|o| o.uid == owner.uid) {
        return Ok(None);
    }
    let mut list = owners.to_vec();
    list.push(owner);
    let patch = serde_json::json!({
        "metadata": {"ownerReferences": list, "resourceVersion": pm.resource_version()},
    });
    let ns = pm.namespace().unwrap_or_default();
    let patched = Api::<ProcMesh>::namespaced(ctx.client.clone(), &ns)
        .patch(
            &pm.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    Ok(Some(patched))
}

/// Deletes `pm` if its missing World was seen deleted after it was created
/// (invariant 2); returns whether it did.
pub async fn delete_if_orphaned(
    pm: &ProcMesh,
    ctx: &ControllerContext,
) -> Result<bool, OperatorError> {
    let key = WorldKey {
        namespace: pm.namespace().unwrap_or_default(),
        name: pm.spec.world.clone(),
    };
    let created = pm
        .meta()
        .creation_timestamp
        .as_ref()
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0);
    if pm.meta().deletion_timestamp.is_some() || !ctx.deleted_worlds.deleted_after(&key, created) {
        return Ok(false);
    }
    let note = format!(
        "World {} was deleted before the operator reconciled it: this ProcMesh is deleted with it",
        key.name
    );
    info!(procmesh = %pm.name_any(), world = %key.name, "deleting the ProcMesh of a deleted World");
    ctx.event(pm, true, "WorldDeleted", note).await;
    match Api::<ProcMesh>::namespaced(ctx.client.clone(), &key.namespace)
        .delete(&pm.name_any(), &kube::api::DeleteParams::background())
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(true),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world(name: &str) -> World {
        let mut w = crate::controllers::procmesh::desired::tests::mk_world();
        w.metadata.name = Some(name.into());
        w.metadata.namespace = Some("ns".into());
        w.metadata.uid = Some(format!("uid-{name}"));
        w
    }

    fn key(name: &str) -> WorldKey {
        WorldKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_deletion_is_remembered_until_the_world_exists_again() {
        let d = DeletedWorlds::default();
        let t = |s| Timestamp::now() + SignedDuration::from_secs(s);
        d.observe_at(&watcher::Event::Delete(world("w")), t(0));
        // A ProcMesh created before the deletion is orphaned; one created
        // after it is not (it waits for a World of that name).
        assert!(d.deleted_after(&key("w"), t(-1)));
        assert!(!d.deleted_after(&key("w"), t(1)));
        assert!(!d.deleted_after(&key("other"), t(-1)));
        d.observe_at(&watcher::Event::Apply(world("w")), t(2));
        assert!(!d.deleted_after(&key("w"), t(-1)));
    }

    #[test]
    fn old_deletions_are_forgotten() {
        let d = DeletedWorlds::default();
        let long_ago = Timestamp::now() - SignedDuration::try_from(KEEP * 2).unwrap();
        d.observe_at(&watcher::Event::Delete(world("old")), long_ago);
        assert!(!d.deleted_after(&key("old"), Timestamp::UNIX_EPOCH));
        // Recording another deletion prunes it.
        d.observe_at(&watcher::Event::Delete(world("new")), Timestamp::now());
        assert_eq!(d.lock().len(), 1);
    }

    #[test]
    fn the_owner_reference_blocks_the_worlds_deletion_and_is_not_a_controller() {
        let r = owner_reference(&world("w")).unwrap();
        assert_eq!((r.kind.as_str(), r.name.as_str()), ("World", "w"));
        assert_eq!(r.uid, "uid-w");
        assert_eq!(r.block_owner_deletion, Some(true));
        assert_ne!(r.controller, Some(true));
    }
}
