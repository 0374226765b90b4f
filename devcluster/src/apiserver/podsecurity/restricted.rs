//! The checks only `restricted` adds, in the real server's order.

use std::collections::BTreeSet;

use serde_json::Value;

use super::Violation;
use super::pod::*;

pub(super) fn allow_privilege_escalation(cs: &[Ctr<'_>]) -> Option<Violation> {
    let names: Vec<&str> = cs
        .iter()
        .filter(|c| bool_at(c.sc("allowPrivilegeEscalation")) != Some(false))
        .map(|c| c.name)
        .collect();
    if names.is_empty() {
        return None;
    }
    violation(
        "allowPrivilegeEscalation != false",
        format!(
            "{} must set securityContext.allowPrivilegeEscalation=false",
            ctrs(&names)
        ),
    )
}

pub(super) fn capabilities_restricted(cs: &[Ctr<'_>]) -> Option<Violation> {
    let mut no_drop = Vec::new();
    let mut adders = Vec::new();
    let mut caps = BTreeSet::new();
    for c in cs {
        let drops_all =
            c.c.pointer("/securityContext/capabilities/drop")
                .and_then(Value::as_array)
                .is_some_and(|d| d.iter().any(|x| x == "ALL"));
        if !drops_all {
            no_drop.push(c.name);
        }
        let bad: Vec<&str> = added_caps(c)
            .into_iter()
            .filter(|cap| *cap != "NET_BIND_SERVICE")
            .collect();
        if !bad.is_empty() {
            adders.push(c.name);
            caps.extend(bad);
        }
    }
    let mut details = Vec::new();
    if !no_drop.is_empty() {
        details.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            ctrs(&no_drop)
        ));
    }
    if !adders.is_empty() {
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            ctrs(&adders),
            quote_join(&caps)
        ));
    }
    if details.is_empty() {
        return None;
    }
    violation("unrestricted capabilities", details.join("; "))
}

/// The volume types restricted allows.
pub(super) const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

pub(super) fn restricted_volumes(spec: &Value) -> Option<Violation> {
    let mut names = Vec::new();
    let mut types = BTreeSet::new();
    for v in volumes(spec) {
        let kind = v
            .as_object()
            .into_iter()
            .flatten()
            .find(|(k, val)| *k != "name" && !val.is_null())
            .map_or("unknown", |(k, _)| k.as_str());
        if !RESTRICTED_VOLUMES.contains(&kind) {
            names.push(volume_name(v));
            types.insert(kind);
        }
    }
    if names.is_empty() {
        return None;
    }
    violation(
        "restricted volume types",
        format!(
            "{} {} {} restricted volume {} {}",
            plural("volume", "volumes", names.len()),
            quote_join(&names),
            plural("uses", "use", names.len()),
            plural("type", "types", types.len()),
            quote_join(&types)
        ),
    )
}

pub(super) fn run_as_non_root(psc: &Value, cs: &[Ctr<'_>]) -> Option<Violation> {
    let pod = bool_at(psc.get("runAsNonRoot"));
    let mut explicit = Vec::new();
    let mut implicit = Vec::new();
    for c in cs {
        match bool_at(c.sc("runAsNonRoot")) {
            Some(true) => {}
            Some(false) => explicit.push(c.name),
            None if pod == Some(true) => {}
            None => implicit.push(c.name),
        }
    }
    let mut details = Vec::new();
    if pod == Some(false) {
        details.push("pod must not set securityContext.runAsNonRoot=false".to_string());
    }
    if !explicit.is_empty() {
        details.push(format!(
            "{} must not set securityContext.runAsNonRoot=false",
            ctrs(&explicit)
        ));
    }
    if !implicit.is_empty() {
        details.push(format!(
            "pod or {} must set securityContext.runAsNonRoot=true",
            ctrs(&implicit)
        ));
    }
    if details.is_empty() {
        return None;
    }
    violation("runAsNonRoot != true", details.join("; "))
}

pub(super) fn run_as_user(psc: &Value, cs: &[Ctr<'_>]) -> Option<Violation> {
    let root = |v: Option<&Value>| v.and_then(Value::as_i64) == Some(0);
    let pod = root(psc.get("runAsUser"));
    let names: Vec<&str> = cs
        .iter()
        .filter(|c| root(c.sc("runAsUser")))
        .map(|c| c.name)
        .collect();
    if !pod && names.is_empty() {
        return None;
    }
    violation(
        "runAsUser=0",
        format!("{} must not set runAsUser=0", setters(pod, &names)),
    )
}

pub(super) fn seccomp_restricted(psc: &Value, cs: &[Ctr<'_>]) -> Option<Violation> {
    let valid = |t: &str| t == "RuntimeDefault" || t == "Localhost";
    let pod_type = seccomp_type(psc.get("seccompProfile"));
    let pod_bad = pod_type.is_some_and(|t| !valid(t));
    let pod_ok = pod_type.is_some_and(valid);
    let mut values = BTreeSet::new();
    if let Some(t) = pod_type.filter(|t| !valid(t)) {
        values.insert(t);
    }
    let mut explicit = Vec::new();
    let mut implicit = Vec::new();
    for c in cs {
        match seccomp_type(c.sc("seccompProfile")) {
            Some(t) if valid(t) => {}
            Some(t) => {
                explicit.push(c.name);
                values.insert(t);
            }
            None if pod_ok => {}
            None => implicit.push(c.name),
        }
    }
    let mut details = Vec::new();
    if pod_bad || !explicit.is_empty() {
        details.push(format!(
            "{} must not set securityContext.seccompProfile.type to {}",
            setters(pod_bad, &explicit),
            quote_join(&values)
        ));
    }
    if !implicit.is_empty() {
        details.push(format!(
            "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
            ctrs(&implicit)
        ));
    }
    if details.is_empty() {
        return None;
    }
    violation("seccompProfile", details.join("; "))
}
