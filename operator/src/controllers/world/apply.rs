//! The World reconcile's apply step, in named phases: ensure the Service,
//! Secret, gang group and NetworkPolicy ([`netpol`]), observe the host pods,
//! sync the hub's agent links, ask Kueue, plan ([`super::plan`]), then act
//! (force-delete fenced stuck pods, delete, create) and write the status.
//!
//! Invariants (the module's, see also [`super`]):
//! 1. Every phase but [`act_on_stuck_pods`], [`delete_pods`] and
//!    [`create_pods`] only reads; the plan is computed from one observation.
//! 2. A pod the API server refuses (400/403/422) is reported, not retried in
//!    silence: a `ReplicaFailure` condition and a `FailedCreate` Event carry
//!    the server's message, as a ReplicaSet reports it.
//! 3. The requeue is the soonest of the plan's deadline, a deferred status
//!    write and a stuck pod's fencing deadline.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hostmesh_crds::Rank;
use hostmesh_crds::World;
use hostmesh_crds::conditions;
use hostmesh_crds::validate::{self, WorldTimings as Timings};
use hostmesh_crds::world::{WorldPhase, WorldStatus};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt as _};
use tracing::{debug, info, warn};

use super::{desired, fencing, gang, kueue, monarch_tls, netpol, observe, plan, secret};
use crate::controllers::shared::ControllerContext;
use crate::controllers::shared::events::{self, PlannedEvent, Severity};
use crate::controllers::shared::writes::write_status;
use crate::hub::trust::Trust;
use crate::hub::{Liveness, WorldAgents, WorldKey};
use crate::{FIELD_MANAGER, OperatorError};

/// Reconciles a live World: ensures its objects, plans and acts.
pub(super) async fn apply(world: &World, ctx: &ControllerContext) -> Result<Action, OperatorError> {
    let name = world.name_any();
    debug!(world = %name, rv = ?world.resource_version(), "reconciling");
    let ns = world.namespace().unwrap_or_default();
    let hash = desired::template_hash(world, &ctx.args.agent_image);
    if !world.spec.managed_by_hostmesh() {
        return unmanaged(world, ctx, &hash).await;
    }
    let timings = match validate::world(&name, &world.spec) {
        Ok(t) => t,
        Err(errs) => return super::invalid(world, ctx, &validate::join(&errs)).await,
    };
    let pp = PatchParams::apply(FIELD_MANAGER).force();

    // Service, Secret and the gang group.
    let svc = desired::service(world)?;
    Api::<Service>::namespaced(ctx.client.clone(), &ns)
        .patch(&name, &pp, &Patch::Apply(&svc))
        .await?;
    let key = super::key_of(world);
    let secret = secret::ensure(
        world,
        ctx,
        &ns,
        ctx.hub.world_secret(&key).map(|k| k.to_vec()),
    )
    .await?;
    let tls_ca = monarch_tls::ensure(world, ctx).await?;
    if let Some(ca) = &tls_ca {
        monarch_tls::renew_hosts(world, ctx, ca).await?;
    }
    let gang_problem = super::ensure_gang_group(world, ctx).await?;
    let netpol_problem = netpol::ensure(world, ctx).await?;

    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let observed = observe_pods(world, ctx, &pods_api).await?;
    let hub = HubView::sync(world, ctx, &key, &observed.pods, &secret, &timings).await;
    let secret_hash = desired::secret_hash(&secret.key);
    let gate = ask_kueue(world, ctx, &hash, observed.left).await?;
    let pod_hash = desired::placed_hash(&hash, gate.placement.as_ref());
    let (critical, meshes) = super::meshes_of(world, ctx, &ns).await?;
    let hosts: Vec<(Rank, String)> = observed
        .pods
        .iter()
        // A pod without an IP has no agent running yet: it starts with
        // the Secret's current token.
        .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
        .filter(|(_, p)| observe::pod_ip(p).is_some())
        .filter_map(|(r, p)| Some((*r, p.uid()?)))
        .collect();
    let rekeyed = |r: Rank, uid: &str| ctx.hub.rekeyed(&key, r, uid);
    secret::advance(world, ctx, &ns, &secret, &hosts, rekeyed, meshes.oldest).await?;
    let liveness = |r: Rank| hub.liveness(r);
    let expired_since = |r: Rank| hub.expired_since(r);
    let watching_since = |r: Rank| hub.watching_since(r);
    let link_error = |r: Rank| hub.link_error(r);
    let monarch_worker = |r: Rank| hub.monarch_worker(r);
    let plan = plan::plan(&plan::PlanInput {
        world,
        timings,
        pods: &observed.pods,
        extra_pods: observed.extra.clone(),
        liveness: &liveness,
        expired_since: &expired_since,
        link_error: &link_error,
        watching_since: &watching_since,
        secret_hash: &secret_hash,
        rotated_hashes: &secret.rotated_hashes,
        credentials_note: secret.replaced.clone(),
        hash: &pod_hash,
        critical_failure: critical,
        now: Timestamp::now(),
        hold: gate.hold,
        admitted: gate.admitted,
        monarch_worker: &monarch_worker,
        meshes: &meshes,
    });

    let (stuck_requeue, forced) = act_on_stuck_pods(world, &pods_api, &observed.pods, &hub).await?;
    ctx.planned_events(world, &forced).await;
    // A World that finishes in this pass says so before its pods go: its
    // ProcMeshes must read the World's end before the exits of the procs
    // its agents stop (a proc that exits 0 on TERM is not a success of
    // its mesh).
    let finishing = matches!(
        plan.status.phase,
        Some(WorldPhase::Failed | WorldPhase::Succeeded)
    ) && world.status.as_ref().and_then(|s| s.phase) != plan.status.phase;
    if !finishing {
        delete_pods(world, &pods_api, &plan).await?;
    }
    let created = Creation {
        pod_hash: &pod_hash,
        secret_hash: &secret_hash,
        placement: gate.placement.as_ref(),
        timings: &timings,
        key: &key,
        tls_ca: tls_ca.as_ref(),
    };
    let refused = create_pods(world, ctx, &plan.create, &created).await?;

    let mut status = plan.status.clone();
    status.monarch = monarch_tls::status(world);
    report_refusal(world, ctx, &mut status, refused).await;
    netpol::report(world, ctx, &mut status, netpol_problem).await;
    if let Some(g) = gang::spec(world)
        && status.phase != Some(WorldPhase::Suspended)
    {
        gang_condition(world, g, &mut status, &observed.pods, gang_problem);
    }
    ctx.planned_events(world, &plan.events).await;
    debug!(world = %name, phase = ?status.phase, ready = ?status.ready, restarts = status.restarts, "writing status");
    let deferred = write_status(world, ctx, status, plan.urgent || finishing).await?;
    if finishing {
        delete_pods(world, &pods_api, &plan).await?;
    }
    // A failure counts once, with the status that records it.
    if deferred.is_none() {
        for cause in &plan.failures {
            ctx.metrics.failure("World", *cause);
        }
    }
    if plan.delete_world {
        // Plan invariant 9: the TTL after finishing has passed; the
        // finalizer deletes its ProcMeshes first.
        info!(world = %name, "ttlSecondsAfterFinished passed: deleting the World");
        match Api::<World>::namespaced(ctx.client.clone(), &ns)
            .delete(&name, &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(requeue_after(
        &plan,
        observed.left,
        [plan.requeue_after, deferred, stuck_requeue],
    )))
}

/// Invariant 5 of [`super`]: no status, no objects; only the Workload, for
/// MultiKueue to dispatch (and only from a valid spec).
async fn unmanaged(
    world: &World,
    ctx: &ControllerContext,
    hash: &str,
) -> Result<Action, OperatorError> {
    debug!(world = %world.name_any(), managed_by = %world.spec.managed_by, "managed by another controller");
    if kueue::sync::queue_name(world).is_none()
        || validate::world(&world.name_any(), &world.spec).is_err()
    {
        return Ok(Action::await_change());
    }
    kueue::sync::gate(&ctx.client, workload_input(world, ctx, hash, 0, None)?).await?;
    Ok(Action::requeue(Duration::from_secs(30)))
}

/// The World's host pods as listed.
struct Observed {
    /// Pods by rank, for ranks of the shape with the expected name.
    pods: BTreeMap<Rank, Arc<Pod>>,
    /// Live pods with the World's label that are not one of its ranks.
    extra: Vec<String>,
    /// How many pods carry the World's label (terminating ones included).
    left: usize,
}

/// How long a reconcile waits for the pod store's first listing before it
/// lists the pods itself.
const STORE_READY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The World's host pods: from the controller's store ([`super`]
/// invariant 7), or listed when no store is ready.
async fn observe_pods(
    world: &World,
    ctx: &ControllerContext,
    pods_api: &Api<Pod>,
) -> Result<Observed, OperatorError> {
    let name = world.name_any();
    let ns = world.namespace().unwrap_or_default();
    let mine = |p: &Pod| {
        p.metadata.namespace.as_deref() == Some(ns.as_str())
            && p.labels().get(desired::LABEL_WORLD) == Some(&name)
    };
    let store = ctx.host_pods.of(&ns);
    let ready = match &store {
        Some(s) => tokio::time::timeout(STORE_READY_WAIT, s.wait_until_ready())
            .await
            .is_ok_and(|r| r.is_ok()),
        None => false,
    };
    let listed: Vec<Arc<Pod>> = match store.filter(|_| ready) {
        Some(s) => s.state().into_iter().filter(|p| mine(p)).collect(),
        None => {
            let lp = ListParams::default().labels(&format!("{}={name}", desired::LABEL_WORLD));
            pods_api
                .list(&lp)
                .await?
                .items
                .into_iter()
                .map(Arc::new)
                .collect()
        }
    };
    let n = world.spec.full_shape().num_ranks();
    let mut out = Observed {
        pods: BTreeMap::new(),
        extra: Vec::new(),
        left: listed.len(),
    };
    for p in listed {
        let rank = p
            .labels()
            .get(desired::LABEL_RANK)
            .and_then(|r| r.parse::<Rank>().ok());
        match rank {
            Some(r) if r < n && p.name_any() == desired::pod_name(&name, r) => {
                out.pods.insert(r, p);
            }
            _ if p.metadata.deletion_timestamp.is_none() => out.extra.push(p.name_any()),
            _ => {}
        }
    }
    Ok(out)
}

/// What the hub knows of each observed pod, after the hub was told which
/// agents to dial (the hosts that have an IP).
struct HubView<'a> {
    ctx: &'a ControllerContext,
    key: &'a WorldKey,
    uids: BTreeMap<Rank, String>,
}

impl<'a> HubView<'a> {
    async fn sync(
        world: &World,
        ctx: &'a ControllerContext,
        key: &'a WorldKey,
        pods: &BTreeMap<Rank, Arc<Pod>>,
        secret: &secret::SecretOutcome,
        timings: &Timings,
    ) -> HubView<'a> {
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
                key,
                WorldAgents {
                    secret: secret.key.as_slice().into(),
                    previous: secret.previous.as_deref().map(Into::into),
                    trust: secret
                        .rotated()
                        .then(|| Arc::new(Trust::new(&secret.key, &secret.lineage))),
                    health_timeout: timings.health_timeout,
                    heartbeat_interval: timings.heartbeat_interval,
                    hosts,
                    epochs: pods
                        .iter()
                        .map(|(r, p)| (*r, fencing::pod_epoch(p)))
                        .collect(),
                },
            )
            .await;
        HubView {
            ctx,
            key,
            uids: pods
                .iter()
                .filter_map(|(r, p)| Some((*r, p.uid()?)))
                .collect(),
        }
    }

    fn uid(&self, r: Rank) -> Option<&str> {
        self.uids.get(&r).map(String::as_str)
    }

    fn liveness(&self, r: Rank) -> Liveness {
        self.uid(r).map_or(Liveness::Unknown, |uid| {
            self.ctx.hub.liveness(self.key, r, uid)
        })
    }

    fn watching_since(&self, r: Rank) -> Option<Timestamp> {
        self.uid(r)
            .and_then(|uid| self.ctx.hub.watching_since(self.key, r, uid))
    }

    fn expired_since(&self, r: Rank) -> Option<Timestamp> {
        self.uid(r)
            .and_then(|uid| self.ctx.hub.expired_since(self.key, r, uid))
    }

    fn last_heard(&self, r: Rank) -> Option<Timestamp> {
        self.uid(r)
            .and_then(|uid| self.ctx.hub.last_heard(self.key, r, Some(uid)))
    }

    fn link_error(&self, r: Rank) -> Option<String> {
        self.uid(r)
            .and_then(|uid| self.ctx.hub.link_error(self.key, r, uid))
    }

    fn monarch_worker(&self, r: Rank) -> Option<hostmesh_agent::protocol::ProcReport> {
        self.uid(r)
            .and_then(|uid| self.ctx.hub.monarch_worker(self.key, r, uid))
    }
}

/// What the World's Kueue Workload is built from.
fn workload_input<'a>(
    world: &'a World,
    ctx: &ControllerContext,
    hash: &str,
    pods_left: usize,
    progress: Option<kueue::WorkloadProgress>,
) -> Result<kueue::sync::WorkloadInput<'a>, OperatorError> {
    Ok(kueue::sync::WorkloadInput {
        world,
        template: desired::pod_set_template(world, &ctx.args.agent_image, hash)?,
        hosts: world.spec.full_shape().num_ranks(),
        pods_left,
        progress,
    })
}

/// What Kueue lets the World do (invariant 6 of [`super`]).
struct KueueGate {
    hold: Option<plan::Hold>,
    placement: Option<kueue::workload::Placement>,
    admitted: Option<String>,
}

async fn ask_kueue(
    world: &World,
    ctx: &ControllerContext,
    hash: &str,
    pods_left: usize,
) -> Result<KueueGate, OperatorError> {
    let gate = if kueue::sync::queue_name(world).is_some() {
        let progress = Some(kueue::progress(world.status.as_ref()));
        kueue::sync::gate(
            &ctx.client,
            workload_input(world, ctx, hash, pods_left, progress)?,
        )
        .await?
    } else {
        kueue::sync::Gate::OPEN
    };
    Ok(match gate {
        kueue::sync::Gate::Held { reason, message } => KueueGate {
            hold: Some(plan::Hold { reason, message }),
            placement: None,
            admitted: None,
        },
        kueue::sync::Gate::Open { placement, message } => KueueGate {
            hold: None,
            placement,
            admitted: message,
        },
    })
}

/// Fencing invariant 3: a pod stuck terminating whose agent must have
/// fenced goes without its kubelet's word, so its rank is replaced. Returns
/// when to look again at a pod that is not there yet, and a Warning Event
/// per pod force-deleted.
async fn act_on_stuck_pods(
    world: &World,
    pods_api: &Api<Pod>,
    pods: &BTreeMap<Rank, Arc<Pod>>,
    hub: &HubView<'_>,
) -> Result<(Option<Duration>, Vec<PlannedEvent>), OperatorError> {
    let mut requeue = None;
    let mut forced = Vec::new();
    for (r, p) in pods {
        let verdict = fencing::stuck(
            p,
            hub.liveness(*r) == Liveness::Alive,
            hub.last_heard(*r),
            hub.watching_since(*r),
            Timestamp::now(),
        );
        match verdict {
            fencing::Stuck::Wait => {}
            fencing::Stuck::Until(at) => {
                let left = Duration::try_from(at.duration_since(Timestamp::now()))
                    .unwrap_or_default()
                    .max(Duration::from_millis(100));
                requeue = Some(requeue.map_or(left, |d: Duration| d.min(left)));
            }
            fencing::Stuck::ForceDelete => {
                let pod_name = p.name_any();
                warn!(world = %world.name_any(), pod = %pod_name, "host pod stuck terminating and its agent must have fenced: deleting it without its kubelet");
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                };
                delete_pod(pods_api, &pod_name, &dp).await?;
                let since = hub
                    .last_heard(*r)
                    .map_or_else(|| "ever".to_string(), |t| t.to_string());
                forced.push(events::event(
                    Severity::Warning,
                    "HostPodForceDeleted",
                    format!(
                        "host pod {pod_name} (rank {r}) stayed terminating without its kubelet confirming, and its agent, not heard since {since}, must have fenced itself: deleted at once (grace 0) so the rank can be replaced"
                    ),
                ));
            }
        }
    }
    Ok((requeue, forced))
}

/// Deletes a pod; one already gone is fine.
async fn delete_pod(
    pods_api: &Api<Pod>,
    name: &str,
    dp: &DeleteParams,
) -> Result<(), OperatorError> {
    match pods_api.delete(name, dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The plan's deletions (a quick one with a 1 s grace period).
async fn delete_pods(
    world: &World,
    pods_api: &Api<Pod>,
    plan: &plan::Plan,
) -> Result<(), OperatorError> {
    for pod_name in &plan.delete {
        info!(world = %world.name_any(), pod = %pod_name, "deleting host pod");
        let dp = if plan.quick.contains(pod_name) {
            DeleteParams {
                grace_period_seconds: Some(1),
                ..DeleteParams::default()
            }
        } else {
            DeleteParams::default()
        };
        delete_pod(pods_api, pod_name, &dp).await?;
    }
    Ok(())
}

/// What every new host pod is built with.
struct Creation<'a> {
    pod_hash: &'a str,
    secret_hash: &'a str,
    placement: Option<&'a kueue::workload::Placement>,
    timings: &'a Timings,
    key: &'a WorldKey,
    /// The World's CA when its Monarch workers serve TLS.
    tls_ca: Option<&'a monarch_tls::Ca>,
}

/// Pods created at once: a 1,000-host World's pods go out in a few dozen
/// round trips, and its first agents are dialed seconds after they start,
/// not after the last pod was created.
const CREATE_CONCURRENCY: usize = 32;

/// Creates the plan's pods, each with a new rank epoch, several at once.
/// Returns the first refusal's message (invariant 2).
async fn create_pods(
    world: &World,
    ctx: &ControllerContext,
    ranks: &[Rank],
    with: &Creation<'_>,
) -> Result<Option<String>, OperatorError> {
    use futures::StreamExt as _;
    let name = world.name_any();
    let raw_pods: Api<kube::api::DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &world.namespace().unwrap_or_default(),
        &kube::api::ApiResource::erase::<Pod>(&()),
    );
    let create = |rank: Rank| {
        let name = &name;
        let raw_pods = &raw_pods;
        async move {
            if let Some(ca) = with.tls_ca {
                monarch_tls::ensure_host(world, ctx, ca, rank).await?;
            }
            let mut pod = desired::pod(
                world,
                rank,
                &ctx.args.agent_image,
                with.pod_hash,
                with.placement,
            )?;
            pod.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(
                    desired::ANNOTATION_SECRET_HASH.to_string(),
                    with.secret_hash.to_string(),
                );
            let epoch =
                fencing::next_epoch(Timestamp::now(), ctx.hub.highest_epoch(with.key, rank));
            fencing::stamp(
                &mut pod,
                epoch,
                fencing::fence_timeout(with.timings.health_timeout, with.timings.eviction_timeout),
            );
            let pod_name = desired::pod_name(name, rank);
            let mut pod = serde_json::to_value(&pod)?;
            if let Some(g) = gang::spec(world) {
                gang::place_pod(&mut pod, world, g, rank);
            }
            // Created as JSON: a gang provider's fields (the Workload API's
            // `spec.schedulingGroup`) are newer than the typed Pod.
            let pod: kube::api::DynamicObject = serde_json::from_value(pod)?;
            let post = PostParams {
                field_manager: Some(FIELD_MANAGER.to_string()),
                ..PostParams::default()
            };
            // A plain create (invariant 7 of [`super`]): a pod that exists
            // (the store has not shown it yet) is left as it is.
            match raw_pods.create(&post, &pod).await {
                Ok(_) => Ok(None),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
                Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
                    debug!(world = %name, pod = %pod_name, code = e.code, message = %e.message, "the API server refused a host pod");
                    Ok(Some(format!("host pod {pod_name}: {}", e.message)))
                }
                Err(e) => Err(OperatorError::from(e)),
            }
        }
    };
    let results: Vec<Result<Option<String>, OperatorError>> =
        futures::stream::iter(ranks.iter().copied())
            .map(create)
            .buffered(CREATE_CONCURRENCY)
            .collect()
            .await;
    let mut refused = None;
    for r in results {
        if let Some(msg) = r? {
            refused.get_or_insert(msg);
        }
    }
    Ok(refused)
}

/// Sets or clears `ReplicaFailure` for a refusal (invariant 2); the Event
/// goes out when the message is new.
async fn report_refusal(
    world: &World,
    ctx: &ControllerContext,
    status: &mut WorldStatus,
    refused: Option<String>,
) {
    let generation = world.metadata.generation;
    let now = Time(Timestamp::now());
    match refused {
        Some(msg) => {
            let was = conditions::get(&status.conditions, conditions::REPLICA_FAILURE)
                .filter(|c| c.status == "True")
                .map(|c| c.message.clone());
            if was.as_deref() != Some(msg.as_str()) {
                warn!(world = %world.name_any(), message = %msg, "the API server refused a host pod");
                ctx.event(world, true, "FailedCreate", msg.clone()).await;
            }
            conditions::set(
                &mut status.conditions,
                conditions::REPLICA_FAILURE,
                true,
                "FailedCreate",
                &msg,
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
}

/// `GangScheduled` from the group object's problem, if any, or from how many
/// live pods are bound.
fn gang_condition(
    world: &World,
    g: &hostmesh_crds::world::GangSpec,
    status: &mut WorldStatus,
    pods: &BTreeMap<Rank, Arc<Pod>>,
    problem: Option<(&'static str, String)>,
) {
    let live: Vec<&Pod> = pods
        .values()
        .map(|p| &**p)
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let bound = live
        .iter()
        .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
        .count();
    let n = world.spec.full_shape().num_ranks();
    let (ok, reason, message) = match problem {
        Some((reason, message)) => (false, reason, message),
        None => gang::condition(world, g, live.len(), bound, n),
    };
    conditions::set(
        &mut status.conditions,
        conditions::GANG_SCHEDULED,
        ok,
        reason,
        &message,
        world.metadata.generation,
        &Time(Timestamp::now()),
    );
}

/// Invariant 3. A suspended or queued World with no pod left waits on a spec
/// change, a pod event or its Workload's watch, not on polling.
fn requeue_after(
    plan: &plan::Plan,
    pods_left: usize,
    deadlines: [Option<Duration>; 3],
) -> Duration {
    let phase = plan.status.phase;
    let steady = phase == Some(WorldPhase::Running)
        || phase == Some(WorldPhase::Failed)
        || phase == Some(WorldPhase::Succeeded)
        || (phase == Some(WorldPhase::Suspended) && pods_left == 0);
    let default = if steady {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(3)
    };
    deadlines.into_iter().flatten().fold(default, Duration::min)
}
