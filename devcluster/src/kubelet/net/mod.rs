//! The pod network: how the process kubelet gives pods their addresses.
//!
//! With [`PodNetwork::Sandbox`] (the default) every pod gets its own
//! network and UTS namespace, like a real pod sandbox: a veth pair to a
//! bridge the kubelet owns, an address from the node's /24 of the pod
//! range, a route for the pod range only, its own hostname, and the
//! `/etc/hosts`, `/etc/resolv.conf` and `/etc/hostname` a kubelet writes.
//! Pods reach the API server through the `kubernetes` Service's ClusterIP,
//! served inside each pod by a small proxy (`proxy`); a cluster DNS server
//! plugs in through [`ClusterDns`]. With [`PodNetwork::Host`] pods share the
//! machine's namespaces on loopback addresses (the old behaviour).
//!
//! Module map: `cidr` (prefixes), `range` (which pod range: given and
//! checked, or a free one picked), `bridge` (the node's /24 and bridge),
//! `sandbox` (one pod's namespaces, veth, listeners), `netlink`, `nsthread`
//! (work inside a namespace), `files`, `proxy`, `dns` (the DNS seam).

mod bridge;
mod cidr;
mod dns;
pub(crate) mod files;
mod netlink;
mod nsthread;
mod proxy;
mod range;
mod sandbox;

use std::net::Ipv4Addr;

pub(crate) use bridge::{NodeNetwork, delete_unclaimed};
pub use cidr::Ipv4Net;
pub use dns::{ClusterDns, DnsPod, DnsSockets};
pub(crate) use nsthread::PodNamespaces;
pub use range::{PodRange, RangeOrigin, RangeOverlap};
pub use sandbox::veth_name;
pub(crate) use sandbox::{ApiService, Sandbox, SandboxSpec};

/// Prefix of the kubelet's bridges (`hmbr10.244.3`).
pub const BRIDGE_PREFIX: &str = "hmbr";
/// Prefix of the host ends of pod veth pairs (`hmv0af40302`).
pub const VETH_PREFIX: &str = "hmv";
/// The cluster DNS address pods' `resolv.conf` names (as `--cluster-dns`).
pub const CLUSTER_DNS_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// The cluster domain.
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// The pod range of sandboxed pods when nothing on the machine is in its
/// way (the first candidate of `range`; an example in messages).
pub(crate) const DEFAULT_POD_RANGE: &str = "10.244.0.0/16";
/// The default pod range with `--pod-network=host`.
pub(crate) const DEFAULT_HOST_POD_RANGE: &str = "127.0.0.0/16";

/// How pods are networked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PodNetwork {
    /// Each pod in its own network and UTS namespace on the kubelet's
    /// bridge (needs root: CAP_NET_ADMIN and CAP_SYS_ADMIN).
    #[default]
    Sandbox,
    /// Pods share the machine's network namespace and hostname, each on a
    /// loopback address of the pod range.
    Host,
}
