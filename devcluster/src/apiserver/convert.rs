//! Owns conversion between resources that share one storage: core `v1`
//! Events and `events.k8s.io/v1` Events are the same objects, as on a real
//! cluster (the operator records through `events.k8s.io`, `kubectl
//! describe` reads core events). Objects are stored in the core form and
//! converted on the way in and out; both conversions are idempotent.
//! HorizontalPodAutoscalers are stored as `autoscaling/v2` and shown as
//! `v1` by their CPU utilization target (what `v1` can say; other metrics
//! and `behavior` do not survive a write through `v1`).

use serde_json::{Map, Value, json};

use super::registry::ResourceInfo;

const RENAMES: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

fn is_new_events(info: &ResourceInfo) -> bool {
    info.builtin && info.group == "events.k8s.io" && info.plural == "events"
}

fn rename(obj: &Value, api_version: &str, to_new: bool) -> Value {
    let Some(m) = obj.as_object() else {
        return obj.clone();
    };
    let mut out = Map::new();
    for (k, v) in m {
        let renamed = RENAMES.iter().find_map(|(core, new)| {
            if to_new && k == core {
                Some(*new)
            } else if !to_new && k == new {
                Some(*core)
            } else {
                None
            }
        });
        out.insert(renamed.unwrap_or(k).to_string(), v.clone());
    }
    if !to_new
        && !out.contains_key("source")
        && let Some(c) = out.get("reportingComponent").cloned()
    {
        out.insert("source".into(), serde_json::json!({"component": c}));
    }
    out.insert("apiVersion".into(), Value::String(api_version.into()));
    Value::Object(out)
}

/// The object as the resource `info` shows it at `version`.
pub(crate) fn to_view(info: &ResourceInfo, version: &str, obj: &Value) -> Value {
    if is_new_events(info) && obj.get("apiVersion").and_then(Value::as_str) == Some("v1") {
        rename(obj, "events.k8s.io/v1", true)
    } else if is_hpa(info)
        && version == "v1"
        && obj.get("apiVersion").and_then(Value::as_str) != Some("autoscaling/v1")
    {
        hpa_to_v1(obj)
    } else {
        obj.clone()
    }
}

/// The object as stored.
pub(crate) fn to_storage(info: &ResourceInfo, obj: Value) -> Value {
    if is_new_events(info) && obj.get("apiVersion").and_then(Value::as_str) != Some("v1") {
        rename(&obj, "v1", false)
    } else if is_hpa(info)
        && obj.get("apiVersion").and_then(Value::as_str) == Some("autoscaling/v1")
    {
        hpa_to_v2(obj)
    } else {
        obj
    }
}

fn is_hpa(info: &ResourceInfo) -> bool {
    info.builtin && info.group == "autoscaling" && info.plural == "horizontalpodautoscalers"
}

/// The CPU utilization metric of `autoscaling/v2` (`metrics` or
/// `currentMetrics` entry), if `m` is one.
fn cpu_utilization(m: &Value, field: &str) -> Option<Value> {
    (m.get("type")? == "Resource" && m.pointer("/resource/name")? == "cpu")
        .then(|| {
            m.pointer(&format!("/resource/{field}/averageUtilization"))
                .cloned()
        })
        .flatten()
}

fn hpa_to_v1(obj: &Value) -> Value {
    let mut o = obj.clone();
    o["apiVersion"] = json!("autoscaling/v1");
    if let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut) {
        let cpu = spec
            .get("metrics")
            .and_then(Value::as_array)
            .and_then(|ms| ms.iter().find_map(|m| cpu_utilization(m, "target")));
        spec.remove("metrics");
        spec.remove("behavior");
        if let Some(cpu) = cpu {
            spec.insert("targetCPUUtilizationPercentage".into(), cpu);
        }
    }
    if let Some(status) = o.get_mut("status").and_then(Value::as_object_mut) {
        let cpu = status
            .get("currentMetrics")
            .and_then(Value::as_array)
            .and_then(|ms| ms.iter().find_map(|m| cpu_utilization(m, "current")));
        status.remove("currentMetrics");
        status.remove("conditions");
        if let Some(cpu) = cpu {
            status.insert("currentCPUUtilizationPercentage".into(), cpu);
        }
    }
    o
}

fn hpa_to_v2(mut o: Value) -> Value {
    o["apiVersion"] = json!("autoscaling/v2");
    if let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut)
        && let Some(cpu) = spec.remove("targetCPUUtilizationPercentage")
    {
        spec.insert(
            "metrics".into(),
            json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": cpu}}}]),
        );
    }
    if let Some(status) = o.get_mut("status").and_then(Value::as_object_mut)
        && let Some(cpu) = status.remove("currentCPUUtilizationPercentage")
    {
        status.insert(
            "currentMetrics".into(),
            json!([{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": cpu}}}]),
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::Registry;

    #[test]
    fn an_hpa_is_shown_as_v1_by_its_cpu_target_and_stored_as_v2() {
        let reg = Registry::new();
        let info = reg
            .lookup("autoscaling", "v1", "horizontalpodautoscalers")
            .expect("served as v1");
        let stored = json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "h"},
            "spec": {"minReplicas": 1, "maxReplicas": 3,
                     "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]},
        });
        let v1 = to_view(&info, "v1", &stored);
        assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 70);
        assert!(v1["spec"].get("metrics").is_none());
        assert_eq!(to_storage(&info, v1)["spec"], stored["spec"]);
        assert_eq!(to_view(&info, "v2", &stored), stored);
    }
}
