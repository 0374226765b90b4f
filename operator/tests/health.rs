//! The health/metrics endpoint over real loopback sockets: status codes and
//! bodies of `/healthz`, `/readyz` and `/metrics`, readiness following the
//! leader-election role, and graceful shutdown (health.rs invariants 1-4).

use std::sync::Arc;
use std::time::Duration;

use hostmesh_operator::health::{self, HealthState};
use hostmesh_operator::leader::Role;
use hostmesh_operator::metrics::Metrics;
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};

const LIMIT: Duration = Duration::from_secs(20);

struct Server {
    addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

async fn start(state: Arc<HealthState>) -> Server {
    let listener = health::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(health::serve(listener, state, async {
        let _ = rx.await;
    }));
    Server {
        addr,
        stop: Some(tx),
        task,
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect(addr: std::net::SocketAddr) -> (Sender, tokio::task::JoinHandle<()>) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, task)
}

async fn request(sender: &mut Sender, method: &str, path: &str) -> (u16, String, String) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = tokio::time::timeout(LIMIT, sender.send_request(req))
        .await
        .expect("response in time")
        .expect("response");
    let code = resp.status().as_u16();
    let ctype = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (
        code,
        ctype,
        String::from_utf8(body.to_vec()).expect("utf-8"),
    )
}

async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String, String) {
    let (mut s, _t) = connect(addr).await;
    request(&mut s, "GET", path).await
}

#[tokio::test]
async fn healthz_metrics_and_readyz_without_leader_election() {
    let metrics = Arc::new(Metrics::new());
    let state = Arc::new(HealthState::new(metrics.clone(), None));
    let server = start(state.clone()).await;

    let (code, _, body) = get(server.addr, "/healthz").await;
    assert_eq!((code, body.as_str()), (200, "ok\n"));

    let (code, _, body) = get(server.addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("[-]controllers not started"), "{body}");

    state.set_controllers_started(true);
    let (code, _, body) = get(server.addr, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("[+]controllers started"), "{body}");
    assert!(!body.contains("leader-election"), "{body}");

    drop(metrics.reconcile("world"));
    let (code, ctype, body) = get(server.addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    assert!(
        body.contains("hostmesh_reconciles_total{controller=\"world\"} 1"),
        "{body}"
    );
    assert!(body.ends_with("# EOF\n"));
}

#[tokio::test]
async fn readyz_follows_the_leader_election_role() {
    let (role_tx, role_rx) = watch::channel(Role::Starting);
    let state = Arc::new(HealthState::new(Arc::new(Metrics::new()), Some(role_rx)));
    state.set_controllers_started(true);
    let server = start(state).await;

    let (code, _, body) = get(server.addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("[-]leader-election lease not read yet"),
        "{body}"
    );

    role_tx
        .send(Role::Standby {
            holder: Some("replica-b".into()),
        })
        .expect("send");
    let (code, _, body) = get(server.addr, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("standby, leader is replica-b"), "{body}");

    role_tx.send(Role::Leader).expect("send");
    let (code, _, body) = get(server.addr, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("[+]leader-election leader"), "{body}");
}

#[tokio::test]
async fn unknown_paths_and_methods_are_refused() {
    let state = Arc::new(HealthState::new(Arc::new(Metrics::new()), None));
    let server = start(state).await;
    let (mut s, _t) = connect(server.addr).await;
    let (code, _, body) = request(&mut s, "GET", "/secrets").await;
    assert_eq!(code, 404);
    assert!(body.contains("/metrics"), "{body}");
    let (code, _, _) = request(&mut s, "POST", "/metrics").await;
    assert_eq!(code, 405);
    let (code, _, body) = request(&mut s, "HEAD", "/healthz").await;
    assert_eq!((code, body.as_str()), (200, ""));
}

#[tokio::test]
async fn shutdown_closes_idle_keepalive_connections_and_stops_accepting() {
    let state = Arc::new(HealthState::new(Arc::new(Metrics::new()), None));
    let mut server = start(state).await;
    // An idle keep-alive connection that has served one request.
    let (mut idle, idle_task) = connect(server.addr).await;
    let (code, _, _) = request(&mut idle, "GET", "/healthz").await;
    assert_eq!(code, 200);

    server
        .stop
        .take()
        .expect("once")
        .send(())
        .expect("server alive");
    tokio::time::timeout(health::SHUTDOWN_GRACE + LIMIT, &mut server.task)
        .await
        .expect("serve returns after shutdown")
        .expect("serve task");
    // The idle connection was closed by the server.
    tokio::time::timeout(LIMIT, idle_task)
        .await
        .expect("client connection closed")
        .expect("client task");
    // The listener is gone.
    assert!(TcpStream::connect(server.addr).await.is_err());
}
