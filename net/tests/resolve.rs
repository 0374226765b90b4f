//! `hostmesh_net` against real files and a real DNS server on loopback that
//! each test starts: the hosts file answers first and DNS is not asked;
//! other names go to the `resolv.conf` name server with its search list and
//! `ndots`; an unknown name is `NotFound`, an unreachable server a `Dns`
//! error; and a Kubernetes client reaches an API server named only in the
//! hosts file, sending the name (not the address) as its Host.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hostmesh_net::{ResolveError, Resolver};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, UdpSocket};

/// A DNS server on 127.0.0.1 (random UDP port) that answers A queries for
/// the names it was given, NODATA for their other types, NXDOMAIN for any
/// other name, and records every question (`name TYPE`).
struct DnsServer {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

impl DnsServer {
    async fn start(names: &[(&str, Ipv4Addr)]) -> DnsServer {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let port = sock.local_addr().unwrap().port();
        let answers: HashMap<String, Ipv4Addr> =
            names.iter().map(|(n, ip)| (n.to_string(), *ip)).collect();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                    return;
                };
                if let Some(reply) = answer(&buf[..n], &answers, &log) {
                    let _ = sock.send_to(&reply, peer).await;
                }
            }
        });
        DnsServer { port, seen }
    }

    fn questions(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// The reply to one query (RFC 1035 4.1), or None for a malformed one.
fn answer(
    q: &[u8],
    answers: &HashMap<String, Ipv4Addr>,
    seen: &Mutex<Vec<String>>,
) -> Option<Vec<u8>> {
    let mut i = 12;
    let mut labels = Vec::new();
    while *q.get(i)? != 0 {
        let len = q[i] as usize;
        labels.push(String::from_utf8_lossy(q.get(i + 1..i + 1 + len)?).to_lowercase());
        i += 1 + len;
    }
    let qtype = u16::from_be_bytes([*q.get(i + 1)?, *q.get(i + 2)?]);
    let question = q.get(12..i + 5)?;
    let name = labels.join(".");
    seen.lock()
        .unwrap()
        .push(format!("{name} {}", if qtype == 1 { "A" } else { "other" }));
    let ip = answers.get(&name);
    let records = u16::from(ip.is_some() && qtype == 1);
    let rcode: u16 = if ip.is_some() { 0 } else { 3 };
    let mut r = Vec::new();
    r.extend_from_slice(&q[0..2]);
    r.extend_from_slice(&(0x8180 | rcode).to_be_bytes());
    for count in [1, records, 0, 0] {
        r.extend_from_slice(&u16::to_be_bytes(count));
    }
    r.extend_from_slice(question);
    if records == 1 {
        r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
        r.extend_from_slice(&ip?.octets());
    }
    Some(r)
}

/// A hosts file and a `resolv.conf` in a temporary directory.
struct Files {
    _dir: tempfile::TempDir,
    hosts: PathBuf,
    resolv_conf: PathBuf,
}

fn files(hosts: &str, resolv_conf: &str) -> Files {
    let dir = tempfile::tempdir().unwrap();
    let h = dir.path().join("hosts");
    let r = dir.path().join("resolv.conf");
    std::fs::write(&h, hosts).unwrap();
    std::fs::write(&r, resolv_conf).unwrap();
    Files {
        _dir: dir,
        hosts: h,
        resolv_conf: r,
    }
}

const HOSTS: &str = "127.0.0.1 localhost\n10.1.2.3 supervisor.hostmesh.test supervisor\n";

#[tokio::test]
async fn the_hosts_file_answers_without_asking_dns() {
    let dns = DnsServer::start(&[("supervisor.hostmesh.test", Ipv4Addr::new(10, 9, 9, 9))]).await;
    let f = files(HOSTS, "nameserver 127.0.0.1\n");
    let r = Resolver::from_files(&f.hosts, &f.resolv_conf).with_dns_port(dns.port);
    assert_eq!(
        r.lookup_host("supervisor.hostmesh.test:26600")
            .await
            .unwrap(),
        ["10.1.2.3:26600".parse::<SocketAddr>().unwrap()]
    );
    assert_eq!(
        r.lookup_ip("SUPERVISOR").await.unwrap(),
        [IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3))]
    );
    assert!(dns.questions().is_empty(), "{:?}", dns.questions());
}

#[tokio::test]
async fn other_names_go_to_the_name_server_of_resolv_conf() {
    let dns = DnsServer::start(&[("api.example.test", Ipv4Addr::new(10, 9, 8, 7))]).await;
    let f = files(
        HOSTS,
        "# comment\nnameserver 127.0.0.1\noptions timeout:2\n",
    );
    let r = Resolver::from_files(&f.hosts, &f.resolv_conf).with_dns_port(dns.port);
    assert_eq!(
        r.lookup_host("api.example.test:6443").await.unwrap(),
        ["10.9.8.7:6443".parse::<SocketAddr>().unwrap()]
    );
    assert!(
        dns.questions().contains(&"api.example.test A".to_string()),
        "{:?}",
        dns.questions()
    );
}

#[tokio::test]
async fn search_domains_and_ndots_apply_as_in_a_pod() {
    // A pod's resolv.conf: short names are tried under the search domains.
    let dns = DnsServer::start(&[(
        "supervisor.ml.svc.cluster.local",
        Ipv4Addr::new(10, 96, 0, 12),
    )])
    .await;
    let f = files(
        "127.0.0.1 localhost\n",
        "search ml.svc.cluster.local svc.cluster.local cluster.local\nnameserver 127.0.0.1\noptions ndots:5\n",
    );
    let r = Resolver::from_files(&f.hosts, &f.resolv_conf).with_dns_port(dns.port);
    assert_eq!(
        r.lookup_ip("supervisor").await.unwrap(),
        [IpAddr::V4(Ipv4Addr::new(10, 96, 0, 12))]
    );
}

#[tokio::test]
async fn an_unknown_name_is_not_found() {
    let dns = DnsServer::start(&[]).await;
    let f = files(HOSTS, "nameserver 127.0.0.1\n");
    let r = Resolver::from_files(&f.hosts, &f.resolv_conf).with_dns_port(dns.port);
    let err = r.lookup_host("nowhere.hostmesh.test:80").await.unwrap_err();
    assert!(matches!(err, ResolveError::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("nowhere.hostmesh.test"), "{err}");
    assert!(!dns.questions().is_empty());
}

#[tokio::test]
async fn an_unreachable_name_server_is_a_dns_error() {
    // A port nothing listens on: the query is refused.
    let port = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().port()
    };
    let f = files(
        HOSTS,
        "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
    );
    let r = Resolver::from_files(&f.hosts, &f.resolv_conf).with_dns_port(port);
    let err = r.lookup_ip("api.example.test").await.unwrap_err();
    assert!(matches!(err, ResolveError::Dns { .. }), "{err:?}");
    // The hosts file still works with DNS down.
    assert!(r.lookup_ip("supervisor.hostmesh.test").await.is_ok());
}

#[tokio::test]
async fn without_resolv_conf_the_name_server_is_127_0_0_1() {
    // As in glibc and musl; the literal needs neither file.
    let dns = DnsServer::start(&[("api.example.test", Ipv4Addr::new(10, 9, 8, 6))]).await;
    let r = Resolver::from_files("/nonexistent/hosts", "/nonexistent/resolv.conf")
        .with_dns_port(dns.port);
    assert_eq!(
        r.lookup_ip("192.0.2.1").await.unwrap(),
        [IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))]
    );
    assert_eq!(
        r.lookup_ip("api.example.test").await.unwrap(),
        [IpAddr::V4(Ipv4Addr::new(10, 9, 8, 6))]
    );
}

/// An HTTP server on loopback answering `GET /version` like an API server;
/// returns its port and the Host header of the first request.
async fn fake_apiserver() -> (u16, tokio::sync::oneshot::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut req = Vec::new();
        let mut buf = [0u8; 4096];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "request cut short");
            req.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&req).to_string();
        let host = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("host: ")
                    .or_else(|| l.strip_prefix("Host: "))
            })
            .unwrap_or("")
            .to_string();
        let _ = tx.send(host);
        let body = r#"{"major":"1","minor":"33","gitVersion":"v1.33.0","gitCommit":"x","gitTreeState":"clean","buildDate":"2025-01-01T00:00:00Z","goVersion":"go1.24","compiler":"gc","platform":"linux/amd64"}"#;
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(resp.as_bytes()).await.unwrap();
        let _ = conn.shutdown().await;
    });
    (port, rx)
}

#[tokio::test]
async fn a_kube_client_reaches_an_api_server_named_in_the_hosts_file() {
    let (port, host_header) = fake_apiserver().await;
    // DNS would not know the name: only the hosts file does.
    let dns = DnsServer::start(&[]).await;
    let f = files(
        "127.0.0.1 localhost\n127.0.0.1 api.hostmesh.test\n",
        "nameserver 127.0.0.1\n",
    );
    let r = Resolver::from_files(&f.hosts, &f.resolv_conf).with_dns_port(dns.port);
    let url: http::Uri = format!("http://api.hostmesh.test:{port}").parse().unwrap();
    let config = kube::Config::new(url);
    let client = hostmesh_net::kube_client_builder(config, r)
        .unwrap()
        .build();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, "v1.33.0");
    assert_eq!(
        host_header.await.unwrap(),
        format!("api.hostmesh.test:{port}")
    );
    assert!(dns.questions().is_empty(), "{:?}", dns.questions());
}

#[tokio::test]
async fn a_kube_client_with_an_unknown_server_name_fails_naming_it() {
    let dns = DnsServer::start(&[]).await;
    let f = files("127.0.0.1 localhost\n", "nameserver 127.0.0.1\n");
    let r = Resolver::from_files(&f.hosts, &f.resolv_conf).with_dns_port(dns.port);
    let config = kube::Config::new("http://missing.hostmesh.test:1".parse().unwrap());
    let client = hostmesh_net::kube_client_builder(config, r)
        .unwrap()
        .build();
    let err = client.apiserver_version().await.unwrap_err();
    let chain = {
        let mut s = err.to_string();
        let mut e: &dyn std::error::Error = &err;
        while let Some(next) = e.source() {
            s.push_str(": ");
            s.push_str(&next.to_string());
            e = next;
        }
        s
    };
    assert!(chain.contains("missing.hostmesh.test"), "{chain}");
}
