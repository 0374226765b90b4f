//! Reading a pod spec for the checks: its containers with their security
//! contexts, typed lookups that treat a field of the wrong type as unset,
//! and the real server's wording of names and lists.

use serde_json::Value;

use super::Violation;

/// A container of the pod with its security context.
pub(super) struct Ctr<'a> {
    pub(super) name: &'a str,
    pub(super) c: &'a Value,
}

impl Ctr<'_> {
    pub(super) fn sc(&self, field: &str) -> Option<&Value> {
        self.c.get("securityContext").and_then(|s| s.get(field))
    }
}

pub(super) fn containers(spec: &Value) -> Vec<Ctr<'_>> {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .filter_map(|l| spec.get(*l).and_then(Value::as_array))
        .flatten()
        .map(|c| Ctr {
            name: c.get("name").and_then(Value::as_str).unwrap_or(""),
            c,
        })
        .collect()
}

pub(super) fn quote_join<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    items
        .into_iter()
        .map(|s| format!("\"{}\"", s.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn plural<'a>(one: &'a str, many: &'a str, n: usize) -> &'a str {
    if n == 1 { one } else { many }
}

/// `container "a"` / `containers "a", "b"`.
pub(super) fn ctrs(names: &[&str]) -> String {
    format!(
        "{} {}",
        plural("container", "containers", names.len()),
        quote_join(names)
    )
}

/// `pod`, `container "a"`, `pod and containers "a", "b"`.
pub(super) fn setters(pod: bool, names: &[&str]) -> String {
    let mut parts = Vec::new();
    if pod {
        parts.push("pod".to_string());
    }
    if !names.is_empty() {
        parts.push(ctrs(names));
    }
    parts.join(" and ")
}

pub(super) fn bool_at(v: Option<&Value>) -> Option<bool> {
    v.and_then(Value::as_bool)
}

pub(super) fn str_at(v: Option<&Value>) -> &str {
    v.and_then(Value::as_str).unwrap_or("")
}

pub(super) fn violation(reason: &str, detail: String) -> Option<Violation> {
    Some(Violation {
        reason: reason.to_string(),
        detail,
    })
}

pub(super) fn added_caps<'a>(c: &Ctr<'a>) -> Vec<&'a str> {
    c.c.pointer("/securityContext/capabilities/add")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|v| v.as_str().unwrap_or(""))
        .collect()
}

pub(super) fn volumes(spec: &Value) -> impl Iterator<Item = &Value> {
    spec.get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

pub(super) fn volume_name(v: &Value) -> &str {
    str_at(v.get("name"))
}

pub(super) fn seccomp_type(sc: Option<&Value>) -> Option<&str> {
    sc.and_then(|s| s.get("type")).and_then(Value::as_str)
}
