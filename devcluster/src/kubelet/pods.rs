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
//!    its `nodeSelector` matches this node's labels.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Binding, Pod, Taint};
use kube::Api;
use kube::api::PostParams;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::node;
use super::pod::{self, Update};
use super::shared::{Shared, pod_key};

struct Entry {
    tx: watch::Sender<Update>,
}

/// The pod loop's bookkeeping, by pod uid.
struct PodLoop {
    shared: Arc<Shared>,
    node_labels: serde_json::Value,
    /// Live workers.
    workers: BTreeMap<String, Entry>,
    tasks: JoinSet<String>,
    /// Workers that ended; not restarted until the pod is deleted.
    finished: BTreeSet<String>,
    /// Pods a binding was attempted for.
    binding: BTreeSet<String>,
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
    let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
    let mut state = PodLoop {
        node_labels: node::labels(&shared.config.node_name),
        shared: shared.clone(),
        workers: BTreeMap::new(),
        tasks: JoinSet::new(),
        finished: BTreeSet::new(),
        binding: BTreeSet::new(),
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
                self.binding.remove(&uid);
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
        if node_name.is_empty()
            && shared.config.bind_unscheduled
            && should_bind(&pod, &self.node_labels)
            && tolerates(&pod, &shared.config.taints)
            && self.binding.insert(uid)
        {
            let shared = shared.clone();
            tokio::spawn(async move { bind(&shared, &pod).await });
        }
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

/// Whether this kubelet should bind `pod` to itself (invariant 3).
pub(crate) fn should_bind(pod: &Pod, node_labels: &serde_json::Value) -> bool {
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
    if spec
        .scheduler_name
        .as_deref()
        .is_some_and(|s| !s.is_empty() && s != "default-scheduler")
    {
        return false;
    }
    spec.node_selector
        .iter()
        .flatten()
        .all(|(k, v)| node_labels.get(k).and_then(|l| l.as_str()) == Some(v.as_str()))
}

async fn bind(shared: &Shared, pod: &Pod) {
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
            return;
        }
    };
    for attempt in 0..5u32 {
        let result: Result<serde_json::Value, kube::Error> = api
            .create_subresource("binding", &name, &PostParams::default(), &binding)
            .await;
        match result {
            Ok(_) => {
                tracing::info!(pod = %format!("{ns}/{name}"), node = %shared.config.node_name, "bound pod");
                return;
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => return,
            Err(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, attempt, "cannot bind pod");
                tokio::select! {
                    _ = shared.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(500 << attempt)) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_only_default_scheduler_pods_that_fit_the_selector() {
        let labels = node::labels("n1");
        let pod = |yaml: &str| -> Pod { serde_saphyr::from_str(yaml).unwrap() };
        assert!(should_bind(
            &pod("spec: {containers: [{name: c}]}"),
            &labels
        ));
        assert!(should_bind(
            &pod("spec: {schedulerName: default-scheduler, containers: [{name: c}]}"),
            &labels
        ));
        assert!(!should_bind(
            &pod("spec: {schedulerName: volcano, containers: [{name: c}]}"),
            &labels
        ));
        assert!(should_bind(
            &pod("spec: {nodeSelector: {kubernetes.io/os: linux}, containers: [{name: c}]}"),
            &labels
        ));
        assert!(!should_bind(
            &pod("spec: {nodeSelector: {gpu: a100}, containers: [{name: c}]}"),
            &labels
        ));
        assert!(!should_bind(
            &pod(
                "metadata: {deletionTimestamp: '2024-01-01T00:00:00Z'}\nspec: {containers: [{name: c}]}"
            ),
            &labels
        ));
    }

    /// Invariant 3: a gated pod waits; once its gates are removed it binds.
    #[test]
    fn a_pod_with_scheduling_gates_is_not_bound_until_they_are_removed() {
        let labels = node::labels("n1");
        let gated: Pod = serde_saphyr::from_str(
            "spec: {schedulingGates: [{name: kueue.x-k8s.io/topology}], containers: [{name: c}]}",
        )
        .unwrap();
        assert!(!should_bind(&gated, &labels));
        let ungated: Pod =
            serde_saphyr::from_str("spec: {schedulingGates: [], containers: [{name: c}]}").unwrap();
        assert!(should_bind(&ungated, &labels));
    }
}
