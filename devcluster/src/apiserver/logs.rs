//! Owns `pods/log`: the request is proxied to the kubelet of the pod's
//! node, as the real API server does. The node publishes where its kubelet
//! serves in `status.addresses` (`InternalIP`) and
//! `status.daemonEndpoints.kubeletEndpoint.Port`; the API server calls
//! `GET http://<ip>:<port>/containerLogs/<ns>/<pod>/<container>` with the
//! query (`follow`, `tailLines`, `sinceSeconds`, `timestamps`,
//! `limitBytes`, `previous`) and `Authorization: Bearer <api server token>`
//! (docs/architecture.md, "Process kubelet").

use bytes::Bytes;
use http::Response;
use http_body_util::BodyExt as _;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::request::Request;
use super::response::{Body, stream_response};
use super::route::RouteTarget;
use super::status::ApiError;
use super::store::Store;

const FORWARDED: &[&str] = &[
    "follow",
    "tailLines",
    "sinceSeconds",
    "sinceTime",
    "timestamps",
    "limitBytes",
    "previous",
];

/// Proxies a log request to the kubelet.
/// `token` is the API server's bearer token, which the kubelet accepts;
/// the stream ends at `shutdown`.
pub(crate) async fn proxy(
    store: &Store,
    token: &str,
    shutdown: CancellationToken,
    t: &RouteTarget,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let name = t.name.clone().unwrap_or_default();
    let ns = t.ns.clone().unwrap_or_default();
    let pod = store
        .lock()
        .get(&t.info.key(), &ns, &name)
        .ok_or_else(|| ApiError::not_found("", "pods", &name))?;
    let names = |list: &str| -> Vec<String> {
        pod.pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let containers = names("containers");
    let init = names("initContainers");
    let ephemeral = names("ephemeralContainers");
    let container = match req.q("container") {
        Some(c) if !c.is_empty() => {
            if !containers
                .iter()
                .chain(init.iter())
                .chain(ephemeral.iter())
                .any(|x| x == c)
            {
                return Err(ApiError::bad_request(format!(
                    "container {c} is not valid for pod {name}: choose one of: [{}]",
                    containers.join(" ")
                )));
            }
            c.to_string()
        }
        _ if containers.len() == 1 => containers[0].clone(),
        _ => {
            return Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            )));
        }
    };
    let node = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if node.is_empty() {
        return Err(ApiError::bad_request(format!(
            "pod {name} is not scheduled to a node yet: no logs to show"
        )));
    }
    let host = kubelet_endpoint(store, &node, &name)?;
    let query: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(
            req.query
                .iter()
                .filter(|(k, _)| FORWARDED.contains(&k.as_str())),
        )
        .finish();
    let uri = format!("/containerLogs/{ns}/{name}/{container}?{query}");
    let tcp = tokio::net::TcpStream::connect(&host).await.map_err(|e| {
        ApiError::backend(format!(
            "cannot reach the kubelet of node {node} at {host}: {e}"
        ))
    })?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .map_err(|e| ApiError::backend(format!("kubelet handshake failed: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let request = http::Request::get(uri)
        .header(http::header::HOST, host.as_str())
        .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let resp = sender
        .send_request(request)
        .await
        .map_err(|e| ApiError::backend(format!("kubelet request failed: {e}")))?;
    let status = resp.status();
    let mut body = resp.into_body();
    if !status.is_success() {
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let msg = String::from_utf8_lossy(&bytes).trim().to_string();
        let mut e = ApiError::backend(format!("the kubelet answered {status}: {msg}"));
        if status.as_u16() == 404 || status.as_u16() == 400 {
            e = ApiError::bad_request(msg);
        }
        return Err(e);
    }
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        loop {
            let frame = tokio::select! {
                f = body.frame() => f,
                _ = shutdown.cancelled() => return,
                _ = tx.closed() => return,
            };
            match frame {
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data()
                        && tx.send(data).await.is_err()
                    {
                        return;
                    }
                }
                _ => return,
            }
        }
    });
    Ok(stream_response(rx, "text/plain"))
}

/// `host:port` of the kubelet of `node` (which runs pod `pod`): the Node's
/// `InternalIP` and `status.daemonEndpoints.kubeletEndpoint.Port`, as
/// kube-apiserver reaches kubelets for logs, exec and port-forward.
pub(crate) fn kubelet_endpoint(store: &Store, node: &str, pod: &str) -> Result<String, ApiError> {
    let node_obj = store
        .lock()
        .get("/nodes", "", node)
        .ok_or_else(|| ApiError::backend(format!("node {node} of pod {pod} is not registered")))?;
    let ip = node_obj
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|x| x["type"] == "InternalIP"))
        .and_then(|x| x["address"].as_str())
        .ok_or_else(|| {
            ApiError::backend(format!(
                "node {node} publishes no InternalIP in status.addresses"
            ))
        })?
        .to_string();
    let port = node_obj
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .filter(|p| *p > 0 && *p <= 65535)
        .ok_or_else(|| {
            ApiError::backend(format!(
                "node {node} publishes no status.daemonEndpoints.kubeletEndpoint.Port"
            ))
        })?;
    Ok(if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    })
}
