//! Pod sandboxes: each pod has its own network and UTS namespace on the
//! kubelet's bridge. Two pods of one headless Service bind the same port,
//! see their own hostname and FQDN, and reach each other (by address and
//! by DNS name) and the machine reaches them; nothing routes out of the pod range; with no pod
//! range given the kubelet picks one that no route of the machine overlaps,
//! and a given one that overlaps is refused (both in a network namespace of
//! the test's own); the cluster DNS seam gets sockets inside each pod.

mod kubelet_common;

use std::net::Ipv4Addr;

use hostmesh_devcluster::kubelet::{
    ClusterDns, DnsSockets, Ipv4Net, Kubelet, KubeletConfig, RangeOrigin, RangeOverlap,
};
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

/// What a flannel-style node has: a bridge `cni0` holding 10.244.0.1/24,
/// so the usual pod range 10.244.0.0/16 overlaps the route to its /24.
/// Made in the test's own network namespace, where its kubelet runs: the
/// machine and other tests never see it.
fn flannel_like_bridge() {
    add_link("cni0", "10.244.0.1/24");
}

#[test]
fn with_no_range_given_the_kubelet_steps_around_a_route_of_the_machine() {
    in_own_netns(|| async {
        flannel_like_bridge();
        let claims = tempfile::tempdir().unwrap();
        let claims_dir = claims.path().to_path_buf();
        let c = Cluster::start_with(203, move |cfg| {
            cfg.pod_ip_range = None;
            cfg.ip_claims_dir = Some(claims_dir);
        })
        .await;
        let picked = c.kubelet().pod_range().expect("a sandbox network").clone();
        let next: Ipv4Net = "10.245.0.0/16".parse().unwrap();
        assert_eq!(picked.range, next, "{picked}");
        assert_eq!(
            picked.origin,
            RangeOrigin::Picked {
                skipped: vec![RangeOverlap {
                    range: "10.244.0.0/16".parse().unwrap(),
                    route: "10.244.0.0/24".parse().unwrap(),
                    dev: Some("cni0".into()),
                }],
            }
        );
        assert_eq!(
            picked.to_string(),
            "10.245.0.0/16 (picked: 10.244.0.0/16 overlaps the route to 10.244.0.0/24 (dev cni0) on this machine)"
        );
        // The Node's /24 and a pod's address come from the picked range,
        // and the pod runs there.
        let cidr = c.pod_cidr().await;
        assert!(next.contains(cidr.addr()), "podCIDR {cidr}");
        c.create_pod(
            "metadata: {name: p}\nspec:\n  restartPolicy: Never\n  containers:\n  - {name: main, image: busybox, command: [sh, -c, 'exit 0']}\n",
        )
        .await;
        let pod = c
            .wait_pod("p", "phase Succeeded", |p| phase(p) == "Succeeded")
            .await;
        let ip: Ipv4Addr = pod.status.unwrap().pod_ip.unwrap().parse().unwrap();
        assert!(cidr.contains(ip), "pod IP {ip} outside {cidr}");
        c.stop().await;
    });
}

#[test]
fn a_given_pod_range_overlapping_a_route_of_the_machine_is_refused() {
    in_own_netns(|| async {
        flannel_like_bridge();
        let dir = tempfile::tempdir().unwrap();
        let (api, client) = hostmesh_testkit::cluster::api_server().await;
        let mut config =
            KubeletConfig::new("overlap-node", dir.path().join("kubelet")).for_api_server(&api);
        config.ip_claims_dir = Some(dir.path().join("claims"));
        config.pod_ip_range = Some("10.244.0.0/16".parse().unwrap());
        let err = Kubelet::start(client.clone(), config)
            .await
            .expect_err("an overlapping pod range is refused");
        assert_eq!(
            err.to_string(),
            "invalid kubelet configuration: the pod range 10.244.0.0/16 overlaps the route to \
             10.244.0.0/24 (dev cni0) already on this machine; choose another --pod-ip-range"
        );
        api.shutdown().await;
    });
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
