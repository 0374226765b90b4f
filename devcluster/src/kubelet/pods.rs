//! The pod loop: watches pods, gives each pod bound to this node a worker,
//! and binds unscheduled pods to this node when asked to.
//!
//! Invariants:
//! 1. At most one worker per pod uid.
//! 2. After a watch restart, workers of pods missing from the new listing
//!    are told the pod is gone.
//! 3. A pod is bound only when it has no node, uses the default scheduler,
//!    is not being deleted, has no `schedulingGates` (as the scheduler
//!    leaves a gated pod alone until every gate is removed; the removal is a
//!    pod update, which the watch delivers, and the pod is bound then) and
//!    it fits this node as kube-scheduler's filters judge it (`schedule`:
//!    node selector and affinity, taints, pod affinity and anti-affinity
//!    against the Nodes and pods the API server holds at that moment).
//! 4. A pod no node fits gets `PodScheduled=False`, reason `Unschedulable`,
//!    with kube-scheduler's message (`0/N nodes are available: ...`), and is
//!    tried again every [`RETRY`] until it fits, is deleted or is bound by
//!    another kubelet.
//! 5. Unscheduled pods are bound in passes, one pass in flight at a time:
//!    a pass lists the Nodes and pods once and places every pod waiting
//!    when it began, counting its own bindings as placed, so a thousand
//!    new pods cost a few listings, not one listing of every pod per pod
//!    (which made binding O(pods²) in time, API server load and memory).
//!    A kubelet binds no more pods than its Node's `pods` capacity
//!    (`max_pods`) holds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Binding, Node, Pod, Taint};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::pod::{self, Update};
use super::schedule::{self, Placed};
use super::shared::{Shared, pod_key};

struct Entry {
    tx: watch::Sender<Update>,
}

/// How often a pod no node fits is tried again (invariant 4).
const RETRY: Duration = Duration::from_secs(2);

/// The pod loop's bookkeeping, by pod uid.
struct PodLoop {
    shared: Arc<Shared>,
    /// Unscheduled pods this kubelet may bind, latest version (invariant 4).
    unbound: BTreeMap<String, Pod>,
    /// Ends of binding passes (invariant 5).
    attempts: mpsc::UnboundedSender<()>,
    /// Live workers.
    workers: BTreeMap<String, Entry>,
    tasks: JoinSet<String>,
    /// Workers that ended; not restarted until the pod is deleted.
    finished: BTreeSet<String>,
    /// Whether a binding pass is in flight (invariant 5).
    binding: bool,
    /// The pods the last pass was started for: a pass's end starts another
    /// only for pods that came since; the rest wait for [`RETRY`].
    last_pass: BTreeSet<String>,
    /// DaemonSet pods left alone.
    refused: BTreeSet<String>,
    /// Pods seen since the watch (re)started listing.
    listing: Option<BTreeSet<String>>,
}

/// Runs until shutdown; on shutdown waits for every worker to stop its pod.
pub(crate) async fn run(shared: Arc<Shared>) {
    let api: Api<Pod> = Api::all(shared.client.clone());
    let mut cfg = watcher::Config::default();
    let field;
    if !shared.config.bind_unscheduled {
        field = format!("spec.nodeName={}", shared.config.node_name);
        cfg = cfg.fields(&field);
    }
    // Its own bounded back-off: a pod deleted while the API server was
    // down is noticed within seconds of its return (`hostmesh_net::watch`).
    let mut stream = hostmesh_net::watch::recovering(watcher::watcher(api, cfg)).boxed();
    let (attempts, mut ended) = mpsc::unbounded_channel();
    let mut retry = tokio::time::interval(RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut state = PodLoop {
        unbound: BTreeMap::new(),
        attempts,
        shared: shared.clone(),
        workers: BTreeMap::new(),
        tasks: JoinSet::new(),
        finished: BTreeSet::new(),
        binding: false,
        last_pass: BTreeSet::new(),
        refused: BTreeSet::new(),
        listing: None,
    };
    loop {
        tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            Some(done) = state.tasks.join_next(), if !state.tasks.is_empty() => {
                if let Ok(uid) = done {
                    state.workers.remove(&uid);
                    state.finished.insert(uid);
                }
            }
            Some(()) = ended.recv() => {
                state.binding = false;
                state.start_pass(false);
            }
            _ = retry.tick(), if !state.unbound.is_empty() => state.start_pass(true),
            item = stream.next() => {
                let Some(item) = item else { break };
                match item {
                    Ok(event) => state.on_event(event),
                    Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
                }
            }
        }
    }
    state.workers.clear();
    while state.tasks.join_next().await.is_some() {}
}

impl PodLoop {
    fn on_event(&mut self, event: Event<Pod>) {
        match event {
            Event::Init => self.listing = Some(BTreeSet::new()),
            Event::InitDone => {
                if let Some(seen) = self.listing.take() {
                    for (uid, entry) in &self.workers {
                        if !seen.contains(uid) {
                            let _ = entry.tx.send(Update::Gone);
                        }
                    }
                }
            }
            Event::Apply(pod) | Event::InitApply(pod) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                if let Some(seen) = self.listing.as_mut() {
                    seen.insert(uid);
                }
                self.on_pod(pod);
            }
            Event::Delete(pod) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                self.unbound.remove(&uid);
                self.finished.remove(&uid);
                self.refused.remove(&uid);
                if let Some(entry) = self.workers.get(&uid) {
                    let _ = entry.tx.send(Update::Gone);
                }
            }
        }
    }

    fn on_pod(&mut self, pod: Pod) {
        let shared = &self.shared;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let node_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        if !node_name.is_empty() || !should_bind(&pod) {
            self.unbound.remove(&uid);
        }
        if node_name == shared.config.node_name {
            if let Some(entry) = self.workers.get(&uid) {
                let _ = entry.tx.send(Update::Pod(Box::new(pod)));
            } else if !self.finished.contains(&uid) {
                if is_daemon_pod(&pod) && !shared.config.run_daemonsets {
                    // Left alone, not failed: a failed pod would make the
                    // DaemonSet controller recreate it over and over.
                    if self.refused.insert(uid) {
                        tracing::info!(pod = ?pod_key(&pod), "not running a DaemonSet pod (see --run-daemonsets)");
                    }
                    return;
                }
                let (tx, rx) = watch::channel(Update::Pod(Box::new(pod.clone())));
                self.workers.insert(uid.clone(), Entry { tx });
                let shared = shared.clone();
                self.tasks.spawn(async move {
                    pod::run(shared, pod, rx).await;
                    uid
                });
            }
            return;
        }
        if node_name.is_empty() && shared.config.bind_unscheduled && should_bind(&pod) {
            self.unbound.insert(uid, pod);
            self.start_pass(false);
        }
    }

    /// Starts a binding pass over the pods waiting now, unless one is in
    /// flight (invariant 5; the pass's end starts the next one) or, unless
    /// `retry`, every waiting pod was in the last pass already.
    fn start_pass(&mut self, retry: bool) {
        if self.binding || self.unbound.is_empty() {
            return;
        }
        if !retry && self.unbound.keys().all(|u| self.last_pass.contains(u)) {
            return;
        }
        self.binding = true;
        self.last_pass = self.unbound.keys().cloned().collect();
        let waiting: Vec<String> = self.unbound.keys().cloned().collect();
        let shared = self.shared.clone();
        let done = self.attempts.clone();
        tokio::spawn(async move {
            schedule_and_bind(&shared, &waiting).await;
            let _ = done.send(());
        });
    }
}

/// Whether `pod` belongs to a DaemonSet (cluster daemons a real cluster
/// would place on every node, this one included).
pub(crate) fn is_daemon_pod(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true))
}

/// Whether `pod` tolerates every NoSchedule/NoExecute taint in `taints`.
pub(crate) fn tolerates(pod: &Pod, taints: &[Taint]) -> bool {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    taints
        .iter()
        .filter(|t| t.effect != "PreferNoSchedule")
        .all(|t| {
            tolerations.iter().any(|tol| {
                let effect_ok = tol
                    .effect
                    .as_deref()
                    .is_none_or(|e| e.is_empty() || e == t.effect);
                let key_ok = match tol.key.as_deref() {
                    None | Some("") => tol.operator.as_deref() == Some("Exists"),
                    Some(k) => k == t.key,
                };
                let value_ok = match tol.operator.as_deref() {
                    Some("Exists") => true,
                    _ => {
                        tol.value.as_deref().unwrap_or_default()
                            == t.value.as_deref().unwrap_or_default()
                    }
                };
                effect_ok && key_ok && value_ok
            })
        })
}

/// Whether `pod` waits for a scheduler this kubelet plays (invariant 3,
/// before the filters): no node yet is checked by the caller.
pub(crate) fn should_bind(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    if matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return false;
    }
    if spec
        .scheduling_gates
        .as_ref()
        .is_some_and(|g| !g.is_empty())
    {
        return false;
    }
    !spec
        .scheduler_name
        .as_deref()
        .is_some_and(|s| !s.is_empty() && s != "default-scheduler")
}

/// One binding pass (invariant 5): binds each pod of `waiting` (by uid)
/// that is still unscheduled and fits this node, or says why no node fits
/// it (invariants 3-4). Every error is logged and the pod tried again in a
/// later pass.
async fn schedule_and_bind(shared: &Shared, waiting: &[String]) {
    let me = &shared.config.node_name;
    let nodes = match Api::<Node>::all(shared.client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(l) => l.items,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list nodes to schedule a pod");
            return;
        }
    };
    let pods = match Api::<Pod>::all(shared.client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(l) => l.items,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list pods to schedule a pod");
            return;
        }
    };
    let labels: BTreeMap<String, BTreeMap<String, String>> = nodes
        .iter()
        .map(|n| {
            (
                n.metadata.name.clone().unwrap_or_default(),
                schedule::node_labels(n),
            )
        })
        .collect();
    let live = |p: &Pod| {
        !matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
    };
    let mut placed: Vec<Placed> = pods
        .iter()
        .filter(|p| live(p))
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.as_ref()?;
            Some(Placed::of(p, labels.get(node)?.clone()))
        })
        .collect();
    let mut mine = pods
        .iter()
        .filter(|p| live(p))
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()) == Some(me))
        .count();
    let by_uid: BTreeMap<&str, &Pod> = pods
        .iter()
        .filter_map(|p| Some((p.metadata.uid.as_deref()?, p)))
        .collect();
    for uid in waiting {
        // As listed now: bound meanwhile (by another kubelet), deleted or
        // changed pods are judged by what the API server holds.
        let Some(pod) = by_uid.get(uid.as_str()).copied() else {
            continue;
        };
        if pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()) || !should_bind(pod) {
            continue;
        }
        match schedule::feasible(pod, &nodes, &placed) {
            Ok(fits) if fits.iter().any(|n| n == me) => {
                if mine >= shared.config.max_pods as usize {
                    // Full: another node's kubelet binds it.
                    continue;
                }
                if bind(shared, pod).await {
                    mine += 1;
                    if let Some(l) = labels.get(me) {
                        placed.push(Placed::of(pod, l.clone()));
                    }
                }
            }
            // Another node's kubelet binds it.
            Ok(_) => {}
            Err(message) => unschedulable(shared, pod, &message).await,
        }
    }
}

/// Writes `PodScheduled=False` (reason `Unschedulable`, `message`) unless
/// the pod already says so (invariant 4).
async fn unschedulable(shared: &Shared, pod: &Pod, message: &str) {
    let said = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
        .is_some_and(|c| c.status == "False" && c.message.as_deref() == Some(message));
    if said {
        return;
    }
    let (ns, name) = pod_key(pod);
    tracing::info!(pod = %format!("{ns}/{name}"), %message, "pod is unschedulable");
    let status = serde_json::json!({"status": {
        "phase": "Pending",
        "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
        }],
    }});
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &ns);
    if let Err(e) = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
    {
        tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "cannot mark the pod unschedulable");
    }
}

/// Binds `pod` to this node; whether it did.
async fn bind(shared: &Shared, pod: &Pod) -> bool {
    let (ns, name) = pod_key(pod);
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &ns);
    let binding: Binding = match serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": ns, "uid": pod.metadata.uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": shared.config.node_name},
    })) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "cannot build binding");
            return false;
        }
    };
    for attempt in 0..5u32 {
        let result: Result<serde_json::Value, kube::Error> = api
            .create_subresource("binding", &name, &PostParams::default(), &binding)
            .await;
        match result {
            Ok(_) => {
                tracing::info!(pod = %format!("{ns}/{name}"), node = %shared.config.node_name, "bound pod");
                return true;
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => return false,
            Err(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, attempt, "cannot bind pod");
                tokio::select! {
                    _ = shared.shutdown.cancelled() => return false,
                    _ = tokio::time::sleep(Duration::from_millis(500 << attempt)) => {}
                }
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_only_default_scheduler_pods() {
        let pod = |yaml: &str| -> Pod { serde_saphyr::from_str(yaml).unwrap() };
        assert!(should_bind(&pod("spec: {containers: [{name: c}]}")));
        assert!(should_bind(&pod(
            "spec: {schedulerName: default-scheduler, containers: [{name: c}]}"
        )));
        assert!(!should_bind(&pod(
            "spec: {schedulerName: volcano, containers: [{name: c}]}"
        )));
        assert!(!should_bind(&pod(
            "metadata: {deletionTimestamp: '2024-01-01T00:00:00Z'}\nspec: {containers: [{name: c}]}"
        )));
    }

    /// Invariant 3: a gated pod waits; once its gates are removed it binds.
    #[test]
    fn a_pod_with_scheduling_gates_is_not_bound_until_they_are_removed() {
        let gated: Pod = serde_saphyr::from_str(
            "spec: {schedulingGates: [{name: kueue.x-k8s.io/topology}], containers: [{name: c}]}",
        )
        .unwrap();
        assert!(!should_bind(&gated));
        let ungated: Pod =
            serde_saphyr::from_str("spec: {schedulingGates: [], containers: [{name: c}]}").unwrap();
        assert!(should_bind(&ungated));
    }
}
