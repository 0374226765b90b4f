//! The Node object: registration with capacity and addresses, the Ready
//! condition, and the Lease heartbeat in `kube-node-lease`.
//!
//! Invariants:
//! 1. The Node exists with a Ready=True condition before `Kubelet::start`
//!    returns; a deleted Node is registered again on the next heartbeat.
//! 2. The Lease `kube-node-lease/<node>` is renewed every quarter of its
//!    duration while the kubelet runs.
//! 3. On shutdown the Ready condition becomes Unknown (reason
//!    `KubeletStopped`), as when a node stops posting status.
//! 4. The Lease's `renewTime` is a `MicroTime`: exactly six fractional
//!    digits (kube-apiserver refuses nine).
//! 5. The reported `kubeletVersion` is the API server's own `gitVersion`
//!    (read when registering): the version-skew policy forbids a kubelet
//!    newer than its API server.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use super::error::{KubeletError, Result};
use super::shared::{Shared, lock};

/// The version reported before the API server's is known (a kubelet that
/// cannot read `/version` registers no Node anyway).
const FALLBACK_VERSION: &str = "v1.33.0";

/// The API server's `gitVersion` per running kubelet (keyed by the address
/// of its `Shared`, which lives as long as the kubelet), read by `register`.
static SERVER_VERSIONS: std::sync::Mutex<std::collections::BTreeMap<usize, String>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn shared_key(shared: &Shared) -> usize {
    std::ptr::from_ref(shared) as usize
}

/// The kubelet version to report (invariant 5).
fn kubelet_version(shared: &Shared) -> String {
    lock(&SERVER_VERSIONS)
        .get(&shared_key(shared))
        .cloned()
        .unwrap_or_else(|| FALLBACK_VERSION.to_string())
}

/// Forgets the API server version of a kubelet that stops.
fn forget_version(shared: &Shared) {
    lock(&SERVER_VERSIONS).remove(&shared_key(shared));
}

/// The current time as a `MicroTime` (invariant 4).
fn micro_now() -> serde_json::Value {
    serde_json::to_value(MicroTime(Timestamp::now())).unwrap_or(serde_json::Value::Null)
}

/// Namespace of node leases.
pub(crate) const LEASE_NAMESPACE: &str = "kube-node-lease";

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn memory_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(4 * 1024 * 1024)
}

fn kernel_version() -> String {
    read_trimmed("/proc/sys/kernel/osrelease")
}

/// `nodeInfo.containerRuntimeVersion`: the runtime's name and version, as
/// `containerd://1.7.0` names containerd's (`kubectl get nodes -o wide`).
const RUNTIME_VERSION: &str = concat!("hostmesh-process://", env!("CARGO_PKG_VERSION"));

/// A small system file's text, trimmed; empty when it cannot be read (a
/// container without DMI, a machine without a machine id).
fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `nodeInfo.osImage`: `PRETTY_NAME` of `/etc/os-release`, as a kubelet
/// reports it; `Linux` when the file says nothing.
fn os_image() -> String {
    let text = std::fs::read_to_string("/etc/os-release")
        .or_else(|_| std::fs::read_to_string("/usr/lib/os-release"))
        .unwrap_or_default();
    pretty_name(&text).unwrap_or_else(|| "Linux".into())
}

/// The `PRETTY_NAME` value of an os-release file (quotes removed).
fn pretty_name(os_release: &str) -> Option<String> {
    os_release.lines().find_map(|l| {
        let v = l.trim().strip_prefix("PRETTY_NAME=")?;
        let v = v.trim().trim_matches(|c| c == '"' || c == '\'');
        (!v.is_empty()).then(|| v.to_string())
    })
}

/// The Node's labels.
pub(crate) fn labels(node: &str) -> serde_json::Value {
    json!({
        "kubernetes.io/hostname": node,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": arch(),
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": arch(),
        "hostmesh.dev/process-kubelet": "true",
    })
}

fn ready_condition(
    status: &str,
    reason: &str,
    message: &str,
    transition: &str,
) -> serde_json::Value {
    let now = Timestamp::now().to_string();
    json!({
        "type": "Ready", "status": status, "reason": reason, "message": message,
        "lastHeartbeatTime": now, "lastTransitionTime": transition,
    })
}

fn pressure(type_: &str, reason: &str, transition: &str) -> serde_json::Value {
    let now = Timestamp::now().to_string();
    json!({
        "type": type_, "status": "False", "reason": reason,
        "message": "the process kubelet does not track this pressure",
        "lastHeartbeatTime": now, "lastTransitionTime": transition,
    })
}

/// The Node's full status.
pub(crate) fn node_status(shared: &Shared, transition: &str) -> serde_json::Value {
    let cfg = &shared.config;
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut capacity = json!({
        "cpu": cpus.to_string(),
        "memory": format!("{}Ki", memory_kib()),
        "pods": cfg.max_pods.to_string(),
        "ephemeral-storage": "100Gi",
    });
    if cfg.gpu_capacity > 0 {
        capacity["nvidia.com/gpu"] = json!(cfg.gpu_capacity.to_string());
    }
    json!({
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [
            pressure("MemoryPressure", "KubeletHasSufficientMemory", transition),
            pressure("DiskPressure", "KubeletHasNoDiskPressure", transition),
            pressure("PIDPressure", "KubeletHasSufficientPID", transition),
            ready_condition("True", "KubeletReady", "hostmesh process kubelet is posting ready status", transition),
        ],
        "addresses": if cfg.advertise_hostname {
            json!([
                {"type": "InternalIP", "address": cfg.node_ip.to_string()},
                {"type": "Hostname", "address": cfg.node_name},
            ])
        } else {
            json!([{"type": "InternalIP", "address": cfg.node_ip.to_string()}])
        },
        "daemonEndpoints": {"kubeletEndpoint": {"Port": *lock(&shared.log_port)}},
        "nodeInfo": {
            "machineID": read_trimmed("/etc/machine-id"),
            "systemUUID": read_trimmed("/sys/class/dmi/id/product_uuid"),
            "bootID": read_trimmed("/proc/sys/kernel/random/boot_id"),
            "kernelVersion": kernel_version(),
            "osImage": os_image(),
            "containerRuntimeVersion": RUNTIME_VERSION,
            "kubeletVersion": kubelet_version(shared),
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": arch(),
        },
    })
}

/// The Node's spec: taints, and the node's /24 as `podCIDR(s)` unless the
/// Node already has another (it is immutable once set).
fn node_spec(shared: &Shared, existing: Option<&Node>) -> serde_json::Value {
    let mut spec = json!({"taints": shared.config.taints});
    if let Some(net) = &shared.network {
        let cidr = net.subnet.to_string();
        let current = existing
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.pod_cidr.clone())
            .filter(|c| !c.is_empty());
        match current {
            Some(c) if c != cidr => {
                tracing::warn!(node = %shared.config.node_name, node_pod_cidr = %c, ours = %cidr, "the Node keeps its podCIDR (immutable); pods use ours");
            }
            _ => {
                spec["podCIDR"] = json!(cidr);
                spec["podCIDRs"] = json!([cidr]);
            }
        }
    }
    spec
}

/// Creates the Node if it does not exist and posts its status.
pub(crate) async fn register(shared: &Shared) -> Result<()> {
    let name = &shared.config.node_name;
    let version = shared
        .client
        .apiserver_version()
        .await
        .map_err(|e| KubeletError::api("read the API server's /version".to_string(), e))?;
    lock(&SERVER_VERSIONS).insert(shared_key(shared), version.git_version);
    let api: Api<Node> = Api::all(shared.client.clone());
    let existing = api
        .get_opt(name)
        .await
        .map_err(|e| KubeletError::api(format!("get node {name}"), e))?;
    if existing.is_none() {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels(name)},
            "spec": node_spec(shared, None),
        }))
        .map_err(|e| KubeletError::Config(format!("node object: {e}")))?;
        match api.create(&PostParams::default(), &node).await {
            Ok(_) => tracing::info!(node = %name, "registered node"),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(KubeletError::api(format!("create node {name}"), e)),
        }
    } else {
        let patch = json!({"metadata": {"labels": labels(name)}, "spec": node_spec(shared, existing.as_ref())});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| KubeletError::api(format!("label node {name}"), e))?;
    }
    post_status(shared).await
}

/// Posts the Node's status (Ready, with a fresh heartbeat time).
pub(crate) async fn post_status(shared: &Shared) -> Result<()> {
    let name = &shared.config.node_name;
    let api: Api<Node> = Api::all(shared.client.clone());
    let transition = shared.started_at.to_string();
    let patch = json!({"status": node_status(shared, &transition)});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| KubeletError::api(format!("update status of node {name}"), e))?;
    Ok(())
}

/// Marks the Node's Ready condition Unknown (the kubelet stopped).
pub(crate) async fn post_stopped(shared: &Shared) -> Result<()> {
    forget_version(shared);
    let name = &shared.config.node_name;
    let api: Api<Node> = Api::all(shared.client.clone());
    let now = Timestamp::now().to_string();
    let patch = json!({"status": {"conditions": [
        pressure("MemoryPressure", "KubeletHasSufficientMemory", &now),
        pressure("DiskPressure", "KubeletHasNoDiskPressure", &now),
        pressure("PIDPressure", "KubeletHasSufficientPID", &now),
        ready_condition("Unknown", "KubeletStopped", "the process kubelet stopped", &now),
    ]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| KubeletError::api(format!("update status of node {name}"), e))?;
    Ok(())
}

async fn ensure_lease_namespace(shared: &Shared) {
    let api: Api<Namespace> = Api::all(shared.client.clone());
    let ns: Namespace = match serde_json::from_value(json!({"metadata": {"name": LEASE_NAMESPACE}}))
    {
        Ok(ns) => ns,
        Err(_) => return,
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => tracing::info!("created namespace {LEASE_NAMESPACE}"),
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 403 => {}
        Err(e) => tracing::warn!(error = %e, "cannot create namespace {LEASE_NAMESPACE}"),
    }
}

/// Renews (or creates) the node Lease.
pub(crate) async fn renew_lease(shared: &Shared) -> Result<()> {
    let name = &shared.config.node_name;
    let api: Api<Lease> = Api::namespaced(shared.client.clone(), LEASE_NAMESPACE);
    let now = micro_now();
    let duration = shared.config.lease_duration.as_secs() as i32;
    match api
        .get_opt(name)
        .await
        .map_err(|e| KubeletError::api(format!("get lease {LEASE_NAMESPACE}/{name}"), e))?
    {
        Some(_) => {
            let patch = json!({"spec": {"holderIdentity": name, "leaseDurationSeconds": duration, "renewTime": now}});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| {
                    KubeletError::api(format!("renew lease {LEASE_NAMESPACE}/{name}"), e)
                })?;
        }
        None => {
            let nodes: Api<Node> = Api::all(shared.client.clone());
            let owner = nodes
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|n| n.metadata.uid);
            let mut lease = json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": LEASE_NAMESPACE},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": duration, "renewTime": now},
            });
            if let Some(uid) = owner {
                lease["metadata"]["ownerReferences"] =
                    json!([{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}]);
            }
            let lease: Lease = serde_json::from_value(lease)
                .map_err(|e| KubeletError::Config(format!("lease object: {e}")))?;
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    return Err(KubeletError::api(
                        format!("create lease {LEASE_NAMESPACE}/{name}"),
                        e,
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Keeps the Node registered and its Lease fresh until shutdown.
pub(crate) async fn heartbeat(shared: Arc<Shared>) {
    ensure_lease_namespace(&shared).await;
    let period = shared.config.lease_duration / 4;
    let mut ticks: u64 = 0;
    loop {
        if let Err(e) = renew_lease(&shared).await {
            tracing::warn!(error = %e, "node lease heartbeat failed");
        }
        if ticks % 4 == 3 {
            let result = match post_status(&shared).await {
                Err(KubeletError::Api {
                    source: kube::Error::Api(s),
                    ..
                }) if s.code == 404 => register(&shared).await,
                other => other,
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, "node status heartbeat failed");
            }
        }
        ticks += 1;
        tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            _ = tokio::time::sleep(period.max(Duration::from_secs(1))) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_image_is_the_pretty_name_of_os_release() {
        let text = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\n";
        assert_eq!(
            pretty_name(text).as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(pretty_name("ID=alpine\n"), None);
        assert!(RUNTIME_VERSION.starts_with("hostmesh-process://"));
    }
}
