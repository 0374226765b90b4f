//! Owns RBAC authorization: PolicyRule matching and an index of the
//! stored ClusterRoles, Roles, ClusterRoleBindings and RoleBindings by
//! subject, so a request is judged by looking up the rules bound to its
//! user and groups, never by scanning every binding.
//!
//! Invariants:
//! 1. A ClusterRoleBinding grants its role's rules everywhere; a
//!    RoleBinding grants its Role's (or referenced ClusterRole's) rules only
//!    to requests in the binding's namespace. Non-resource rules count only
//!    through ClusterRoleBindings.
//! 2. Rules match as in Kubernetes' `RuleAllows`: verbs, API groups and
//!    resources with `*`; a subresource as `resource/sub` or `*/sub`;
//!    resourceNames only when the request names an object; nonResourceURLs
//!    exactly or by a trailing `*` prefix.
//! 3. Every authenticated user has the default discovery and self-review
//!    grants of a real cluster (`system:discovery`, `system:basic-user`,
//!    `system:public-info-viewer`), without any stored object.
//! 4. The index is rebuilt from the stored objects after any write to an
//!    RBAC resource (the store drops it; the next request builds it), so
//!    grants and revocations take effect with the next request.
//! 5. No escalation checks (`escalate`, `bind`): what is stored is what is
//!    granted. Aggregated ClusterRoles get their rules stored by the
//!    aggregation controller (`policy`), as in Kubernetes.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde_json::{Value, json};

use super::User;
use super::attrs::Attributes;
use crate::apiserver::status::ApiError;

/// The storage keys of the RBAC resources.
pub(crate) const CLUSTER_ROLES: &str = "rbac.authorization.k8s.io/clusterroles";
pub(crate) const ROLES: &str = "rbac.authorization.k8s.io/roles";
pub(crate) const CLUSTER_ROLE_BINDINGS: &str = "rbac.authorization.k8s.io/clusterrolebindings";
pub(crate) const ROLE_BINDINGS: &str = "rbac.authorization.k8s.io/rolebindings";

/// Whether a storage key is one of the RBAC resources.
pub(crate) fn is_rbac_key(key: &str) -> bool {
    key.starts_with("rbac.authorization.k8s.io/")
}

/// One PolicyRule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) verbs: Vec<String>,
    pub(crate) api_groups: Vec<String>,
    pub(crate) resources: Vec<String>,
    pub(crate) resource_names: Vec<String>,
    pub(crate) non_resource_urls: Vec<String>,
}

impl Rule {
    /// The rule in a stored `rules[]` entry.
    pub(crate) fn from_json(v: &Value) -> Self {
        let strs = |k: &str| -> Vec<String> {
            v.get(k)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        Self {
            verbs: strs("verbs"),
            api_groups: strs("apiGroups"),
            resources: strs("resources"),
            resource_names: strs("resourceNames"),
            non_resource_urls: strs("nonResourceURLs"),
        }
    }

    /// The rule as a SelfSubjectRulesReview lists it.
    pub(crate) fn to_json(&self) -> Value {
        if self.non_resource_urls.is_empty() {
            let mut r = json!({"verbs": self.verbs, "apiGroups": self.api_groups, "resources": self.resources});
            if !self.resource_names.is_empty() {
                r["resourceNames"] = json!(self.resource_names);
            }
            r
        } else {
            json!({"verbs": self.verbs, "nonResourceURLs": self.non_resource_urls})
        }
    }

    fn rules(v: &Value) -> Vec<Rule> {
        v.get("rules")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(Rule::from_json).collect())
            .unwrap_or_default()
    }
}

fn has(list: &[String], x: &str) -> bool {
    list.iter().any(|v| v == "*" || v == x)
}

/// Whether `rule` allows the request `a` (Kubernetes' `RuleAllows`).
pub(crate) fn rule_allows(rule: &Rule, a: &Attributes) -> bool {
    if !has(&rule.verbs, &a.verb) {
        return false;
    }
    if !a.resource_request {
        return rule.non_resource_urls.iter().any(|u| {
            u == "*"
                || *u == a.path
                || u.strip_suffix('*')
                    .is_some_and(|prefix| a.path.starts_with(prefix))
        });
    }
    if !has(&rule.api_groups, &a.group) {
        return false;
    }
    let combined = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let resource_ok = rule.resources.iter().any(|r| {
        r == "*"
            || *r == combined
            || (!a.subresource.is_empty() && r.strip_prefix("*/") == Some(a.subresource.as_str()))
    });
    if !resource_ok {
        return false;
    }
    rule.resource_names.is_empty() || rule.resource_names.contains(&a.name)
}

/// The grants every authenticated user has in a real cluster
/// (`system:discovery`, `system:basic-user`, `system:public-info-viewer`).
fn authenticated_defaults() -> Arc<[Rule]> {
    static RULES: OnceLock<Arc<[Rule]>> = OnceLock::new();
    RULES
        .get_or_init(|| {
            let s = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
            vec![
                Rule {
                    verbs: s(&["get"]),
                    non_resource_urls: s(&[
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
                    ]),
                    ..Rule::default()
                },
                Rule {
                    verbs: s(&["create"]),
                    api_groups: s(&["authorization.k8s.io"]),
                    resources: s(&["selfsubjectaccessreviews", "selfsubjectrulesreviews"]),
                    ..Rule::default()
                },
                Rule {
                    verbs: s(&["create"]),
                    api_groups: s(&["authentication.k8s.io"]),
                    resources: s(&["selfsubjectreviews"]),
                    ..Rule::default()
                },
            ]
            .into()
        })
        .clone()
}

/// A subject of a binding, normalised: a ServiceAccount is the user
/// `system:serviceaccount:<ns>:<name>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Subject {
    User(String),
    Group(String),
}

type Grants = HashMap<Subject, Vec<Arc<[Rule]>>>;

/// The bindings by subject, with their roles' rules resolved.
#[derive(Debug, Default)]
pub(crate) struct Index {
    cluster: Grants,
    /// Per namespace: the RoleBindings there.
    namespaced: HashMap<String, Grants>,
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn subjects(binding: &Value, binding_ns: &str) -> Vec<Subject> {
    let Some(list) = binding.get("subjects").and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|sub| {
            let name = s(sub, "/name");
            if name.is_empty() {
                return None;
            }
            match s(sub, "/kind") {
                "User" => Some(Subject::User(name.to_string())),
                "Group" => Some(Subject::Group(name.to_string())),
                "ServiceAccount" => {
                    let ns = match s(sub, "/namespace") {
                        "" => binding_ns,
                        ns => ns,
                    };
                    (!ns.is_empty())
                        .then(|| Subject::User(format!("system:serviceaccount:{ns}:{name}")))
                }
                _ => None,
            }
        })
        .collect()
}

impl Index {
    /// Builds the index from the stored RBAC objects.
    pub(crate) fn build<'a>(
        cluster_roles: impl Iterator<Item = &'a Value>,
        roles: impl Iterator<Item = &'a Value>,
        cluster_role_bindings: impl Iterator<Item = &'a Value>,
        role_bindings: impl Iterator<Item = &'a Value>,
    ) -> Self {
        let name = |v: &Value| s(v, "/metadata/name").to_string();
        let ns = |v: &Value| s(v, "/metadata/namespace").to_string();
        let cluster_roles: HashMap<String, Arc<[Rule]>> = cluster_roles
            .map(|r| (name(r), Rule::rules(r).into()))
            .collect();
        let roles: HashMap<(String, String), Arc<[Rule]>> = roles
            .map(|r| ((ns(r), name(r)), Rule::rules(r).into()))
            .collect();
        let mut index = Index::default();
        index.cluster.insert(
            Subject::Group("system:authenticated".into()),
            vec![authenticated_defaults()],
        );
        for b in cluster_role_bindings {
            if s(b, "/roleRef/kind") != "ClusterRole" {
                continue;
            }
            let Some(rules) = cluster_roles.get(s(b, "/roleRef/name")) else {
                continue;
            };
            for subject in subjects(b, "") {
                index
                    .cluster
                    .entry(subject)
                    .or_default()
                    .push(rules.clone());
            }
        }
        for b in role_bindings {
            let bns = ns(b);
            let role = s(b, "/roleRef/name");
            let rules = match s(b, "/roleRef/kind") {
                "ClusterRole" => cluster_roles.get(role),
                "Role" => roles.get(&(bns.clone(), role.to_string())),
                _ => None,
            };
            let Some(rules) = rules else { continue };
            for subject in subjects(b, &bns) {
                index
                    .namespaced
                    .entry(bns.clone())
                    .or_default()
                    .entry(subject)
                    .or_default()
                    .push(rules.clone());
            }
        }
        index
    }

    fn subject_keys(user: &User) -> impl Iterator<Item = Subject> + '_ {
        std::iter::once(Subject::User(user.name.clone()))
            .chain(user.groups.iter().map(|g| Subject::Group(g.clone())))
    }

    /// The rule sets that apply to `user` in `namespace` ("": cluster
    /// scope only).
    fn grants<'a>(
        &'a self,
        user: &'a User,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a Rule> + 'a {
        let ns_grants = (!namespace.is_empty())
            .then(|| self.namespaced.get(namespace))
            .flatten();
        Self::subject_keys(user).flat_map(move |subject| {
            let c = self.cluster.get(&subject).into_iter().flatten();
            let n = ns_grants
                .and_then(|g| g.get(&subject))
                .into_iter()
                .flatten();
            c.chain(n).flat_map(|rules| rules.iter())
        })
    }

    /// Whether `user` may do `a`.
    pub(crate) fn allows(&self, user: &User, a: &Attributes) -> bool {
        if user.is_superuser() {
            return true;
        }
        let ns = if a.resource_request {
            a.namespace.as_str()
        } else {
            ""
        };
        self.grants(user, ns).any(|r| rule_allows(r, a))
    }

    /// Every rule that applies to `user` in `namespace` (for
    /// SelfSubjectRulesReview).
    pub(crate) fn rules_for(&self, user: &User, namespace: &str) -> Vec<Rule> {
        let mut out: Vec<Rule> = Vec::new();
        for r in self.grants(user, namespace) {
            if !out.contains(r) {
                out.push(r.clone());
            }
        }
        out
    }
}

/// The 403 a real API server answers when `user` may not do `a`.
pub(crate) fn forbidden(user: &User, a: &Attributes) -> ApiError {
    if !a.resource_request {
        return ApiError::forbidden(format!(
            "forbidden: User {:?} cannot {} path {:?}",
            user.name, a.verb, a.path
        ));
    }
    let resource = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace {:?}", a.namespace)
    };
    let reason = format!(
        "User {:?} cannot {} resource {:?} in API group {:?} {scope}",
        user.name, a.verb, resource, a.group
    );
    let qualified = if a.group.is_empty() {
        a.resource.clone()
    } else {
        format!("{}.{}", a.resource, a.group)
    };
    let message = if a.name.is_empty() {
        format!("{qualified} is forbidden: {reason}")
    } else {
        format!("{qualified} {:?} is forbidden: {reason}", a.name)
    };
    let mut details = serde_json::Map::new();
    for (k, v) in [
        ("name", &a.name),
        ("group", &a.group),
        ("kind", &a.resource),
    ] {
        if !v.is_empty() {
            details.insert(k.into(), json!(v));
        }
    }
    let mut e = ApiError::forbidden(message);
    e.details = Some(Value::Object(details));
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(v: Value) -> Rule {
        Rule::from_json(&v)
    }

    fn res(verb: &str, group: &str, resource: &str, sub: &str, ns: &str, name: &str) -> Attributes {
        Attributes::resource(verb, group, resource, sub, ns, name)
    }

    fn sa(ns: &str, name: &str) -> User {
        User::service_account(ns, name, "uid")
    }

    #[test]
    fn verbs_groups_and_resources_match_exactly_or_by_star() {
        let r = rule(json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}));
        assert!(rule_allows(&r, &res("get", "", "pods", "", "a", "x")));
        assert!(rule_allows(&r, &res("list", "", "pods", "", "a", "")));
        assert!(!rule_allows(&r, &res("watch", "", "pods", "", "a", "")));
        assert!(!rule_allows(&r, &res("get", "apps", "pods", "", "a", "x")));
        assert!(!rule_allows(&r, &res("get", "", "services", "", "a", "x")));
        let star = rule(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}));
        for verb in [
            "get",
            "list",
            "watch",
            "create",
            "update",
            "patch",
            "delete",
            "deletecollection",
        ] {
            assert!(rule_allows(
                &star,
                &res(verb, "hostmesh.dev", "worlds", "status", "", "w")
            ));
        }
        // A resource rule never matches a path, and vice versa.
        assert!(!rule_allows(
            &star,
            &Attributes::non_resource("get", "/healthz")
        ));
    }

    #[test]
    fn subresources_need_their_own_rule() {
        let pods = rule(json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}));
        assert!(!rule_allows(
            &pods,
            &res("get", "", "pods", "log", "a", "x")
        ));
        let log = rule(json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]}));
        assert!(rule_allows(&log, &res("get", "", "pods", "log", "a", "x")));
        assert!(!rule_allows(&log, &res("get", "", "pods", "", "a", "x")));
        let any_status =
            rule(json!({"verbs": ["update"], "apiGroups": ["*"], "resources": ["*/status"]}));
        assert!(rule_allows(
            &any_status,
            &res("update", "hostmesh.dev", "worlds", "status", "a", "w")
        ));
        assert!(!rule_allows(
            &any_status,
            &res("update", "hostmesh.dev", "worlds", "", "a", "w")
        ));
        // `pods/*` is not a wildcard in Kubernetes either.
        let pods_star = rule(json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/*"]}));
        assert!(!rule_allows(
            &pods_star,
            &res("get", "", "pods", "log", "a", "x")
        ));
    }

    #[test]
    fn resource_names_only_match_named_requests() {
        let r = rule(
            json!({"verbs": ["get", "update", "list"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["lock"]}),
        );
        assert!(rule_allows(
            &r,
            &res("get", "coordination.k8s.io", "leases", "", "a", "lock")
        ));
        assert!(!rule_allows(
            &r,
            &res("get", "coordination.k8s.io", "leases", "", "a", "other")
        ));
        // A list names nothing (unless it selects one name).
        assert!(!rule_allows(
            &r,
            &res("list", "coordination.k8s.io", "leases", "", "a", "")
        ));
        assert!(rule_allows(
            &r,
            &res("list", "coordination.k8s.io", "leases", "", "a", "lock")
        ));
    }

    #[test]
    fn non_resource_urls_match_exactly_or_by_prefix() {
        let r = rule(json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/apis/*"]}));
        assert!(rule_allows(
            &r,
            &Attributes::non_resource("get", "/healthz")
        ));
        assert!(!rule_allows(
            &r,
            &Attributes::non_resource("get", "/healthz/ping")
        ));
        assert!(rule_allows(
            &r,
            &Attributes::non_resource("get", "/apis/apps/v1")
        ));
        assert!(!rule_allows(&r, &Attributes::non_resource("get", "/apis")));
        assert!(!rule_allows(
            &r,
            &Attributes::non_resource("post", "/healthz")
        ));
        let all = rule(json!({"verbs": ["*"], "nonResourceURLs": ["*"]}));
        assert!(rule_allows(
            &all,
            &Attributes::non_resource("delete", "/anything")
        ));
    }

    fn index(objs: Value) -> Index {
        let list = |k: &str| objs[k].as_array().cloned().unwrap_or_default();
        let (cr, r, crb, rb) = (list("cr"), list("r"), list("crb"), list("rb"));
        Index::build(cr.iter(), r.iter(), crb.iter(), rb.iter())
    }

    #[test]
    fn role_bindings_grant_only_in_their_namespace() {
        let idx = index(json!({
            "cr": [{"metadata": {"name": "pod-reader"}, "rules": [{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}]}],
            "r": [{"metadata": {"name": "cm-writer", "namespace": "a"}, "rules": [{"verbs": ["create"], "apiGroups": [""], "resources": ["configmaps"]}]}],
            "rb": [
                {"metadata": {"name": "b1", "namespace": "a"}, "roleRef": {"kind": "ClusterRole", "name": "pod-reader"},
                 "subjects": [{"kind": "ServiceAccount", "name": "op"}]},
                {"metadata": {"name": "b2", "namespace": "a"}, "roleRef": {"kind": "Role", "name": "cm-writer"},
                 "subjects": [{"kind": "ServiceAccount", "name": "op", "namespace": "a"}]},
                // A Role of another namespace is not found through a binding here.
                {"metadata": {"name": "b3", "namespace": "b"}, "roleRef": {"kind": "Role", "name": "cm-writer"},
                 "subjects": [{"kind": "ServiceAccount", "name": "op", "namespace": "a"}]},
            ],
        }));
        let op = sa("a", "op");
        assert!(idx.allows(&op, &res("list", "", "pods", "", "a", "")));
        assert!(!idx.allows(&op, &res("list", "", "pods", "", "b", "")));
        assert!(
            !idx.allows(&op, &res("list", "", "pods", "", "", "")),
            "all namespaces needs a ClusterRoleBinding"
        );
        assert!(idx.allows(&op, &res("create", "", "configmaps", "", "a", "")));
        assert!(!idx.allows(&op, &res("create", "", "configmaps", "", "b", "")));
        assert!(!idx.allows(&sa("b", "op"), &res("list", "", "pods", "", "a", "")));
    }

    #[test]
    fn cluster_role_bindings_grant_everywhere_to_users_groups_and_service_accounts() {
        let idx = index(json!({
            "cr": [
                {"metadata": {"name": "node-reader"}, "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["nodes"]}]},
                {"metadata": {"name": "metrics"}, "rules": [{"verbs": ["get"], "nonResourceURLs": ["/metrics"]}]},
            ],
            "crb": [
                {"metadata": {"name": "x"}, "roleRef": {"kind": "ClusterRole", "name": "node-reader"},
                 "subjects": [{"kind": "Group", "name": "system:serviceaccounts:a"}, {"kind": "User", "name": "jane"}]},
                {"metadata": {"name": "y"}, "roleRef": {"kind": "ClusterRole", "name": "metrics"},
                 "subjects": [{"kind": "ServiceAccount", "name": "op", "namespace": "a"}]},
                // A binding to a missing role grants nothing.
                {"metadata": {"name": "z"}, "roleRef": {"kind": "ClusterRole", "name": "missing"},
                 "subjects": [{"kind": "Group", "name": "system:authenticated"}]},
            ],
        }));
        assert!(idx.allows(&sa("a", "other"), &res("get", "", "nodes", "", "", "n")));
        assert!(!idx.allows(&sa("b", "other"), &res("get", "", "nodes", "", "", "n")));
        let jane = User {
            name: "jane".into(),
            uid: String::new(),
            groups: vec!["system:authenticated".into()],
            extra: Vec::new(),
        };
        assert!(idx.allows(&jane, &res("get", "", "nodes", "", "", "n")));
        assert!(idx.allows(&sa("a", "op"), &Attributes::non_resource("get", "/metrics")));
        assert!(!idx.allows(
            &sa("a", "other"),
            &Attributes::non_resource("get", "/metrics")
        ));
        // Defaults for every authenticated user: discovery and self reviews.
        assert!(idx.allows(
            &sa("b", "x"),
            &Attributes::non_resource("get", "/apis/apps/v1")
        ));
        assert!(idx.allows(
            &sa("b", "x"),
            &Attributes::non_resource("get", "/openapi/v3")
        ));
        assert!(idx.allows(
            &sa("b", "x"),
            &res(
                "create",
                "authorization.k8s.io",
                "selfsubjectaccessreviews",
                "",
                "",
                ""
            )
        ));
        assert!(!idx.allows(
            &sa("b", "x"),
            &res(
                "create",
                "authorization.k8s.io",
                "subjectaccessreviews",
                "",
                "",
                ""
            )
        ));
        assert!(!idx.allows(&sa("b", "x"), &Attributes::non_resource("get", "/metrics")));
        assert!(idx.allows(&User::admin(), &res("delete", "", "nodes", "", "", "n")));
    }

    #[test]
    fn forbidden_messages_read_like_the_real_server() {
        let u = sa("ns", "sa");
        let e = forbidden(&u, &res("list", "", "pods", "", "default", ""));
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            r#"pods is forbidden: User "system:serviceaccount:ns:sa" cannot list resource "pods" in API group "" in the namespace "default""#
        );
        assert_eq!(e.details, Some(json!({"kind": "pods"})));
        let e = forbidden(&u, &res("delete", "", "nodes", "", "", "n1"));
        assert_eq!(
            e.message,
            r#"nodes "n1" is forbidden: User "system:serviceaccount:ns:sa" cannot delete resource "nodes" in API group "" at the cluster scope"#
        );
        let e = forbidden(
            &u,
            &res("update", "hostmesh.dev", "worlds", "status", "t", "w"),
        );
        assert_eq!(
            e.message,
            r#"worlds.hostmesh.dev "w" is forbidden: User "system:serviceaccount:ns:sa" cannot update resource "worlds/status" in API group "hostmesh.dev" in the namespace "t""#
        );
        assert_eq!(
            e.details,
            Some(json!({"name": "w", "group": "hostmesh.dev", "kind": "worlds"}))
        );
        let e = forbidden(&u, &Attributes::non_resource("get", "/metrics"));
        assert_eq!(
            e.message,
            r#"forbidden: User "system:serviceaccount:ns:sa" cannot get path "/metrics""#
        );
    }
}
