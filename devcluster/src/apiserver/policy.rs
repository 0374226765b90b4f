//! Owns the default RBAC objects every cluster has and ClusterRole
//! aggregation, as kube-apiserver bootstraps and maintains them:
//! `cluster-admin`, the user-facing `admin`, `edit` and `view` (built by
//! aggregation from `system:aggregate-to-*` and any ClusterRole labelled
//! `rbac.authorization.k8s.io/aggregate-to-<role>: "true"`),
//! `system:discovery`, `system:basic-user` and `system:public-info-viewer`,
//! and their ClusterRoleBindings.
//!
//! Invariants:
//! 1. At start every default object that is missing is created (a deleted
//!    one comes back on the next start, as kube-apiserver's RBAC
//!    reconciliation does); existing ones are left as they are.
//! 2. A ClusterRole with an `aggregationRule` holds, in `rules`, the
//!    rules of every ClusterRole its selectors match (by name order, each
//!    rule once), kept current by `run` after every RBAC write, as the
//!    cluster-role-aggregation controller does.
//! 3. Bindings: `cluster-admin` to `system:masters`; `system:discovery`
//!    and `system:basic-user` to `system:authenticated`;
//!    `system:public-info-viewer` to `system:authenticated` and
//!    `system:unauthenticated`.

use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::auth::rbac::{CLUSTER_ROLE_BINDINGS, CLUSTER_ROLES};
use super::meta;
use super::store::Store;

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];
const READ_WRITE: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Value {
    json!({"verbs": verbs, "apiGroups": groups, "resources": resources})
}

fn urls(verbs: &[&str], paths: &[&str]) -> Value {
    json!({"verbs": verbs, "nonResourceURLs": paths})
}

fn cluster_role(name: &str, labels: Value, rules: Vec<Value>, aggregate: Option<&str>) -> Value {
    let mut all_labels = json!({"kubernetes.io/bootstrapping": "rbac-defaults"});
    if let (Some(to), Some(extra)) = (all_labels.as_object_mut(), labels.as_object()) {
        to.extend(extra.clone());
    }
    let mut r = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": name,
            "labels": all_labels,
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "rules": rules,
    });
    if let Some(to) = aggregate {
        r["aggregationRule"] = json!({"clusterRoleSelectors": [
            {"matchLabels": {format!("rbac.authorization.k8s.io/aggregate-to-{to}"): "true"}},
        ]});
    }
    r
}

fn binding(name: &str, role: &str, groups: &[&str]) -> Value {
    let subjects: Vec<Value> = groups
        .iter()
        .map(|g| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g}))
        .collect();
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects,
    })
}

fn aggregate_label(to: &str) -> Value {
    json!({format!("rbac.authorization.k8s.io/aggregate-to-{to}"): "true"})
}

/// The default ClusterRoles (invariant 1).
fn cluster_roles() -> Vec<Value> {
    let view_rules = vec![
        rule(
            READ,
            &[""],
            &[
                "pods",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "serviceaccounts",
                "services",
                "services/status",
                "endpoints",
                "persistentvolumeclaims",
                "persistentvolumeclaims/status",
                "configmaps",
            ],
        ),
        rule(
            READ,
            &[""],
            &[
                "limitranges",
                "resourcequotas",
                "bindings",
                "events",
                "pods/status",
                "resourcequotas/status",
                "namespaces/status",
                "replicationcontrollers/status",
                "pods/log",
            ],
        ),
        rule(READ, &[""], &["namespaces"]),
        rule(READ, &["discovery.k8s.io"], &["endpointslices"]),
        rule(
            READ,
            &["apps"],
            &[
                "controllerrevisions",
                "statefulsets",
                "statefulsets/scale",
                "statefulsets/status",
                "daemonsets",
                "daemonsets/status",
                "deployments",
                "deployments/scale",
                "deployments/status",
                "replicasets",
                "replicasets/scale",
                "replicasets/status",
            ],
        ),
        rule(
            READ,
            &["autoscaling"],
            &[
                "horizontalpodautoscalers",
                "horizontalpodautoscalers/status",
            ],
        ),
        rule(
            READ,
            &["batch"],
            &["cronjobs", "cronjobs/status", "jobs", "jobs/status"],
        ),
        rule(
            READ,
            &["extensions"],
            &[
                "daemonsets",
                "daemonsets/status",
                "deployments",
                "deployments/scale",
                "deployments/status",
                "ingresses",
                "ingresses/status",
                "networkpolicies",
                "replicasets",
                "replicasets/scale",
                "replicasets/status",
                "replicationcontrollers/scale",
            ],
        ),
        rule(
            READ,
            &["policy"],
            &["poddisruptionbudgets", "poddisruptionbudgets/status"],
        ),
        rule(
            READ,
            &["networking.k8s.io"],
            &["ingresses", "ingresses/status", "networkpolicies"],
        ),
    ];
    let edit_rules = vec![
        rule(&["impersonate"], &[""], &["serviceaccounts"]),
        rule(
            WRITE,
            &[""],
            &[
                "pods",
                "pods/attach",
                "pods/proxy",
                "pods/exec",
                "pods/portforward",
            ],
        ),
        rule(&["create"], &[""], &["pods/eviction"]),
        rule(
            WRITE,
            &[""],
            &[
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "serviceaccounts",
                "services",
                "services/proxy",
                "persistentvolumeclaims",
                "configmaps",
                "secrets",
                "events",
            ],
        ),
        rule(&["create"], &[""], &["serviceaccounts/token"]),
        rule(
            WRITE,
            &["apps"],
            &[
                "statefulsets",
                "statefulsets/scale",
                "daemonsets",
                "deployments",
                "deployments/scale",
                "deployments/rollback",
                "replicasets",
                "replicasets/scale",
            ],
        ),
        rule(WRITE, &["autoscaling"], &["horizontalpodautoscalers"]),
        rule(WRITE, &["batch"], &["cronjobs", "jobs"]),
        rule(
            WRITE,
            &["extensions"],
            &[
                "daemonsets",
                "deployments",
                "deployments/scale",
                "deployments/rollback",
                "ingresses",
                "networkpolicies",
                "replicasets",
                "replicasets/scale",
                "replicationcontrollers/scale",
            ],
        ),
        rule(WRITE, &["policy"], &["poddisruptionbudgets"]),
        rule(
            WRITE,
            &["networking.k8s.io"],
            &["ingresses", "networkpolicies"],
        ),
        rule(READ_WRITE, &["coordination.k8s.io"], &["leases"]),
        rule(
            READ,
            &[""],
            &[
                "pods/attach",
                "pods/exec",
                "pods/portforward",
                "pods/proxy",
                "secrets",
                "services/proxy",
            ],
        ),
    ];
    let admin_rules = vec![
        rule(
            &["create"],
            &["authorization.k8s.io"],
            &["localsubjectaccessreviews"],
        ),
        rule(
            READ_WRITE,
            &["rbac.authorization.k8s.io"],
            &["rolebindings", "roles"],
        ),
    ];
    vec![
        cluster_role(
            "cluster-admin",
            json!({}),
            vec![rule(&["*"], &["*"], &["*"]), urls(&["*"], &["*"])],
            None,
        ),
        cluster_role("admin", json!({}), Vec::new(), Some("admin")),
        cluster_role("edit", aggregate_label("admin"), Vec::new(), Some("edit")),
        cluster_role("view", aggregate_label("edit"), Vec::new(), Some("view")),
        cluster_role(
            "system:aggregate-to-admin",
            aggregate_label("admin"),
            admin_rules,
            None,
        ),
        cluster_role(
            "system:aggregate-to-edit",
            aggregate_label("edit"),
            edit_rules,
            None,
        ),
        cluster_role(
            "system:aggregate-to-view",
            aggregate_label("view"),
            view_rules,
            None,
        ),
        cluster_role(
            "system:discovery",
            json!({}),
            vec![urls(
                &["get"],
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
            )],
            None,
        ),
        cluster_role(
            "system:basic-user",
            json!({}),
            vec![
                rule(
                    &["create"],
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                ),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
            ],
            None,
        ),
        cluster_role(
            "system:auth-delegator",
            json!({}),
            vec![
                rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
            ],
            None,
        ),
        cluster_role(
            "system:public-info-viewer",
            json!({}),
            vec![urls(
                &["get"],
                &["/healthz", "/livez", "/readyz", "/version", "/version/"],
            )],
            None,
        ),
    ]
}

/// The default ClusterRoleBindings (invariant 3).
fn cluster_role_bindings() -> Vec<Value> {
    vec![
        binding("cluster-admin", "cluster-admin", &["system:masters"]),
        binding(
            "system:discovery",
            "system:discovery",
            &["system:authenticated"],
        ),
        binding(
            "system:basic-user",
            "system:basic-user",
            &["system:authenticated"],
        ),
        binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            &["system:authenticated", "system:unauthenticated"],
        ),
    ]
}

/// Creates the missing default objects (invariant 1) and aggregates.
pub(crate) fn bootstrap(store: &Store) {
    let mut st = store.lock();
    for (key, objs) in [
        (CLUSTER_ROLES, cluster_roles()),
        (CLUSTER_ROLE_BINDINGS, cluster_role_bindings()),
    ] {
        for mut o in objs {
            let name = meta::name(&o).to_string();
            if st.get(key, "", &name).is_none() {
                let m = meta::meta_mut(&mut o);
                m.insert("uid".into(), json!(meta::new_uid()));
                m.insert("creationTimestamp".into(), json!(meta::now()));
                st.put(key, "", &name, o);
            }
        }
    }
    drop(st);
    aggregate(store);
}

/// Whether `labels` satisfy one `metav1.LabelSelector`.
fn selects(sel: &Value, labels: Option<&Value>) -> bool {
    let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    let labels_ok = sel
        .get("matchLabels")
        .and_then(Value::as_object)
        .is_none_or(|m| m.iter().all(|(k, v)| get(k) == v.as_str()));
    let exprs_ok = sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e.get("key").and_then(Value::as_str).unwrap_or("");
            let values: Vec<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match e.get("operator").and_then(Value::as_str).unwrap_or("") {
                "In" => get(key).is_some_and(|v| values.contains(&v)),
                "NotIn" => get(key).is_none_or(|v| !values.contains(&v)),
                "Exists" => get(key).is_some(),
                "DoesNotExist" => get(key).is_none(),
                _ => false,
            }
        });
    labels_ok && exprs_ok
}

/// The rules each aggregated ClusterRole should hold (invariant 2).
fn aggregated(roles: &[std::sync::Arc<Value>]) -> Vec<(String, Vec<Value>)> {
    let mut out = Vec::new();
    for r in roles {
        let Some(selectors) = r
            .pointer("/aggregationRule/clusterRoleSelectors")
            .and_then(Value::as_array)
        else {
            continue;
        };
        let me = meta::name(r);
        let mut rules: Vec<Value> = Vec::new();
        // `roles` come in name order from the store.
        for other in roles.iter().filter(|o| meta::name(o) != me) {
            let labels = other.pointer("/metadata/labels");
            if !selectors.iter().any(|s| selects(s, labels)) {
                continue;
            }
            for rule in other
                .get("rules")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if !rules.contains(rule) {
                    rules.push(rule.clone());
                }
            }
        }
        out.push((me.to_string(), rules));
    }
    out
}

/// Brings the rules of every aggregated ClusterRole up to date, repeating
/// until nothing changes (aggregation chains: view feeds edit feeds admin).
fn aggregate(store: &Store) {
    for _ in 0..8 {
        let mut st = store.lock();
        let roles: Vec<std::sync::Arc<Value>> = st
            .scan(CLUSTER_ROLES, None, None)
            .map(|(_, o)| o.clone())
            .collect();
        let mut changed = false;
        for (name, rules) in aggregated(&roles) {
            let Some(cur) = st.get(CLUSTER_ROLES, "", &name) else {
                continue;
            };
            let have = cur.get("rules").cloned().unwrap_or(json!([]));
            if have == json!(rules) {
                continue;
            }
            let mut new = (*cur).clone();
            new["rules"] = json!(rules);
            st.put(CLUSTER_ROLES, "", &name, new);
            changed = true;
        }
        drop(st);
        if !changed {
            return;
        }
        store.wrote(false);
    }
}

/// The aggregation controller: re-aggregates after RBAC writes.
pub(crate) async fn run(store: std::sync::Arc<Store>, shutdown: CancellationToken) {
    let mut seen = u64::MAX;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = store.lock().rbac_writes();
        if now != seen {
            aggregate(&store);
            seen = store.lock().rbac_writes();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn aggregation_follows_the_label_chain() {
        let roles: Vec<Arc<Value>> = cluster_roles().into_iter().map(Arc::new).collect();
        let agg = aggregated(&roles);
        let view = &agg.iter().find(|(n, _)| n == "view").expect("view").1;
        assert!(view.iter().any(|r| {
            r["resources"]
                .as_array()
                .is_some_and(|a| a.contains(&json!("deployments")))
        }));
        let admin = &agg.iter().find(|(n, _)| n == "admin").expect("admin").1;
        assert!(admin.iter().any(|r| {
            r["resources"]
                .as_array()
                .is_some_and(|a| a.contains(&json!("rolebindings")))
        }));
        let sel = json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]});
        assert!(
            selects(&sel, Some(&json!({"a": "x"}))) && !selects(&sel, Some(&json!({"a": "y"})))
        );
    }
}
