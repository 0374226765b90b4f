//! The seam between the kubelet and a cluster DNS server: the kubelet binds
//! UDP and TCP port 53 on the cluster DNS address inside each pod's network
//! namespace and hands the sockets to a [`ClusterDns`]; the server answers
//! on them for as long as the pod lives.
//!
//! Invariants:
//! 1. The sockets are bound inside the pod's namespace, on
//!    [`CLUSTER_DNS_IP`](super::CLUSTER_DNS_IP) (added to the pod's `lo`),
//!    so every pod has its own resolver at the address its `resolv.conf`
//!    names, reachable without any route out of the pod.
//! 2. The future [`ClusterDns::serve`] returns is owned by the pod's
//!    sandbox and dropped when the pod goes, closing the sockets.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::BorrowedFd;

use futures::future::BoxFuture;

use super::nsthread;

/// The pod a [`DnsSockets`] serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsPod {
    /// The pod's namespace (its default search domain).
    pub namespace: String,
    /// The pod's name.
    pub name: String,
}

/// UDP and TCP sockets bound to `<cluster DNS IP>:53` inside one pod.
#[derive(Debug)]
pub struct DnsSockets {
    /// Which pod they serve.
    pub pod: DnsPod,
    /// The UDP socket.
    pub udp: tokio::net::UdpSocket,
    /// The TCP listener.
    pub tcp: tokio::net::TcpListener,
}

/// A cluster DNS server the kubelet gives each pod's sockets to.
pub trait ClusterDns: Send + Sync + 'static {
    /// Serves DNS on `sockets` until the returned future is dropped (the
    /// kubelet drops it when the pod goes; invariant 2).
    fn serve(&self, sockets: DnsSockets) -> BoxFuture<'static, ()>;
}

/// Binds UDP and TCP `ip:53` inside the network namespace `netns`.
pub(crate) async fn bind_dns_sockets(
    netns: BorrowedFd<'_>,
    ip: Ipv4Addr,
) -> std::io::Result<(tokio::net::UdpSocket, tokio::net::TcpListener)> {
    let addr = SocketAddr::from((ip, 53));
    let (udp, tcp) = nsthread::in_netns(netns.try_clone_to_owned()?, move || {
        let udp = std::net::UdpSocket::bind(addr)?;
        udp.set_nonblocking(true)?;
        let tcp = std::net::TcpListener::bind(addr)?;
        tcp.set_nonblocking(true)?;
        Ok::<_, std::io::Error>((udp, tcp))
    })
    .await??;
    Ok((
        tokio::net::UdpSocket::from_std(udp)?,
        tokio::net::TcpListener::from_std(tcp)?,
    ))
}

/// The embedded cluster DNS server serves every pod's sockets; its
/// [`Serving`](crate::dns::Serving) lives as long as the future the kubelet
/// holds for the pod.
impl ClusterDns for crate::dns::ClusterDns {
    fn serve(&self, sockets: DnsSockets) -> BoxFuture<'static, ()> {
        let serving = crate::dns::ClusterDns::serve(self, sockets.udp, sockets.tcp);
        Box::pin(async move {
            let _serving = serving;
            std::future::pending::<()>().await
        })
    }
}
