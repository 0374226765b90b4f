//! Owns conversion between resources that share one storage: core `v1`
//! Events and `events.k8s.io/v1` Events are the same objects, as on a real
//! cluster (the operator records through `events.k8s.io`, `kubectl
//! describe` reads core events). Objects are stored in the core form and
//! converted on the way in and out; both conversions are idempotent.

use serde_json::{Map, Value};

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

/// The object as the resource `info` shows it.
pub(crate) fn to_view(info: &ResourceInfo, obj: &Value) -> Value {
    if is_new_events(info) && obj.get("apiVersion").and_then(Value::as_str) == Some("v1") {
        rename(obj, "events.k8s.io/v1", true)
    } else {
        obj.clone()
    }
}

/// The object as stored.
pub(crate) fn to_storage(info: &ResourceInfo, obj: Value) -> Value {
    if is_new_events(info) && obj.get("apiVersion").and_then(Value::as_str) != Some("v1") {
        rename(&obj, "v1", false)
    } else {
        obj
    }
}
