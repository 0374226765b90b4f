//! Pod sandboxes leave nothing behind: 100 pods created and deleted (ten at
//! a time) leave no network namespace, veth, bridge port, address or route;
//! stopping the kubelet removes its bridge. One test in this binary, so the
//! namespaces this process holds are the kubelet's alone.

mod kubelet_common;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use hostmesh_devcluster::kubelet::{Ipv4Net, VETH_PREFIX};
use hostmesh_testkit::eventually_ok;
use kube::api::DeleteParams;
use kubelet_common::*;

const CYCLES: usize = 100;
const PARALLEL: usize = 10;

/// Network namespaces this process holds descriptors of (the kubelet keeps
/// one per pod sandbox).
fn held_netns() -> BTreeSet<String> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|t| t.to_string_lossy().into_owned())
        .filter(|t| t.starts_with("net:["))
        .collect()
}

/// Host ends of veths of pods in `cidr` (the name encodes the address).
fn veths_in(cidr: Ipv4Net) -> Vec<String> {
    std::fs::read_dir("/sys/class/net")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n.strip_prefix(VETH_PREFIX)
                .and_then(|hex| u32::from_str_radix(hex, 16).ok())
                .is_some_and(|ip| cidr.contains(Ipv4Addr::from(ip)))
        })
        .collect()
}

fn bridge_of(cidr: Ipv4Net) -> String {
    let [a, b, c, _] = cidr.addr().octets();
    format!("hmbr{a}.{b}.{c}")
}

/// Ports of `bridge`.
fn bridge_ports(bridge: &str) -> Vec<String> {
    std::fs::read_dir(format!("/sys/class/net/{bridge}/brif"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Routes of the machine into `cidr` that are not the bridge's own.
fn foreign_routes(cidr: Ipv4Net, bridge: &str) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/net/route").unwrap();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let dest = u32::from_str_radix(f.get(1)?, 16).ok()?;
            let dest = Ipv4Addr::from(u32::from_be(dest));
            (cidr.contains(dest) && f[0] != bridge).then(|| l.to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_pods_leave_no_namespace_veth_or_route_behind() {
    let before = held_netns();
    let c = Cluster::start(203).await;
    let cidr = c.pod_cidr().await;
    let bridge = bridge_of(cidr);
    assert!(
        std::path::Path::new("/sys/class/net")
            .join(&bridge)
            .exists(),
        "the kubelet made its bridge {bridge}"
    );
    let mut seen_ips = BTreeSet::new();
    for round in 0..CYCLES / PARALLEL {
        let names: Vec<String> = (0..PARALLEL)
            .map(|i| format!("churn-{round}-{i}"))
            .collect();
        for name in &names {
            c.create_pod(&format!(
                "metadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: main, image: busybox, command: [sleep, '600']}}\n"
            ))
            .await;
        }
        for name in &names {
            let pod = c
                .wait_pod(name, "running", |p| container_pid(p, "main").is_some())
                .await;
            seen_ips.insert(pod.status.unwrap().pod_ip.unwrap());
        }
        // While they run: one namespace and one veth on the bridge each.
        assert_eq!(veths_in(cidr).len(), PARALLEL, "round {round}");
        assert_eq!(
            held_netns().difference(&before).count(),
            PARALLEL,
            "round {round}"
        );
        assert_eq!(bridge_ports(&bridge).len(), PARALLEL, "round {round}");
        for name in &names {
            c.pods()
                .delete(name, &DeleteParams::default())
                .await
                .unwrap();
        }
        for name in &names {
            c.wait_pod_gone(name).await;
        }
    }
    assert!(seen_ips.len() >= PARALLEL, "{seen_ips:?}");
    eventually_ok("every sandbox to be gone", async || {
        let left = (
            held_netns()
                .difference(&before)
                .cloned()
                .collect::<Vec<_>>(),
            veths_in(cidr),
            bridge_ports(&bridge),
            foreign_routes(cidr, &bridge),
        );
        if left.0.is_empty() && left.1.is_empty() && left.2.is_empty() && left.3.is_empty() {
            Ok(())
        } else {
            Err(left)
        }
    })
    .await;
    c.stop().await;
    assert!(
        !std::path::Path::new("/sys/class/net")
            .join(&bridge)
            .exists(),
        "stopping the kubelet removes {bridge}"
    );
    assert_eq!(held_netns(), before);
}
