//! Kubernetes Events about pods (`Started`, `Killing`, `BackOff`,
//! `Unhealthy`, `Failed`), as a kubelet records them for `kubectl describe`.
//! Publishing never blocks a pod worker: each event is sent from its own
//! task and a failure is only logged.

use k8s_openapi::api::core::v1::Pod;
use kube::Resource as _;
use kube::runtime::events::{Event, EventType, Recorder};

/// Records `reason` (with `note`) on `pod`, in the background.
pub(crate) fn emit(
    recorder: &Recorder,
    pod: &Pod,
    warning: bool,
    reason: &str,
    action: &str,
    note: String,
) {
    let recorder = recorder.clone();
    let reference = pod.object_ref(&());
    let event = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    };
    tokio::spawn(async move {
        if let Err(e) = recorder.publish(&event, &reference).await {
            tracing::debug!(error = %e, reason = %event.reason, "cannot record event");
        }
    });
}
