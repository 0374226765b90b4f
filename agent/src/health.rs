//! The agent's plain-HTTP health endpoint: `/healthz` answers 200 while the
//! agent runs; `/readyz` answers 200 once the agent serves its protocol (and,
//! on a Monarch host, once its worker listens) and 503 once it is shutting
//! down. Nothing else is served (404), and nothing here reveals proc state.
//!
//! It listens on the pod IP (the kubelet's probe) and, best effort, on
//! loopback at the same port: `kubectl port-forward` connects to localhost
//! inside the pod's network namespace. Where pods share one namespace
//! (`--pod-network host`), the loopback port belongs to the first agent.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::error::HostError;

/// Readiness shared between the agent and the health endpoint: the agent
/// serves, and no worker it waits for is missing.
#[derive(Debug, Default, Clone)]
pub struct Readiness {
    ready: Arc<AtomicBool>,
    /// Set while a Monarch worker does not listen (yet, or any more).
    worker_missing: Arc<AtomicBool>,
}

impl Readiness {
    /// Sets whether the agent serves.
    pub fn set(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Sets whether the host's Monarch worker listens.
    pub fn set_worker_listening(&self, listening: bool) {
        self.worker_missing.store(!listening, Ordering::SeqCst);
    }

    /// Whether `/readyz` answers 200.
    pub fn get(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && !self.worker_missing.load(Ordering::SeqCst)
    }
}

/// Binds the health endpoint; returns the bound address and the serving
/// future (runs until dropped).
pub(crate) async fn serve(
    addr: SocketAddr,
    readiness: Readiness,
) -> Result<(SocketAddr, impl Future<Output = ()> + Send + 'static), HostError> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        HostError::io(
            format!("cannot listen for health checks on {addr} (--health-port)"),
            e,
        )
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| HostError::io("health listener address", e))?;
    // Best effort: a second agent in a shared namespace finds it taken.
    let local = if bound.ip().is_loopback() || bound.ip().is_unspecified() {
        None
    } else {
        let lo = SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), bound.port());
        match TcpListener::bind(lo).await {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::debug!(%lo, error = %e, "health endpoint not on loopback");
                None
            }
        }
    };
    let main = accept_loop(listener, readiness.clone());
    let fut = async move {
        match local {
            Some(l) => {
                futures::future::join(main, accept_loop(l, readiness)).await;
            }
            None => main.await,
        }
    };
    Ok((bound, fut))
}

async fn accept_loop(listener: TcpListener, readiness: Readiness) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors and the like: back off, keep serving.
                tracing::warn!(error = %e, "health endpoint accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let readiness = readiness.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let ready = readiness.get();
                async move { Ok::<_, Infallible>(answer(req.uri().path(), ready)) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn answer(path: &str, ready: bool) -> Response<Full<Bytes>> {
    let (code, body) = match path {
        "/healthz" => (StatusCode::OK, "ok\n"),
        "/readyz" if ready => (StatusCode::OK, "ready\n"),
        "/readyz" => (StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        _ => (StatusCode::NOT_FOUND, "not found\n"),
    };
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = code;
    resp
}
