//! The operator's plain-HTTP endpoint: `/metrics` (Prometheus, OpenMetrics
//! text), `/healthz` (the process is alive and serving) and `/readyz`
//! (controllers started and, with leader election, this replica is the
//! leader or a ready standby).
//!
//! Invariants:
//! 1. `/healthz` answers 200 whenever the server runs; it checks nothing that
//!    a restart would not fix faster than waiting.
//! 2. `/readyz` answers 200 only when every check passes and 503 otherwise,
//!    with one `[+]`/`[-]` line per check, as the Kubernetes API server does.
//! 3. Shutdown stops accepting at once, lets in-flight requests finish, and
//!    closes idle keep-alive connections; [`serve`] returns within
//!    [`SHUTDOWN_GRACE`] of the shutdown signal.
//! 4. Only GET and HEAD are served; no endpoint takes input beyond its path.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::leader::Role;
use crate::metrics::{self, Metrics};

/// How long [`serve`] waits for open connections after the shutdown signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Errors from the HTTP endpoint.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr} (--http-addr): {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

/// Flags for the HTTP endpoint (flatten into the operator's `clap::Args`).
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// Address serving `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = "HOSTMESH_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,
}

/// What the endpoint reports; shared with the code that starts controllers.
#[derive(Debug)]
pub struct HealthState {
    metrics: Arc<Metrics>,
    controllers_started: AtomicBool,
    role: Option<watch::Receiver<Role>>,
}

impl HealthState {
    /// State for a replica; `role` is `None` when leader election is off.
    pub fn new(metrics: Arc<Metrics>, role: Option<watch::Receiver<Role>>) -> Self {
        Self {
            metrics,
            controllers_started: AtomicBool::new(false),
            role,
        }
    }

    /// Marks the controllers as started (or stopped, during shutdown).
    pub fn set_controllers_started(&self, started: bool) {
        self.controllers_started.store(started, Ordering::Release);
    }

    /// The readiness checks as `(name, passed, detail)`.
    pub fn readiness(&self) -> Vec<(&'static str, bool, String)> {
        let started = self.controllers_started.load(Ordering::Acquire);
        let mut checks = vec![(
            "controllers",
            started,
            if started { "started" } else { "not started" }.to_owned(),
        )];
        if let Some(role) = &self.role {
            let (ok, detail) = match &*role.borrow() {
                Role::Starting => (false, "lease not read yet".to_owned()),
                Role::Leader => (true, "leader".to_owned()),
                Role::Standby { holder: Some(h) } => (true, format!("standby, leader is {h}")),
                Role::Standby { holder: None } => (true, "standby".to_owned()),
            };
            checks.push(("leader-election", ok, detail));
        }
        checks
    }
}

/// Binds `addr`; separate from [`serve`] so callers learn the bound port.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, HealthError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| HealthError::Bind { addr, source })
}

/// Binds `addr` and serves in a task until `shutdown` resolves; returns the
/// bound address (useful with port 0) and the task.
pub async fn spawn(
    addr: SocketAddr,
    state: Arc<HealthState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), HealthError> {
    let listener = bind(addr).await?;
    let bound = listener
        .local_addr()
        .map_err(|source| HealthError::Bind { addr, source })?;
    tracing::info!(addr = %bound, "serving /metrics, /healthz and /readyz");
    Ok((bound, tokio::spawn(serve(listener, state, shutdown))))
}

/// Serves until `shutdown` resolves, then shuts down gracefully (invariant 3).
pub async fn serve(
    listener: TcpListener,
    state: Arc<HealthState>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Transient (EMFILE, aborted handshakes): keep serving.
                        tracing::warn!(error = %e, "accepting a health/metrics connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                conns.spawn(connection(stream, peer, state.clone(), stop_rx.clone()));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = conns.len(),
            "health/metrics connections still open after the grace period; closing them"
        );
        conns.shutdown().await;
    }
}

async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    state: Arc<HealthState>,
    mut stop: watch::Receiver<bool>,
) {
    let svc = service_fn(move |req| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(handle(&req, &state)) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10))
        .serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    tokio::select! {
        res = conn.as_mut() => {
            if let Err(e) = res {
                tracing::debug!(%peer, error = %e, "health/metrics connection ended with an error");
            }
        }
        // The flag only ever goes from false to true, after the last accept.
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "health/metrics connection ended with an error");
            }
        }
    }
}

/// Routes one request (pure: no I/O).
pub fn handle<B>(req: &Request<B>, state: &HealthState) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD are served\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            let mut resp = Response::new(Full::new(Bytes::from(state.metrics.encode())));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(metrics::CONTENT_TYPE),
            );
            resp
        }
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => {
            let checks = state.readiness();
            let ready = checks.iter().all(|(_, ok, _)| *ok);
            let mut body = String::new();
            for (name, ok, detail) in &checks {
                let mark = if *ok { '+' } else { '-' };
                body.push_str(&format!("[{mark}]{name} {detail}\n"));
            }
            body.push_str(if ready { "ok\n" } else { "not ready\n" });
            let code = if ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            text(code, body)
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n".into(),
        ),
    }
}

fn text(code: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}
