//! Request metrics taken at the kube client: a tower layer that sees every
//! request the operator sends, so `hostmesh_status_writes_total` counts
//! each write to a World's or ProcMesh's status subresource with its real
//! outcome, whatever code path issued it, and `hostmesh_api_requests_total`
//! counts every request by verb (the operator's load on the API server).
//!
//! Invariants:
//! 1. Only PATCH and PUT on `/apis/hostmesh.dev/<version>/namespaces/<ns>/
//!    {worlds,procmeshes}/<name>/status` are counted as status writes;
//!    every other request passes through untouched, counted only by verb.
//! 2. The outcome is the HTTP status: 2xx `applied`, 409 `conflict`, any
//!    other status or a transport failure `error`.
//! 3. Every request is counted once in `hostmesh_api_requests_total`, by
//!    the verb Kubernetes would log for it ([`verb_of`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Method, Request, Response};

use crate::metrics::{Metrics, StatusWriteOutcome};

/// Wraps a kube client's service stack (`ClientBuilder::with_layer`).
#[derive(Debug, Clone)]
pub struct StatusWriteLayer {
    metrics: Arc<Metrics>,
}

impl StatusWriteLayer {
    /// A layer recording into `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

impl<S> tower_layer::Layer<S> for StatusWriteLayer {
    type Service = StatusWriteService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        StatusWriteService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`StatusWriteLayer`] produces.
#[derive(Debug, Clone)]
pub struct StatusWriteService<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

/// The kind whose status `method path` writes, if it is such a write
/// (invariant 1).
pub fn status_write_kind(method: &Method, path: &str) -> Option<&'static str> {
    if method != Method::PATCH && method != Method::PUT {
        return None;
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        [
            "apis",
            "hostmesh.dev",
            _version,
            "namespaces",
            _ns,
            plural,
            _name,
            "status",
        ] => match *plural {
            "worlds" => Some("World"),
            "procmeshes" => Some("ProcMesh"),
            _ => None,
        },
        _ => None,
    }
}

/// The Kubernetes verb of a request (invariant 3): GET of a collection is
/// `list`, or `watch` with `watch=true`; of one object `get`.
pub fn verb_of(method: &Method, path: &str, query: Option<&str>) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        Method::GET => {
            let watch =
                query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
            if watch {
                return "watch";
            }
            // /api/v1/<plural>, /api/v1/namespaces/<ns>/<plural>,
            // /apis/<group>/<version>/... : a collection has an even
            // number of segments after the version prefix's start.
            let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
            let rest = match parts.first() {
                Some(&"api") => parts.get(2..),
                Some(&"apis") => parts.get(3..),
                _ => None,
            }
            .unwrap_or_default();
            let rest = match rest {
                ["namespaces", _ns, more @ ..] if !more.is_empty() => more,
                other => other,
            };
            if rest.len() == 1 { "list" } else { "get" }
        }
        _ => "other",
    }
}

/// The outcome of a response code (invariant 2).
pub fn outcome_of(code: u16) -> StatusWriteOutcome {
    match code {
        200..=299 => StatusWriteOutcome::Applied,
        409 => StatusWriteOutcome::Conflict,
        _ => StatusWriteOutcome::Error,
    }
}

impl<S, ReqBody, ResBody> tower_service::Service<Request<ReqBody>> for StatusWriteService<S>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let kind = status_write_kind(req.method(), req.uri().path());
        self.metrics
            .api_request(verb_of(req.method(), req.uri().path(), req.uri().query()));
        let fut = self.inner.call(req);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let res = fut.await;
            if let Some(kind) = kind {
                let outcome = match &res {
                    Ok(resp) => outcome_of(resp.status().as_u16()),
                    Err(_) => StatusWriteOutcome::Error,
                };
                metrics.status_write(kind, outcome);
            }
            res
        })
    }
}

/// A client for `config` whose status writes are counted in `metrics`.
pub fn client(config: kube::Config, metrics: Arc<Metrics>) -> Result<kube::Client, kube::Error> {
    Ok(
        hostmesh_net::kube_client_builder(config, hostmesh_net::Resolver::system())?
            .with_layer(&StatusWriteLayer::new(metrics))
            .build(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_status_writes_of_hostmesh_kinds_are_counted() {
        let p = "/apis/hostmesh.dev/v1alpha1/namespaces/ml/worlds/trainer/status";
        assert_eq!(status_write_kind(&Method::PATCH, p), Some("World"));
        assert_eq!(status_write_kind(&Method::PUT, p), Some("World"));
        assert_eq!(status_write_kind(&Method::GET, p), None);
        let p = "/apis/hostmesh.dev/v1alpha1/namespaces/ml/procmeshes/train/status";
        assert_eq!(status_write_kind(&Method::PATCH, p), Some("ProcMesh"));
        for other in [
            "/apis/hostmesh.dev/v1alpha1/namespaces/ml/worlds/trainer",
            "/api/v1/namespaces/ml/pods/p/status",
            "/apis/example.com/v1/namespaces/ml/worlds/trainer/status",
            "/apis/hostmesh.dev/v1alpha1/namespaces/ml/widgets/w/status",
        ] {
            assert_eq!(status_write_kind(&Method::PATCH, other), None, "{other}");
        }
    }

    #[test]
    fn requests_are_counted_by_their_kubernetes_verb() {
        let get = |p: &str, q: Option<&str>| verb_of(&Method::GET, p, q);
        assert_eq!(get("/api/v1/namespaces/ml/pods", None), "list");
        assert_eq!(get("/api/v1/pods", Some("labelSelector=a")), "list");
        assert_eq!(
            get(
                "/api/v1/namespaces/ml/pods",
                Some("watch=true&resourceVersion=5")
            ),
            "watch"
        );
        assert_eq!(get("/api/v1/namespaces/ml/pods/p", None), "get");
        assert_eq!(get("/api/v1/namespaces", None), "list");
        assert_eq!(get("/api/v1/namespaces/ml", None), "get");
        assert_eq!(
            get("/apis/hostmesh.dev/v1alpha1/namespaces/ml/worlds", None),
            "list"
        );
        assert_eq!(
            get("/apis/hostmesh.dev/v1alpha1/namespaces/ml/worlds/w", None),
            "get"
        );
        assert_eq!(get("/apis/hostmesh.dev/v1alpha1/worlds", None), "list");
        let p = "/api/v1/namespaces/ml/pods/p";
        assert_eq!(verb_of(&Method::PATCH, p, None), "patch");
        assert_eq!(verb_of(&Method::PUT, p, None), "update");
        assert_eq!(verb_of(&Method::DELETE, p, None), "delete");
        assert_eq!(
            verb_of(&Method::POST, "/api/v1/namespaces/ml/pods", None),
            "create"
        );
    }

    #[test]
    fn outcomes_follow_the_http_status() {
        assert_eq!(outcome_of(200), StatusWriteOutcome::Applied);
        assert_eq!(outcome_of(201), StatusWriteOutcome::Applied);
        assert_eq!(outcome_of(409), StatusWriteOutcome::Conflict);
        assert_eq!(outcome_of(422), StatusWriteOutcome::Error);
        assert_eq!(outcome_of(500), StatusWriteOutcome::Error);
    }
}
