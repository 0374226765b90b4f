//! The `kubernetes` Service inside a pod: a TCP listener on the Service's
//! ClusterIP and port in the pod's network namespace that forwards every
//! connection to the API server address the kubelet itself uses (what
//! kube-proxy's userspace mode did).
//!
//! Invariants:
//! 1. At most [`MAX_CONNECTIONS`] connections are forwarded at once per
//!    pod; further ones wait in the listen backlog.
//! 2. Every forwarded connection belongs to the proxy's task: dropping or
//!    aborting it closes the listener and every connection (no socket keeps
//!    the pod's namespace alive after the pod).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// Most connections forwarded at once for one pod (invariant 1).
pub(crate) const MAX_CONNECTIONS: usize = 256;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Forwards connections accepted on `listener` to `upstream` (`host:port`)
/// until dropped.
pub(crate) async fn serve(listener: TcpListener, upstream: String) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut conns = JoinSet::new();
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        tokio::select! {
            accepted = listener.accept() => {
                let mut inbound = match accepted {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "API server proxy: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let upstream = upstream.clone();
                conns.spawn(async move {
                    let _permit = permit;
                    let connect = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&upstream)).await;
                    let mut outbound = match connect {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%upstream, error = %e, "API server proxy: cannot connect");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%upstream, "API server proxy: connect timed out");
                            return;
                        }
                    };
                    let _ = outbound.set_nodelay(true);
                    let _ = inbound.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}
