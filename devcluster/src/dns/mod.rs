//! Cluster DNS for the embedded cluster: an authoritative server for the
//! cluster zone (`cluster.local`), fed from the API server, serving the
//! records of the Kubernetes DNS specification (see `records.rs` for the
//! list) on sockets it is handed. Built on hickory (`hickory-server`).
//!
//! ```no_run
//! # async fn f(client: kube::Client) -> Result<(), hostmesh_devcluster::dns::DnsError> {
//! use hostmesh_devcluster::dns::{ClusterDns, DnsConfig};
//! let dns = ClusterDns::start(&client, DnsConfig::default())?;
//! dns.ready().await;
//! let (serving, addr) = dns.bind("127.0.0.1:0".parse().unwrap()).await?;
//! // ... resolve names at `addr` (UDP and TCP) ...
//! drop(serving); // stops answering on those sockets
//! # Ok(()) }
//! ```
//!
//! One [`ClusterDns`] holds the caches; [`ClusterDns::serve`] answers on a
//! UDP socket and a TCP listener (the kubelet hands it one pair bound to
//! the DNS address inside each pod's network namespace) until the returned
//! [`Serving`] is dropped.
//!
//! Decisions:
//! - **Names outside the cluster zone are REFUSED**, not forwarded: pods of
//!   the embedded cluster have no route off the machine, and no traffic
//!   leaves it. Reverse (`in-addr.arpa`) names are answered only for
//!   addresses the zone knows (cluster IPs and endpoints).
//! - **ClusterIP Services resolve to their cluster IP**, as on any cluster;
//!   the embedded cluster has no kube-proxy, so a cluster IP carries no
//!   traffic (the kubelet proxies only `default/kubernetes`). Headless
//!   Services resolve to their pods and work end to end.
//!
//! Invariants:
//! 1. [`ClusterDns::start`] reads only Services, EndpointSlices and Pods
//!    (as CoreDNS does); it never writes to the API server.
//! 2. Dropping a [`Serving`] stops every task that serves its sockets and
//!    closes them; dropping the [`ClusterDns`] stops the watches (servings
//!    still alive keep answering from the last zone).
//! 3. Until the caches have synced, every query is answered SERVFAIL.

mod feed;
pub mod records;
mod server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_server::Server;
use hickory_server::proto::rr::{LowerName, Name, RecordType};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use records::{Answer, Zone};

/// A `tracing` directive for default log filters of processes that serve
/// DNS: hickory-server logs every query at `info`.
pub const QUIET_QUERY_LOGS: &str = "hickory_server=warn";

/// The cluster DNS server's configuration.
#[derive(Debug, Clone)]
pub struct DnsConfig {
    /// The cluster zone (kubelet `clusterDomain`), default `cluster.local`.
    pub cluster_domain: String,
    /// TTL of every record and of negative answers (CoreDNS: 5 s).
    pub ttl: Duration,
    /// A TCP connection that sends no query for this long is closed.
    pub tcp_idle_timeout: Duration,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            cluster_domain: "cluster.local".into(),
            ttl: Duration::from_secs(5),
            tcp_idle_timeout: Duration::from_secs(10),
        }
    }
}

/// Why the cluster DNS could not start or bind.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// `cluster_domain` is not a DNS name.
    #[error(
        "cluster DNS: cluster_domain {domain:?} is not a DNS name ({reason}); use dot-separated labels such as cluster.local"
    )]
    ClusterDomain {
        /// The configured domain.
        domain: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A socket could not be bound.
    #[error("cluster DNS: cannot bind {proto} {addr}: {source}")]
    Bind {
        /// `udp` or `tcp`.
        proto: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The cluster DNS: caches of the API server and the zone built from them.
pub struct ClusterDns {
    zone: watch::Receiver<Option<Arc<Zone>>>,
    config: DnsConfig,
    _tasks: JoinSet<()>,
}

/// Answers on one UDP socket and one TCP listener until dropped.
pub struct Serving {
    _server: Server<server::DnsHandler>,
}

impl ClusterDns {
    /// Starts watching the API server through `client` (all namespaces).
    ///
    /// # Errors
    /// [`DnsError::ClusterDomain`] when `config.cluster_domain` is not a
    /// DNS name.
    pub fn start(client: &kube::Client, config: DnsConfig) -> Result<Self, DnsError> {
        let origin = zone_origin(&config.cluster_domain)?;
        let ttl = u32::try_from(config.ttl.as_secs()).unwrap_or(u32::MAX);
        let (tx, rx) = watch::channel(None);
        let mut tasks = JoinSet::new();
        feed::spawn(client, origin, ttl, tx, &mut tasks);
        Ok(Self {
            zone: rx,
            config,
            _tasks: tasks,
        })
    }

    /// Waits until the caches have synced and the first zone is built.
    pub async fn ready(&self) {
        let mut rx = self.zone.clone();
        let _ = rx.wait_for(Option::is_some).await;
    }

    /// Whether the caches have synced.
    pub fn is_ready(&self) -> bool {
        self.zone.borrow().is_some()
    }

    /// The current answer to `name`/`qtype`, as the server would give it
    /// (`None` before the caches synced).
    pub fn lookup(&self, name: &Name, qtype: RecordType) -> Option<Answer> {
        let zone = self.zone.borrow().clone()?;
        Some(zone.lookup(&LowerName::new(name), qtype))
    }

    /// Serves DNS on `udp` and `tcp` (already bound, e.g. to the DNS
    /// address inside a pod's network namespace) until the returned
    /// [`Serving`] is dropped. Must be called within a tokio runtime.
    pub fn serve(&self, udp: UdpSocket, tcp: TcpListener) -> Serving {
        let mut server = Server::new(server::DnsHandler {
            zone: self.zone.clone(),
        });
        server.register_socket(udp);
        server.register_listener(tcp, self.config.tcp_idle_timeout, 32);
        Serving { _server: server }
    }

    /// [`ClusterDns::serve`] for std sockets (e.g. bound on a thread that
    /// entered a pod's network namespace); sets them non-blocking. Must be
    /// called within a tokio runtime.
    ///
    /// # Errors
    /// The I/O error when a socket cannot be registered with tokio.
    pub fn serve_std(
        &self,
        udp: std::net::UdpSocket,
        tcp: std::net::TcpListener,
    ) -> std::io::Result<Serving> {
        udp.set_nonblocking(true)?;
        tcp.set_nonblocking(true)?;
        Ok(self.serve(UdpSocket::from_std(udp)?, TcpListener::from_std(tcp)?))
    }

    /// Binds UDP and TCP on `addr` (with port 0: one free port for both)
    /// and serves them; returns the bound address.
    ///
    /// # Errors
    /// [`DnsError::Bind`] when either socket cannot be bound.
    pub async fn bind(&self, addr: SocketAddr) -> Result<(Serving, SocketAddr), DnsError> {
        let bind_err = |proto, addr, source| DnsError::Bind {
            proto,
            addr,
            source,
        };
        // With port 0 the UDP port may be taken for TCP; try a few.
        let attempts = if addr.port() == 0 { 8 } else { 1 };
        let mut last = None;
        for _ in 0..attempts {
            let udp = UdpSocket::bind(addr)
                .await
                .map_err(|e| bind_err("udp", addr, e))?;
            let bound = udp.local_addr().map_err(|e| bind_err("udp", addr, e))?;
            match TcpListener::bind(bound).await {
                Ok(tcp) => return Ok((self.serve(udp, tcp), bound)),
                Err(e) => last = Some(bind_err("tcp", bound, e)),
            }
        }
        Err(last.unwrap_or_else(|| bind_err("tcp", addr, std::io::Error::other("no attempt made"))))
    }
}

/// `cluster.local` -> `cluster.local.`, refusing what is not a DNS name.
fn zone_origin(domain: &str) -> Result<Name, DnsError> {
    let err = |reason: String| DnsError::ClusterDomain {
        domain: domain.to_string(),
        reason,
    };
    let trimmed = domain.trim_end_matches('.');
    if trimmed.is_empty() {
        return Err(err("it is empty".into()));
    }
    if trimmed.split('.').any(str::is_empty) {
        return Err(err("it has an empty label".into()));
    }
    let mut name = Name::from_ascii(trimmed).map_err(|e| err(e.to_string()))?;
    name.set_fqdn(true);
    Ok(name.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_domain_is_validated() {
        assert_eq!(
            zone_origin("Cluster.Local").unwrap().to_string(),
            "cluster.local."
        );
        assert_eq!(zone_origin("x.y.").unwrap().to_string(), "x.y.");
        for bad in ["", ".", "a..b", "a b.c"] {
            let e = zone_origin(bad).unwrap_err().to_string();
            assert!(e.contains("cluster_domain"), "{bad}: {e}");
        }
    }
}
