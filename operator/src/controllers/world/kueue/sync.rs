//! The Kueue side of a World reconcile (I/O): keeps the World's Workload
//! as [`super::workload`] builds it, reads Kueue's verdict and turns it into
//! a [`Gate`] the plan obeys, gives the quota back after an eviction, and
//! watches Workloads so an admission or eviction wakes the World at once.
//!
//! Nothing here runs for a World without the `kueue.x-k8s.io/queue-name`
//! label, and nothing needs Kueue installed until a World names a queue:
//! its API is looked up per reconcile of such a World (kueue invariant 1:
//! a World naming a queue on a cluster without Kueue is held with reason
//! `KueueNotInstalled`, never silently Pending).

use hostmesh_crds::Rank;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use hostmesh_crds::World;
use hostmesh_crds::conditions::{AWAITING_ADMISSION, KUEUE_NOT_INSTALLED};
use hostmesh_crds::world::{LABEL_PRIORITY_CLASS, LABEL_QUEUE_NAME};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};
use tracing::{debug, info};

use super::workload::{self, Placement, Priority, Verdict};
use crate::OperatorError;

/// What Kueue lets the World do this reconcile.
#[derive(Clone, Debug, PartialEq)]
pub enum Gate {
    /// Run. `placement` is set when Kueue admitted the World (and says where
    /// its hosts go); `message` says who admitted it.
    Open {
        /// The admitted flavors' node selectors and tolerations.
        placement: Option<Placement>,
        /// `admitted by ClusterQueue cq (flavors a, b)`.
        message: Option<String>,
    },
    /// Hold the World suspended (kueue invariant 1).
    Held {
        /// Reason of the World's `Suspended` condition.
        reason: String,
        /// Its message: what the World waits for, or why it was evicted.
        message: String,
    },
}

impl Gate {
    /// A World that is not queued runs.
    pub const OPEN: Gate = Gate::Open {
        placement: None,
        message: None,
    };

    fn held(reason: &str, message: impl Into<String>) -> Gate {
        Gate::Held {
            reason: reason.to_string(),
            message: message.into(),
        }
    }
}

/// The LocalQueue a World names, if any.
pub fn queue_name(world: &World) -> Option<&str> {
    world
        .labels()
        .get(LABEL_QUEUE_NAME)
        .map(String::as_str)
        .filter(|q| !q.is_empty())
}

/// Whether the API server serves Kueue's Workload API (the version the
/// operator writes).
pub async fn served(client: &Client) -> Result<bool, OperatorError> {
    match client
        .list_api_group_resources(&format!("{}/{}", workload::GROUP, workload::VERSION))
        .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "workloads")),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// What the World's Workload is built from.
pub struct WorkloadInput<'a> {
    /// The World.
    pub world: &'a World,
    /// Its host pods' template (as the rank-0 pod, see
    /// `desired::pod_set_template`).
    pub template: PodTemplateSpec,
    /// Its number of hosts.
    pub hosts: Rank,
    /// Host pods of the World that still exist (terminating ones too): the
    /// quota is given back only at 0 (kueue invariant 3).
    pub pods_left: usize,
    /// What the World's stored status says, reported on an admitted
    /// Workload (kueue invariant 6); `None` for a World another
    /// controller runs.
    pub progress: Option<workload::WorkloadProgress>,
}

/// Keeps the World's Workload and returns what Kueue lets the World do
/// (kueue invariants 1-5). Call only for a World that names a queue. The
/// API server refusing the operator Kueue's objects (403: the chart's
/// `kueue.enabled` is off) holds the World with reason `KueueForbidden`.
pub async fn gate(client: &Client, input: WorkloadInput<'_>) -> Result<Gate, OperatorError> {
    match gate_inner(client, input).await {
        Err(OperatorError::Kube(kube::Error::Api(e))) if e.code == 403 => Ok(Gate::held(
            "KueueForbidden",
            format!(
                "the operator may not use Kueue's API ({}): install the hostmesh chart with kueue.enabled=true (docs/scheduling.md)",
                e.message
            ),
        )),
        other => other,
    }
}

async fn gate_inner(client: &Client, input: WorkloadInput<'_>) -> Result<Gate, OperatorError> {
    let world = input.world;
    let Some(queue) = queue_name(world) else {
        return Ok(Gate::OPEN);
    };
    let is_served = served(client).await?;
    if is_served {
        // A Workload watch still waiting for Kueue's API starts now.
        KUEUE_SERVED.notify_waiters();
    }
    debug!(world = %world.name_any(), queue, served = is_served, "Kueue gate");
    if !is_served {
        return Ok(Gate::held(
            KUEUE_NOT_INSTALLED,
            format!(
                "label {LABEL_QUEUE_NAME}={queue} queues the World in Kueue, but the API server does not serve {}.{}/{} (Kueue is not installed, or older than v0.15): install Kueue, or remove the label to run the World without it",
                "workloads",
                workload::GROUP,
                workload::VERSION
            ),
        ));
    }
    let ns = world.namespace().unwrap_or_default();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &workload::workloads());
    let name = workload::name(world);
    let hash = workload::pod_set_hash(world, input.hosts);
    let Some(wl) = api.get_opt(&name).await? else {
        let priority = match priority(client, world, &input.template).await? {
            Ok(p) => p,
            Err(held) => return Ok(held),
        };
        let obj = workload::desired(
            world,
            queue,
            input.template,
            input.hosts,
            priority.as_ref(),
            &hash,
        )?;
        let obj: DynamicObject = serde_json::from_value(obj)?;
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => {
                info!(world = %world.name_any(), workload = %name, queue, "created Kueue Workload")
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
                return Ok(Gate::held(
                    "WorkloadRefused",
                    format!("the API server refused Workload {name}: {}", e.message),
                ));
            }
            Err(e) => return Err(e.into()),
        }
        return Ok(Gate::held(
            AWAITING_ADMISSION,
            format!("waiting for Kueue to admit Workload {name} in LocalQueue {queue}"),
        ));
    };
    let wl = serde_json::to_value(&wl)?;
    if wl
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
    {
        if input.pods_left == 0 {
            drop_finalizer(&api, &wl).await?;
        }
        return Ok(Gate::held(
            AWAITING_ADMISSION,
            format!("Workload {name} is being deleted; a new one is queued once it is gone"),
        ));
    }
    let stored_hash = wl
        .pointer(&format!(
            "/metadata/annotations/{}",
            workload::ANNOTATION_POD_SET_HASH.replace('/', "~1")
        ))
        .and_then(Value::as_str);
    if stored_hash != Some(hash.as_str()) {
        // Kueue invariant 2: the hosts stop first, then the stale Workload
        // (and its quota) goes, then a new one is queued.
        if input.pods_left == 0 {
            info!(world = %world.name_any(), workload = %name, "the World's pod set changed: replacing its Workload");
            match api.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            drop_finalizer(&api, &wl).await?;
        }
        return Ok(Gate::held(
            AWAITING_ADMISSION,
            format!(
                "the World's hosts or template changed since Workload {name} was queued: it is replaced and queued again"
            ),
        ));
    }
    // Kueue invariant 5.
    let active = !world.spec.suspend;
    if wl
        .pointer("/spec/active")
        .and_then(Value::as_bool)
        .unwrap_or(true)
        != active
    {
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"active": active}})),
        )
        .await?;
    }
    match workload::verdict(&wl) {
        Verdict::Pending { message } => Ok(Gate::held(AWAITING_ADMISSION, message)),
        Verdict::Evicted {
            reason,
            message,
            quota_reserved,
        } => {
            if quota_reserved && input.pods_left == 0 {
                let patch = workload::release_quota(&wl, &Time(Timestamp::now()));
                match api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {
                        info!(world = %world.name_any(), workload = %name, %reason, "hosts stopped: gave the evicted Workload's quota back")
                    }
                    // Kueue wrote in between: recomputed on the next pass.
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            let reason = if reason.is_empty() {
                "Evicted".to_string()
            } else {
                reason
            };
            Ok(Gate::held(
                &reason,
                format!(
                    "evicted by Kueue ({reason}): {message}; the hosts are stopped and the World waits to be admitted again (Workload {name})"
                ),
            ))
        }
        Verdict::Admitted {
            cluster_queue,
            flavors,
            updates,
        } => {
            let flavor_api: Api<DynamicObject> =
                Api::all_with(client.clone(), &workload::resource_flavors());
            let mut objs = Vec::new();
            for f in &flavors {
                match flavor_api.get_opt(f).await? {
                    Some(o) => objs.push(serde_json::to_value(o)?),
                    None => {
                        return Ok(Gate::held(
                            "FlavorNotFound",
                            format!(
                                "Workload {name} is admitted with ResourceFlavor {f}, which does not exist; the hosts cannot be placed"
                            ),
                        ));
                    }
                }
            }
            if let Some(progress) = &input.progress
                && let Some(patch) = workload::report(&wl, progress, &Time(Timestamp::now()))
            {
                match api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {
                        debug!(world = %world.name_any(), workload = %name, "reported PodsReady/Finished to the Workload")
                    }
                    // Kueue wrote in between: reported again on the next pass.
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            let list = if flavors.is_empty() {
                String::new()
            } else {
                format!(" (flavors {})", flavors.join(", "))
            };
            Ok(Gate::Open {
                placement: Some(Placement::of_flavors(&objs).merge(updates)),
                message: Some(format!("admitted by ClusterQueue {cluster_queue}{list}")),
            })
        }
    }
}

/// The Workload's priority (the World's `kueue.x-k8s.io/priority-class`
/// label, else the pods' `priorityClassName`), or the hold that says which
/// class is missing.
async fn priority(
    client: &Client,
    world: &World,
    template: &PodTemplateSpec,
) -> Result<Result<Option<Priority>, Gate>, OperatorError> {
    if let Some(class) = world.labels().get(LABEL_PRIORITY_CLASS) {
        let api: Api<DynamicObject> =
            Api::all_with(client.clone(), &workload::workload_priority_classes());
        return Ok(match api.get_opt(class).await? {
            Some(o) => Ok(Some(Priority {
                group: workload::GROUP,
                kind: "WorkloadPriorityClass",
                name: class.clone(),
                value: o.data["value"].as_i64().unwrap_or_default() as i32,
            })),
            None => Err(Gate::held(
                "PriorityClassNotFound",
                format!(
                    "label {LABEL_PRIORITY_CLASS}: WorkloadPriorityClass {class} does not exist; create it or fix the label"
                ),
            )),
        });
    }
    let Some(class) = template
        .spec
        .as_ref()
        .and_then(|s| s.priority_class_name.clone())
        .filter(|c| !c.is_empty())
    else {
        return Ok(Ok(None));
    };
    let api: Api<PriorityClass> = Api::all(client.clone());
    Ok(match api.get_opt(&class).await? {
        Some(pc) => Ok(Some(Priority {
            group: "scheduling.k8s.io",
            kind: "PriorityClass",
            name: class,
            value: pc.value,
        })),
        None => Err(Gate::held(
            "PriorityClassNotFound",
            format!(
                "spec.template.spec.priorityClassName: PriorityClass {class} does not exist; create it or fix the name"
            ),
        )),
    })
}

/// Removes Kueue's `resource-in-use` finalizer from a Workload whose World
/// has no hosts left (what Kueue's integrations do once their job stopped).
async fn drop_finalizer(api: &Api<DynamicObject>, wl: &Value) -> Result<(), OperatorError> {
    let finalizers: Vec<&str> = wl
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !finalizers.contains(&workload::FINALIZER_RESOURCE_IN_USE) {
        return Ok(());
    }
    let keep: Vec<&str> = finalizers
        .into_iter()
        .filter(|f| *f != workload::FINALIZER_RESOURCE_IN_USE)
        .collect();
    let name = wl
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let patch = json!({"metadata": {"finalizers": keep, "resourceVersion": wl.pointer("/metadata/resourceVersion")}});
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A World being deleted: its Workload goes with it (owner reference), and
/// Kueue's `resource-in-use` finalizer is removed so it can.
pub async fn release_on_delete(client: &Client, world: &World) -> Result<(), OperatorError> {
    if !served(client).await? {
        return Ok(());
    }
    let ns = world.namespace().unwrap_or_default();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &workload::workloads());
    if let Some(wl) = api.get_opt(&workload::name(world)).await? {
        drop_finalizer(&api, &serde_json::to_value(&wl)?).await?;
    }
    Ok(())
}

/// How often a controller without Kueue looks for it again.
const DISCOVERY_INTERVAL: Duration = Duration::from_secs(30);

/// How long a Workload watch the operator's RBAC refused waits before it
/// is tried again (a grant added later is picked up then).
const FORBIDDEN_RETRY: Duration = Duration::from_secs(300);

/// Whether a watch failed because the API server refused the operator
/// (403).
fn forbidden(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 403,
        watcher::Error::WatchError(s) => s.code == 403,
        _ => false,
    }
}

/// Woken by a reconcile that found Kueue's API served, so a watch waiting
/// for it (Kueue installed after the operator started) starts at once
/// instead of at the next [`DISCOVERY_INTERVAL`].
static KUEUE_SERVED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Worlds to reconcile because their Workload changed. Until Kueue's API
/// is served this only looks for it every 30 s, or at once when a
/// reconcile finds it; then it watches Workloads in `ns` (all
/// namespaces with `None`) and yields each one's controlling World. Its
/// background task ends when the stream is dropped.
pub fn triggers(client: Client, ns: Option<String>) -> impl Stream<Item = ObjectRef<World>> + Send {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        // Invariant: a Workload watch the operator's RBAC refuses (the
        // chart's `kueue.enabled` off) is dropped and tried again only
        // after FORBIDDEN_RETRY, instead of a 403 every few seconds.
        let mut refused = false;
        loop {
            if refused {
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep(FORBIDDEN_RETRY) => {}
                }
            }
            loop {
                if tx.is_closed() {
                    return;
                }
                match served(&client).await {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) => debug!(error = %e, "looking up Kueue's Workload API"),
                }
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = KUEUE_SERVED.notified() => {}
                    _ = tokio::time::sleep(DISCOVERY_INTERVAL) => {}
                }
            }
            let ar = workload::workloads();
            let api: Api<DynamicObject> = match &ns {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
                None => Api::all_with(client.clone(), &ar),
            };
            // Its own back-off: a failing watch neither spins nor waits long
            // (`hostmesh_net::watch`).
            let mut events = std::pin::pin!(
                hostmesh_net::watch::recovering(watcher(api, watcher::Config::default())).boxed()
            );
            // The controller going away (shutdown, lost leadership) drops the
            // receiver: the watch ends with it instead of lingering.
            loop {
                let ev = tokio::select! {
                    _ = tx.closed() => return,
                    ev = events.next() => match ev {
                        Some(ev) => ev,
                        None => return,
                    },
                };
                let objs = match ev {
                    Ok(
                        watcher::Event::Apply(o)
                        | watcher::Event::Delete(o)
                        | watcher::Event::InitApply(o),
                    ) => vec![o],
                    Ok(_) => vec![],
                    Err(e) if forbidden(&e) => {
                        if !refused {
                            info!(
                                "Kueue's Workloads are served but not granted to the operator (the chart's kueue.enabled is off): Worlds that name a Kueue queue are held with reason KueueForbidden"
                            );
                        }
                        refused = true;
                        break;
                    }
                    Err(e) => {
                        debug!(error = %e, "watching Kueue Workloads");
                        vec![]
                    }
                };
                for o in objs {
                    let ns = o.namespace().unwrap_or_default();
                    for owner in o.owner_references() {
                        if owner.kind == "World"
                            && owner.api_version
                                == format!("{}/{}", hostmesh_crds::GROUP, hostmesh_crds::VERSION)
                            && owner.controller == Some(true)
                            && tx
                                .send(ObjectRef::<World>::new(&owner.name).within(&ns))
                                .is_err()
                        {
                            return;
                        }
                    }
                }
            }
        }
    });
    futures::stream::unfold(rx, |mut rx| async move {
        let r = rx.recv().await?;
        Some((r, rx))
    })
}
