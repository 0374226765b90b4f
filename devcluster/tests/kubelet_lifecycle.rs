//! The kubelet's life and its pods' ends: Node registration and Lease,
//! binding, per-pod loopback IPs, `pods/log` through the API server, pod
//! deletion (SIGTERM, grace, SIGKILL; the processes are gone), and shutdown
//! leaving no process behind.

mod kubelet_common;

use std::io::{Read as _, Write as _};

use futures::AsyncBufReadExt as _;
use std::time::Duration;

use hostmesh_testkit::process::gone;
use hostmesh_testkit::{PATIENCE, eventually_ok};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, LogParams};
use kubelet_common::*;

fn node_ready(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_is_registered_ready_with_a_lease() {
    let c = Cluster::start_with(237, |cfg| cfg.gpu_capacity = 8).await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    let node = nodes.get(&c.node).await.unwrap();
    assert_eq!(node_ready(&node).as_deref(), Some("True"));
    let status = node.status.clone().unwrap();
    let capacity = status.capacity.unwrap();
    assert_eq!(capacity["nvidia.com/gpu"].0, "8");
    assert!(capacity.contains_key("cpu") && capacity.contains_key("memory"));
    let addresses = status.addresses.unwrap();
    assert!(
        addresses
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == "127.0.0.1")
    );
    assert_eq!(
        node.metadata.labels.unwrap()["kubernetes.io/hostname"],
        c.node
    );
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), "kube-node-lease");
    let lease = leases.get(&c.node).await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some(c.node.as_str())
    );
    // renewTime is a MicroTime as written: six fractional digits (a real
    // kube-apiserver refuses nine).
    let raw = c
        .client
        .request_text(
            http::Request::get(format!(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{}",
                c.node
            ))
            .body(Vec::new())
            .unwrap(),
        )
        .await
        .unwrap();
    let raw: serde_json::Value = serde_json::from_str(&raw).unwrap();
    let renew = raw["spec"]["renewTime"].as_str().unwrap().to_string();
    let frac = renew
        .split_once('.')
        .map(|(_, f)| f.trim_end_matches('Z'))
        .unwrap_or("");
    assert_eq!(frac.len(), 6, "renewTime {renew}");
    // The kubelet is never newer than its API server (version skew).
    let server_version = c.client.apiserver_version().await.unwrap().git_version;
    assert_eq!(
        node.status
            .as_ref()
            .unwrap()
            .node_info
            .as_ref()
            .unwrap()
            .kubelet_version,
        server_version
    );

    // nodeInfo as a kubelet fills it (`kubectl get nodes -o wide`).
    let info = node.status.as_ref().unwrap().node_info.clone().unwrap();
    assert_eq!(
        info.kernel_version,
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap()
            .trim()
    );
    let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let pretty = os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "Linux".into());
    assert_eq!(info.os_image, pretty);
    assert_eq!(
        info.container_runtime_version,
        format!("hostmesh-process://{}", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(
        (info.operating_system.as_str(), info.boot_id.is_empty()),
        ("linux", false)
    );

    // A second kubelet cannot take the same data directory.
    let err = hostmesh_devcluster::kubelet::Kubelet::start(
        c.client.clone(),
        test_config(c.dir.path(), "other-node"),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("another kubelet"), "{err}");

    let client = c.client.clone();
    let name = c.node.clone();
    let api = c.stop_kubelet_only().await;
    let node = Api::<Node>::all(client).get(&name).await.unwrap();
    assert_eq!(node_ready(&node).as_deref(), Some("Unknown"));
    api.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unscheduled_pods_are_bound_unless_another_scheduler_owns_them() {
    let c = Cluster::start(238).await;
    c.create_pod(
        "metadata: {name: other}\nspec:\n  schedulerName: volcano\n  containers: [{name: main, image: busybox, command: [sleep, '600']}]\n",
    )
    .await;
    c.create_pod(
        "metadata: {name: elsewhere}\nspec:\n  nodeSelector: {gpu: h100}\n  containers: [{name: main, image: busybox, command: [sleep, '600']}]\n",
    )
    .await;
    c.create_pod("metadata: {name: mine}\nspec:\n  containers: [{name: main, image: busybox, command: [sleep, '600']}]\n")
        .await;
    let pod = c
        .wait_pod("mine", "Running", |p| phase(p) == "Running")
        .await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(c.node.as_str())
    );
    assert_eq!(condition(&pod, "PodScheduled").as_deref(), Some("True"));
    // The pod loop handles watch events in order: both earlier pods were
    // considered before `mine` was bound.
    for name in ["other", "elsewhere"] {
        let p = c.pods().get(name).await.unwrap();
        assert_eq!(
            p.spec.unwrap().node_name,
            None,
            "{name} must stay unscheduled"
        );
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_listen_on_the_same_port_on_their_own_ips() {
    let c = Cluster::start(239).await;
    let python = python();
    for name in ["web-a", "web-b"] {
        c.create_pod(&format!(
            r#"
metadata: {{name: {name}}}
spec:
  volumes: [{{name: www, emptyDir: {{}}}}]
  initContainers:
  - name: page
    image: busybox
    command: [sh, -c, 'echo $(POD_NAME) > /hostmesh-kubelet-test/www/name']
    env: [{{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}]
    volumeMounts: [{{name: www, mountPath: /hostmesh-kubelet-test/www}}]
  containers:
  - name: web
    image: python
    command: [{python}, -m, http.server, --bind, $(POD_IP), --directory, /hostmesh-kubelet-test/www, "26600"]
    env: [{{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}]
    volumeMounts: [{{name: www, mountPath: /hostmesh-kubelet-test/www}}]
    readinessProbe: {{tcpSocket: {{port: 26600}}, periodSeconds: 1}}
"#
        ))
        .await;
    }
    let mut ips = Vec::new();
    let cidr = c.pod_cidr().await;
    for name in ["web-a", "web-b"] {
        let pod = c
            .wait_pod(name, "Ready", |p| {
                condition(p, "Ready").as_deref() == Some("True")
            })
            .await;
        let status = pod.status.unwrap();
        let ip = status.pod_ip.unwrap();
        let addr: std::net::Ipv4Addr = ip.parse().unwrap();
        assert!(
            cidr.contains(addr) && addr != cidr.addr(),
            "{ip} not in {cidr}"
        );
        assert_ne!(addr.octets()[3], 1, "{ip} is the gateway");
        assert_eq!(status.pod_ips.unwrap()[0].ip, ip);
        assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));
        let mut stream = std::net::TcpStream::connect((ip.as_str(), 26600)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        write!(stream, "GET /name HTTP/1.0\r\nHost: {ip}\r\n\r\n").unwrap();
        let mut body = String::new();
        stream.read_to_string(&mut body).unwrap();
        assert!(body.ends_with(&format!("\r\n\r\n{name}\n")), "{body}");
        ips.push(ip);
    }
    assert_ne!(ips[0], ips[1]);

    // A host-network pod's IP is the node's, and it takes none from the pool.
    c.create_pod(
        "metadata: {name: hostnet}\nspec:\n  hostNetwork: true\n  containers:\n  - {name: main, image: busybox, command: [sleep, '600']}\n",
    )
    .await;
    let pod = c
        .wait_pod("hostnet", "running", |p| container_pid(p, "main").is_some())
        .await;
    assert_eq!(pod.status.unwrap().pod_ip.as_deref(), Some("127.0.0.1"));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_served_through_the_api_server() {
    let c = Cluster::start(240).await;
    c.create_pod(
        "metadata: {name: talker}\nspec:\n  restartPolicy: Never\n  containers:\n  - {name: main, image: busybox, command: [sh, -c, 'for i in 1 2 3 4; do echo line $i; done']}\n",
    )
    .await;
    c.wait_pod("talker", "Succeeded", |p| phase(p) == "Succeeded")
        .await;
    let all = c
        .pods()
        .logs("talker", &LogParams::default())
        .await
        .unwrap();
    assert_eq!(all, "line 1\nline 2\nline 3\nline 4\n");
    let tail = c
        .pods()
        .logs(
            "talker",
            &LogParams {
                tail_lines: Some(2),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(tail, "line 3\nline 4\n");

    // `kubectl logs -f`: output arrives as it is written, and the stream
    // ends when the container exits.
    let go = c.dir.path().join("go");
    c.create_pod(&format!(
        "metadata: {{name: follower}}\nspec:\n  restartPolicy: Never\n  containers:\n  - {{name: main, image: busybox, command: [sh, -c, 'echo first; while [ ! -f {} ]; do sleep 0.1; done; echo second']}}\n",
        go.display()
    ))
    .await;
    c.wait_pod("follower", "running", |p| {
        container_pid(p, "main").is_some()
    })
    .await;
    let params = LogParams {
        follow: true,
        ..Default::default()
    };
    let mut lines = c
        .pods()
        .log_stream("follower", &params)
        .await
        .unwrap()
        .lines();
    async fn next<S: futures::Stream + Unpin>(lines: &mut S) -> Option<S::Item> {
        tokio::time::timeout(PATIENCE, futures::StreamExt::next(lines))
            .await
            .expect("log line in time")
    }
    assert_eq!(next(&mut lines).await.unwrap().unwrap(), "first");
    std::fs::write(&go, "").unwrap();
    assert_eq!(next(&mut lines).await.unwrap().unwrap(), "second");
    assert!(
        next(&mut lines).await.is_none(),
        "the stream must end with the container"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_pod_stops_its_processes_then_removes_it() {
    let c = Cluster::start(241).await;
    let pids = c.dir.path().join("pids");
    std::fs::create_dir_all(&pids).unwrap();
    let pids_dir = pids.display();
    // `polite` exits on SIGTERM; `stubborn` ignores it and needs SIGKILL.
    c.create_pod(&format!(
        r#"
metadata: {{name: doomed}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: polite
    image: busybox
    command: [sh, -c, 'trap "echo got TERM > {pids_dir}/polite-term; exit 0" TERM; sleep 600 & echo $! > {pids_dir}/polite-child; wait']
  - name: stubborn
    image: busybox
    command: [sh, -c, 'trap "" TERM; sleep 600 & echo $! > {pids_dir}/stubborn-child; while true; do sleep 1; done']
"#
    ))
    .await;
    let pod = c
        .wait_pod("doomed", "both running", |p| {
            container_pid(p, "polite").is_some() && container_pid(p, "stubborn").is_some()
        })
        .await;
    let mut all = vec![
        container_pid(&pod, "polite").unwrap(),
        container_pid(&pod, "stubborn").unwrap(),
    ];
    all.push(read_pid_file(&pids.join("polite-child")).await);
    all.push(read_pid_file(&pids.join("stubborn-child")).await);
    assert!(all.iter().all(|p| !gone(*p)));

    c.pods()
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    c.wait_pod_gone("doomed").await;
    wait_pids_gone(&all).await;
    let term = std::fs::read_to_string(pids.join("polite-term")).unwrap_or_default();
    assert_eq!(
        term, "got TERM\n",
        "the polite container must have been sent SIGTERM first"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_shutdown_leaves_no_process_behind() {
    let c = Cluster::start(242).await;
    let pids = c.dir.path().join("pids");
    std::fs::create_dir_all(&pids).unwrap();
    for name in ["one", "two"] {
        c.create_pod(&format!(
            "metadata: {{name: {name}}}\nspec:\n  containers:\n  - {{name: main, image: busybox, command: [sh, -c, 'sleep 600 & echo $! > {}/{name}; wait']}}\n",
            pids.display()
        ))
        .await;
    }
    let mut all = Vec::new();
    for name in ["one", "two"] {
        let pod = c
            .wait_pod(name, "running", |p| container_pid(p, "main").is_some())
            .await;
        all.push(container_pid(&pod, "main").unwrap());
        all.push(read_pid_file(&pids.join(name)).await);
    }
    assert!(all.iter().all(|p| !gone(*p)));
    c.stop().await;
    wait_pids_gone(&all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_pods_get_distinct_ips_and_all_stop_on_deletion() {
    let c = Cluster::start(244).await;
    const N: usize = 16;
    for i in 0..N {
        c.create_pod(&format!(
            "metadata: {{name: many-{i}, labels: {{batch: many}}}}\nspec:\n  terminationGracePeriodSeconds: 5\n  containers:\n  - {{name: main, image: busybox, command: [sleep, '600']}}\n"
        ))
        .await;
    }
    let mut pids = Vec::new();
    let mut ips = std::collections::BTreeSet::new();
    for i in 0..N {
        let pod = c
            .wait_pod(&format!("many-{i}"), "running", |p| {
                container_pid(p, "main").is_some()
            })
            .await;
        pids.push(container_pid(&pod, "main").unwrap());
        ips.insert(pod.status.unwrap().pod_ip.unwrap());
    }
    assert_eq!(ips.len(), N, "pod IPs must be distinct: {ips:?}");
    c.pods()
        .delete_collection(
            &DeleteParams::default(),
            &kube::api::ListParams::default().labels("batch=many"),
        )
        .await
        .unwrap();
    for i in 0..N {
        c.wait_pod_gone(&format!("many-{i}")).await;
    }
    wait_pids_gone(&pids).await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_kubelet_runs_its_pods_again_on_the_same_ip() {
    let mut c = Cluster::start(246).await;
    c.create_pod(
        "metadata: {name: survivor}\nspec:\n  containers:\n  - {name: main, image: busybox, command: [sleep, '600']}\n",
    )
    .await;
    c.create_pod(
        "metadata: {name: finished}\nspec:\n  restartPolicy: Never\n  containers:\n  - {name: main, image: busybox, command: [sh, -c, 'exit 0']}\n",
    )
    .await;
    let before = c
        .wait_pod("survivor", "running", |p| {
            container_pid(p, "main").is_some()
        })
        .await;
    let done = c
        .wait_pod("finished", "Succeeded", |p| phase(p) == "Succeeded")
        .await;
    let old_pid = container_pid(&before, "main").unwrap();
    let ip = before.status.as_ref().unwrap().pod_ip.clone().unwrap();

    c.restart_kubelet().await;
    wait_pids_gone(&[old_pid]).await;
    let after = c
        .wait_pod("survivor", "running again", |p| {
            container_pid(p, "main").is_some_and(|pid| pid != old_pid)
        })
        .await;
    assert_eq!(container(&after, "main").unwrap().restart_count, 1);
    assert_eq!(after.status.unwrap().pod_ip.unwrap(), ip);
    // A pod that had finished is left as it was.
    let still = c.pods().get("finished").await.unwrap();
    assert_eq!(phase(&still), "Succeeded");
    assert_eq!(
        container(&still, "main").unwrap().state,
        container(&done, "main").unwrap().state
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_binding_off_only_pods_bound_to_the_node_run() {
    let c = Cluster::start_with(247, |cfg| {
        cfg.bind_unscheduled = false;
        cfg.taints = vec![
            hostmesh_devcluster::kubelet::parse_taint("hostmesh.dev/process-kubelet").unwrap(),
        ];
    })
    .await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    let node = nodes.get(&c.node).await.unwrap();
    let taints = node.spec.unwrap().taints.unwrap();
    assert_eq!(taints[0].key, "hostmesh.dev/process-kubelet");
    assert_eq!(taints[0].effect, "NoSchedule");
    c.create_pod(
        "metadata: {name: unbound}\nspec:\n  containers: [{name: main, image: busybox, command: [sleep, '600']}]\n",
    )
    .await;
    c.create_pod(&format!(
        "metadata: {{name: pinned}}\nspec:\n  nodeName: {}\n  containers: [{{name: main, image: busybox, command: [sleep, '600']}}]\n",
        c.node
    ))
    .await;
    c.wait_pod("pinned", "Running", |p| phase(p) == "Running")
        .await;
    let unbound = c.pods().get("unbound").await.unwrap();
    assert_eq!(unbound.spec.unwrap().node_name, None);
    assert!(
        unbound
            .status
            .and_then(|s| s.phase)
            .is_none_or(|p| p == "Pending")
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_waits_for_an_api_server_that_is_still_starting() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut api_config = hostmesh_devcluster::apiserver::ApiServerConfig {
        data_dir: Some(dir.path().join("api")),
        ..Default::default()
    };
    // First run: credentials are made and kept in the data dir, the port is fixed.
    let (first, client) = hostmesh_testkit::cluster::api_server_with(api_config.clone()).await;
    api_config.listen = first.addr();
    first.shutdown().await;

    let config = test_config(dir.path(), "late-node");
    let kubelet = tokio::spawn(hostmesh_devcluster::kubelet::Kubelet::start(
        client.clone(),
        config,
    ));
    let (api, _) = hostmesh_testkit::cluster::api_server_with(api_config).await;
    let kubelet = kubelet
        .await
        .unwrap()
        .expect("the kubelet registers once the server is up");
    let node = Api::<Node>::all(client).get("late-node").await.unwrap();
    assert_eq!(node_ready(&node).as_deref(), Some("True"));
    kubelet.shutdown().await.unwrap();
    api.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_sharing_a_machine_never_share_a_pod_ip() {
    // Two clusters whose kubelets were given the same pod range: each
    // claims its own /24 of it.
    let a = Cluster::start(251).await;
    let b = Cluster::start(251).await;
    let (cidr_a, cidr_b) = (a.pod_cidr().await, b.pod_cidr().await);
    assert_ne!(cidr_a, cidr_b);
    let spec = "spec:\n  containers: [{name: main, image: busybox, command: [sleep, '600']}]\n";
    let mut ips = std::collections::BTreeSet::new();
    for (c, name) in [(&a, "a-0"), (&b, "b-0"), (&a, "a-1"), (&b, "b-1")] {
        c.create_pod(&format!("metadata: {{name: {name}}}\n{spec}"))
            .await;
        let pod = c
            .wait_pod(name, "running", |p| container_pid(p, "main").is_some())
            .await;
        ips.insert(pod.status.unwrap().pod_ip.unwrap());
    }
    assert_eq!(ips.len(), 4, "{ips:?}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_everything_even_when_the_api_server_is_gone() {
    let mut c = Cluster::start(252).await;
    c.create_pod("metadata: {name: orphan}\nspec:\n  containers:\n  - {name: main, image: busybox, command: [sleep, '600']}\n")
        .await;
    let pod = c
        .wait_pod("orphan", "running", |p| container_pid(p, "main").is_some())
        .await;
    let pid = container_pid(&pod, "main").unwrap();
    c.api.take().unwrap().shutdown().await;
    let kubelet = c.kubelet.take().unwrap();
    tokio::time::timeout(PATIENCE, kubelet.shutdown())
        .await
        .expect("shutdown finishes without the API server")
        .unwrap();
    wait_pids_gone(&[pid]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_restart_with_cached_secrets_while_the_api_server_is_down() {
    let mut c = Cluster::start(253).await;
    c.create::<k8s_openapi::api::core::v1::Secret>(
        "metadata: {name: cached}\nstringData: {token: t0k}\n",
    )
    .await;
    c.create_pod(
        r#"
metadata: {name: looper}
spec:
  volumes: [{name: state, emptyDir: {}}]
  containers:
  - name: main
    image: busybox
    command: [sh, -c, 'n=$(cat /hostmesh-kubelet-test/loop/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /hostmesh-kubelet-test/loop/n; echo "run $n $TOKEN"']
    env: [{name: TOKEN, valueFrom: {secretKeyRef: {name: cached, key: token}}}]
    volumeMounts: [{name: state, mountPath: /hostmesh-kubelet-test/loop}]
"#,
    )
    .await;
    c.wait_pod("looper", "a restart", |p| {
        container(p, "main").is_some_and(|s| s.restart_count >= 1)
    })
    .await;
    let uid = c.pods().get("looper").await.unwrap().metadata.uid.unwrap();
    let counter = c
        .dir
        .path()
        .join("kubelet/pods")
        .join(&uid)
        .join("volumes/state/n");
    c.api.take().unwrap().shutdown().await;
    let runs_before: u32 = std::fs::read_to_string(&counter)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Later runs, started with the API server gone, still get the token.
    let seen = eventually_ok("a restart after the API server went away", async || {
        let seen = c
            .kubelet()
            .logs("default", "looper", "main", None)
            .unwrap_or_default();
        let run: u32 = seen
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if run > runs_before + 1 {
            Ok(seen)
        } else {
            Err(seen)
        }
    })
    .await;
    assert!(seen.ends_with(" t0k\n"), "{seen:?}");
    let kubelet = c.kubelet.take().unwrap();
    tokio::time::timeout(PATIENCE, kubelet.shutdown())
        .await
        .unwrap()
        .unwrap();
}
