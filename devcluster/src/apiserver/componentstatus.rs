//! Owns `v1` ComponentStatus (`kubectl get cs`), deprecated since 1.19 and
//! still served: computed on every request, never stored. The embedded
//! server is its own scheduler (the kubelet binds pods), controller
//! manager and store, so all three report what a healthy cluster does.
//!
//! Invariants:
//! 1. Only `get` and `list` are served: a watch is 405 with the real
//!    message, other verbs 405, an unknown name the real server's 500
//!    `Component not found: <name>`.
//! 2. Every answer carries the real server's deprecation warning.

use serde_json::{Value, json};

use super::route::RouteTarget;
use super::status::ApiError;

/// The warning every answer carries (invariant 2).
pub(crate) const DEPRECATED: &str = "v1 ComponentStatus is deprecated in v1.19+";

/// The components, in the real server's order.
const COMPONENTS: &[&str] = &["scheduler", "controller-manager", "etcd-0"];

fn item(name: &str) -> Value {
    json!({
        "kind": "ComponentStatus",
        "apiVersion": "v1",
        "metadata": {"name": name, "creationTimestamp": null},
        "conditions": [{"type": "Healthy", "status": "True", "message": "ok"}],
    })
}

/// Whether `t` addresses componentstatuses.
pub(crate) fn is_target(t: &RouteTarget) -> bool {
    t.info.builtin && t.info.group.is_empty() && t.info.plural == "componentstatuses"
}

/// The answer to a GET (a list or one component), invariant 1.
pub(crate) fn get(t: &RouteTarget, watching: bool) -> Result<Value, ApiError> {
    if watching {
        let mut e = ApiError::method_not_allowed();
        e.message = "watch is not supported on resources of kind \"componentstatuses\"".into();
        e.details = Some(json!({"kind": "componentstatuses"}));
        return Err(e);
    }
    match &t.name {
        None => Ok(json!({
            "kind": "ComponentStatusList",
            "apiVersion": "v1",
            "metadata": {},
            "items": COMPONENTS.iter().map(|c| {
                let mut i = item(c);
                if let Some(o) = i.as_object_mut() {
                    // List items carry no kind, as the real server's.
                    o.remove("kind");
                    o.remove("apiVersion");
                }
                i
            }).collect::<Vec<_>>(),
        })),
        Some(n) if COMPONENTS.contains(&n.as_str()) => Ok(item(n)),
        Some(n) => Err(ApiError::unknown(500, format!("Component not found: {n}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::Registry;

    fn target(name: Option<&str>) -> RouteTarget {
        RouteTarget {
            info: Registry::new()
                .lookup("", "v1", "componentstatuses")
                .expect("served"),
            version: "v1".into(),
            ns: None,
            name: name.map(str::to_string),
            sub: None,
        }
    }

    #[test]
    fn components_are_healthy_and_only_read() {
        let list = get(&target(None), false).expect("list");
        let names: Vec<&str> = list["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|i| i["metadata"]["name"].as_str())
            .collect();
        assert_eq!(names, ["scheduler", "controller-manager", "etcd-0"]);
        assert_eq!(list["items"][2]["conditions"][0]["status"], "True");
        assert_eq!(
            get(&target(Some("etcd-0")), false).expect("get")["kind"],
            "ComponentStatus"
        );
        let e = get(&target(Some("nope")), false).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (500, "Component not found: nope")
        );
        let e = get(&target(None), true).unwrap_err();
        assert_eq!(e.code, 405);
    }
}
