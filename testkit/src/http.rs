//! A raw HTTP/1.1 GET over loopback, for endpoints that must answer plain
//! HTTP (health, metrics), and a free loopback port ([`free_port`]) for a
//! server the test starts.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, ToSocketAddrs};

/// How long a single response may take.
const HTTP_WAIT: Duration = Duration::from_secs(60);

/// A TCP port on 127.0.0.1 that was free a moment ago (bound, then
/// released), for a server or forward the test starts next.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

/// GET over a fresh connection; `(status code, body)`, or `None` when
/// nothing (complete) answers.
pub async fn get(addr: impl ToSocketAddrs, path: &str) -> Option<(u16, String)> {
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
