//! The ProcMesh controller: validate against the World, wait for it to be
//! Running, ask each host's agent for its procs through the hub, compute
//! status from the agents' reports ([`plan`]), report stalls and keep
//! their stacks ([`stall`]), and on deletion stop the procs gracefully
//! behind a finalizer.
//!
//! Invariants:
//! 1. Validation problems (missing World, a `perHost` name that is also a
//!    World dimension) are conditions with messages naming the field; the
//!    object then waits for a change (or for its World to appear).
//! 2. Status is written whole through the status subresource, only when it
//!    changed.
//! 3. The finalizer is released only after every agent stopped the procs or
//!    `stopTimeout` (plus a margin) passed, or when the World is gone.
//! 4. A ProcMesh goes with its World: the World owns it once seen, and one
//!    whose World was deleted before that is deleted ([`orphans`]).

pub mod actors;
pub mod addresses;
pub mod causal;
pub mod deps;
pub mod desired;
pub mod exit;
pub mod incidents;
pub mod orphans;
pub mod plan;
pub mod rules;
pub mod stall;

use hostmesh_crds::Rank;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use hostmesh_crds::conditions::{self, FAILED, PROGRESSING, READY};
use hostmesh_crds::procmesh::{ProcMeshPhase, ProcMeshStatus};
use hostmesh_crds::validate;
use hostmesh_crds::world::{HostState, WorldPhase};
use hostmesh_crds::{ProcMesh, World};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::controller::Action;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, ResourceExt as _};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::OperatorError;
use crate::controllers::shared::writes::{self, write_status};
use crate::controllers::shared::{ControllerContext, obj_ref, watch};
use crate::hub::{MeshKey, WorldKey};

/// Finalizer on ProcMeshes.
pub const FINALIZER: &str = "hostmesh.dev/procmesh";

/// Hosts whose agents are sent their procs at once.
const SPAWN_CONCURRENCY: usize = 64;

/// Runs the ProcMesh controller until `shutdown`.
pub async fn controller(
    ctx: Arc<ControllerContext>,
    namespace: Option<String>,
    triggers: mpsc::UnboundedReceiver<MeshKey>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let (meshes, worlds) = match &namespace {
        Some(ns) => (
            Api::<ProcMesh>::namespaced(client.clone(), ns),
            Api::<World>::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let hub_triggers = futures::stream::unfold(triggers, |mut rx| async move {
        let key = rx.recv().await?;
        Some((obj_ref::<ProcMesh>(&key.namespace, &key.name), rx))
    });
    // Each watch with its own back-off, the hub's triggers never behind
    // one (`shared::watch`).
    let ctrl = watch::controller(meshes.clone(), watcher::Config::default());
    let store = ctrl.store();
    let dependents = ctrl.store();
    // Deletions of Worlds are remembered for the ProcMeshes they leave
    // (`orphans`).
    let seen = ctx.clone();
    let world_events =
        hostmesh_net::watch::recovering(kube::runtime::watcher(worlds, watcher::Config::default()))
            .inspect(move |e| {
                if let Ok(e) = e {
                    seen.deleted_worlds.observe(e);
                }
            })
            .touched_objects();
    ctrl.watches_stream(
        watch::objects(meshes, watcher::Config::default()),
        move |pm: ProcMesh| {
            // A ProcMesh's change wakes those that depend on it (`dependsOn`).
            let ns = pm.namespace();
            let name = pm.name_any();
            dependents
                .state()
                .into_iter()
                .filter(|d| d.namespace() == ns && d.spec.depends_on.iter().any(|x| x.name == name))
                .map(|d| kube::runtime::reflector::ObjectRef::from_obj(&*d))
                .collect::<Vec<_>>()
        },
    )
    .watches_stream(world_events, move |w: World| {
        // A World's change (Running, Degraded, deleted) wakes its ProcMeshes.
        let ns = w.namespace();
        let name = w.name_any();
        store
            .state()
            .into_iter()
            .filter(|pm| pm.namespace() == ns && pm.spec.world == name)
            .map(|pm| kube::runtime::reflector::ObjectRef::from_obj(&*pm))
            .collect::<Vec<_>>()
    })
    .reconcile_on(hub_triggers)
    .with_config(kube::runtime::controller::Config::default().concurrency(ctx.args.concurrency))
    .graceful_shutdown_on(shutdown)
    .run(reconcile, error_policy, ctx)
    .for_each(|res| async move {
        if let Err(e) = res {
            debug!(error = %e, "procmesh reconcile failed");
        }
    })
    .await;
}

fn error_policy(pm: Arc<ProcMesh>, err: &OperatorError, ctx: Arc<ControllerContext>) -> Action {
    crate::controllers::shared::requeue_on_error("procmesh", &*pm, err, &ctx)
}

/// Reconciles one ProcMesh.
pub async fn reconcile(
    pm: Arc<ProcMesh>,
    ctx: Arc<ControllerContext>,
) -> Result<Action, OperatorError> {
    let ctx = &*ctx;
    crate::controllers::shared::reconcile_finalized(
        "procmesh",
        pm,
        ctx,
        FINALIZER,
        |pm| async move { apply(&pm, ctx).await },
        |pm| async move { cleanup(&pm, ctx).await },
    )
    .await
}

fn world_key(pm: &ProcMesh) -> WorldKey {
    WorldKey {
        namespace: pm.namespace().unwrap_or_default(),
        name: pm.spec.world.clone(),
    }
}

async fn apply(pm: &ProcMesh, ctx: &ControllerContext) -> Result<Action, OperatorError> {
    let ns = pm.namespace().unwrap_or_default();
    let world = Api::<World>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&pm.spec.world)
        .await?;
    // Owned by its World, or gone with a World deleted before (`orphans`).
    let owned;
    let pm = match &world {
        Some(w) => match orphans::ensure_owner(pm, w, ctx).await? {
            Some(patched) => {
                owned = patched;
                &owned
            }
            None => pm,
        },
        None if orphans::delete_if_orphaned(pm, ctx).await? => return Ok(Action::await_change()),
        None => pm,
    };
    let timings = match validate::proc_mesh_named(
        &pm.name_any(),
        &pm.spec,
        world.as_ref().map(|w| &w.spec),
    ) {
        Ok(t) => t,
        // A missing World may appear: look again now and then.
        Err(errs) => return invalid(pm, ctx, &validate::join(&errs), world.is_none()).await,
    };
    let Some(world) = world else {
        return Err(OperatorError::MissingField("World"));
    };
    let key = world_key(pm);
    let world_extent = world.spec.full_shape();
    let hosts = world_extent.num_ranks();
    let id = desired::mesh_id(pm, &world);
    // Procs of an earlier spec go first (a spec change replaces the procs).
    let replacing = stop_stale(
        ctx,
        &key,
        &desired::mesh_prefix(pm),
        Some(&id),
        timings.stop_timeout,
    )
    .await;
    let states = ctx.hub.proc_states(&key, &id);
    let extent = world_extent.concat(&pm.spec.per_host_shape()).to_string();
    let lost_hosts = lost_hosts(&world);
    let reported = ctx.hub.reported_hosts(&key);
    let last_heard: BTreeMap<Rank, Timestamp> = lost_hosts
        .keys()
        .filter_map(|h| Some((*h, ctx.hub.last_heard(&key, *h, None)?)))
        .collect();
    let world_ended = world_ended(&world);
    let deps = dependencies(pm, ctx, &ns).await?;
    if let deps::Deps::Invalid(msg) = &deps {
        return invalid(pm, ctx, msg, true).await;
    }
    let mut plan = plan::plan(&plan::PlanInput {
        pm,
        timings,
        world_phase: world.status.as_ref().and_then(|s| s.phase),
        world_suspended: world_ended.is_none()
            && (world.spec.suspend
                || world.status.as_ref().and_then(|s| s.phase) == Some(WorldPhase::Suspended)),
        hosts,
        extent,
        shape: world_extent.concat(&pm.spec.per_host_shape()),
        states: &states,
        lost_hosts: &lost_hosts,
        reported: &reported,
        last_heard: &last_heard,
        now: Timestamp::now(),
        world_ended,
        deps,
        host_causes: &host_causes(&world),
    });
    // Stalls: the condition, and the stacks of a new stall taken before
    // anything is restarted or stopped (stall.rs invariant 2).
    let total = hosts.saturating_mul(pm.spec.per_host_shape().num_ranks());
    let stalled = stall::stalled(&states, |r| recorded_incarnation(pm, r));
    if let Some(ev) = stall::set_condition(pm, &mut plan.status, &stalled, total, Timestamp::now())
    {
        plan.events.push(ev);
    }
    if let Some(ev) = stall::capture_on_new_episode(ctx, pm, &key, &id, &stalled, total).await {
        plan.events.push(ev);
    }

    // Write-ahead: a restart decision, with the failure behind it, is in
    // status before any agent acts on it. Otherwise a paced or stale (409)
    // write after the restart would leave a running new incarnation with no
    // record of why it was restarted (no restart count, no firstFailure).
    let prev_restarts = pm.status.as_ref().map_or(0, |s| s.restarts);
    let prev_incarnations = pm.status.as_ref().map(|s| &s.incarnations);
    let written_ahead = plan.spawn.is_some()
        && (plan.status.restarts != prev_restarts
            || prev_incarnations != Some(&plan.status.incarnations));
    if written_ahead {
        write_status(pm, ctx, plan.status.clone(), true).await?;
    }
    if let Some(inc) = plan.spawn.as_ref().filter(|_| !replacing) {
        // Hosts at once, each its requests in order: a slow or hung agent
        // holds up its own host only, and a 1,000-host spawn takes a few
        // round trips, not one per proc.
        let (key, world, grace) = (&key, &world, timings.stop_timeout);
        let errors: Vec<_> = futures::stream::iter(0..hosts)
            .map(|host| async move {
                let reqs = desired::host_procs(pm, world, host, &|r| inc.get(r));
                ctx.hub.ensure_procs(key, host, reqs, grace).await
            })
            .buffer_unordered(SPAWN_CONCURRENCY)
            .filter_map(|r| async move { r.err() })
            .collect()
            .await;
        if let Some(e) = errors.first() {
            debug!(procmesh = %pm.name_any(), error = %e, failed_hosts = errors.len(), "could not reach every agent yet");
        }
    }
    if plan.stop {
        debug!(procmesh = %pm.name_any(), phase = ?plan.status.phase, "stopping the ProcMesh's remaining procs");
        if let Err(e) = ctx.hub.stop_procs(&key, &id, timings.stop_timeout).await {
            warn!(procmesh = %pm.name_any(), error = %e, "stopping procs failed");
        }
    }
    if plan.status.phase == Some(ProcMeshPhase::Running) {
        ctx.hub.reset_urgent(&MeshKey {
            namespace: ns.clone(),
            name: pm.name_any(),
        });
    }
    ctx.planned_events(pm, &plan.events).await;
    let deferred = if written_ahead {
        None
    } else {
        write_status(pm, ctx, plan.status.clone(), false).await?
    };
    // A runtime-aware mesh's addresses, for clients (addresses.rs).
    if pm.spec.runtime_aware {
        let data = addresses::data(
            &id,
            &states,
            |r| incarnation_in(pm, &plan.status, r),
            plan.status.extent.as_deref().unwrap_or_default(),
            &super::world::secret::runtime_name(&world.name_any()),
        );
        if let Err(e) = addresses::publish(&ctx.client, pm, data).await {
            warn!(procmesh = %pm.name_any(), error = %e, "cannot write the runtime addresses ConfigMap");
        }
    }
    // Recovery phases and failures count once, with the status that
    // records them.
    if deferred.is_none() {
        for (phase, took) in &plan.recovery {
            ctx.metrics.observe_recovery(phase, *took);
        }
        for cause in &plan.failures {
            ctx.metrics.failure("ProcMesh", *cause);
        }
    }
    let deferred = if replacing {
        Some(
            deferred
                .unwrap_or(Duration::from_secs(1))
                .min(Duration::from_secs(1)),
        )
    } else {
        deferred
    };
    let default = match plan.status.phase {
        Some(ProcMeshPhase::Running | ProcMeshPhase::Failed | ProcMeshPhase::Succeeded) => {
            Duration::from_secs(60)
        }
        _ => Duration::from_secs(2),
    };
    let requeue = [plan.requeue_after, deferred]
        .into_iter()
        .flatten()
        .fold(default, Duration::min);
    Ok(Action::requeue(requeue))
}

/// What `spec.dependsOn` says ([`deps`]), read only until the mesh has
/// spawned in its generation or ended (deps invariant 3).
async fn dependencies(
    pm: &ProcMesh,
    ctx: &ControllerContext,
    ns: &str,
) -> Result<deps::Deps, OperatorError> {
    let status = pm.status.as_ref();
    let same_gen = status.and_then(|s| s.observed_generation) == pm.metadata.generation;
    let latched = same_gen
        && status.is_some_and(|s| {
            s.start_time.is_some()
                || matches!(
                    s.phase,
                    Some(ProcMeshPhase::Succeeded | ProcMeshPhase::Failed)
                )
        });
    if pm.spec.depends_on.is_empty() || latched {
        return Ok(deps::Deps::Met);
    }
    let all = Api::<ProcMesh>::namespaced(ctx.client.clone(), ns)
        .list(&kube::api::ListParams::default())
        .await?
        .items;
    Ok(deps::evaluate(pm, &all))
}

/// Why the ProcMeshes of `world` cannot run any more: it finished
/// (plan invariant 9), as its status says.
fn world_ended(world: &World) -> Option<String> {
    let status = world.status.as_ref()?;
    let name = world.name_any();
    match status.phase? {
        WorldPhase::Failed => {
            let why = conditions::get(&status.conditions, FAILED)
                .map(|c| c.message.clone())
                .unwrap_or_default();
            Some(format!("World {name} failed: {why}"))
        }
        WorldPhase::Succeeded => Some(format!(
            "World {name} has finished (Succeeded): its hosts are gone; create a new World to run more"
        )),
        _ => None,
    }
}

/// The incarnation status recorded for `rank` (before this reconcile's
/// decisions): a stall of an older incarnation is not a stall of the rank.
fn recorded_incarnation(pm: &ProcMesh, rank: Rank) -> u32 {
    pm.status
        .as_ref()
        .map_or(0, |st| incarnation_in(pm, st, rank))
}

/// `rank`'s incarnation as status `st` of `pm` records it.
fn incarnation_in(pm: &ProcMesh, st: &hostmesh_crds::procmesh::ProcMeshStatus, rank: Rank) -> u32 {
    let gang = if pm.spec.restart_policy.policy == hostmesh_crds::procmesh::RestartMode::Gang {
        st.restarts
    } else {
        0
    };
    hostmesh_crds::runs::get(&st.incarnations, rank)
        .map_or(0, |i| i.incarnation)
        .max(gang)
}

/// Stops the procs of every mesh id under `prefix` except `keep`, and
/// forgets those that have ended. Returns whether some are still running.
async fn stop_stale(
    ctx: &ControllerContext,
    key: &crate::hub::WorldKey,
    prefix: &str,
    keep: Option<&str>,
    grace: Duration,
) -> bool {
    let mut running = false;
    for old in ctx.hub.mesh_ids(key, prefix) {
        if Some(old.as_str()) == keep {
            continue;
        }
        if let Err(e) = ctx.hub.stop_procs(key, &old, grace).await {
            debug!(mesh = %old, error = %e, "stopping procs of an earlier spec");
        }
        if ctx.hub.procs_running(key, &old) {
            running = true;
        } else {
            ctx.hub.forget_procs(key, &old);
        }
    }
    running
}

/// Hosts of `world` that are gone (Expired, Failed, Terminating, or no pod
/// at all), with
/// their state, from its status runs (the World controller is the source
/// of truth for pod-level states the hub cannot see).
fn lost_hosts(world: &World) -> BTreeMap<Rank, HostState> {
    let mut out = BTreeMap::new();
    for run in world.status.iter().flat_map(|s| &s.hosts) {
        if matches!(
            run.value.state,
            HostState::Expired | HostState::Failed | HostState::Terminating | HostState::Pending
        ) {
            for r in run.start..run.end().min(run.start + 100_000) {
                out.insert(r, run.value.state);
            }
        }
    }
    out
}

/// Whose fault a failure on each host of `world` would be, as the World
/// controller attributed its hosts (`status.hosts[].cause`).
fn host_causes(world: &World) -> BTreeMap<Rank, hostmesh_crds::cause::Attribution> {
    let mut out = BTreeMap::new();
    for run in world.status.iter().flat_map(|s| &s.hosts) {
        let (Some(cause), Some(evidence)) = (run.value.cause, run.value.evidence.as_ref()) else {
            continue;
        };
        for r in run.start..run.end().min(run.start + 100_000) {
            out.insert(
                r,
                hostmesh_crds::cause::Attribution {
                    cause,
                    evidence: evidence.clone(),
                },
            );
        }
    }
    out
}

async fn invalid(
    pm: &ProcMesh,
    ctx: &ControllerContext,
    msg: &str,
    retry: bool,
) -> Result<Action, OperatorError> {
    let mut status = pm.status.clone().unwrap_or_default();
    let now = Time(Timestamp::now());
    let generation = pm.metadata.generation;
    status.phase = Some(ProcMeshPhase::Pending);
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
        PROGRESSING,
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
    if pm.status.as_ref() != Some(&status) {
        ctx.event(pm, true, "InvalidSpec", msg.to_string()).await;
    }
    write_status(pm, ctx, status.clone(), true).await?;
    Ok(if retry {
        Action::requeue(Duration::from_secs(10))
    } else {
        Action::await_change()
    })
}

writes::paced_status!(ProcMesh, ProcMeshStatus, "procmesh");

async fn cleanup(pm: &ProcMesh, ctx: &ControllerContext) -> Result<Action, OperatorError> {
    let name = pm.name_any();
    let prefix = desired::mesh_prefix(pm);
    let key = world_key(pm);
    let ns = pm.namespace().unwrap_or_default();
    let world = Api::<World>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&pm.spec.world)
        .await?;
    let stop_timeout = validate::proc_mesh(&pm.spec, world.as_ref().map(|w| &w.spec))
        .map(|t| t.stop_timeout)
        .unwrap_or(Duration::from_secs(30));
    if world.is_none() {
        for id in ctx.hub.mesh_ids(&key, &prefix) {
            ctx.hub.forget_procs(&key, &id);
        }
        return Ok(Action::await_change());
    }
    let mut status = pm.status.clone().unwrap_or_default();
    let now = Timestamp::now();
    if status.phase != Some(ProcMeshPhase::Stopping) {
        status.phase = Some(ProcMeshPhase::Stopping);
        status.stopping_since = Some(Time(now));
        conditions::set(
            &mut status.conditions,
            READY,
            false,
            "Stopping",
            "ProcMesh is being deleted",
            pm.metadata.generation,
            &Time(now),
        );
        write_status(pm, ctx, status.clone(), true).await?;
        info!(procmesh = %name, "stopping procs before deletion");
        ctx.event(
            pm,
            false,
            "Stopping",
            format!("stopping procs (stopTimeout {}s)", stop_timeout.as_secs()),
        )
        .await;
    }
    // Stops every proc this ProcMesh ever had; ended ones are forgotten.
    let still_running = stop_stale(ctx, &key, &prefix, None, stop_timeout).await;
    let started = status.stopping_since.as_ref().map_or(now, |t| t.0);
    let deadline = started
        + SignedDuration::try_from(stop_timeout + Duration::from_secs(5))
            .unwrap_or(SignedDuration::MAX);
    if still_running && now < deadline {
        return Err(crate::Pending::ProcsStopping(name).into());
    }
    for id in ctx.hub.mesh_ids(&key, &prefix) {
        ctx.hub.forget_procs(&key, &id);
    }
    ctx.pacer.forget(&writes::pacer_key::<ProcMesh>(&ns, &name));
    Ok(Action::await_change())
}
