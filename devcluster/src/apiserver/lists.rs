//! Owns how lists inside objects merge: by key (containers by `name`,
//! conditions by `type`, ...), as sets (finalizers), or atomically. Built-in
//! types use the merge keys of their Go types; custom resources use the
//! `x-kubernetes-list-type` / `x-kubernetes-list-map-keys` of their schema
//! (atomic when unset, as the real server does).

use serde_json::Value;

/// How a list field merges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListKind {
    /// Replaced whole.
    Atomic,
    /// A set of scalars (union on merge).
    Set,
    /// Items identified by these key fields.
    Map(Vec<String>),
}

/// The merge keys of built-in list fields, by field name.
fn builtin_kind(field: &str, items: &[Value]) -> ListKind {
    let keyed = |k: &str| ListKind::Map(vec![k.to_string()]);
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims"
        | "containerStatuses"
        | "initContainerStatuses"
        | "readinessGates" => keyed("name"),
        "volumeMounts" => keyed("mountPath"),
        "volumeDevices" => keyed("devicePath"),
        "conditions" | "addresses" => keyed("type"),
        "hostAliases" => keyed("ip"),
        "topologySpreadConstraints" => keyed("topologyKey"),
        "ownerReferences" => keyed("uid"),
        "finalizers" => ListKind::Set,
        "ports" => {
            if items.iter().any(|i| i.get("containerPort").is_some()) {
                keyed("containerPort")
            } else {
                keyed("port")
            }
        }
        _ => ListKind::Atomic,
    }
}

/// The list kind of `field`, given the schema node of the list (custom
/// resources) or none (built-in types).
pub(crate) fn list_kind(
    builtin: bool,
    field: &str,
    schema: Option<&Value>,
    items: &[Value],
) -> ListKind {
    if field == "finalizers" {
        return ListKind::Set;
    }
    if field == "ownerReferences" {
        return ListKind::Map(vec!["uid".into()]);
    }
    if builtin {
        return builtin_kind(field, items);
    }
    let Some(schema) = schema else {
        return ListKind::Atomic;
    };
    match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => ListKind::Set,
        Some("map") => ListKind::Map(
            schema
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|k| k.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
        ),
        _ => ListKind::Atomic,
    }
}

/// The schema of property `field` under an object schema.
pub(crate) fn child_schema<'a>(schema: Option<&'a Value>, field: &str) -> Option<&'a Value> {
    let s = schema?;
    s.get("properties")
        .and_then(|p| p.get(field))
        .or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))
}

/// The item schema of an array schema.
pub(crate) fn item_schema(schema: Option<&Value>) -> Option<&Value> {
    schema?.get("items")
}

/// The key values of a keyed item, or `None` when a key is missing.
pub(crate) fn item_key(item: &Value, keys: &[String]) -> Option<serde_json::Map<String, Value>> {
    let mut out = serde_json::Map::new();
    for k in keys {
        // A missing key with a scalar default (ports' protocol) still keys.
        let v = item.get(k)?;
        out.insert(k.clone(), v.clone());
    }
    Some(out)
}

/// Whether `item` has the key values `key`.
pub(crate) fn has_key(item: &Value, key: &serde_json::Map<String, Value>) -> bool {
    key.iter().all(|(k, v)| item.get(k) == Some(v))
}
