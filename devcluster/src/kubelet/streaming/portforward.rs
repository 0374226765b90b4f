//! port-forward over SPDY/3.1 (`portforward.k8s.io`): for every forwarded
//! connection the client opens an `error` and a `data` stream with the same
//! `requestid` and `port`; the kubelet connects to `localhost:<port>`
//! inside the pod's network namespace (a socket made on a thread that
//! entered it), or to the pod IP when the pod shares the node's network
//! namespace, and copies both ways.
//!
//! Invariants:
//! 1. A connection that cannot be made is reported on its error stream in
//!    the kubelet's words (`error forwarding port P to pod ...: failed to
//!    connect to localhost:P inside namespace ...`), and both streams end.
//! 2. When one direction ends, the other gets one second to finish (as
//!    containerd does); then both streams end and the socket is closed.
//! 3. Every connection task ends with the session.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::streams::spdy::frame::header;
use crate::streams::spdy::session::{self, Stream};

use super::super::shared::ExecTarget;
use super::{MAX_STREAMS, Session, netns};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one port-forward session on an upgraded connection.
pub(super) async fn serve(session: Session, io: TokioIo<Upgraded>) {
    let gone = session.ended();
    let (mut incoming, task) = session::serve(io, MAX_STREAMS, gone.clone());
    let mut pending: HashMap<String, (Option<Stream>, Option<Stream>)> = HashMap::new();
    let mut conns = tokio::task::JoinSet::new();
    let pod = format!("{}/{}", session.ns, session.pod);
    loop {
        let s = tokio::select! {
            s = incoming.recv() => s,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let Some(s) = s else { break };
        let id = header(&s.headers, "requestid")
            .map(str::to_string)
            .unwrap_or_else(|| s.id.to_string());
        let slot = pending.entry(id.clone()).or_default();
        match header(&s.headers, "streamtype") {
            Some("error") => slot.0 = Some(s),
            Some("data") => slot.1 = Some(s),
            other => {
                tracing::debug!(?other, "port-forward stream of unknown type");
                let _ = s.writer.reset().await;
                continue;
            }
        }
        let complete = matches!(pending.get(&id), Some((Some(_), Some(_))));
        if complete && let Some((Some(error), Some(data))) = pending.remove(&id) {
            conns.spawn(forward(session.target.clone(), pod.clone(), error, data));
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
    drop((pending, incoming));
    let _ = task.await;
    gone.cancel();
}

/// Connects to `port` where the pod listens: `localhost` inside its
/// network namespace, else its IP.
async fn dial(target: &ExecTarget, port: u16) -> Result<TcpStream, String> {
    let namespaces = netns::to_enter(target.pid).map_err(|e| {
        format!(
            "cannot read the network namespace of the pod's process {}: {e}",
            target.pid
        )
    })?;
    if !namespaces
        .iter()
        .any(|(_, flag)| *flag == libc::CLONE_NEWNET)
    {
        let addr = SocketAddr::from((target.pod_ip, port));
        return match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(format!(
                "failed to connect to {addr} (the pod's IP: the pod shares the node's network namespace): {e}"
            )),
            Err(_) => Err(format!("failed to connect to {addr}: timed out")),
        };
    }
    let ns = netns::describe(target.pid);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let net: Vec<_> = namespaces
        .into_iter()
        .filter(|(_, flag)| *flag == libc::CLONE_NEWNET)
        .collect();
    std::thread::Builder::new()
        .name("portforward-netns".into())
        .spawn(move || {
            let r = netns::enter(&net).map_err(|e| format!("cannot enter {ns}: {e}")).and_then(|()| {
                let v4 = std::net::TcpStream::connect_timeout(&SocketAddr::from((Ipv4Addr::LOCALHOST, port)), CONNECT_TIMEOUT);
                match v4 {
                    Ok(s) => Ok(s),
                    Err(e4) => std::net::TcpStream::connect_timeout(&SocketAddr::from((Ipv6Addr::LOCALHOST, port)), CONNECT_TIMEOUT)
                        .map_err(|e6| format!(
                            "failed to connect to localhost:{port} inside namespace {ns:?}, IPv4: dial tcp4 127.0.0.1:{port}: {e4} IPv6 dial tcp6 [::1]:{port}: {e6} "
                        )),
                }
            });
            let _ = tx.send(r);
        })
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    let std_stream = rx
        .await
        .map_err(|_| "the connecting thread ended early".to_string())??;
    std_stream
        .set_nonblocking(true)
        .map_err(|e| e.to_string())?;
    TcpStream::from_std(std_stream).map_err(|e| e.to_string())
}

async fn forward(target: ExecTarget, pod: String, error: Stream, data: Stream) {
    let port_text = header(&data.headers, "port").unwrap_or("").to_string();
    let port = match port_text.parse::<u16>() {
        Ok(p) if p > 0 => p,
        _ => {
            let msg = format!("invalid port {port_text:?}: a port must be between 1 and 65535");
            let _ = error.writer.write(Bytes::from(msg)).await;
            let _ = error.writer.finish().await;
            let _ = data.writer.finish().await;
            return;
        }
    };
    let tcp = match dial(&target, port).await {
        Ok(t) => t,
        Err(e) => {
            let msg = format!("error forwarding port {port} to pod {pod}: {e}");
            tracing::debug!(%msg, "port-forward");
            let _ = error.writer.write(Bytes::from(msg)).await;
            let _ = error.writer.finish().await;
            let _ = data.writer.finish().await;
            return;
        }
    };
    let Stream {
        mut inbox, writer, ..
    } = data;
    let (mut rd, mut wr) = tcp.into_split();
    let up = async move {
        while let Some(d) = inbox.recv().await {
            if wr.write_all(&d).await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    };
    let w = &writer;
    let down = async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if w.write(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    tokio::pin!(up, down);
    // Invariant 2.
    tokio::select! {
        _ = &mut up => { let _ = tokio::time::timeout(Duration::from_secs(1), &mut down).await; }
        _ = &mut down => { let _ = tokio::time::timeout(Duration::from_secs(1), &mut up).await; }
    }
    let _ = writer.finish().await;
    let _ = error.writer.finish().await;
}
