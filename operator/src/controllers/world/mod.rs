//! The World controller: a thin reconcile around kube's `finalizer()`, with
//! the pipeline dereference → validate ([`hostmesh_crds::validate`]) →
//! build ([`desired`]) → decide ([`plan`]) → apply → write status whole.
//!
//! Invariants:
//! 1. Objects are applied with server-side apply under [`crate::FIELD_MANAGER`];
//!    existing pods are never patched (changes roll them, see [`plan`]).
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

pub mod desired;
pub mod fencing;
pub mod gang;
pub mod kueue;
pub mod monarch;
pub mod observe;
pub mod plan;
pub mod secret;
pub mod topology;
pub mod worker;

use hostmesh_crds::Rank;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use hostmesh_crds::conditions::{self, FAILED, READY};
use hostmesh_crds::procmesh::ProcMeshPhase;
use hostmesh_crds::validate;
use hostmesh_crds::world::{WorldPhase, WorldStatus};
use hostmesh_crds::{ProcMesh, World};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, ResourceExt as _};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::controllers::shared::writes::{self, PacedStatus, write_status};
use crate::controllers::shared::{ControllerContext, obj_ref};
use crate::hub::Liveness;
use crate::hub::{WorldAgents, WorldKey};
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
    let managed = watcher::Config::default().labels(desired::LABEL_WORLD);
    let hub_triggers = futures::stream::unfold(triggers, |mut rx| async move {
        let key = rx.recv().await?;
        Some((obj_ref::<World>(&key.namespace, &key.name), rx))
    });
    let workload_triggers = kueue::sync::triggers(client.clone(), namespace.clone());
    Controller::new(worlds, watcher::Config::default())
        .owns(pods, managed)
        .watches(meshes, watcher::Config::default(), |pm: ProcMesh| {
            // A critical ProcMesh's failure fails its World.
            let ns = pm.namespace()?;
            pm.spec
                .critical
                .then(|| obj_ref::<World>(&ns, &pm.spec.world))
        })
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
        |w| async move { apply(&w, ctx).await },
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

async fn apply(world: &World, ctx: &ControllerContext) -> Result<Action, OperatorError> {
    let name = world.name_any();
    debug!(world = %name, rv = ?world.resource_version(), "reconciling");
    let ns = world.namespace().unwrap_or_default();
    let hash = desired::template_hash(world, &ctx.args.agent_image);
    if !world.spec.managed_by_hostmesh() {
        // Invariant 5: no status, no objects; only the Workload, for
        // MultiKueue to dispatch (and only from a valid spec).
        debug!(world = %name, managed_by = %world.spec.managed_by, "managed by another controller");
        if kueue::sync::queue_name(world).is_some() && validate::world(&name, &world.spec).is_ok() {
            kueue::sync::gate(
                &ctx.client,
                kueue::sync::WorkloadInput {
                    world,
                    template: desired::pod_set_template(world, &ctx.args.agent_image, &hash)?,
                    hosts: world.spec.full_shape().num_ranks(),
                    pods_left: 0,
                    progress: None,
                },
            )
            .await?;
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
        return Ok(Action::await_change());
    }
    let timings = match validate::world(&name, &world.spec) {
        Ok(t) => t,
        Err(errs) => return invalid(world, ctx, &validate::join(&errs)).await,
    };
    let pp = PatchParams::apply(FIELD_MANAGER).force();

    // Service and Secret.
    let svc = desired::service(world)?;
    Api::<Service>::namespaced(ctx.client.clone(), &ns)
        .patch(&name, &pp, &Patch::Apply(&svc))
        .await?;
    let secret = secret::ensure(
        world,
        ctx,
        &ns,
        ctx.hub.world_secret(&key_of(world)).map(|k| k.to_vec()),
    )
    .await?;
    let gang_problem = ensure_gang_group(world, ctx).await?;

    // Pods, by rank.
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let lp = ListParams::default().labels(&format!("{}={name}", desired::LABEL_WORLD));
    let n = world.spec.full_shape().num_ranks();
    let mut pods = BTreeMap::new();
    let mut extra = Vec::new();
    let listed = pods_api.list(&lp).await?.items;
    let pods_left = listed.len();
    for p in listed {
        let rank = p
            .labels()
            .get(desired::LABEL_RANK)
            .and_then(|r| r.parse::<Rank>().ok());
        match rank {
            Some(r) if r < n && p.name_any() == desired::pod_name(&name, r) => {
                pods.insert(r, p);
            }
            _ if p.metadata.deletion_timestamp.is_none() => extra.push(p.name_any()),
            _ => {}
        }
    }

    // Agents: dial the hosts that have an IP.
    let key = key_of(world);
    let hosts = pods
        .iter()
        .filter_map(|(r, p)| {
            Some((
                *r,
                (
                    p.uid()?,
                    SocketAddr::new(observe::pod_ip(p)?, world.spec.port),
                ),
            ))
        })
        .collect();
    ctx.hub
        .sync_world(
            &key,
            WorldAgents {
                secret: secret.key.clone().into(),
                health_timeout: timings.health_timeout,
                hosts,
                epochs: pods
                    .iter()
                    .map(|(r, p)| (*r, fencing::pod_epoch(p)))
                    .collect(),
            },
        )
        .await;
    let uids: BTreeMap<Rank, String> = pods
        .iter()
        .filter_map(|(r, p)| Some((*r, p.uid()?)))
        .collect();
    let liveness = |r: Rank| {
        uids.get(&r)
            .map_or(Liveness::Unknown, |uid| ctx.hub.liveness(&key, r, uid))
    };

    let expired_since = |r: Rank| {
        uids.get(&r)
            .and_then(|uid| ctx.hub.expired_since(&key, r, uid))
    };
    let watching_since = |r: Rank| {
        uids.get(&r)
            .and_then(|uid| ctx.hub.watching_since(&key, r, uid))
    };
    let link_error = |r: Rank| {
        uids.get(&r)
            .and_then(|uid| ctx.hub.link_error(&key, r, uid))
    };
    let monarch_worker = |r: Rank| {
        uids.get(&r)
            .and_then(|uid| ctx.hub.monarch_worker(&key, r, uid))
    };
    let secret_hash = desired::secret_hash(&secret.key);
    // Invariant 6: what Kueue lets the World do.
    let gate = if kueue::sync::queue_name(world).is_some() {
        kueue::sync::gate(
            &ctx.client,
            kueue::sync::WorkloadInput {
                world,
                template: desired::pod_set_template(world, &ctx.args.agent_image, &hash)?,
                hosts: n,
                pods_left,
                progress: Some(kueue::progress(world.status.as_ref())),
            },
        )
        .await?
    } else {
        kueue::sync::Gate::OPEN
    };
    let (hold, placement, admitted) = match gate {
        kueue::sync::Gate::Held { reason, message } => {
            (Some(plan::Hold { reason, message }), None, None)
        }
        kueue::sync::Gate::Open { placement, message } => (None, placement, message),
    };
    let pod_hash = desired::placed_hash(&hash, placement.as_ref());
    let critical = critical_failure(world, ctx, &ns).await?;
    let plan = plan::plan(&plan::PlanInput {
        world,
        timings,
        pods: &pods,
        extra_pods: extra,
        liveness: &liveness,
        expired_since: &expired_since,
        link_error: &link_error,
        watching_since: &watching_since,
        secret_hash: &secret_hash,
        credentials_note: secret.replaced.clone(),
        hash: &pod_hash,
        critical_failure: critical,
        now: Timestamp::now(),
        hold,
        admitted,
        monarch_worker: &monarch_worker,
    });

    // Fencing invariant 3: a pod stuck terminating whose agent must have
    // fenced goes without its kubelet's word, so its rank is replaced.
    let mut stuck_requeue = None;
    for (r, p) in &pods {
        let uid = uids.get(r).map(String::as_str).unwrap_or_default();
        let verdict = fencing::stuck(
            p,
            liveness(*r) == Liveness::Alive,
            ctx.hub.pod_last_heard(&key, *r, uid),
            watching_since(*r),
            Timestamp::now(),
        );
        match verdict {
            fencing::Stuck::Wait => {}
            fencing::Stuck::Until(at) => {
                let left = Duration::try_from(at.duration_since(Timestamp::now()))
                    .unwrap_or_default()
                    .max(Duration::from_millis(100));
                stuck_requeue = Some(stuck_requeue.map_or(left, |d: Duration| d.min(left)));
            }
            fencing::Stuck::ForceDelete => {
                let pod_name = p.name_any();
                warn!(world = %name, pod = %pod_name, "host pod stuck terminating and its agent must have fenced: deleting it without its kubelet");
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                };
                match pods_api.delete(&pod_name, &dp).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }

    for pod_name in &plan.delete {
        info!(world = %name, pod = %pod_name, "deleting host pod");
        let dp = if plan.quick.contains(pod_name) {
            DeleteParams {
                grace_period_seconds: Some(1),
                ..DeleteParams::default()
            }
        } else {
            DeleteParams::default()
        };
        match pods_api.delete(pod_name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    // A pod the API server refuses (PodSecurity, quota, a webhook) is not
    // retried in silence: its message goes into a ReplicaFailure condition
    // and a Warning Event, as a ReplicaSet reports FailedCreate.
    let mut refused: Option<String> = None;
    for rank in &plan.create {
        let mut pod = desired::pod(
            world,
            *rank,
            &ctx.args.agent_image,
            &pod_hash,
            placement.as_ref(),
        )?;
        pod.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                desired::ANNOTATION_SECRET_HASH.to_string(),
                secret_hash.clone(),
            );
        let epoch = fencing::next_epoch(Timestamp::now(), ctx.hub.highest_epoch(&key, *rank));
        fencing::stamp(
            &mut pod,
            epoch,
            fencing::fence_timeout(timings.health_timeout, timings.eviction_timeout),
        );
        let pod_name = desired::pod_name(&name, *rank);
        let mut pod = serde_json::to_value(&pod)?;
        if let Some(g) = gang::spec(world) {
            gang::place_pod(&mut pod, world, g);
        }
        match pods_api.patch(&pod_name, &pp, &Patch::Apply(&pod)).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
                debug!(world = %name, pod = %pod_name, code = e.code, message = %e.message, "the API server refused a host pod");
                refused.get_or_insert(format!("host pod {pod_name}: {}", e.message));
            }
            Err(e) => return Err(e.into()),
        }
    }
    let mut status = plan.status.clone();
    let generation = world.metadata.generation;
    let now = Time(Timestamp::now());
    match &refused {
        Some(msg) => {
            let was = conditions::get(&status.conditions, conditions::REPLICA_FAILURE)
                .filter(|c| c.status == "True")
                .map(|c| c.message.clone());
            if was.as_deref() != Some(msg.as_str()) {
                warn!(world = %name, message = %msg, "the API server refused a host pod");
                ctx.event(world, true, "FailedCreate", msg.clone()).await;
            }
            conditions::set(
                &mut status.conditions,
                conditions::REPLICA_FAILURE,
                true,
                "FailedCreate",
                msg,
                generation,
                &now,
            );
        }
        None if conditions::get(&status.conditions, conditions::REPLICA_FAILURE).is_some() => {
            conditions::set(
                &mut status.conditions,
                conditions::REPLICA_FAILURE,
                false,
                "PodsCreated",
                "",
                generation,
                &now,
            );
        }
        None => {}
    }
    if let Some(g) = gang::spec(world)
        && status.phase != Some(WorldPhase::Suspended)
    {
        let live: Vec<&Pod> = pods
            .values()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let bound = live
            .iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
            .count();
        let (ok, reason, message) = match &gang_problem {
            Some((reason, message)) => (false, *reason, message.clone()),
            None => gang::condition(world, g, live.len(), bound, n),
        };
        conditions::set(
            &mut status.conditions,
            conditions::GANG_SCHEDULED,
            ok,
            reason,
            &message,
            generation,
            &now,
        );
    }
    for ev in &plan.events {
        ctx.event(
            world,
            ev.severity == crate::controllers::shared::Severity::Warning,
            ev.reason,
            ev.note.clone(),
        )
        .await;
    }
    debug!(world = %name, phase = ?status.phase, ready = ?status.ready, restarts = status.restarts, "writing status");
    let deferred = write_status(world, ctx, status.clone(), false).await?;

    // A suspended or queued World with no pod left waits on a spec change,
    // a pod event or its Workload's watch, not on polling.
    let steady = plan.status.phase == Some(WorldPhase::Running)
        || plan.status.phase == Some(WorldPhase::Failed)
        || (plan.status.phase == Some(WorldPhase::Suspended) && pods_left == 0);
    let default_requeue = if steady {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(3)
    };
    let requeue = [plan.requeue_after, deferred, stuck_requeue]
        .into_iter()
        .flatten()
        .fold(default_requeue, Duration::min);
    Ok(Action::requeue(requeue))
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

async fn critical_failure(
    world: &World,
    ctx: &ControllerContext,
    ns: &str,
) -> Result<Option<String>, OperatorError> {
    let meshes: Api<ProcMesh> = Api::namespaced(ctx.client.clone(), ns);
    let name = world.name_any();
    for pm in meshes.list(&ListParams::default()).await?.items {
        let status = pm.status.as_ref();
        if pm.spec.world == name
            && pm.spec.critical
            && status.and_then(|s| s.phase) == Some(ProcMeshPhase::Failed)
        {
            let why = status
                .and_then(|s| conditions::get(&s.conditions, FAILED))
                .map(|c| c.message.clone())
                .unwrap_or_default();
            return Ok(Some(format!(
                "critical ProcMesh {} failed: {why}",
                pm.name_any()
            )));
        }
    }
    Ok(None)
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

impl PacedStatus for World {
    type Status = WorldStatus;
    const KIND: &'static str = "world";
    fn status(&self) -> Option<&WorldStatus> {
        self.status.as_ref()
    }
    fn set_status(&mut self, status: WorldStatus) {
        self.status = Some(status);
    }
    fn is_urgent(old: &WorldStatus, new: &WorldStatus) -> bool {
        old.first_failure != new.first_failure
            || writes::urgent(old.phase, new.phase, &old.conditions, &new.conditions)
    }
}

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
