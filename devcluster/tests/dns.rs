//! The cluster DNS server against the embedded API server with the
//! EndpointSlice controller running: pods are objects whose status the test
//! writes; queries go over real UDP and TCP sockets on loopback, built and
//! parsed with hickory, and through `hostmesh_net`'s resolver reading a
//! pod's `resolv.conf` (search path, `ndots:5`).

mod endpoints_common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use endpoints_common::Env;
use hickory_server::proto::op::{Message, Query, ResponseCode};
use hickory_server::proto::rr::{Name, RData, RecordType};
use hostmesh_devcluster::dns::{ClusterDns, DnsConfig, DnsError};
use hostmesh_testkit::eventually_ok;
use k8s_openapi::api::core::v1::Service;
use kube::api::DeleteParams;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

/// How long one query waits for its answer.
const QUERY_TIMEOUT: Duration = Duration::from_secs(3);

fn question(name: &str, qtype: RecordType) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).expect("name"), qtype));
    m.to_vec().expect("encode query")
}

/// One query over UDP.
async fn udp(server: SocketAddr, name: &str, qtype: RecordType) -> Result<Message, String> {
    let sock = UdpSocket::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    sock.connect(server).await.map_err(|e| e.to_string())?;
    sock.send(&question(name, qtype))
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 65535];
    let n = tokio::time::timeout(QUERY_TIMEOUT, sock.recv(&mut buf))
        .await
        .map_err(|_| "no UDP answer".to_string())?
        .map_err(|e| e.to_string())?;
    Message::from_vec(&buf[..n]).map_err(|e| e.to_string())
}

/// One query over TCP (two-byte length framing).
async fn tcp(server: SocketAddr, name: &str, qtype: RecordType) -> Result<Message, String> {
    let exchange = async {
        let mut s = TcpStream::connect(server).await?;
        let q = question(name, qtype);
        let len = u16::try_from(q.len()).expect("short query");
        s.write_all(&len.to_be_bytes()).await?;
        s.write_all(&q).await?;
        let n = usize::from(s.read_u16().await?);
        let mut buf = vec![0u8; n];
        s.read_exact(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = tokio::time::timeout(QUERY_TIMEOUT, exchange)
        .await
        .map_err(|_| "no TCP answer".to_string())?
        .map_err(|e| e.to_string())?;
    Message::from_vec(&buf).map_err(|e| e.to_string())
}

/// The answer section's data, sorted, as text.
fn data(m: &Message) -> Vec<String> {
    let mut v: Vec<String> = m.answers.iter().map(|r| r.data.to_string()).collect();
    v.sort();
    v
}

/// Polls until `name`/`qtype` answers NOERROR with exactly `want`.
async fn expect(server: SocketAddr, name: &str, qtype: RecordType, want: &[&str]) -> Message {
    eventually_ok(&format!("{name} {qtype} = {want:?}"), async || {
        let m = udp(server, name, qtype).await?;
        if m.metadata.response_code == ResponseCode::NoError && data(&m) == want {
            Ok(m)
        } else {
            Err(format!("{:?} {:?}", m.metadata.response_code, data(&m)))
        }
    })
    .await
}

fn soa_in_authority(m: &Message) -> bool {
    m.authorities
        .iter()
        .any(|r| matches!(r.data, RData::SOA(_)) && r.name.to_string() == "cluster.local.")
}

async fn start_dns(env: &Env) -> (ClusterDns, hostmesh_devcluster::dns::Serving, SocketAddr) {
    let dns = ClusterDns::start(&env.client, DnsConfig::default()).expect("dns starts");
    tokio::time::timeout(Duration::from_secs(60), dns.ready())
        .await
        .expect("dns caches sync");
    let (serving, addr) = dns
        .bind("127.0.0.1:0".parse().unwrap())
        .await
        .expect("bind 127.0.0.1:0");
    (dns, serving, addr)
}

#[tokio::test(flavor = "multi_thread")]
async fn headless_service_pods_hostnames_srv_and_updates() {
    let env = Env::start().await;
    let (dns, _serving, addr) = start_dns(&env).await;
    env.create::<Service>(
        "metadata: {name: w}\nspec: {clusterIP: None, selector: {app: w}, ports: [{name: rpc, port: 26600, targetPort: rpc}]}",
    )
    .await;
    env.pod("w-host-0", "w", Some("w"), "10.244.0.2").await;
    env.pod("w-host-1", "w", Some("w"), "10.244.0.3").await;

    let svc = "w.default.svc.cluster.local.";
    let m = expect(addr, svc, RecordType::A, &["10.244.0.2", "10.244.0.3"]).await;
    assert!(m.metadata.authoritative, "answers are authoritative");
    assert!(!m.metadata.recursion_available, "no recursion offered");
    expect(
        addr,
        "w-host-0.w.default.svc.cluster.local.",
        RecordType::A,
        &["10.244.0.2"],
    )
    .await;
    // Case-insensitive.
    expect(
        addr,
        "W-HOST-1.W.Default.SVC.cluster.LOCAL.",
        RecordType::A,
        &["10.244.0.3"],
    )
    .await;
    // SRV per named port and endpoint, targets' addresses as additionals.
    let m = expect(
        addr,
        "_rpc._tcp.w.default.svc.cluster.local.",
        RecordType::SRV,
        &[
            "0 50 26600 w-host-0.w.default.svc.cluster.local.",
            "0 50 26600 w-host-1.w.default.svc.cluster.local.",
        ],
    )
    .await;
    let mut extra: Vec<String> = m.additionals.iter().map(|r| r.data.to_string()).collect();
    extra.sort();
    assert_eq!(extra, ["10.244.0.2", "10.244.0.3"]);
    // Pod records; AAAA of a v4-only name is NOERROR, empty, with the SOA.
    expect(
        addr,
        "10-244-0-2.default.pod.cluster.local.",
        RecordType::A,
        &["10.244.0.2"],
    )
    .await;
    let m = expect(addr, svc, RecordType::AAAA, &[]).await;
    assert!(soa_in_authority(&m), "{m:?}");
    // TCP answers the same.
    let m = tcp(addr, svc, RecordType::A).await.expect("tcp answer");
    assert_eq!(data(&m), ["10.244.0.2", "10.244.0.3"]);
    // The library view agrees with the wire.
    assert!(dns.is_ready());

    // As a pod resolves: resolv.conf with the search path and ndots:5.
    let dir = tempfile::tempdir().unwrap();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 127.0.0.1\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n",
    )
    .unwrap();
    let resolver = hostmesh_net::Resolver::from_files(dir.path().join("hosts"), &resolv)
        .with_dns_port(addr.port());
    let ips = resolver
        .lookup_ip("w-host-1.w")
        .await
        .expect("w-host-1.w resolves");
    assert_eq!(ips, [IpAddr::from([10, 244, 0, 3])]);
    let mut ips = resolver.lookup_ip("w").await.expect("w resolves");
    ips.sort();
    assert_eq!(
        ips,
        [IpAddr::from([10, 244, 0, 2]), IpAddr::from([10, 244, 0, 3])]
    );
    assert!(
        resolver.lookup_ip("nothing-here.invalid").await.is_err(),
        "names outside the cluster do not resolve"
    );

    // A pod goes away: its records follow.
    env.pods()
        .delete("w-host-1", &DeleteParams::default())
        .await
        .unwrap();
    expect(addr, svc, RecordType::A, &["10.244.0.2"]).await;
    eventually_ok("w-host-1 NXDOMAIN", async || {
        let m = udp(addr, "w-host-1.w.default.svc.cluster.local.", RecordType::A).await?;
        if m.metadata.response_code == ResponseCode::NXDomain && soa_in_authority(&m) {
            Ok(())
        } else {
            Err(format!("{m:?}"))
        }
    })
    .await;
    // Not ready: out of the Service's addresses.
    env.set_status("w-host-0", "10.244.0.2", false).await;
    expect(addr, svc, RecordType::A, &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_ip_external_name_nxdomain_and_refused() {
    let env = Env::start().await;
    let (_dns, _serving, addr) = start_dns(&env).await;
    let web = env
        .create::<Service>(
            "metadata: {name: web}\nspec: {selector: {app: web}, ports: [{name: http, port: 80}]}",
        )
        .await;
    let ip = web.spec.unwrap().cluster_ip.expect("a cluster IP");
    env.create::<Service>(
        "metadata: {name: ext}\nspec: {type: ExternalName, externalName: db.example.org}",
    )
    .await;

    expect(
        addr,
        "web.default.svc.cluster.local.",
        RecordType::A,
        &[ip.as_str()],
    )
    .await;
    expect(
        addr,
        "_http._tcp.web.default.svc.cluster.local.",
        RecordType::SRV,
        &["0 100 80 web.default.svc.cluster.local."],
    )
    .await;
    let reverse: Vec<&str> = ip.split('.').rev().collect();
    expect(
        addr,
        &format!("{}.in-addr.arpa.", reverse.join(".")),
        RecordType::PTR,
        &["web.default.svc.cluster.local."],
    )
    .await;
    let m = expect(
        addr,
        "ext.default.svc.cluster.local.",
        RecordType::A,
        &["db.example.org."],
    )
    .await;
    assert!(matches!(m.answers[0].data, RData::CNAME(_)));

    // A name in the zone that does not exist: NXDOMAIN with the SOA.
    let m = udp(addr, "nope.default.svc.cluster.local.", RecordType::A)
        .await
        .unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert!(soa_in_authority(&m), "{m:?}");
    // An empty non-terminal exists: NOERROR, no records.
    let m = udp(addr, "default.svc.cluster.local.", RecordType::A)
        .await
        .unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.answers.is_empty() && soa_in_authority(&m), "{m:?}");
    // Outside the zone: REFUSED, over UDP and TCP; nothing forwarded.
    for m in [
        udp(addr, "example.com.", RecordType::A).await.unwrap(),
        tcp(addr, "example.com.", RecordType::A).await.unwrap(),
    ] {
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
        assert!(m.answers.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn serves_many_socket_pairs_and_stops_when_a_handle_drops() {
    let env = Env::start().await;
    let (dns, serving_a, addr_a) = start_dns(&env).await;
    // The kubelet's way: sockets bound elsewhere, handed over.
    let udp_b = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr_b = udp_b.local_addr().unwrap();
    let tcp_b = TcpListener::bind(addr_b).await.unwrap();
    let serving_b = dns.serve(udp_b, tcp_b);
    env.create::<Service>("metadata: {name: one}\nspec: {ports: [{port: 80}]}")
        .await;
    let name = "one.default.svc.cluster.local.";
    for addr in [addr_a, addr_b] {
        eventually_ok("both servings answer", async || {
            let m = udp(addr, name, RecordType::A).await?;
            if m.answers.len() == 1 {
                Ok(())
            } else {
                Err(format!("{m:?}"))
            }
        })
        .await;
        tcp(addr, name, RecordType::A).await.expect("tcp answer");
    }

    drop(serving_a);
    eventually_ok("the dropped serving stops answering", async || {
        let (u, t) = (
            udp(addr_a, name, RecordType::A).await,
            tcp(addr_a, name, RecordType::A).await,
        );
        if u.is_err() && t.is_err() {
            Ok(())
        } else {
            Err(format!("{u:?} {t:?}"))
        }
    })
    .await;
    // The TCP port is closed, not merely slow.
    assert!(TcpStream::connect(addr_a).await.is_err(), "listener closed");
    // The other one still answers.
    let m = udp(addr_b, name, RecordType::A)
        .await
        .expect("b still answers");
    assert_eq!(m.answers.len(), 1);
    drop(serving_b);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_cluster_domain_is_refused_with_the_field() {
    let env = Env::start().await;
    let err = ClusterDns::start(
        &env.client,
        DnsConfig {
            cluster_domain: "cluster..local".into(),
            ..DnsConfig::default()
        },
    )
    .err()
    .expect("refused");
    assert!(matches!(err, DnsError::ClusterDomain { .. }));
    assert!(err.to_string().contains("cluster_domain"), "{err}");
}
