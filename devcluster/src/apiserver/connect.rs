//! Owns the connect subresources `pods/exec`, `pods/attach` and
//! `pods/portforward`: the request is checked (the pod, its container, its
//! node, the ports) and then carried to the kubelet of the pod's node, found
//! as for `pods/log` (`status.addresses` InternalIP,
//! `status.daemonEndpoints.kubeletEndpoint.Port`, the API server's bearer
//! token), at `/exec/<ns>/<pod>/<container>`, `/attach/...` or
//! `/portForward/<ns>/<pod>`.
//!
//! - WebSocket exec/attach (`v5`/`v4.channel.k8s.io`) and every SPDY
//!   upgrade are relayed: the kubelet speaks the same protocols, its `101`
//!   goes back to the client and the two connections are spliced.
//! - WebSocket port-forward (`SPDY/3.1+portforward.k8s.io`, kubectl 1.31+)
//!   is answered here; the server opens a SPDY upgrade to the kubelet and
//!   carries the SPDY bytes in WebSocket binary messages both ways, as the
//!   real API server's tunneling handler does.
//!
//! Invariants:
//! 1. RBAC was checked before (verb `create` on the subresource, also for
//!    the WebSocket GET: `auth::attrs`).
//! 2. A kubelet that refuses the upgrade is reported with its own message
//!    and a matching code (400, 404, 429), never as a silent close.
//! 3. Every spliced connection ends with either side or at shutdown.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use http::{HeaderValue, Method, Response, header};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::http::Ctx;
use super::response::Body;
use super::route::{self, Route};
use super::status::ApiError;
use super::store::Store;
use crate::streams::channel::{PORT_FORWARD, TUNNELED_PORT_FORWARD};
use crate::streams::upgrade::{self, Kind};

/// A connect request: pod and subresource.
#[derive(Debug, Clone)]
pub(crate) struct ConnectTarget {
    ns: String,
    name: String,
    sub: String,
}

/// The connect subresource `path` addresses, if it is one.
pub(crate) fn target(store: &Store, path: &str) -> Option<ConnectTarget> {
    let Ok(Route::Resource(t)) = route::route(path, &store.registry()) else {
        return None;
    };
    let sub = t.sub.as_deref()?;
    if !(t.info.builtin && t.info.group.is_empty() && t.info.plural == "pods") {
        return None;
    }
    if !matches!(sub, "exec" | "attach" | "portforward") {
        return None;
    }
    Some(ConnectTarget {
        ns: t.ns.clone()?,
        name: t.name.clone()?,
        sub: sub.to_string(),
    })
}

fn names(pod: &Value, field: &str) -> Vec<String> {
    pod.pointer(field)
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The container a request addresses, checked against the pod.
fn container(pod: &Value, name: &str, asked: Option<&str>) -> Result<String, ApiError> {
    let main = names(pod, "/spec/containers");
    let all: Vec<String> = main
        .iter()
        .cloned()
        .chain(names(pod, "/spec/initContainers"))
        .chain(names(pod, "/spec/ephemeralContainers"))
        .collect();
    match asked.filter(|c| !c.is_empty()) {
        Some(c) if all.iter().any(|x| x == c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        ))),
        None if main.len() == 1 => Ok(main[0].clone()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            main.join(" ")
        ))),
    }
}

/// `host:port` of the kubelet running `pod`.
fn kubelet(store: &Store, pod: &Value, name: &str) -> Result<String, ApiError> {
    let node = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request(format!("pod {name} does not have a host assigned")))?
        .to_string();
    super::logs::kubelet_endpoint(store, &node, name)
}

/// Query values of `key` (repeated keys, as kubectl sends `command`).
fn all<'a>(query: &'a [(String, String)], key: &str) -> impl Iterator<Item = &'a str> {
    query
        .iter()
        .filter(move |(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The kubelet path and query for `t`.
fn kubelet_uri(
    t: &ConnectTarget,
    pod: &Value,
    query: &[(String, String)],
) -> Result<String, ApiError> {
    if t.sub == "portforward" {
        for p in all(query, "ports").flat_map(|v| v.split(',')) {
            match p.trim().parse::<u16>() {
                Ok(n) if n > 0 => {}
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "invalid port {p:?} in ports: a port must be between 1 and 65535"
                    )));
                }
            }
        }
        return Ok(format!("/portForward/{}/{}", t.ns, t.name));
    }
    let c = container(pod, &t.name, all(query, "container").next())?;
    let flag = |k: &str| all(query, k).any(|v| matches!(v, "true" | "1" | "True"));
    let mut q = form_urlencoded::Serializer::new(String::new());
    if t.sub == "exec" {
        let command: Vec<&str> = all(query, "command").collect();
        if command.is_empty() {
            return Err(ApiError::bad_request(
                "you must specify at least one command for the container",
            ));
        }
        for c in command {
            q.append_pair("command", c);
        }
    }
    for (ours, theirs) in [
        ("stdin", "input"),
        ("stdout", "output"),
        ("stderr", "error"),
        ("tty", "tty"),
    ] {
        if flag(ours) {
            q.append_pair(theirs, "1");
        }
    }
    let sub = if t.sub == "exec" { "exec" } else { "attach" };
    Ok(format!("/{sub}/{}/{}/{c}?{}", t.ns, t.name, q.finish()))
}

/// Opens an upgraded connection to the kubelet: `headers` carry the
/// upgrade; returns the kubelet's `101` headers and the connection.
async fn dial(
    host: &str,
    token: &str,
    method: Method,
    uri: &str,
    headers: Vec<(header::HeaderName, HeaderValue)>,
) -> Result<(http::HeaderMap, Upgraded), ApiError> {
    let tcp = tokio::net::TcpStream::connect(host)
        .await
        .map_err(|e| ApiError::backend(format!("cannot reach the kubelet at {host}: {e}")))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| ApiError::backend(format!("kubelet handshake failed: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let mut b = http::Request::builder()
        .method(method)
        .uri(uri)
        .header(header::HOST, host)
        .header(header::AUTHORIZATION, format!("Bearer {token}"));
    for (k, v) in headers {
        b = b.header(k, v);
    }
    let request = b
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let mut resp = sender
        .send_request(request)
        .await
        .map_err(|e| ApiError::backend(format!("kubelet request failed: {e}")))?;
    let status = resp.status();
    if status != http::StatusCode::SWITCHING_PROTOCOLS {
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let msg = String::from_utf8_lossy(&bytes).trim().to_string();
        return Err(match status.as_u16() {
            400 | 404 => ApiError::bad_request(msg),
            403 => ApiError::forbidden(msg),
            429 => ApiError::too_many_requests(msg),
            _ => ApiError::backend(format!("the kubelet answered {status}: {msg}")),
        });
    }
    let head = resp.headers().clone();
    let up = hyper::upgrade::on(&mut resp)
        .await
        .map_err(|e| ApiError::backend(format!("the kubelet's upgrade failed: {e}")))?;
    Ok((head, up))
}

/// Serves one connect request (invariant 1: already authorized).
pub(crate) async fn serve(
    ctx: &Arc<Ctx>,
    t: &ConnectTarget,
    mut req: http::Request<Incoming>,
    query: &HashMap<String, String>,
) -> Result<Response<Body>, ApiError> {
    if req.method() != Method::GET && req.method() != Method::POST {
        return Err(ApiError::method_not_allowed());
    }
    // Repeated keys matter here (`command`): parse the query again.
    let _ = query;
    let pairs: Vec<(String, String)> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let pod = ctx
        .store
        .lock()
        .get("/pods", &t.ns, &t.name)
        .ok_or_else(|| ApiError::not_found("", "pods", &t.name))?;
    let uri = kubelet_uri(t, &pod, &pairs)?;
    let host = kubelet(&ctx.store, &pod, &t.name)?;
    let Some(kind) = upgrade::kind(req.headers()) else {
        return Err(ApiError::bad_request(format!(
            "Upgrade request required: pods/{} is served over WebSocket or SPDY/3.1",
            t.sub
        )));
    };
    let copy = |names: &[header::HeaderName]| -> Vec<(header::HeaderName, HeaderValue)> {
        names
            .iter()
            .flat_map(|n| {
                req.headers()
                    .get_all(n)
                    .iter()
                    .map(move |v| (n.clone(), v.clone()))
            })
            .collect()
    };
    let tunnel = match &kind {
        Kind::WebSocket { protocols, .. } if t.sub == "portforward" => {
            if !protocols.iter().any(|p| p == TUNNELED_PORT_FORWARD) {
                return Err(ApiError::bad_request(format!(
                    "port-forward over WebSocket needs the subprotocol {TUNNELED_PORT_FORWARD}"
                )));
            }
            true
        }
        _ => false,
    };
    let upgrade_headers = if tunnel {
        vec![
            (header::CONNECTION, HeaderValue::from_static("Upgrade")),
            (header::UPGRADE, HeaderValue::from_static(upgrade::SPDY)),
            (
                header::HeaderName::from_static("x-stream-protocol-version"),
                HeaderValue::from_static(PORT_FORWARD),
            ),
        ]
    } else {
        let mut h = vec![(header::CONNECTION, HeaderValue::from_static("Upgrade"))];
        h.extend(copy(&[
            header::UPGRADE,
            header::SEC_WEBSOCKET_KEY,
            header::SEC_WEBSOCKET_VERSION,
            header::SEC_WEBSOCKET_PROTOCOL,
            header::HeaderName::from_static("x-stream-protocol-version"),
        ]));
        h
    };
    // WebSocket handshakes are GETs; SPDY upgrades are POSTs (client-go's).
    let method = match (&kind, tunnel) {
        (Kind::WebSocket { .. }, false) => Method::GET,
        _ => Method::POST,
    };
    let (kubelet_head, kubelet_io) = dial(&host, &ctx.token, method, &uri, upgrade_headers).await?;
    let on_client = hyper::upgrade::on(&mut req);
    let shutdown = ctx.shutdown.clone();
    let mut resp = Response::new(
        http_body_util::Empty::<Bytes>::new()
            .map_err(|n| match n {})
            .boxed_unsync(),
    );
    if tunnel {
        let r = upgrade::switching(&kind, TUNNELED_PORT_FORWARD)
            .body(())
            .map_err(|e| ApiError::internal(e.to_string()))?;
        *resp.status_mut() = r.status();
        *resp.headers_mut() = r.headers().clone();
        tokio::spawn(async move {
            let Ok(client) = on_client.await else { return };
            let ws =
                WebSocketStream::from_raw_socket(TokioIo::new(client), Role::Server, None).await;
            tokio::select! {
                _ = carry(ws, TokioIo::new(kubelet_io)) => {}
                _ = shutdown.cancelled() => {}
            }
        });
    } else {
        *resp.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
        for name in [
            header::CONNECTION,
            header::UPGRADE,
            header::SEC_WEBSOCKET_ACCEPT,
            header::SEC_WEBSOCKET_PROTOCOL,
            header::HeaderName::from_static("x-stream-protocol-version"),
        ] {
            for v in kubelet_head.get_all(&name) {
                resp.headers_mut().append(name.clone(), v.clone());
            }
        }
        tokio::spawn(async move {
            let Ok(client) = on_client.await else { return };
            let (mut a, mut b) = (TokioIo::new(client), TokioIo::new(kubelet_io));
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                _ = shutdown.cancelled() => {}
            }
        });
    }
    Ok(resp)
}

/// Carries SPDY bytes between WebSocket binary messages and the kubelet's
/// connection until either side ends.
async fn carry(ws: WebSocketStream<TokioIo<Upgraded>>, kubelet: TokioIo<Upgraded>) {
    let (mut sink, mut source) = ws.split();
    let (mut rd, mut wr) = tokio::io::split(kubelet);
    let up = async {
        while let Some(Ok(m)) = source.next().await {
            match m {
                Message::Binary(b) if wr.write_all(&b).await.is_err() => break,
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = wr.shutdown().await;
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink
                        .send(Message::Binary(Bytes::copy_from_slice(&buf[..n])))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        let _ = sink.close().await;
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({"spec": {
            "containers": [{"name": "main"}, {"name": "side"}],
            "initContainers": [{"name": "init"}],
        }})
    }

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn target(sub: &str) -> ConnectTarget {
        ConnectTarget {
            ns: "default".into(),
            name: "p".into(),
            sub: sub.into(),
        }
    }

    #[test]
    fn containers_are_checked_as_kubernetes_does() {
        let p = pod();
        assert_eq!(container(&p, "p", Some("side")).unwrap(), "side");
        assert_eq!(container(&p, "p", Some("init")).unwrap(), "init");
        let e = container(&p, "p", Some("nope")).unwrap_err();
        assert_eq!(e.message, "container nope is not valid for pod p");
        let e = container(&p, "p", None).unwrap_err();
        assert!(
            e.message.contains("choose one of: [main side]"),
            "{}",
            e.message
        );
        let one = json!({"spec": {"containers": [{"name": "only"}]}});
        assert_eq!(container(&one, "p", None).unwrap(), "only");
    }

    #[test]
    fn the_kubelet_gets_its_own_option_names() {
        let uri = kubelet_uri(
            &target("exec"),
            &pod(),
            &q(&[
                ("container", "main"),
                ("command", "sh"),
                ("command", "-c"),
                ("command", "echo a&b"),
                ("stdin", "true"),
                ("stdout", "true"),
                ("tty", "true"),
            ]),
        )
        .unwrap();
        assert_eq!(
            uri,
            "/exec/default/p/main?command=sh&command=-c&command=echo+a%26b&input=1&output=1&tty=1"
        );
        let e = kubelet_uri(&target("exec"), &pod(), &q(&[("container", "main")])).unwrap_err();
        assert!(e.message.contains("at least one command"), "{}", e.message);
        assert_eq!(
            kubelet_uri(&target("portforward"), &pod(), &q(&[("ports", "80,8080")])).unwrap(),
            "/portForward/default/p"
        );
        for bad in ["0", "70000", "http"] {
            let e = kubelet_uri(&target("portforward"), &pod(), &q(&[("ports", bad)])).unwrap_err();
            assert!(e.message.contains("between 1 and 65535"), "{}", e.message);
        }
    }
}
