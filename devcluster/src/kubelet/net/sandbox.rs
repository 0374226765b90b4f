//! One pod's sandbox: its network and UTS namespaces, the veth pair that
//! joins it to the node's bridge, its address and routes, and the
//! listeners the kubelet serves inside it (the `kubernetes` Service proxy,
//! the cluster DNS sockets).
//!
//! Invariants:
//! 1. Inside the pod: `lo` up, `eth0` with the pod's address on the node's
//!    /24, and one route, the whole pod range through the gateway. No
//!    default route: nothing leaves the machine.
//! 2. The host end of the veth is named after the pod's address
//!    (`hmv<hex>`), so a name is never in use by two live pods.
//! 3. `teardown` stops every task serving inside the pod, deletes the veth
//!    pair and drops the namespace descriptors; when the kubelet dies
//!    instead, closing its descriptors frees the same things.
//! 4. A sandbox that fails half-way is torn down before the error returns.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd as _;
use std::sync::Arc;

use tokio::task::JoinSet;

use super::bridge::NodeNetwork;
use super::dns::{ClusterDns, DnsPod, DnsSockets, bind_dns_sockets};
use super::netlink::Netlink;
use super::nsthread::{PodNamespaces, in_netns, new_pod_namespaces};
use super::{CLUSTER_DNS_IP, VETH_PREFIX, proxy};

/// The `kubernetes` Service as pods reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiService {
    /// Its ClusterIP.
    pub(crate) cluster_ip: Ipv4Addr,
    /// Its port (443).
    pub(crate) port: u16,
    /// Where the kubelet forwards it to: the API server address it uses.
    pub(crate) upstream: String,
}

/// What a pod's sandbox is made with.
pub(crate) struct SandboxSpec<'a> {
    /// The pod's namespace and name.
    pub(crate) pod: DnsPod,
    /// The pod's address on the node's /24.
    pub(crate) ip: Ipv4Addr,
    /// The pod's hostname.
    pub(crate) hostname: &'a str,
    /// The `kubernetes` Service to serve inside, if known.
    pub(crate) api: Option<&'a ApiService>,
    /// The cluster DNS server to hand sockets to, if any.
    pub(crate) dns: Option<&'a Arc<dyn ClusterDns>>,
}

/// A live pod sandbox.
#[derive(Debug)]
pub(crate) struct Sandbox {
    /// The namespaces containers join.
    pub(crate) ns: Arc<PodNamespaces>,
    host_veth: String,
    tasks: JoinSet<()>,
}

/// The host end's name of the veth of a pod at `ip` (invariant 2).
pub fn veth_name(ip: Ipv4Addr) -> String {
    format!("{VETH_PREFIX}{:08x}", u32::from(ip))
}

fn fail(what: &str, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl Sandbox {
    /// Makes the sandbox of one pod on `node` (invariant 4).
    pub(crate) async fn create(
        node: &NodeNetwork,
        spec: SandboxSpec<'_>,
    ) -> std::io::Result<Sandbox> {
        let ns = new_pod_namespaces(spec.hostname)
            .await
            .map_err(|e| fail("cannot create the pod's network and UTS namespaces", e))?;
        let mut sandbox = Sandbox {
            ns: Arc::new(ns),
            host_veth: veth_name(spec.ip),
            tasks: JoinSet::new(),
        };
        match sandbox.wire(node, &spec).await {
            Ok(()) => Ok(sandbox),
            Err(e) => {
                sandbox.teardown().await;
                Err(e)
            }
        }
    }

    async fn wire(&mut self, node: &NodeNetwork, spec: &SandboxSpec<'_>) -> std::io::Result<()> {
        let host = Netlink::host()?;
        // A veth of this name can only be left by a pod whose teardown failed.
        host.delete(&self.host_veth).await?;
        host.create_veth(
            &self.host_veth,
            node.bridge_index,
            "eth0",
            self.ns.net.as_fd(),
        )
        .await?;
        drop(host);
        let inside = Netlink::inside(self.ns.net.as_fd()).await?;
        let lo = inside.up("lo").await?;
        let eth0 = inside.up("eth0").await?;
        inside
            .add_address(eth0, spec.ip, node.subnet.prefix())
            .await?;
        if node.range.prefix() < node.subnet.prefix() {
            inside.add_route(node.range, node.gateway, eth0).await?;
        }
        if let Some(api) = spec.api {
            inside.add_address(lo, api.cluster_ip, 32).await?;
        }
        if spec.dns.is_some() {
            inside.add_address(lo, CLUSTER_DNS_IP, 32).await?;
        }
        drop(inside);
        if let Some(api) = spec.api {
            let addr = SocketAddr::from((api.cluster_ip, api.port));
            let listener = in_netns(self.ns.net.try_clone()?, move || {
                let l = std::net::TcpListener::bind(addr)?;
                l.set_nonblocking(true)?;
                Ok::<_, std::io::Error>(l)
            })
            .await?
            .map_err(|e| fail(&format!("cannot listen on {addr} in the pod"), e))?;
            let listener = tokio::net::TcpListener::from_std(listener)?;
            self.tasks
                .spawn(proxy::serve(listener, api.upstream.clone()));
        }
        if let Some(dns) = spec.dns {
            let (udp, tcp) = bind_dns_sockets(self.ns.net.as_fd(), CLUSTER_DNS_IP)
                .await
                .map_err(|e| fail("cannot bind the cluster DNS sockets in the pod", e))?;
            self.tasks.spawn(dns.serve(DnsSockets {
                pod: spec.pod.clone(),
                udp,
                tcp,
            }));
        }
        Ok(())
    }

    /// Removes everything (invariant 3).
    pub(crate) async fn teardown(mut self) {
        self.tasks.shutdown().await;
        match Netlink::host() {
            Ok(host) => {
                if let Err(e) = host.delete(&self.host_veth).await {
                    tracing::warn!(veth = %self.host_veth, error = %e, "cannot delete the pod's veth; it goes with the namespace");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot open netlink to delete a pod's veth"),
        }
    }
}
