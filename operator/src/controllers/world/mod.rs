//! The World controller: a thin reconcile around kube's `finalizer()`, with
//! the pipeline dereference → validate ([`hostmesh_crds::validate`]) →
//! build ([`desired`]) → decide ([`plan`]) → apply (`apply`, in named
//! phases) → write status whole.
//!
//! Invariants:
//! 1. Objects are applied with server-side apply under [`crate::FIELD_MANAGER`],
//!    host pods created under it (invariant 7); existing pods are never
//!    patched (changes roll them, see [`plan`]).
//! 2. The Secret is never rewritten; a deleted one is recreated with the
//!    token the agents hold ([`secret`]).
//! 3. Status is written through the status subresource, whole (replaced,
//!    guarded by the resourceVersion it was computed from, so a reconcile
//!    working from a stale cache cannot overwrite newer status),
//!    only when it differs from what is stored, paced by [`crate::controllers::shared::writes`].
//! 4. Deleting a World deletes its ProcMeshes first and waits until their
//!    finalizers have stopped their procs; pods go by owner references.
//! 5. A World whose `spec.managedBy` is not `hostmesh.dev/operator` is left
//!    alone: no Service, Secret, pods or status; only its Kueue Workload is
//!    kept (MultiKueue dispatches the World from it, see [`kueue`]).
//! 6. A World that names a Kueue queue runs only as its Workload allows
//!    ([`kueue`]); until then it is held with the suspend path.
//! 7. Host pods are read from the controller's reflector store (slimmed
//!    to what the controller reads, [`observe::slim`]), not listed per
//!    reconcile; a pod the store
//!    does not show yet is created with a plain create, which answers 409
//!    for a pod that exists, so a store that lags creates nothing twice.

mod apply;
mod cause;
pub mod desired;
pub mod fencing;
pub mod gang;
pub mod kueue;
pub mod monarch;
pub mod monarch_tls;
pub mod netpol;
pub mod observe;
pub mod plan;
pub mod rules;
pub mod secret;
pub mod topology;
pub mod worker;
pub mod workload_api;

use std::sync::Arc;

use futures::StreamExt as _;
use hostmesh_crds::conditions::{self, FAILED, READY};
use hostmesh_crds::procmesh::ProcMeshPhase;
use hostmesh_crds::world::{WorldPhase, WorldStatus};
use hostmesh_crds::{ProcMesh, World};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, ResourceExt as _};
use tokio::sync::mpsc;
use tracing::{debug, info};

use crate::controllers::shared::writes::{self, write_status};
use crate::controllers::shared::{ControllerContext, obj_ref, watch};
use crate::hub::WorldKey;
use crate::{FIELD_MANAGER, OperatorError};

/// Finalizer on Worlds.
pub const FINALIZER: &str = "hostmesh.dev/world";

/// Runs the World controller until `shutdown`.
pub async fn controller(
    ctx: Arc<ControllerContext>,
    namespace: Option<String>,
    triggers: mpsc::UnboundedReceiver<WorldKey>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let (worlds, pods, meshes) = match &namespace {
        Some(ns) => (
            Api::<World>::namespaced(client.clone(), ns),
            Api::<Pod>::namespaced(client.clone(), ns),
            Api::<ProcMesh>::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client.clone()),
        ),
    };
    if !ctx.args.network_policy.enabled {
        // netpol invariant 4: the policies of an earlier run go.
        let (ctx, ns) = (ctx.clone(), namespace.clone());
        tokio::spawn(async move { netpol::remove_all(&ctx, ns.as_deref()).await });
    }
    let managed = watcher::Config::default().labels(desired::LABEL_WORLD);
    // Host pods are reflected into a store (invariant 7) that reconciles
    // read; the same watch triggers the owners.
    let (pod_store, pod_writer) = kube::runtime::reflector::store::<Pod>();
    ctx.host_pods.register(namespace.clone(), pod_store);
    // The pods' watch with its own back-off (`shared::watch`).
    let pod_stream =
        hostmesh_net::watch::recovering(watcher::watcher(pods, managed).modify(observe::slim))
            .reflect(pod_writer)
            .touched_objects();
    let hub_triggers = futures::stream::unfold(triggers, |mut rx| async move {
        let key = rx.recv().await?;
        Some((obj_ref::<World>(&key.namespace, &key.name), rx))
    });
    let workload_triggers = kueue::sync::triggers(client.clone(), namespace.clone());
    // Each watch with its own back-off, the hub's triggers never behind
    // one (`shared::watch`).
    watch::controller(worlds, watcher::Config::default())
        .owns_stream(pod_stream)
        .watches_stream(
            watch::objects(meshes, watcher::Config::default()),
            |pm: ProcMesh| {
                // A critical ProcMesh's failure fails its World; a ProcMesh
                // that ended or goes may finish it (`finishWhen`).
                let ns = pm.namespace()?;
                let ended =
                    pm.status.as_ref().and_then(|s| s.phase).is_some_and(|p| {
                        matches!(p, ProcMeshPhase::Succeeded | ProcMeshPhase::Failed)
                    });
                (pm.spec.critical || ended || pm.metadata.deletion_timestamp.is_some())
                    .then(|| obj_ref::<World>(&ns, &pm.spec.world))
            },
        )
        .reconcile_on(futures::stream::select(hub_triggers, workload_triggers))
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.args.concurrency))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                debug!(error = %e, "world reconcile failed");
            }
        })
        .await;
}

fn error_policy(world: Arc<World>, err: &OperatorError, ctx: Arc<ControllerContext>) -> Action {
    crate::controllers::shared::requeue_on_error("world", &*world, err, &ctx)
}

/// Reconciles one World.
pub async fn reconcile(
    world: Arc<World>,
    ctx: Arc<ControllerContext>,
) -> Result<Action, OperatorError> {
    let ctx = &*ctx;
    crate::controllers::shared::reconcile_finalized(
        "world",
        world,
        ctx,
        FINALIZER,
        |w| async move { apply::apply(&w, ctx).await },
        |w| async move { cleanup(&w, ctx).await },
    )
    .await
}

fn key_of(world: &World) -> WorldKey {
    WorldKey {
        namespace: world.namespace().unwrap_or_default(),
        name: world.name_any(),
    }
}

/// Applies the gang provider's group object (gang invariant 1), or says
/// why it cannot: the provider's API is not served (gang invariant 3) or
/// the operator may not write it.
async fn ensure_gang_group(
    world: &World,
    ctx: &ControllerContext,
) -> Result<Option<(&'static str, String)>, OperatorError> {
    let Some(g) = gang::spec(world) else {
        return Ok(None);
    };
    if g.provider == hostmesh_crds::world::GangProvider::Kubernetes {
        return workload_api::ensure(world, ctx).await;
    }
    let ar = gang::resource(g.provider);
    let served = match ctx.client.list_api_group_resources(&ar.api_version).await {
        Ok(list) => list.resources.iter().any(|r| r.name == ar.plural),
        Err(kube::Error::Api(e)) if e.code == 404 => false,
        Err(e) => return Err(e.into()),
    };
    if !served {
        return Ok(Some((
            "ProviderNotInstalled",
            format!(
                "spec.scheduling.gang.provider {:?} needs {}, which the API server does not serve: install the provider or choose another one",
                g.provider,
                gang::describe(g.provider)
            ),
        )));
    }
    let group = gang::group(world, g, world.spec.full_shape().num_ranks())?;
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &world.namespace().unwrap_or_default(),
        &ar,
    );
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    match api
        .patch(&world.name_any(), &pp, &Patch::Apply(&group))
        .await
    {
        Ok(_) => Ok(None),
        Err(kube::Error::Api(e)) if e.code == 403 => Ok(Some((
            "PodGroupForbidden",
            format!(
                "the operator may not write PodGroup {} ({}): install the hostmesh chart with gangScheduling.enabled=true",
                world.name_any(),
                e.message
            ),
        ))),
        Err(kube::Error::Api(e)) if matches!(e.code, 400 | 422) => Ok(Some((
            "PodGroupRefused",
            format!(
                "the API server refused PodGroup {}: {}",
                world.name_any(),
                e.message
            ),
        ))),
        Err(e) => Err(e.into()),
    }
}

/// The ProcMeshes on `world`: whether a critical one failed (its failure
/// fails the World), and what `finishWhen` reads (plan invariant 9).
async fn meshes_of(
    world: &World,
    ctx: &ControllerContext,
    ns: &str,
) -> Result<(Option<String>, plan::Meshes), OperatorError> {
    let api: Api<ProcMesh> = Api::namespaced(ctx.client.clone(), ns);
    let name = world.name_any();
    let mut critical = None;
    let mut meshes = plan::Meshes::default();
    for pm in api.list(&ListParams::default()).await?.items {
        if pm.spec.world != name {
            continue;
        }
        let status = pm.status.as_ref();
        let failed = status.and_then(|s| s.phase) == Some(ProcMeshPhase::Failed);
        let why = || {
            status
                .and_then(|s| conditions::get(&s.conditions, FAILED))
                .map(|c| c.message.clone())
                .unwrap_or_default()
        };
        if pm.spec.critical && failed && critical.is_none() {
            critical = Some(format!(
                "critical ProcMesh {} failed: {}",
                pm.name_any(),
                why()
            ));
        }
        if pm.metadata.deletion_timestamp.is_some() {
            continue;
        }
        meshes.total += 1;
        if let Some(t) = pm.metadata.creation_timestamp.as_ref().map(|t| t.0) {
            meshes.oldest = Some(meshes.oldest.map_or(t, |o| o.min(t)));
        }
        match status.and_then(|s| s.phase) {
            Some(ProcMeshPhase::Succeeded) => meshes.succeeded.push(pm.name_any()),
            Some(ProcMeshPhase::Failed) => meshes.failed.push((pm.name_any(), why())),
            _ => {}
        }
    }
    Ok((critical, meshes))
}

async fn invalid(
    world: &World,
    ctx: &ControllerContext,
    msg: &str,
) -> Result<Action, OperatorError> {
    debug!(world = %world.name_any(), message = %msg, "invalid spec");
    let mut status = world.status.clone().unwrap_or_default();
    let now = Time(Timestamp::now());
    let generation = world.metadata.generation;
    status.phase = Some(WorldPhase::Pending);
    status.observed_generation = generation;
    conditions::set(
        &mut status.conditions,
        READY,
        false,
        "InvalidSpec",
        msg,
        generation,
        &now,
    );
    conditions::set(
        &mut status.conditions,
        FAILED,
        true,
        "InvalidSpec",
        msg,
        generation,
        &now,
    );
    if world.status.as_ref() != Some(&status) {
        ctx.event(world, true, "InvalidSpec", msg.to_string()).await;
    }
    write_status(world, ctx, status, true).await?;
    Ok(Action::await_change())
}

writes::paced_status!(World, WorldStatus, "world");

async fn cleanup(world: &World, ctx: &ControllerContext) -> Result<Action, OperatorError> {
    let name = world.name_any();
    let ns = world.namespace().unwrap_or_default();
    // ProcMeshes first (invariant 4).
    let meshes: Api<ProcMesh> = Api::namespaced(ctx.client.clone(), &ns);
    let mine: Vec<ProcMesh> = meshes
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|pm| pm.spec.world == name)
        .collect();
    if !mine.is_empty() {
        let mut status = world.status.clone().unwrap_or_default();
        status.phase = Some(WorldPhase::Terminating);
        write_status(world, ctx, status, true).await?;
        for pm in &mine {
            if pm.metadata.deletion_timestamp.is_none() {
                info!(world = %name, procmesh = %pm.name_any(), "deleting ProcMesh before its World");
                match meshes
                    .delete(&pm.name_any(), &DeleteParams::default())
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        return Err(crate::Pending::ProcMeshesStopping {
            world: name.clone(),
            count: mine.len(),
        }
        .into());
    }
    if kueue::sync::queue_name(world).is_some() {
        kueue::sync::release_on_delete(&ctx.client, world).await?;
    }
    ctx.hub.forget_world(&key_of(world));
    ctx.tls_leaves
        .forget_world(&world.namespace().unwrap_or_default(), &name);
    ctx.applied_policies
        .forget(&world.uid().unwrap_or_default());
    ctx.pacer.forget(&writes::pacer_key::<World>(
        &world.namespace().unwrap_or_default(),
        &name,
    ));
    ctx.event(
        world,
        false,
        "Deleted",
        format!("World {name} deleted; host pods go with it"),
    )
    .await;
    Ok(Action::await_change())
}
