//! Pod sandboxes: each pod has its own network and UTS namespace on the
//! kubelet's bridge. Two pods of one headless Service bind the same port,
//! see their own hostname and FQDN, and reach each other (by address and
//! by DNS name) and the machine reaches them; nothing routes out of the pod range; a pod range that
//! overlaps a route of the machine is refused; the cluster DNS seam gets
//! sockets inside each pod.

mod kubelet_common;

use std::net::Ipv4Addr;

use hostmesh_devcluster::kubelet::{ClusterDns, DnsSockets, Kubelet, KubeletConfig};
use hostmesh_testkit::eventually_async;
use kubelet_common::*;

const PORT: u16 = 26680;
/// `ENETUNREACH` on Linux: no route to the address.
const ENETUNREACH: i32 = 101;

fn web_pod(name: &str, python: &str) -> String {
    format!(
        r#"
metadata: {{name: {name}, labels: {{app: web}}}}
spec:
  hostname: {name}
  subdomain: web
  containers:
  - name: main
    image: python
    command: [sh, -c]
    args:
    - |
      mkdir -p /srv && cd /srv
      echo "hostname=$(hostname)"
      echo "fqdn=$(hostname -f)"
      echo "hosts=$(grep "$(hostname)" /etc/hosts)"
      echo "resolv=$(cat /etc/resolv.conf | tr '\n' ';')"
      hostname > name
      exec {python} -m http.server --bind 0.0.0.0 {PORT}
    volumeMounts: [{{name: srv, mountPath: /srv}}]
    readinessProbe: {{tcpSocket: {{port: {PORT}}}, periodSeconds: 1}}
  volumes: [{{name: srv, emptyDir: {{}}}}]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_a_headless_service_have_their_own_network_and_names() {
    // With the embedded cluster DNS behind the kubelet's seam.
    let c = Cluster::start_with_client(201, |cfg, client| {
        cfg.cluster_dns = hostmesh_devcluster::kubelet::cluster_dns(client);
    })
    .await;
    // The EndpointSlice controller gives the headless Service its
    // endpoints (with the pods' hostnames), which the DNS serves.
    let controllers = hostmesh_devcluster::controllers::start(c.client.clone());
    let python = python();
    c.create::<k8s_openapi::api::core::v1::Service>(&format!(
        "metadata: {{name: web}}\nspec: {{clusterIP: None, selector: {{app: web}}, ports: [{{name: http, port: {PORT}}}]}}\n"
    ))
    .await;
    for name in ["web-0", "web-1"] {
        c.create_pod(&web_pod(name, &python)).await;
    }
    let cidr = c.pod_cidr().await;
    let mut ips = Vec::new();
    for name in ["web-0", "web-1"] {
        let pod = c
            .wait_pod(name, "Ready", |p| {
                condition(p, "Ready").as_deref() == Some("True")
            })
            .await;
        let ip: Ipv4Addr = pod.status.unwrap().pod_ip.unwrap().parse().unwrap();
        assert!(cidr.contains(ip), "{ip} is not in the node's {cidr}");
        assert!(!ip.is_loopback() && !ip.is_link_local());
        let logs = c.kubelet().logs("default", name, "main", None).unwrap();
        let fqdn = format!("{name}.web.default.svc.cluster.local");
        assert!(logs.contains(&format!("hostname={name}\n")), "{logs}");
        assert!(logs.contains(&format!("fqdn={fqdn}\n")), "{logs}");
        assert!(
            logs.contains(&format!("hosts={ip}\t{fqdn}\t{name}\n")),
            "{logs}"
        );
        assert!(
            logs.contains("resolv=nameserver 10.96.0.10;search default.svc.cluster.local svc.cluster.local cluster.local;options ndots:5;"),
            "{logs}"
        );
        // The machine reaches the pod on its address; both bound 0.0.0.0:PORT.
        let (code, body) = hostmesh_testkit::http::get((ip, PORT), "/name")
            .await
            .expect("the machine reaches the pod");
        assert_eq!((code, body.trim()), (200, name));
        ips.push(ip);
    }
    assert_ne!(ips[0], ips[1]);

    // A third pod reaches both by pod IP, and nothing outside the pod range.
    c.create_pod(&format!(
        r#"
metadata: {{name: client}}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: python
    command: [{python}, -c]
    args:
    - |
      import socket, urllib.request
      for ip in ["{a}", "{b}"]:
          print("peer", urllib.request.urlopen(f"http://{{ip}}:{PORT}/name", timeout=10).read().decode().strip())
      for name in ["web-0.web", "web-1.web.default.svc.cluster.local"]:
          print("dns", name, socket.gethostbyname(name))
      for ip in ["203.0.113.7", "10.97.0.5", "192.168.1.1"]:
          s = socket.socket()
          s.settimeout(5)
          try:
              s.connect((ip, 80))
              print("reached", ip)
          except OSError as e:
              print("unreachable", ip, e.errno)
"#,
        a = ips[0],
        b = ips[1],
    ))
    .await;
    let done = c
        .wait_pod("client", "finished", |p| {
            matches!(phase(p), "Succeeded" | "Failed")
        })
        .await;
    let logs = c.kubelet().logs("default", "client", "main", None).unwrap();
    assert_eq!(phase(&done), "Succeeded", "{logs}");
    let enetunreach = ENETUNREACH;
    let (a, b) = (ips[0], ips[1]);
    assert_eq!(
        logs,
        format!(
            "peer web-0\npeer web-1\ndns web-0.web {a}\ndns web-1.web.default.svc.cluster.local {b}\nunreachable 203.0.113.7 {enetunreach}\nunreachable 10.97.0.5 {enetunreach}\nunreachable 192.168.1.1 {enetunreach}\n"
        )
    );
    controllers.shutdown().await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_range_overlapping_a_route_of_the_machine_is_refused() {
    // A route the kubelet does not own: a link of the test's with an
    // address, so its /24 is in the machine's routing table (no traffic
    // is sent).
    let link = TestLink::create("hmtestlink0", "10.251.7.1/24");
    let dir = tempfile::tempdir().unwrap();
    let (api, client) = hostmesh_testkit::cluster::api_server().await;
    let mut config =
        KubeletConfig::new("overlap-node", dir.path().join("kubelet")).for_api_server(&api);
    config.pod_ip_range = "10.251.0.0/16".parse().unwrap();
    let err = Kubelet::start(client.clone(), config)
        .await
        .expect_err("an overlapping pod range is refused");
    let msg = err.to_string();
    assert!(
        msg.contains("10.251.0.0/16")
            && msg.contains("10.251.7.0/24")
            && msg.contains("hmtestlink0"),
        "{msg}"
    );
    drop(link);
    api.shutdown().await;
}

/// A link (a bridge: every kernel that runs sandboxes has them) made with
/// `ip` for the test, deleted on drop.
struct TestLink(&'static str);

impl TestLink {
    fn create(name: &'static str, addr: &str) -> Self {
        let ip = |args: &[&str]| {
            std::process::Command::new("ip")
                .args(args)
                .status()
                .expect("these tests need iproute2's ip")
        };
        // A leftover of an interrupted run.
        let _ = std::process::Command::new("ip")
            .args(["link", "del", name])
            .stderr(std::process::Stdio::null())
            .status();
        assert!(ip(&["link", "add", name, "type", "bridge"]).success());
        let link = TestLink(name);
        assert!(ip(&["addr", "add", addr, "dev", name]).success());
        assert!(ip(&["link", "set", name, "up"]).success());
        link
    }
}

impl Drop for TestLink {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", self.0])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_network_mode_keeps_pods_on_loopback() {
    let c = Cluster::start_with(202, |cfg| *cfg = cfg.clone().host_network(202)).await;
    c.create_pod(
        "metadata: {name: lo}\nspec:\n  restartPolicy: Never\n  containers:\n  - {name: main, image: busybox, command: [sh, -c, 'echo $KUBERNETES_SERVICE_HOST']}\n",
    )
    .await;
    let pod = c
        .wait_pod("lo", "phase Succeeded", |p| phase(p) == "Succeeded")
        .await;
    let ip = pod.status.unwrap().pod_ip.unwrap();
    assert!(ip.starts_with("127.202."), "{ip}");
    let logs = eventually_async("the container's output", async || {
        c.kubelet()
            .logs("default", "lo", "main", None)
            .ok()
            .filter(|l| !l.is_empty())
    })
    .await;
    assert_eq!(logs.trim(), "127.0.0.1");
    c.stop().await;
}

/// A stand-in for the cluster DNS server behind the kubelet's seam: it
/// answers every UDP datagram and every TCP connection with the pod it
/// serves, so the test sees which sockets reached which server.
struct WhoAmI;

impl ClusterDns for WhoAmI {
    fn serve(&self, sockets: DnsSockets) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(async move {
            let me = format!("{}/{}", sockets.pod.namespace, sockets.pod.name);
            let mut buf = [0u8; 512];
            loop {
                tokio::select! {
                    Ok((_, from)) = sockets.udp.recv_from(&mut buf) => {
                        let _ = sockets.udp.send_to(me.as_bytes(), from).await;
                    }
                    Ok((mut conn, _)) = sockets.tcp.accept() => {
                        use tokio::io::AsyncWriteExt as _;
                        let _ = conn.write_all(me.as_bytes()).await;
                    }
                }
            }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_dns_seam_gets_sockets_inside_each_pod() {
    let c = Cluster::start_with(204, |cfg| {
        cfg.cluster_dns = Some(std::sync::Arc::new(WhoAmI));
    })
    .await;
    let python = python();
    c.create_pod(&format!(
        r#"
metadata: {{name: asker}}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: python
    command: [{python}, -c]
    args:
    - |
      import socket
      u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
      u.settimeout(10)
      u.sendto(b"q", ("10.96.0.10", 53))
      print("udp", u.recvfrom(512)[0].decode())
      t = socket.create_connection(("10.96.0.10", 53), timeout=10)
      print("tcp", t.recv(512).decode())
"#
    ))
    .await;
    c.wait_pod("asker", "phase Succeeded", |p| phase(p) == "Succeeded")
        .await;
    let logs = c.kubelet().logs("default", "asker", "main", None).unwrap();
    assert_eq!(logs, "udp default/asker\ntcp default/asker\n");
    c.stop().await;
}
