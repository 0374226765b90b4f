//! The kubelet's streaming endpoints, served beside `/containerLogs` on the
//! node IP and port the Node publishes, with the same bearer token:
//!
//! - `/exec/<ns>/<pod>/<container>?command=..&input=1&output=1&error=1&tty=1`
//!   (the API server's names; `stdin`, `stdout`, `stderr` are accepted too)
//!   over WebSocket (`v5.channel.k8s.io`, `v4.channel.k8s.io`) or SPDY/3.1
//!   (`v4.channel.k8s.io`): `exec`, `ws`, `spdy`.
//! - `/attach/<ns>/<pod>/<container>`: the same protocols; see `attach`.
//! - `/portForward/<ns>/<pod>` over SPDY/3.1 (`portforward.k8s.io`):
//!   `portforward`.
//!
//! `netns` enters a container's network and UTS namespaces.
//!
//! Invariants:
//! 1. Every session holds a slot of [`Limits`] (per kubelet and per pod)
//!    from the upgrade until everything it started has ended; beyond the
//!    bound the request gets `429 Too Many Requests` naming the bound.
//! 2. A session ends when its command ends, its client goes away, the pod
//!    leaves the node or the kubelet shuts down.

mod attach;
mod exec;
mod netns;
mod portforward;
mod spdy;
mod ws;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::streams::channel::{PORT_FORWARD, V4, V5};
use crate::streams::upgrade::{self, Kind};

use super::logs::{Body, text};
use super::shared::{ExecTarget, Shared, lock};

/// Concurrent streaming sessions one kubelet serves.
pub(crate) const MAX_SESSIONS: usize = 64;
/// Concurrent streaming sessions into one pod.
pub(crate) const MAX_SESSIONS_PER_POD: usize = 16;
/// Live SPDY streams of one session (port-forward: two per connection, so
/// 128 forwarded connections at once).
pub(crate) const MAX_STREAMS: usize = 256;

/// Sessions open on the kubelet, and per pod.
type Counts = Arc<Mutex<(usize, HashMap<(String, String), usize>)>>;

/// Bounds on concurrent sessions (invariant 1).
#[derive(Debug, Default)]
pub(crate) struct StreamLimits {
    counts: Counts,
}

/// A session's slot; released when dropped.
#[derive(Debug)]
pub(crate) struct StreamSlot {
    counts: Counts,
    pod: (String, String),
}

impl StreamLimits {
    fn acquire(&self, ns: &str, pod: &str) -> Result<StreamSlot, String> {
        let mut c = lock(&self.counts);
        let key = (ns.to_string(), pod.to_string());
        if c.0 >= MAX_SESSIONS {
            return Err(format!(
                "the kubelet already serves {MAX_SESSIONS} exec, attach and port-forward sessions; close some and retry"
            ));
        }
        let n = c.1.get(&key).copied().unwrap_or(0);
        if n >= MAX_SESSIONS_PER_POD {
            return Err(format!(
                "pod {ns}/{pod} already has {MAX_SESSIONS_PER_POD} exec, attach and port-forward sessions; close some and retry"
            ));
        }
        c.0 += 1;
        c.1.insert(key.clone(), n + 1);
        Ok(StreamSlot {
            counts: self.counts.clone(),
            pod: key,
        })
    }

    /// Sessions open now (for tests and leak checks).
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        lock(&self.counts).0
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut c = lock(&self.counts);
        c.0 = c.0.saturating_sub(1);
        if let Some(n) = c.1.get_mut(&self.pod) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.1.remove(&self.pod);
            }
        }
    }
}

/// Whether `path` is one of the streaming endpoints.
pub(crate) fn is_streaming_path(path: &str) -> bool {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    matches!(first, "exec" | "attach" | "portForward")
}

/// The options of an exec or attach request.
#[derive(Debug, Clone, Default)]
pub(crate) struct ExecOptions {
    pub(crate) command: Vec<String>,
    pub(crate) stdin: bool,
    pub(crate) stdout: bool,
    pub(crate) stderr: bool,
    pub(crate) tty: bool,
}

fn truthy(v: &str) -> bool {
    matches!(v, "1" | "true" | "True" | "TRUE")
}

fn exec_options(query: &[(String, String)]) -> ExecOptions {
    let mut o = ExecOptions::default();
    for (k, v) in query {
        match k.as_str() {
            "command" => o.command.push(v.clone()),
            "input" | "stdin" => o.stdin = truthy(v),
            "output" | "stdout" => o.stdout = truthy(v),
            "error" | "stderr" => o.stderr = truthy(v),
            "tty" => o.tty = truthy(v),
            _ => {}
        }
    }
    if o.tty {
        // A terminal merges stderr into stdout, as in Kubernetes.
        o.stderr = false;
    }
    o
}

/// The running container `container` of pod `ns/pod` on this node, or
/// the message for the client.
fn target(
    shared: &Shared,
    ns: &str,
    pod: &str,
    container: Option<&str>,
) -> Result<ExecTarget, (StatusCode, String)> {
    let entry = lock(&shared.pods)
        .get(&(ns.to_string(), pod.to_string()))
        .cloned()
        .ok_or_else(|| {
            (
                StatusCode::NOT_FOUND,
                format!("pod {ns}/{pod} is not on this node"),
            )
        })?;
    let targets = lock(&entry.targets);
    match container {
        Some(c) => targets.get(c).cloned().ok_or_else(|| {
            (
                StatusCode::BAD_REQUEST,
                format!(
                    "container not found ({c:?}): no running container {c:?} in pod {ns}/{pod}"
                ),
            )
        }),
        None => targets.values().next().cloned().ok_or_else(|| {
            (
                StatusCode::BAD_REQUEST,
                format!("pod {ns}/{pod} has no running container to forward ports into"),
            )
        }),
    }
}

/// Serves one streaming request (already authenticated).
pub(crate) async fn handle(shared: Arc<Shared>, mut req: Request<Incoming>) -> Response<Body> {
    if req.method() != http::Method::GET && req.method() != http::Method::POST {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and POST are supported",
        );
    }
    let path = req.uri().path().to_string();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let query: Vec<(String, String)> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let (what, ns, pod, container) = match parts.as_slice() {
        [w @ ("exec" | "attach"), ns, pod, c] => (*w, *ns, *pod, Some(*c)),
        ["portForward", ns, pod] => ("portForward", *ns, *pod, None),
        _ => {
            return text(
                StatusCode::NOT_FOUND,
                "expected /exec/<namespace>/<pod>/<container>, /attach/<namespace>/<pod>/<container> or /portForward/<namespace>/<pod>",
            );
        }
    };
    let Some(kind) = upgrade::kind(req.headers()) else {
        return text(
            StatusCode::BAD_REQUEST,
            "this endpoint needs an upgrade to WebSocket or SPDY/3.1 (Connection: Upgrade)",
        );
    };
    let opts = exec_options(&query);
    if what != "portForward" {
        if what == "exec" && opts.command.is_empty() {
            return text(
                StatusCode::BAD_REQUEST,
                "you must specify at least one command for the container",
            );
        }
        if !opts.stdin && !opts.stdout && !opts.stderr {
            return text(
                StatusCode::BAD_REQUEST,
                "you must specify at least one of stdin, stdout, stderr",
            );
        }
    }
    let target = match target(&shared, ns, pod, container) {
        Ok(t) => t,
        Err((code, m)) => return text(code, m),
    };
    let supported: &[&str] = match (&kind, what) {
        (_, "portForward") => &[PORT_FORWARD],
        (Kind::WebSocket { .. }, _) => &[V5, V4],
        (Kind::Spdy { .. }, _) => &[V4],
    };
    let offered = match &kind {
        Kind::WebSocket { protocols, .. } | Kind::Spdy { protocols } => protocols,
    };
    let Some(protocol) = upgrade::choose(offered, supported) else {
        return text(
            StatusCode::FORBIDDEN,
            format!(
                "none of the offered protocols {offered:?} is supported; this kubelet speaks {supported:?}"
            ),
        );
    };
    if matches!(kind, Kind::WebSocket { .. }) && what == "portForward" {
        return text(
            StatusCode::BAD_REQUEST,
            "port-forward is served over SPDY/3.1 only",
        );
    }
    let slot = match shared.stream_limits.acquire(ns, pod) {
        Ok(s) => s,
        Err(m) => return text(StatusCode::TOO_MANY_REQUESTS, m),
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let session = Session {
        shared: shared.clone(),
        target,
        ns: ns.to_string(),
        pod: pod.to_string(),
        container: container.unwrap_or("").to_string(),
        opts,
        protocol: protocol.to_string(),
        _slot: slot,
    };
    let is_ws = matches!(kind, Kind::WebSocket { .. });
    let what = what.to_string();
    tokio::spawn(async move {
        let io = match on_upgrade.await {
            Ok(u) => hyper_util::rt::TokioIo::new(u),
            Err(e) => {
                tracing::debug!(error = %e, "streaming upgrade failed");
                return;
            }
        };
        match (what.as_str(), is_ws) {
            ("portForward", _) => portforward::serve(session, io).await,
            (_, true) => ws::serve(session, io, &what).await,
            (_, false) => spdy::serve(session, io, &what).await,
        }
    });
    use http_body_util::BodyExt as _;
    match upgrade::switching(&kind, protocol).body(http_body_util::Empty::<Bytes>::new().boxed()) {
        Ok(r) => r,
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Runs the command of an exec session, or attaches.
pub(crate) async fn run(
    session: &Session,
    what: &str,
    io: exec::ExecIo,
    gone: tokio_util::sync::CancellationToken,
) -> crate::streams::channel::ExecOutcome {
    if what == "attach" {
        attach::run(session, io, gone).await
    } else {
        exec::run(
            &session.shared,
            &session.target,
            &session.opts.command,
            session.opts.tty,
            io,
            gone,
        )
        .await
    }
}

/// One upgraded session and what it may reach.
pub(crate) struct Session {
    pub(crate) shared: Arc<Shared>,
    pub(crate) target: ExecTarget,
    pub(crate) ns: String,
    pub(crate) pod: String,
    pub(crate) container: String,
    pub(crate) opts: ExecOptions,
    pub(crate) protocol: String,
    _slot: StreamSlot,
}

impl Session {
    /// Cancelled when the kubelet stops or the pod's container is gone
    /// (invariant 2).
    pub(crate) fn ended(&self) -> tokio_util::sync::CancellationToken {
        let token = self.shared.shutdown.child_token();
        let shared = self.shared.clone();
        let key = (self.ns.clone(), self.pod.clone());
        let pid = self.target.pid;
        let t = token.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = t.cancelled() => return,
                    _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
                }
                let alive = lock(&shared.pods)
                    .get(&key)
                    .is_some_and(|e| lock(&e.targets).values().any(|x| x.pid == pid));
                if !alive {
                    t.cancel();
                    return;
                }
            }
        });
        token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_servers_and_kubectls_option_names_are_read() {
        let q = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let o = exec_options(&q(&[
            ("command", "sh"),
            ("command", "-c"),
            ("input", "1"),
            ("output", "1"),
            ("error", "1"),
        ]));
        assert_eq!(o.command, ["sh", "-c"]);
        assert!(o.stdin && o.stdout && o.stderr && !o.tty);
        let o = exec_options(&q(&[
            ("stdout", "true"),
            ("stderr", "true"),
            ("tty", "true"),
        ]));
        assert!(
            o.stdout && o.tty && !o.stderr,
            "a terminal has no separate stderr"
        );
    }

    #[test]
    fn sessions_are_bounded_per_pod_and_per_kubelet() {
        let l = StreamLimits::default();
        let per_pod: Vec<StreamSlot> = (0..MAX_SESSIONS_PER_POD)
            .map(|_| l.acquire("a", "p").unwrap())
            .collect();
        let e = l.acquire("a", "p").unwrap_err();
        assert!(e.contains("pod a/p already has"), "{e}");
        let mut others = Vec::new();
        for i in 0..(MAX_SESSIONS - MAX_SESSIONS_PER_POD) {
            others.push(
                l.acquire("a", &format!("q{}", i % 3))
                    .or_else(|_| l.acquire("b", &format!("r{i}")))
                    .unwrap(),
            );
        }
        let e = l.acquire("c", "new").unwrap_err();
        assert!(e.contains("the kubelet already serves"), "{e}");
        drop(per_pod);
        drop(others);
        assert_eq!(l.open(), 0);
        assert!(lock(&l.counts).1.is_empty());
    }
}
