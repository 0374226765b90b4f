//! A raw HTTP/1.1 GET over loopback, for endpoints that must answer plain
//! HTTP (health, metrics).

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, ToSocketAddrs};

/// How long a single response may take.
const HTTP_WAIT: Duration = Duration::from_secs(60);

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
