//! The few rtnetlink operations the sandbox network needs (links, bridge,
//! veth pairs, addresses, routes), over a netlink socket of a chosen network
//! namespace.
//!
//! Invariants:
//! 1. A [`Netlink`] talks to the network namespace its socket was created
//!    in (a socket keeps its namespace): the host's for [`Netlink::host`],
//!    a pod's for [`Netlink::inside`].
//! 2. Its connection task ends when the `Netlink` is dropped, so no socket
//!    outlives the operations and keeps a pod's namespace alive.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, IntoRawFd as _, OwnedFd};

use futures::TryStreamExt as _;
use rtnetlink::packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkMessage};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute};
use rtnetlink::{LinkBridge, LinkMessageBuilder, LinkUnspec, RouteMessageBuilder};

use super::Ipv4Net;
use super::nsthread;

/// A route of the machine's routing tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Route {
    /// Destination.
    pub(crate) dest: Ipv4Net,
    /// Name of the output interface, when it has one.
    pub(crate) dev: Option<String>,
}

/// A netlink connection to one network namespace (invariant 1).
pub(crate) struct Netlink {
    handle: rtnetlink::Handle,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Netlink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn err(what: &str, e: rtnetlink::Error) -> std::io::Error {
    match e {
        rtnetlink::Error::NetlinkError(m) => {
            let io = m.to_io();
            std::io::Error::new(io.kind(), format!("{what}: {io}"))
        }
        other => std::io::Error::other(format!("{what}: {other}")),
    }
}

/// The errno of a netlink error, if it is one.
fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => Some(-m.raw_code()),
        _ => None,
    }
}

fn name_of(link: &LinkMessage) -> Option<&str> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.as_str()),
        _ => None,
    })
}

impl Netlink {
    /// A connection to the kubelet's own (the machine's) namespace.
    pub(crate) fn host() -> std::io::Result<Self> {
        let (conn, handle, _) = rtnetlink::new_connection()?;
        Ok(Self {
            handle,
            task: tokio::spawn(conn),
        })
    }

    /// A connection to the namespace `netns` (a `/proc/.../ns/net` file).
    pub(crate) async fn inside(netns: BorrowedFd<'_>) -> std::io::Result<Self> {
        let ns = netns.try_clone_to_owned()?;
        let socket: OwnedFd = nsthread::in_netns(ns, || {
            // SAFETY: socket(2) with constant arguments; the result is checked.
            let raw = unsafe {
                libc::socket(
                    libc::AF_NETLINK,
                    libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                    libc::NETLINK_ROUTE,
                )
            };
            if raw < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: `raw` is a new descriptor nobody else owns.
            Ok(unsafe { OwnedFd::from_raw_fd(raw) })
        })
        .await??;
        // SAFETY: the descriptor is a netlink socket we own; ownership moves.
        let socket = unsafe { rtnetlink::sys::TokioSocket::from_raw_fd(socket.into_raw_fd()) };
        let (conn, handle, _) = rtnetlink::from_socket(socket);
        Ok(Self {
            handle,
            task: tokio::spawn(conn),
        })
    }

    /// Every link, as (index, name).
    pub(crate) async fn links(&self) -> std::io::Result<Vec<(u32, String)>> {
        let mut out = Vec::new();
        let mut stream = self.handle.link().get().execute();
        while let Some(link) = stream.try_next().await.map_err(|e| err("list links", e))? {
            if let Some(name) = name_of(&link) {
                out.push((link.header.index, name.to_string()));
            }
        }
        Ok(out)
    }

    /// The index of link `name`, if it exists.
    pub(crate) async fn index(&self, name: &str) -> std::io::Result<Option<u32>> {
        let mut stream = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute();
        match stream.try_next().await {
            Ok(link) => Ok(link.map(|l| l.header.index)),
            Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(err(&format!("look up link {name}"), e)),
        }
    }

    /// Deletes link `name`; true when it existed.
    pub(crate) async fn delete(&self, name: &str) -> std::io::Result<bool> {
        let Some(index) = self.index(name).await? else {
            return Ok(false);
        };
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(true),
            Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(false),
            Err(e) => Err(err(&format!("delete link {name}"), e)),
        }
    }

    /// Creates bridge `name` with address `gateway/prefix`, up, with
    /// iptables off for its bridged traffic (a host firewall's FORWARD
    /// policy must not drop pod-to-pod frames); returns its index.
    pub(crate) async fn create_bridge(
        &self,
        name: &str,
        gateway: Ipv4Addr,
        prefix: u8,
    ) -> std::io::Result<u32> {
        let msg = LinkBridge::new(name).nf_call_iptables(false).up().build();
        self.handle
            .link()
            .add(msg)
            .execute()
            .await
            .map_err(|e| err(&format!("create bridge {name}"), e))?;
        let index = self
            .index(name)
            .await?
            .ok_or_else(|| std::io::Error::other(format!("bridge {name} vanished")))?;
        self.add_address(index, gateway, prefix).await?;
        Ok(index)
    }

    /// Creates a veth pair: `host` here, on `bridge` and up; its peer
    /// `peer` inside the namespace `netns`.
    pub(crate) async fn create_veth(
        &self,
        host: &str,
        bridge: u32,
        peer: &str,
        netns: BorrowedFd<'_>,
    ) -> std::io::Result<()> {
        let peer_msg = LinkUnspec::new_with_name(peer)
            .setns_by_fd(netns.as_fd().as_raw_fd())
            .build();
        let msg = LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Veth)
            .name(host.to_string())
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg)))
            .controller(bridge)
            .up()
            .build();
        self.handle
            .link()
            .add(msg)
            .execute()
            .await
            .map_err(|e| err(&format!("create veth {host}"), e))
    }

    /// Sets link `name` up; returns its index.
    pub(crate) async fn up(&self, name: &str) -> std::io::Result<u32> {
        let index = self
            .index(name)
            .await?
            .ok_or_else(|| std::io::Error::other(format!("no link {name}")))?;
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(|e| err(&format!("set {name} up"), e))?;
        Ok(index)
    }

    /// Adds `ip/prefix` to link `index`.
    pub(crate) async fn add_address(
        &self,
        index: u32,
        ip: Ipv4Addr,
        prefix: u8,
    ) -> std::io::Result<()> {
        self.handle
            .address()
            .add(index, IpAddr::V4(ip), prefix)
            .execute()
            .await
            .map_err(|e| err(&format!("add address {ip}/{prefix}"), e))
    }

    /// Adds a route to `dest` through `gateway` on link `index`.
    pub(crate) async fn add_route(
        &self,
        dest: Ipv4Net,
        gateway: Ipv4Addr,
        index: u32,
    ) -> std::io::Result<()> {
        let msg = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(dest.addr(), dest.prefix())
            .gateway(gateway)
            .output_interface(index)
            .build();
        self.handle
            .route()
            .add(msg)
            .execute()
            .await
            .map_err(|e| err(&format!("add route {dest} via {gateway}"), e))
    }

    /// Every IPv4 route of every table.
    pub(crate) async fn routes(&self) -> std::io::Result<Vec<Route>> {
        let names: std::collections::BTreeMap<u32, String> =
            self.links().await?.into_iter().collect();
        let mut out = Vec::new();
        let mut stream = self
            .handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute();
        while let Some(route) = stream.try_next().await.map_err(|e| err("list routes", e))? {
            let prefix = route.header.destination_prefix_length;
            let mut dest = Ipv4Addr::UNSPECIFIED;
            let mut dev = None;
            for a in &route.attributes {
                match a {
                    RouteAttribute::Destination(RouteAddress::Inet(ip)) => dest = *ip,
                    RouteAttribute::Oif(i) => dev = names.get(i).cloned(),
                    _ => {}
                }
            }
            if let Some(dest) = Ipv4Net::new(dest, prefix) {
                out.push(Route { dest, dev });
            }
        }
        Ok(out)
    }
}
