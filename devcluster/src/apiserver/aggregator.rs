//! Owns the `apiregistration.k8s.io/v1` APIService objects of the group
//! versions this server serves, as kube-apiserver's aggregator registers
//! them (`v1.`, `v1.apps`, ... `Local`, always `Available`), and one per
//! served version of every CRD group (as the CRD registration controller
//! does), so `kubectl get apiservices` lists what discovery lists.
//!
//! Invariants:
//! 1. After every CRD write and at start, each served group version has
//!    its APIService with the real spec (`groupPriorityMinimum`,
//!    `versionPriority`) and label `kube-aggregator.kubernetes.io/automanaged`
//!    (`onstart` for built-in groups, `true` for CRD groups).
//! 2. An APIService labelled `automanaged: "true"` whose group version is
//!    no longer served (its CRD is gone) is removed; other APIServices are
//!    left alone (no aggregated API server is proxied to, see
//!    docs/apiserver.md).

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::meta;
use super::registry::{group_priority, version_priority_of};
use super::store::StoreState;

/// The storage key of APIServices.
pub(crate) const KEY: &str = "apiregistration.k8s.io/apiservices";
const LABEL: &str = "kube-aggregator.kubernetes.io/automanaged";

/// The APIService name of a group version: `v1.apps`, `v1.` for core.
fn name(group: &str, version: &str) -> String {
    format!("{version}.{group}")
}

fn desired_spec(group: &str, version: &str, builtin: bool) -> Value {
    let (group_min, version_default) = group_priority(group);
    let version_priority = if builtin {
        version_priority_of(group, version)
    } else {
        version_default
    };
    let mut spec = json!({
        "version": version,
        "groupPriorityMinimum": group_min,
        "versionPriority": version_priority,
    });
    if !group.is_empty() {
        spec["group"] = json!(group);
    }
    spec
}

/// Brings the stored APIServices in line with the served group versions
/// (invariants 1 and 2).
pub(crate) fn sync(st: &mut StoreState) {
    let builtin_groups: BTreeSet<String> = st
        .registry
        .all()
        .filter(|r| r.builtin)
        .map(|r| r.group.clone())
        .collect();
    let mut wanted = BTreeSet::new();
    for (group, versions) in st.registry.groups() {
        if group == "apiregistration.k8s.io" {
            // The aggregator does not register itself.
            continue;
        }
        let builtin = builtin_groups.contains(&group);
        for version in versions {
            let n = name(&group, &version);
            wanted.insert(n.clone());
            let spec = desired_spec(&group, &version, builtin);
            let label = if builtin { "onstart" } else { "true" };
            let old = st.get(KEY, "", &n);
            if old.as_deref().is_some_and(|o| {
                o.get("spec") == Some(&spec)
                    && o.pointer(&format!("/metadata/labels/{}", LABEL.replace('/', "~1")))
                        .and_then(Value::as_str)
                        == Some(label)
            }) {
                continue;
            }
            let (uid, created) = match old.as_deref() {
                Some(o) => (
                    o.pointer("/metadata/uid")
                        .cloned()
                        .unwrap_or(json!(meta::new_uid())),
                    o.pointer("/metadata/creationTimestamp")
                        .cloned()
                        .unwrap_or(json!(meta::now())),
                ),
                None => (json!(meta::new_uid()), json!(meta::now())),
            };
            let obj = json!({
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": n, "uid": uid, "creationTimestamp": created, "labels": {LABEL: label}},
                "spec": spec,
                "status": {"conditions": [{
                    "type": "Available", "status": "True", "lastTransitionTime": meta::now(),
                    "reason": "Local", "message": "Local APIServices are always available",
                }]},
            });
            st.put(KEY, "", &n, obj);
        }
    }
    let stale: Vec<String> = st
        .scan(KEY, None, None)
        .filter(|((_, n), o)| {
            !wanted.contains(n)
                && o.pointer(&format!("/metadata/labels/{}", LABEL.replace('/', "~1")))
                    .and_then(Value::as_str)
                    == Some("true")
        })
        .map(|((_, n), _)| n.clone())
        .collect();
    for n in stale {
        st.remove(KEY, "", &n);
    }
}
