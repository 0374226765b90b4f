//! Owns the wire: TLS accept loop, HTTP/1.1 and HTTP/2 via hyper, and
//! dispatch of routed requests to the verbs, after `auth` has said who
//! asks and that they may.
//!
//! Invariants:
//! 1. Every request except `/healthz`, `/livez`, `/readyz` and `/version`
//!    comes on a connection with a client certificate of the cluster CA or
//!    carries a bearer token the server accepts; others get 401 before any
//!    routing.
//! 2. A request from a user who is not a superuser is authorized by RBAC
//!    before routing (403 otherwise), from the URL alone.
//! 3. Every error is a `Status` object with the matching HTTP code.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Response, header};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::auth::{self, Authenticator, User};
use super::handlers::{self, Request};
use super::lifecycle::Part;
use super::response::{Body, error_response, full, json_response, stream_response};
use super::route::{self, Route, RouteTarget};
use super::serviceaccount::{self, TokenIssuer};
use super::status::ApiError;
use super::store::Store;
use super::watch::{self, WatchConfig};
use super::{
    certs, componentstatus, connect, discovery, disruption, limits, logs, openapi, podsecurity,
    scale, table,
};

/// Everything a request handler needs.
pub(crate) struct Ctx {
    pub(crate) store: Arc<Store>,
    pub(crate) auth: Authenticator,
    pub(crate) tokens: TokenIssuer,
    /// The admin token (sent to kubelets when proxying `pods/log`).
    pub(crate) token: String,
    pub(crate) server_addr: String,
    pub(crate) watch: WatchConfig,
    pub(crate) shutdown: CancellationToken,
    pub(crate) max_body: usize,
}

/// Accepts connections until shutdown.
pub(crate) async fn serve(listener: TcpListener, acceptor: TlsAcceptor, ctx: Arc<Ctx>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let ctx = ctx.clone();
        conns.spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(t) => t,
                Err(e) => {
                    debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            let shutdown = ctx.shutdown.clone();
            // A client certificate (verified against the CA by rustls)
            // names the user of every request on this connection.
            let cert_user = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| auth::x509::user_of(c));
            let svc = hyper::service::service_fn(move |req| {
                let ctx = ctx.clone();
                let cert_user = cert_user.clone();
                async move { Ok::<_, Infallible>(handle(ctx, req, cert_user).await) }
            });
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let conn =
                builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(tls), svc);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        debug!(%peer, error = %e, "connection ended with an error");
                    }
                }
                _ = shutdown.cancelled() => {}
            }
        });
        while conns.try_join_next().is_some() {}
    }
    conns.abort_all();
}

async fn handle(
    ctx: Arc<Ctx>,
    req: http::Request<Incoming>,
    cert_user: Option<User>,
) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let public = matches!(
        path.as_str(),
        "/healthz" | "/livez" | "/readyz" | "/version"
    );
    let query: HashMap<String, String> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let user = if public {
        None
    } else {
        let header = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        // As kube-apiserver's union authenticator: the client certificate
        // first, then the bearer token.
        let user = match cert_user {
            Some(u) => u,
            None => match ctx.auth.authenticate(&ctx.store, header) {
                Ok(u) => u,
                Err(e) => return error_response(&e),
            },
        };
        let attrs = auth::attrs::parse(method.as_str(), &path, &query);
        if let Err(e) = auth::authorize(&ctx.store, &user, &attrs) {
            return error_response(&e);
        }
        Some(user)
    };
    // exec, attach and port-forward take over the connection.
    if let Some(target) = connect::target(&ctx.store, &path) {
        let resp = match connect::serve(&ctx, &target, req, &query).await {
            Ok(r) => r,
            Err(e) => error_response(&e),
        };
        debug!(%method, %path, status = resp.status().as_u16(), "request");
        return resp;
    }
    let hdr = |h: header::HeaderName| {
        req.headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let (content_type, accept, user_agent) = (
        hdr(header::CONTENT_TYPE),
        hdr(header::ACCEPT),
        hdr(header::USER_AGENT),
    );
    let body = match http_body_util::Limited::new(req.into_body(), ctx.max_body)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return error_response(&limits::body_too_large(ctx.max_body));
        }
        Err(e) => {
            return error_response(&ApiError::bad_request(format!(
                "cannot read the request body: {e}"
            )));
        }
    };
    // Public paths are served to anyone; they never reach a resource.
    let user = user.unwrap_or_else(User::anonymous);
    let request = Request {
        query,
        content_type,
        accept,
        user_agent,
        body,
        user: user.clone(),
        warnings: std::sync::Mutex::default(),
    };
    let resp = dispatch(&ctx, &user, &method, &path, &request).await;
    debug!(%method, %path, status = resp.status().as_u16(), "request");
    resp
}

async fn dispatch(
    ctx: &Arc<Ctx>,
    user: &User,
    method: &Method,
    path: &str,
    req: &Request,
) -> Response<Body> {
    let registry = ctx.store.registry();
    let route = match route::route(path, &registry) {
        Ok(r) => r,
        Err(e) if e.code == 404 && !route::handled(path, &registry) => {
            return full(
                404,
                "text/plain; charset=utf-8",
                Bytes::from_static(b"404 page not found\n"),
            );
        }
        Err(e) => return error_response(&e),
    };
    let get_only = |v: Value| {
        if method == Method::GET {
            json_response(200, &v)
        } else {
            error_response(&ApiError::method_not_allowed())
        }
    };
    match route {
        Route::Version => get_only(discovery::version()),
        Route::Healthz => full(200, "text/plain", Bytes::from_static(b"ok")),
        Route::Api => get_only(discovery::api(&ctx.server_addr)),
        Route::Apis => get_only(discovery::apis(&registry)),
        Route::Group(g) => get_only(discovery::group(&registry, &g)),
        Route::ResourceList(g, v) => get_only(discovery::resources(&registry, &g, &v)),
        Route::OpenApiV2 if req.accept.contains("protobuf") => {
            // client-go only parses the protobuf form; a document without
            // definitions makes kubectl skip client-side validation (the
            // server validates instead).
            full(
                200,
                "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
                openapi::v2_protobuf(),
            )
        }
        Route::OpenApiV2 => get_only(openapi::v2(&registry)),
        Route::OpenApiV3 => get_only(openapi::v3_index(&registry)),
        Route::OpenApiV3Doc(g, v) => get_only(openapi::v3_doc(&registry, &g, &v)),
        Route::Resource(t) => match resource(ctx, user, method, &t, req).await {
            Ok(r) => r,
            Err(e) => error_response(&e),
        },
    }
}

async fn resource(
    ctx: &Arc<Ctx>,
    user: &User,
    method: &Method,
    t: &RouteTarget,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let store = &ctx.store;
    let watching = req.q("watch").is_some_and(|w| w == "true" || w == "1");
    let sub = t.sub.as_deref();
    if let Some(s) = sub
        && !t.info.subresources().contains(&s)
    {
        return Err(ApiError::no_route(&format!("{}/{s}", t.info.plural)));
    }
    if t.info.is_review() {
        if method != Method::POST || t.name.is_some() {
            return Err(ApiError::method_not_allowed());
        }
        let (code, body) = if t.info.plural == "tokenreviews" {
            auth::review::token_review(&ctx.auth, store, t, req)?
        } else {
            auth::review::review(store, user, t, req)?
        };
        return Ok(json_response(code, &body));
    }
    let reply = match (method, sub) {
        (&Method::GET, None) if componentstatus::is_target(t) => {
            req.warn(vec![componentstatus::DEPRECATED.into()]);
            let body = componentstatus::get(t, watching)?;
            if req.wants_table() {
                let items = match body.get("items").and_then(Value::as_array) {
                    Some(items) => items.clone(),
                    None => vec![body],
                };
                (
                    200,
                    table::table(
                        &t.info,
                        &t.version,
                        &items,
                        req.q("includeObject"),
                        None,
                        true,
                    ),
                )
            } else {
                (200, body)
            }
        }
        _ if componentstatus::is_target(t) => return Err(ApiError::method_not_allowed()),
        (&Method::GET, None) if watching => {
            let rx = watch::start(store.clone(), t, req, ctx.watch, ctx.shutdown.clone())?;
            return Ok(stream_response(rx, "application/json"));
        }
        (&Method::GET, Some("log")) => {
            return logs::proxy(&ctx.store, &ctx.token, ctx.shutdown.clone(), t, req).await;
        }
        (&Method::GET, Some("scale")) => scale::get(store, t)?,
        (&Method::PUT, Some("scale")) => scale::write(store, t, req, false)?,
        (&Method::PATCH, Some("scale")) => scale::write(store, t, req, true)?,
        (&Method::GET, None) if t.name.is_none() => handlers::list(store, t, req)?,
        (&Method::GET, _) => handlers::get(store, t, req)?,
        (&Method::POST, None) => handlers::create(store, t, req)?,
        (&Method::POST, Some("binding")) => handlers::bind(store, t, req)?,
        (&Method::POST, Some("eviction")) => disruption::evict(store, t, req)?,
        (&Method::POST, Some("token")) => {
            serviceaccount::token_request(&ctx.tokens, store, t, req)?
        }
        (&Method::PUT, None) => handlers::update(store, t, req, Part::Main)?,
        (&Method::PUT, Some("status")) => handlers::update(store, t, req, Part::Status)?,
        (&Method::PUT, Some("finalize")) => handlers::finalize_namespace(store, t, req)?,
        (&Method::PATCH, None) => handlers::patch(store, t, req, Part::Main)?,
        (&Method::PATCH, Some("status")) => handlers::patch(store, t, req, Part::Status)?,
        (&Method::PUT, Some("ephemeralcontainers")) => {
            handlers::update(store, t, req, Part::Ephemeral)?
        }
        (&Method::PATCH, Some("ephemeralcontainers")) => {
            handlers::patch(store, t, req, Part::Ephemeral)?
        }
        (&Method::PUT, Some("approval")) => {
            certs::signer::may_approve(store, user, t)?;
            handlers::update(store, t, req, Part::Approval)?
        }
        (&Method::PATCH, Some("approval")) => {
            certs::signer::may_approve(store, user, t)?;
            handlers::patch(store, t, req, Part::Approval)?
        }
        (&Method::DELETE, None) if t.name.is_none() => handlers::delete_collection(store, t, req)?,
        (&Method::DELETE, None) => handlers::delete(store, t, req)?,
        _ => return Err(ApiError::method_not_allowed()),
    };
    let reply = if req.wants_metadata() {
        (reply.0, handlers::as_metadata(reply.1))
    } else {
        reply
    };
    let mut resp = json_response(reply.0, &reply.1);
    let warnings = std::mem::take(
        &mut *req
            .warnings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    for w in warnings {
        match http::HeaderValue::from_str(&podsecurity::warning_header(&w)) {
            Ok(v) => {
                resp.headers_mut().append(header::WARNING, v);
            }
            Err(e) => debug!(error = %e, "a warning cannot be sent as a header"),
        }
    }
    Ok(resp)
}
