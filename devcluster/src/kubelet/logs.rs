//! Container logs: each container's output is appended to
//! `<pod dir>/logs/<container>.log` (the previous run's output moves to
//! `<container>.previous.log` when the container restarts), read through
//! [`super::KubeletHandle::logs`] and served over HTTP for the API server's
//! `pods/log` proxy.
//!
//! The HTTP endpoint is `GET /containerLogs/<ns>/<pod>/<container>` on the
//! node IP and the port published in the Node's
//! `status.daemonEndpoints.kubeletEndpoint.Port`, with the query parameters
//! `tailLines`, `limitBytes`, `previous` and `follow`.
//!
//! The same endpoint serves exec, attach and port-forward (`streaming`).
//! With a client CA (`KubeletConfig::client_ca`, for a real kube-apiserver)
//! it serves HTTPS and also accepts client certificates (`serving`).
//!
//! Invariants:
//! 1. Every request carries `Authorization: Bearer <token>` with the token
//!    the kubelet was configured with, or comes over a TLS connection whose
//!    client certificate chains to the client CA and whose subject a
//!    `SubjectAccessReview` allows on `nodes/proxy` (403 otherwise);
//!    anything else gets 401 (logs can hold secrets). Without a token and a
//!    client CA the endpoint is not served.
//! 2. A followed log ends once its container has stopped and all its output
//!    was sent, or when the pod leaves this node, the kubelet stops or the
//!    client goes away.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use tokio::net::TcpListener;

use super::error::{KubeletError, Result};
use super::serving::Peer;
use super::shared::{Shared, lock};

pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// Path of a container's current or previous log in `dir` (the pod dir).
pub(crate) fn log_path(dir: &Path, container: &str, previous: bool) -> PathBuf {
    let name = if previous {
        format!("{container}.previous.log")
    } else {
        format!("{container}.log")
    };
    dir.join("logs").join(name)
}

/// The last `n` lines of `text`.
pub(crate) fn tail(text: &str, n: usize) -> String {
    if n == 0 {
        return String::new();
    }
    let trimmed = text.strip_suffix('\n').unwrap_or(text);
    let start = trimmed
        .rmatch_indices('\n')
        .nth(n - 1)
        .map(|(i, _)| i + 1)
        .unwrap_or(0);
    text[start..].to_string()
}

/// Reads a container's log: `tail_lines` last lines, at most `limit_bytes`.
pub(crate) fn read_log(
    shared: &Shared,
    namespace: &str,
    pod: &str,
    container: &str,
    previous: bool,
    tail_lines: Option<usize>,
) -> Result<(PathBuf, String)> {
    let entry = lock(&shared.pods)
        .get(&(namespace.to_string(), pod.to_string()))
        .cloned()
        .ok_or_else(|| {
            KubeletError::NotFound(format!("pod {namespace}/{pod} is not on this node"))
        })?;
    if container.is_empty() || container.contains('/') || container.contains("..") {
        return Err(KubeletError::NotFound(format!(
            "container {container:?} of pod {namespace}/{pod}"
        )));
    }
    let path = log_path(&entry.dir, container, previous);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let what = if previous {
                "has no previous run"
            } else {
                "has not started"
            };
            return Err(KubeletError::NotFound(format!(
                "container {container:?} of pod {namespace}/{pod} {what}"
            )));
        }
        Err(e) => return Err(KubeletError::io("cannot read log", path, e)),
    };
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let text = match tail_lines {
        None => text,
        Some(n) => tail(&text, n),
    };
    Ok((path, text))
}

/// Binds the log endpoint on the node IP; returns the bound port.
pub(crate) async fn bind(shared: &Shared) -> Result<Option<TcpListener>> {
    if shared.config.log_token.is_none() && shared.config.client_ca.is_none() {
        return Ok(None);
    }
    if let Some(ca) = &shared.config.client_ca {
        // Refuse to start with a client CA that cannot be used.
        super::serving::acceptor(shared, ca)?;
    }
    let addr = SocketAddr::from((shared.config.node_ip, shared.config.log_port));
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| KubeletError::io("cannot listen for log requests on", addr.to_string(), e))?;
    Ok(Some(listener))
}

/// Serves log requests until shutdown.
pub(crate) async fn serve(shared: Arc<Shared>, listener: TcpListener) {
    let tls = match shared.config.client_ca.as_deref() {
        Some(ca) => match super::serving::acceptor(&shared, ca) {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::error!(error = %e, "the kubelet endpoint cannot serve HTTPS");
                return;
            }
        },
        None => None,
    };
    loop {
        let stream = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "log endpoint accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let shared = shared.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let serve = |io, peer: Option<Peer>| {
                let svc = hyper::service::service_fn(move |req| {
                    let shared = shared.clone();
                    let peer = peer.clone();
                    async move { Ok::<_, Infallible>(handle(shared, peer, req).await) }
                });
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .with_upgrades()
            };
            match tls {
                None => {
                    let _ = serve(hyper_util::rt::TokioIo::new(Io::Plain(stream)), None).await;
                }
                Some(acceptor) => {
                    let Ok(conn) = acceptor.accept(stream).await else {
                        return;
                    };
                    let peer = super::serving::peer(conn.get_ref().1);
                    let _ =
                        serve(hyper_util::rt::TokioIo::new(Io::Tls(Box::new(conn))), peer).await;
                }
            }
        });
    }
}

pub(crate) fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.into())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    r
}

/// Invariant 1: the token, or a client certificate the API server allows.
async fn authorize(
    shared: &Shared,
    peer: Option<&Peer>,
    req: &Request<Incoming>,
) -> std::result::Result<(), Response<Body>> {
    if authorized(shared, req) {
        return Ok(());
    }
    let Some(peer) = peer else {
        return Err(text(
            StatusCode::UNAUTHORIZED,
            "Unauthorized: a valid bearer token or client certificate is required",
        ));
    };
    let verb = match *req.method() {
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "get",
    };
    super::serving::allowed(shared, peer, verb)
        .await
        .map_err(|m| text(StatusCode::FORBIDDEN, m))
}

fn authorized(shared: &Shared, req: &Request<Incoming>) -> bool {
    let Some(token) = shared.config.log_token.as_deref() else {
        return false;
    };
    let Some(given) = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    constant_time_eq(given.as_bytes(), token.as_bytes())
}

/// Compares two byte strings in time that depends only on their lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn handle(shared: Arc<Shared>, peer: Option<Peer>, req: Request<Incoming>) -> Response<Body> {
    if let Err(refused) = authorize(&shared, peer.as_ref(), &req).await {
        return refused;
    }
    if super::streaming::is_streaming_path(req.uri().path()) {
        return super::streaming::handle(shared, req).await;
    }
    if req.method() != http::Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET is supported");
    }
    let parts: Vec<&str> = req.uri().path().trim_matches('/').split('/').collect();
    let [prefix, ns, pod, container] = parts.as_slice() else {
        return text(
            StatusCode::NOT_FOUND,
            "expected /containerLogs/<namespace>/<pod>/<container>",
        );
    };
    if *prefix != "containerLogs" {
        return text(
            StatusCode::NOT_FOUND,
            "expected /containerLogs/<namespace>/<pod>/<container>",
        );
    }
    let query: Vec<(String, String)> = req
        .uri()
        .query()
        .map(|q| {
            q.split('&')
                .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default();
    let get = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let number = |k: &str| -> std::result::Result<Option<usize>, String> {
        match get(k) {
            None | Some("") => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| format!("{k}={v:?} is not a non-negative integer")),
        }
    };
    let (tail_lines, limit) = match (number("tailLines"), number("limitBytes")) {
        (Ok(t), Ok(l)) => (t, l),
        (Err(m), _) | (_, Err(m)) => return text(StatusCode::BAD_REQUEST, m),
    };
    let previous = get("previous") == Some("true");
    let follow = get("follow") == Some("true");
    let (path, mut body) = match read_log(&shared, ns, pod, container, previous, tail_lines) {
        Ok(v) => v,
        Err(KubeletError::NotFound(m)) => return text(StatusCode::NOT_FOUND, m),
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    if let Some(limit) = limit {
        let mut cut = limit.min(body.len());
        while !body.is_char_boundary(cut) {
            cut -= 1;
        }
        body.truncate(cut);
    }
    if !follow || previous {
        return text(StatusCode::OK, body);
    }
    let offset = super::logrotate::end_position(&shared.log_cuts, &path).await;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let _ = tx.try_send(Bytes::from(body));
    let key = (ns.to_string(), pod.to_string());
    let container = container.to_string();
    let uid = match lock(&shared.pods).get(&key) {
        Some(entry) => entry.uid.clone(),
        None => {
            return text(
                StatusCode::NOT_FOUND,
                format!("pod {ns}/{pod} is not on this node"),
            );
        }
    };
    tokio::spawn(async move {
        let mut offset = offset;
        loop {
            tokio::select! {
                _ = shared.shutdown.cancelled() => return,
                _ = tx.closed() => return,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            let running = match lock(&shared.pods).get(&key) {
                Some(entry) if entry.uid == uid => lock(&entry.running).contains(&container),
                _ => return,
            };
            // Positions are absolute: rotation cuts the file's front.
            let Some((next, buf)) =
                super::logrotate::read_from(&shared.log_cuts, &path, offset).await
            else {
                if running {
                    continue;
                }
                return;
            };
            offset = next;
            if buf.is_empty() {
                if running {
                    continue;
                }
                // The container is gone and everything it wrote was sent.
                return;
            }
            if tx.send(Bytes::from(buf)).await.is_err() {
                return;
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut r = Response::new(StreamBody::new(stream).boxed());
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    r
}

/// A plain or TLS connection to the endpoint.
enum Io {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
}

impl tokio::io::AsyncRead for Io {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Io {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            Io::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tail;

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(tail("a\nb\nc", 2), "b\nc");
        assert_eq!(tail("a\nb\n", 5), "a\nb\n");
        assert_eq!(tail("a\n", 0), "");
    }
}
