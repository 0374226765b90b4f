//! Kubernetes Events about pods (`Started`, `Killing`, `BackOff`,
//! `Unhealthy`, `Failed`), written as `v1` Events with source `kubelet` the
//! way a kubelet records them, so `kubectl describe pod` and
//! `kubectl get events` show them. Publishing never blocks a pod worker:
//! each event is sent from its own task and a failure is only logged.

use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;

use super::shared::{Shared, pod_key};

static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// Records `reason` (with `note`) on `pod`, in the background.
pub(crate) fn emit(shared: &Shared, pod: &Pod, warning: bool, reason: &str, note: String) {
    let (ns, name) = pod_key(pod);
    let now = Timestamp::now();
    let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    let event_name = format!("{name}.{:x}{seq:04x}", now.as_nanosecond() as u64);
    let event = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name, "namespace": ns},
        "involvedObject": {
            "apiVersion": "v1", "kind": "Pod", "name": name, "namespace": ns,
            "uid": pod.metadata.uid,
        },
        "reason": reason,
        "message": note.chars().take(1000).collect::<String>(),
        "type": if warning { "Warning" } else { "Normal" },
        "source": {"component": "kubelet", "host": shared.config.node_name},
        "reportingComponent": "kubelet",
        "reportingInstance": shared.config.node_name,
        "firstTimestamp": now.to_string(),
        "lastTimestamp": now.to_string(),
        "count": 1,
    });
    let event: Event = match serde_json::from_value(event) {
        Ok(e) => e,
        Err(e) => {
            tracing::debug!(error = %e, "cannot build event");
            return;
        }
    };
    let api: Api<Event> = Api::namespaced(shared.client.clone(), &ns);
    tokio::spawn(async move {
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            tracing::debug!(error = %e, reason = %event.reason.unwrap_or_default(), "cannot record event");
        }
    });
}
