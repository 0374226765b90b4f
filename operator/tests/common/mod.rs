//! Helpers shared by the operator's integration tests: a raw HTTP GET over
//! loopback, and an embedded API server with the CRDs installed.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;
use std::time::Duration;

use hostmesh_devcluster::apiserver::{ApiServer, ApiServerConfig, ApiServerHandle};
use hostmesh_operator::manifest;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, ToSocketAddrs};

/// How long a single response may take.
const HTTP_WAIT: Duration = Duration::from_secs(60);

/// GET over a fresh loopback connection; `(status code, body)`, or `None`
/// when nothing (complete) answers.
pub(crate) async fn get(addr: impl ToSocketAddrs, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(HTTP_WAIT, s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, text.split_once("\r\n\r\n")?.1.to_owned()))
}

/// An embedded API server writing its kubeconfig to `kubeconfig`, with the
/// hostmesh CRDs applied.
pub(crate) async fn server_with_crds(kubeconfig: &Path) -> ApiServerHandle {
    let server = ApiServer::start(ApiServerConfig {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        ..ApiServerConfig::default()
    })
    .await
    .expect("embedded API server starts");
    let client = server.client().expect("client");
    let crds = manifest::parse("crds", &hostmesh_crds::crd_yaml().expect("crds")).expect("parse");
    manifest::apply_all(&client, &crds, "default", "test")
        .await
        .expect("install CRDs");
    server
}
