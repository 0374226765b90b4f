//! Owns discovery: `/version`, `/api`, `/apis`, group and group/version
//! resource lists, built from the registry (so installed CRDs appear as
//! soon as they are stored).

use serde_json::{Value, json};

use super::registry::Registry;

/// The version this server reports (kubectl picks its client by it).
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64",
        "emulationMajor": "1",
        "emulationMinor": "33",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "32",
    })
}

/// `/api`.
pub(crate) fn api(server_addr: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_addr}],
    })
}

fn group_json(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": vs,
        "preferredVersion": vs.first().cloned().unwrap_or(json!({})),
    })
}

/// `/apis`.
pub(crate) fn apis(reg: &Registry) -> Value {
    let groups: Vec<Value> = reg
        .groups()
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_json(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`.
pub(crate) fn group(reg: &Registry, name: &str) -> Value {
    let versions = reg
        .groups()
        .into_iter()
        .find(|(g, _)| g == name)
        .map(|(_, v)| v)
        .unwrap_or_default();
    let mut g = group_json(name, &versions);
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    g
}

/// `/api/v1` or `/apis/<group>/<version>`.
pub(crate) fn resources(reg: &Registry, group: &str, version: &str) -> Value {
    let mut out = Vec::new();
    for r in reg
        .all()
        .filter(|r| r.group == group && r.versions.iter().any(|v| v == version))
    {
        let verbs = if r.is_review() {
            vec!["create"]
        } else if r.read_only {
            vec!["get", "list"]
        } else {
            vec![
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        };
        let mut e = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": verbs,
            "storageVersionHash": "",
        });
        if !r.short_names.is_empty() {
            e["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            e["categories"] = json!(r.categories);
        }
        out.push(e);
        for sub in r.subresources() {
            let (kind, verbs): (&str, Vec<&str>) = match sub {
                "status" | "approval" => (&r.kind, vec!["get", "patch", "update"]),
                "binding" => ("Binding", vec!["create"]),
                "ephemeralcontainers" => (&r.kind, vec!["get", "patch", "update"]),
                "log" => (&r.kind, vec!["get"]),
                "exec" => ("PodExecOptions", vec!["create", "get"]),
                "attach" => ("PodAttachOptions", vec!["create", "get"]),
                "portforward" => ("PodPortForwardOptions", vec!["create", "get"]),
                "finalize" => (&r.kind, vec!["update"]),
                "scale" => ("Scale", vec!["get", "patch", "update"]),
                "eviction" => ("Eviction", vec!["create"]),
                "token" => ("TokenRequest", vec!["create"]),
                _ => (&r.kind, vec!["get"]),
            };
            let mut e = json!({
                "name": format!("{}/{sub}", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": kind,
                "verbs": verbs,
            });
            // Subresources served in another group's kind say so.
            let other_group = match sub {
                "scale" => Some(("autoscaling", "v1")),
                "eviction" => Some(("policy", "v1")),
                "token" => Some(("authentication.k8s.io", "v1")),
                _ => None,
            };
            if let Some((g, v)) = other_group {
                e["group"] = json!(g);
                e["version"] = json!(v);
            }
            out.push(e);
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out})
}
