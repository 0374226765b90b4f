//! The MonarchMesh controller (only with `--serve-monarch-mesh`): serves
//! Monarch's `monarch.pytorch.org/v1alpha1` `MonarchMesh` in place of the
//! Monarch operator, so `KubernetesJob.add_mesh(..., image_spec=...)`
//! provisions a hostmesh World whose hosts run the Monarch workers.
//! Pipeline: validate ([`hostmesh_crds::monarchmesh::validate`]) → build
//! ([`desired`]) → apply → status from the World ([`status`]).
//!
//! Invariants:
//! 1. A MonarchMesh owns (controller reference) one World of its name and
//!    the Service `<name>-svc`; deleting it deletes both through garbage
//!    collection (no finalizer: Monarch's `job.kill()` deletes the mesh and
//!    nothing needs to happen before its World's own finalizer runs).
//! 2. A World of that name that this mesh does not control is never
//!    touched: status says `WorldConflict`.
//! 3. An invalid spec creates or changes nothing: status says `InvalidSpec`
//!    with the field and the fix (for API servers that do not evaluate
//!    the CRD's CEL rules); a World made from an earlier valid spec keeps
//!    running.
//! 4. Status is replaced whole through the status subresource, guarded by
//!    the resourceVersion it was computed from, only when it changed,
//!    paced like the World's ([`crate::controllers::shared::writes`]).

pub mod desired;
pub mod status;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use hostmesh_crds::World;
use hostmesh_crds::field;
use hostmesh_crds::monarchmesh::{MonarchMesh, MonarchMeshStatus};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kube::{Api, ResourceExt as _};
use tracing::debug;

use crate::controllers::shared::writes::{self, write_status};
use crate::controllers::shared::{ControllerContext, watch};
use crate::{FIELD_MANAGER, OperatorError};

/// Kind label in metrics and logs.
const KIND: &str = "monarchmesh";

/// Runs the MonarchMesh controller in `namespace` (all when `None`) until
/// `shutdown`.
pub async fn controller(
    ctx: Arc<ControllerContext>,
    namespace: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let (meshes, worlds) = match &namespace {
        Some(ns) => (
            Api::<MonarchMesh>::namespaced(client.clone(), ns),
            Api::<PartialObjectMeta<World>>::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let owned = watcher::Config::default().labels(desired::LABEL_MONARCH_MESH);
    watch::controller(meshes, watcher::Config::default())
        .owns_stream(watch::objects(worlds, owned))
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.args.concurrency))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                debug!(error = %e, "monarchmesh reconcile failed");
            }
        })
        .await;
}

fn error_policy(
    mesh: Arc<MonarchMesh>,
    err: &OperatorError,
    ctx: Arc<ControllerContext>,
) -> Action {
    crate::controllers::shared::requeue_on_error(KIND, &*mesh, err, &ctx)
}

/// Reconciles one MonarchMesh (invariants 1-4).
pub async fn reconcile(
    mesh: Arc<MonarchMesh>,
    ctx: Arc<ControllerContext>,
) -> Result<Action, OperatorError> {
    let _timer = ctx.metrics.reconcile(KIND);
    if mesh.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = mesh.name_any();
    let ns = mesh
        .namespace()
        .ok_or(OperatorError::MissingField("metadata.namespace"))?;
    let now = Time(Timestamp::now());

    // Validate (invariant 3).
    let mut errs =
        hostmesh_crds::monarchmesh::validate(&name, &mesh.spec, hostmesh_crds::world::DEFAULT_PORT);
    let command = desired::worker_command(&mesh).unwrap_or_else(|e| {
        errs.push(e);
        Vec::new()
    });
    if !errs.is_empty() {
        let msg = field::join(&errs);
        debug!(monarchmesh = %name, message = %msg, "invalid spec");
        if mesh.status.as_ref().and_then(|s| ready_reason(s)) != Some(status::INVALID_SPEC) {
            ctx.event(&*mesh, true, status::INVALID_SPEC, msg.clone())
                .await;
        }
        let st = status::blocked(&mesh, status::INVALID_SPEC, &msg, &now);
        write_status(&*mesh, &ctx, st, true).await?;
        return Ok(Action::await_change());
    }

    // Invariant 2.
    let worlds: Api<World> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(w) = worlds.get_opt(&name).await?
        && !controlled_by(&w, &mesh)
    {
        let msg = format!(
            "World {name} already exists and is not this MonarchMesh's; delete that World or give the mesh another name"
        );
        let st = status::blocked(&mesh, status::WORLD_CONFLICT, &msg, &now);
        write_status(&*mesh, &ctx, st, true).await?;
        return Ok(Action::requeue(Duration::from_secs(30)));
    }

    // Apply (invariant 1).
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let world: World = worlds
        .patch(&name, &pp, &Patch::Apply(desired::world(&mesh, &command)?))
        .await?;
    let svc = desired::service(&mesh)?;
    Api::<Service>::namespaced(ctx.client.clone(), &ns)
        .patch(&svc.name_any(), &pp, &Patch::Apply(&svc))
        .await?;

    let st = status::from_world(&mesh, &world, &now);
    match write_status(&*mesh, &ctx, st, false).await? {
        Some(wait) => Ok(Action::requeue(wait)),
        None => Ok(Action::await_change()),
    }
}

fn ready_reason(s: &MonarchMeshStatus) -> Option<&str> {
    hostmesh_crds::conditions::get(&s.conditions, hostmesh_crds::conditions::READY)
        .map(|c| c.reason.as_str())
}

fn controlled_by(world: &World, mesh: &MonarchMesh) -> bool {
    let uid = mesh.metadata.uid.as_deref();
    world
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

writes::paced_status!(MonarchMesh, MonarchMeshStatus, KIND);
