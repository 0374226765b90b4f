//! [`Resolver`]: names to addresses as a pod sees them, without the C
//! library. An IP literal is itself; otherwise the hosts file answers first
//! (every line that names the host), and only a name it does not know goes to
//! DNS: the name servers, `search`/`domain`, `ndots`, `timeout` and
//! `attempts` of `resolv.conf`, through `hickory-resolver`. Both files are
//! read on every lookup, as glibc does, so a resolver never holds a stale
//! picture; a lookup is two small file reads plus the DNS round trips.
//! Without a `resolv.conf` (or without a `nameserver` line in it) the name
//! server is 127.0.0.1, as in glibc and musl.

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use hickory_resolver::config::{NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;

use crate::hosts;

/// The system hosts file.
pub const HOSTS_FILE: &str = "/etc/hosts";
/// The system resolver configuration.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";
/// The DNS port (`resolv.conf` has no way to name another).
pub const DNS_PORT: u16 = 53;

/// Why a name did not resolve.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The target is not `host:port`.
    #[error("invalid address {target:?}: expected host:port")]
    BadTarget {
        /// What was given.
        target: String,
    },
    /// Neither the hosts file nor DNS knows the name.
    #[error("cannot resolve {name}: no such host (not in {hosts}, not in DNS)")]
    NotFound {
        /// The name.
        name: String,
        /// The hosts file that was read.
        hosts: String,
    },
    /// DNS did not answer (no server reachable, timeout, server failure).
    #[error("cannot resolve {name}: {source}")]
    Dns {
        /// The name.
        name: String,
        /// What the DNS client reported.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Resolves names from a hosts file and the DNS servers of a `resolv.conf`.
/// Cheap to clone; holds no sockets between lookups.
#[derive(Debug, Clone)]
pub struct Resolver {
    hosts_file: PathBuf,
    resolv_conf: PathBuf,
    dns_port: u16,
}

impl Default for Resolver {
    fn default() -> Self {
        Resolver::system()
    }
}

impl Resolver {
    /// The system's files: `/etc/hosts` and `/etc/resolv.conf`.
    pub fn system() -> Self {
        Resolver::from_files(HOSTS_FILE, RESOLV_CONF)
    }

    /// Another hosts file and `resolv.conf` (tests, unusual layouts).
    pub fn from_files(hosts_file: impl Into<PathBuf>, resolv_conf: impl Into<PathBuf>) -> Self {
        Resolver {
            hosts_file: hosts_file.into(),
            resolv_conf: resolv_conf.into(),
            dns_port: DNS_PORT,
        }
    }

    /// Asks the name servers on `port` instead of 53 (a test's DNS server on
    /// loopback).
    pub fn with_dns_port(mut self, port: u16) -> Self {
        self.dns_port = port;
        self
    }

    /// The hosts file this resolver reads.
    pub fn hosts_file(&self) -> &Path {
        &self.hosts_file
    }

    /// Resolves `target` (`host:port`, `ip:port` or `[ipv6]:port`) to socket
    /// addresses, in preference order (never empty on success).
    pub async fn lookup_host(&self, target: &str) -> Result<Vec<SocketAddr>, ResolveError> {
        if let Ok(addr) = target.parse::<SocketAddr>() {
            return Ok(vec![addr]);
        }
        let bad = || ResolveError::BadTarget {
            target: target.to_string(),
        };
        let (host, port) = target.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad());
        }
        Ok(self
            .lookup_ip(host)
            .await?
            .into_iter()
            .map(|ip| SocketAddr::new(ip, port))
            .collect())
    }

    /// Resolves a host name (or IP literal) to its addresses, in preference
    /// order (never empty on success).
    pub async fn lookup_ip(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        let from_file = hosts::lookup(&read_or_empty(&self.hosts_file).await, host);
        if !from_file.is_empty() {
            tracing::debug!(name = host, addrs = ?from_file, file = %self.hosts_file.display(), "resolved from the hosts file");
            return Ok(from_file);
        }
        let resolver = self.dns_resolver(host).await?;
        let not_found = || ResolveError::NotFound {
            name: host.to_string(),
            hosts: self.hosts_file.display().to_string(),
        };
        match resolver.lookup_ip(host).await {
            Ok(found) => {
                let ips: Vec<IpAddr> = found.iter().collect();
                tracing::debug!(name = host, addrs = ?ips, "resolved by DNS");
                if ips.is_empty() {
                    Err(not_found())
                } else {
                    Ok(ips)
                }
            }
            Err(e) if e.is_nx_domain() || e.is_no_records_found() => Err(not_found()),
            Err(e) => Err(ResolveError::Dns {
                name: host.to_string(),
                source: Box::new(e),
            }),
        }
    }

    /// A DNS client configured from `resolv.conf` as it is now.
    async fn dns_resolver(
        &self,
        name: &str,
    ) -> Result<hickory_resolver::Resolver<TokioRuntimeProvider>, ResolveError> {
        let text = read_or_empty(&self.resolv_conf).await;
        let (config, mut opts) = match hickory_resolver::system_conf::parse_resolv_conf(&text) {
            Ok(parsed) => parsed,
            Err(e) => {
                tracing::debug!(file = %self.resolv_conf.display(), error = %e, "no usable resolv.conf; asking 127.0.0.1");
                let local = NameServerConfig::udp_and_tcp(IpAddr::V4(Ipv4Addr::LOCALHOST));
                (
                    ResolverConfig::from_parts(None, Vec::new(), vec![local]),
                    ResolverOpts::default(),
                )
            }
        };
        let (domain, search, mut servers) = config.into_parts();
        for server in &mut servers {
            for conn in &mut server.connections {
                conn.port = self.dns_port;
            }
        }
        // The hosts file was read above, from this resolver's path.
        opts.use_hosts_file = ResolveHosts::Never;
        let mut builder = hickory_resolver::Resolver::builder_with_config(
            ResolverConfig::from_parts(domain, search, servers),
            TokioRuntimeProvider::default(),
        );
        *builder.options_mut() = opts;
        builder.build().map_err(|e| ResolveError::Dns {
            name: name.to_string(),
            source: Box::new(e),
        })
    }
}

/// Resolves `target` (`host:port`) with the system's files: the hosts file
/// first, then DNS ([`Resolver::system`]).
pub async fn lookup_host(target: &str) -> Result<Vec<SocketAddr>, ResolveError> {
    Resolver::system().lookup_host(target).await
}

/// The file's text; empty when it is missing or unreadable (as the C
/// libraries treat a missing hosts file or `resolv.conf`).
async fn read_or_empty(path: &Path) -> String {
    match tokio::fs::read(path).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => {
            if e.kind() != ErrorKind::NotFound {
                tracing::debug!(file = %path.display(), error = %e, "cannot read; treated as empty");
            }
            String::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nowhere() -> Resolver {
        Resolver::from_files("/nonexistent/hosts", "/nonexistent/resolv.conf")
    }

    #[tokio::test]
    async fn literals_need_no_files() {
        let r = nowhere();
        assert_eq!(
            r.lookup_host("10.1.2.3:26600").await.unwrap(),
            ["10.1.2.3:26600".parse().unwrap()]
        );
        assert_eq!(
            r.lookup_host("[fd00::1]:80").await.unwrap(),
            ["[fd00::1]:80".parse().unwrap()]
        );
        assert_eq!(
            r.lookup_ip("::1").await.unwrap(),
            ["::1".parse::<IpAddr>().unwrap()]
        );
    }

    #[tokio::test]
    async fn targets_without_a_port_are_refused() {
        let r = nowhere();
        for bad in [
            "supervisor",
            "supervisor:",
            "supervisor:http",
            ":80",
            "[]:80",
        ] {
            assert!(
                matches!(
                    r.lookup_host(bad).await,
                    Err(ResolveError::BadTarget { .. })
                ),
                "{bad}"
            );
        }
    }
}
