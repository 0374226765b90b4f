//! Owns request attributes: what a request asks to do, in the terms RBAC
//! rules speak (verb, API group, resource, subresource, name, namespace,
//! or a non-resource path), derived from the method, path and query the
//! way the real API server's `RequestInfoFactory` does it: from the URL
//! alone, before routing, so authorization never depends on whether the
//! resource exists.

use std::collections::HashMap;

/// What a request asks to do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Attributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection` for resources; the lowercase HTTP method for
    /// non-resource paths.
    pub(crate) verb: String,
    /// Whether this addresses an API resource (else a non-resource path
    /// such as `/healthz`, `/api`, `/apis/g/v`, `/openapi/v3`).
    pub(crate) resource_request: bool,
    pub(crate) path: String,
    pub(crate) group: String,
    pub(crate) version: String,
    pub(crate) resource: String,
    pub(crate) subresource: String,
    pub(crate) name: String,
    pub(crate) namespace: String,
}

impl Attributes {
    /// Attributes of a resource request (for access reviews and tests).
    pub(crate) fn resource(
        verb: &str,
        group: &str,
        resource: &str,
        subresource: &str,
        namespace: &str,
        name: &str,
    ) -> Self {
        Self {
            verb: verb.into(),
            resource_request: true,
            group: group.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            namespace: namespace.into(),
            name: name.into(),
            ..Self::default()
        }
    }

    /// Attributes of a non-resource request.
    pub(crate) fn non_resource(verb: &str, path: &str) -> Self {
        Self {
            verb: verb.into(),
            path: path.into(),
            ..Self::default()
        }
    }
}

/// The attributes of `method path?query`.
pub(crate) fn parse(method: &str, path: &str, query: &HashMap<String, String>) -> Attributes {
    let non_resource = || Attributes::non_resource(&method.to_ascii_lowercase(), path);
    let parts: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    if parts.len() < 3 {
        return non_resource();
    }
    let (group, rest) = match parts[0] {
        "api" => ("", &parts[1..]),
        "apis" if parts.len() >= 4 => (parts[1], &parts[2..]),
        _ => return non_resource(),
    };
    let version = rest[0];
    let mut rest = &rest[1..];
    let mut verb = match method {
        "POST" => "create",
        "GET" | "HEAD" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "",
    }
    .to_string();
    // `/watch/...` is the old way to ask for a watch.
    if rest.first() == Some(&"watch") {
        verb = "watch".into();
        rest = &rest[1..];
    }
    let mut namespace = String::new();
    if rest.first() == Some(&"namespaces") && rest.len() > 1 {
        namespace = rest[1].to_string();
        if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
            rest = &rest[2..];
        }
    }
    let mut a = Attributes {
        verb,
        resource_request: true,
        path: path.to_string(),
        group: group.to_string(),
        version: version.to_string(),
        namespace,
        ..Attributes::default()
    };
    if let Some(r) = rest.first() {
        a.resource = r.to_string();
    }
    if let Some(n) = rest.get(1) {
        a.name = n.to_string();
    }
    if let Some(s) = rest.get(2) {
        a.subresource = s.to_string();
    }
    // Connecting to a pod (exec, attach, port-forward) creates a stream,
    // also over the WebSocket GET (Kubernetes 1.31+).
    if a.resource == "pods"
        && matches!(a.subresource.as_str(), "exec" | "attach" | "portforward")
        && a.verb == "get"
    {
        a.verb = "create".into();
    }
    if a.name.is_empty() && a.verb == "get" {
        let watching = query.get("watch").is_some_and(|w| w == "true" || w == "1");
        a.verb = if watching { "watch" } else { "list" }.into();
    }
    if a.name.is_empty() && matches!(a.verb.as_str(), "list" | "watch") {
        // A list or watch of one object by name (`fieldSelector=
        // metadata.name=x`, what kube-rs and client-go informers on one
        // object send) is judged against resourceNames like a get.
        if let Some(name) = query.get("fieldSelector").and_then(|f| exact_name(f)) {
            a.name = name;
        }
    }
    if a.name.is_empty() && a.verb == "delete" {
        a.verb = "deletecollection".into();
    }
    a
}

/// `x` when the field selector is exactly `metadata.name=x` (or `==`).
fn exact_name(selector: &str) -> Option<String> {
    if selector.contains(',') {
        return None;
    }
    let rest = selector.trim().strip_prefix("metadata.name")?;
    let name = rest
        .strip_prefix("==")
        .or_else(|| rest.strip_prefix('='))?
        .trim();
    (!name.is_empty() && !name.contains(['/', '%']) && name != "." && name != "..")
        .then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn p(method: &str, path: &str) -> Attributes {
        parse(method, path, &HashMap::new())
    }

    #[test]
    fn verbs_follow_method_name_and_query() {
        assert_eq!(p("GET", "/api/v1/namespaces/a/pods/x").verb, "get");
        assert_eq!(p("GET", "/api/v1/namespaces/a/pods").verb, "list");
        let w = parse("GET", "/api/v1/namespaces/a/pods", &q(&[("watch", "true")]));
        assert_eq!(w.verb, "watch");
        assert_eq!(p("POST", "/api/v1/namespaces/a/pods").verb, "create");
        assert_eq!(p("PUT", "/api/v1/namespaces/a/pods/x").verb, "update");
        assert_eq!(p("PATCH", "/api/v1/namespaces/a/pods/x").verb, "patch");
        assert_eq!(p("DELETE", "/api/v1/namespaces/a/pods/x").verb, "delete");
        assert_eq!(
            p("DELETE", "/api/v1/namespaces/a/pods").verb,
            "deletecollection"
        );
        assert_eq!(p("GET", "/api/v1/watch/namespaces/a/pods").verb, "watch");
    }

    #[test]
    fn resources_subresources_groups_and_namespaces() {
        let a = p("GET", "/api/v1/namespaces/a/pods/x/log");
        assert_eq!(
            a,
            Attributes {
                path: "/api/v1/namespaces/a/pods/x/log".into(),
                version: "v1".into(),
                ..Attributes::resource("get", "", "pods", "log", "a", "x")
            }
        );
        let a = p(
            "PUT",
            "/apis/hostmesh.dev/v1alpha1/namespaces/t/worlds/w/status",
        );
        assert_eq!(
            (
                a.group.as_str(),
                a.resource.as_str(),
                a.subresource.as_str()
            ),
            ("hostmesh.dev", "worlds", "status")
        );
        let a = p("GET", "/api/v1/nodes/n1");
        assert_eq!((a.namespace.as_str(), a.name.as_str()), ("", "n1"));
        // The namespace object is in its own namespace.
        let a = p("GET", "/api/v1/namespaces/t");
        assert_eq!(
            (a.resource.as_str(), a.name.as_str(), a.namespace.as_str()),
            ("namespaces", "t", "t")
        );
        let a = p("PUT", "/api/v1/namespaces/t/finalize");
        assert_eq!(
            (a.resource.as_str(), a.subresource.as_str()),
            ("namespaces", "finalize")
        );
        let a = p("GET", "/apis/apps/v1/deployments");
        assert_eq!((a.verb.as_str(), a.namespace.as_str()), ("list", ""));
    }

    #[test]
    fn connecting_to_a_pod_is_create_even_over_get() {
        for sub in ["exec", "attach", "portforward"] {
            let path = format!("/api/v1/namespaces/a/pods/x/{sub}");
            assert_eq!(p("GET", &path).verb, "create", "{sub}");
            assert_eq!(p("POST", &path).verb, "create", "{sub}");
            assert_eq!(p("GET", &path).subresource, sub);
        }
        assert_eq!(p("GET", "/api/v1/namespaces/a/pods/x/log").verb, "get");
    }

    #[test]
    fn discovery_and_health_are_non_resource_paths() {
        for path in [
            "/api",
            "/api/v1",
            "/apis",
            "/apis/apps",
            "/apis/apps/v1",
            "/healthz",
            "/openapi/v3/apis/apps/v1",
        ] {
            let a = p("GET", path);
            assert!(!a.resource_request, "{path}");
            assert_eq!((a.verb.as_str(), a.path.as_str()), ("get", path));
        }
        assert_eq!(p("POST", "/healthz").verb, "post");
    }

    #[test]
    fn a_list_of_one_name_carries_the_name() {
        let a = parse(
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/a/leases",
            &q(&[("fieldSelector", "metadata.name=lock"), ("watch", "1")]),
        );
        assert_eq!((a.verb.as_str(), a.name.as_str()), ("watch", "lock"));
        let a = parse(
            "GET",
            "/api/v1/namespaces/a/pods",
            &q(&[("fieldSelector", "metadata.name=x,status.phase=Running")]),
        );
        assert_eq!(a.name, "");
    }
}
