//! Owns URL routing: turns a request path into a discovery endpoint or a
//! resource address (resource, version, namespace, name, subresource).

use std::sync::Arc;

use super::registry::{Registry, ResourceInfo};
use super::status::ApiError;

/// A resource address.
#[derive(Debug, Clone)]
pub(crate) struct RouteTarget {
    pub(crate) info: Arc<ResourceInfo>,
    pub(crate) version: String,
    /// The namespace in the path (`None`: cluster-scoped or all namespaces).
    pub(crate) ns: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) sub: Option<String>,
}

/// What a path addresses.
#[derive(Debug)]
pub(crate) enum Route {
    Version,
    Healthz,
    Api,
    Apis,
    Group(String),
    ResourceList(String, String),
    OpenApiV2,
    OpenApiV3,
    OpenApiV3Doc(String, String),
    Resource(RouteTarget),
}

/// Whether a handler serves `path` at all: the discovery roots, `/openapi`,
/// and the group versions the registry serves. kube-apiserver answers
/// other paths (`/foo`, `/apis/unknown.io/v1`) with a plain-text `404
/// page not found`, not a `Status`.
pub(crate) fn handled(path: &str, reg: &Registry) -> bool {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let served = |g: &str, v: &str| {
        reg.groups()
            .iter()
            .any(|(x, vs)| x == g && vs.iter().any(|y| y == v))
    };
    match segs.as_slice() {
        ["version" | "healthz" | "livez" | "readyz" | "api" | "apis"] => true,
        ["openapi", ..] => true,
        ["api", v, ..] => served("", v),
        ["apis", g] => reg.groups().iter().any(|(x, _)| x == g),
        ["apis", g, v, ..] => served(g, v),
        _ => false,
    }
}

/// Routes a path (without query).
pub(crate) fn route(path: &str, reg: &Registry) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    match segs.as_slice() {
        ["version"] => Ok(Route::Version),
        ["healthz"] | ["livez"] | ["readyz"] => Ok(Route::Healthz),
        ["api"] => Ok(Route::Api),
        ["apis"] => Ok(Route::Apis),
        ["openapi", "v2"] => Ok(Route::OpenApiV2),
        ["openapi", "v3"] => Ok(Route::OpenApiV3),
        ["openapi", "v3", "api", v] => Ok(Route::OpenApiV3Doc(String::new(), v.to_string())),
        ["openapi", "v3", "apis", g, v] => Ok(Route::OpenApiV3Doc(g.to_string(), v.to_string())),
        ["api", v] => {
            known_gv(reg, "", v).map(|_| Route::ResourceList(String::new(), v.to_string()))
        }
        ["apis", g] => {
            if reg.groups().iter().any(|(x, _)| x == g) {
                Ok(Route::Group(g.to_string()))
            } else {
                Err(ApiError::no_route(path))
            }
        }
        ["apis", g, v] => {
            known_gv(reg, g, v).map(|_| Route::ResourceList(g.to_string(), v.to_string()))
        }
        ["api", v, rest @ ..] => resource(reg, "", v, rest, path),
        ["apis", g, v, rest @ ..] => resource(reg, g, v, rest, path),
        _ => Err(ApiError::no_route(path)),
    }
}

fn known_gv(reg: &Registry, g: &str, v: &str) -> Result<(), ApiError> {
    if reg
        .groups()
        .iter()
        .any(|(x, vs)| x == g && vs.iter().any(|y| y == v))
    {
        Ok(())
    } else {
        Err(ApiError::no_route(&format!("{g}/{v}")))
    }
}

fn resource(
    reg: &Registry,
    g: &str,
    v: &str,
    rest: &[&str],
    path: &str,
) -> Result<Route, ApiError> {
    let lookup = |plural: &str| {
        reg.lookup(g, v, plural)
            .ok_or_else(|| ApiError::no_route(path))
    };
    let target =
        |info: Arc<ResourceInfo>, ns: Option<&str>, name: Option<&str>, sub: Option<&str>| {
            Ok(Route::Resource(RouteTarget {
                info,
                version: v.to_string(),
                ns: ns.map(str::to_string),
                name: name.map(str::to_string),
                sub: sub.map(str::to_string),
            }))
        };
    match rest {
        // The namespace object itself and its subresources.
        ["namespaces", name] if g.is_empty() => {
            target(lookup("namespaces")?, None, Some(name), None)
        }
        ["namespaces", name, sub @ ("status" | "finalize")] if g.is_empty() => {
            target(lookup("namespaces")?, None, Some(name), Some(sub))
        }
        ["namespaces", ns, plural, tail @ ..] => {
            let info = lookup(plural)?;
            if !info.namespaced {
                return Err(ApiError::no_route(path));
            }
            match tail {
                [] => target(info, Some(ns), None, None),
                [name] => target(info, Some(ns), Some(name), None),
                [name, sub] => target(info, Some(ns), Some(name), Some(sub)),
                _ => Err(ApiError::no_route(path)),
            }
        }
        [plural] => target(lookup(plural)?, None, None, None),
        [plural, name] => {
            let info = lookup(plural)?;
            if info.namespaced {
                return Err(ApiError::no_route(path));
            }
            target(info, None, Some(name), None)
        }
        [plural, name, sub] => {
            let info = lookup(plural)?;
            if info.namespaced {
                return Err(ApiError::no_route(path));
            }
            target(info, None, Some(name), Some(sub))
        }
        _ => Err(ApiError::no_route(path)),
    }
}
