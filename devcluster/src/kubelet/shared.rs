//! State shared by the kubelet's tasks: the client, the configuration, the
//! pod IP pool, the node's pod network, the registry of live process groups and the directory of
//! pods on this node (for logs).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

use super::config::{ImageTable, KubeletConfig};
use super::ipam::IpPool;
use super::net::{ApiService, NodeNetwork};

/// Where a pod on this node keeps its files.
#[derive(Debug, Clone)]
pub(crate) struct PodEntry {
    /// The pod's uid.
    pub(crate) uid: String,
    /// `<data_dir>/pods/<uid>`.
    pub(crate) dir: PathBuf,
    /// Names of the containers whose process is running now (a followed log
    /// ends when its container is no longer in here).
    pub(crate) running: Arc<Mutex<BTreeSet<String>>>,
    /// The running containers' processes by container name, for exec,
    /// attach and port-forward (`streaming`).
    pub(crate) targets: Arc<Mutex<BTreeMap<String, ExecTarget>>>,
}

/// A running container as exec and port-forward reach it: its process
/// (whose namespaces they join) and how it was launched (environment,
/// user, working directory).
#[derive(Debug, Clone)]
pub(crate) struct ExecTarget {
    /// The container's main process.
    pub(crate) pid: i32,
    /// The container's launch.
    pub(crate) launch: super::process::Launch,
    /// The pod's IP.
    pub(crate) pod_ip: std::net::Ipv4Addr,
}

/// Shared by the node loop, the pod loop and every pod worker.
pub(crate) struct Shared {
    /// API client.
    pub(crate) client: kube::Client,
    /// Configuration.
    pub(crate) config: KubeletConfig,
    /// Images to programs, with the hostmesh image.
    pub(crate) images: ImageTable,
    /// Pod IPs.
    pub(crate) ips: Mutex<IpPool>,
    /// The node's /24 and bridge (`None` with `--pod-network=host`).
    pub(crate) network: Option<NodeNetwork>,
    /// The `kubernetes` Service as sandboxed pods reach it, once read.
    pub(crate) api_service: tokio::sync::Mutex<Option<ApiService>>,
    /// Process groups that may still have members.
    pub(crate) groups: Arc<Mutex<BTreeSet<i32>>>,
    /// Pods on this node by (namespace, name).
    pub(crate) pods: Mutex<BTreeMap<(String, String), PodEntry>>,
    /// Cancelled when the kubelet shuts down.
    pub(crate) shutdown: CancellationToken,
    /// When the kubelet started (the Node's condition transition time).
    pub(crate) started_at: k8s_openapi::jiff::Timestamp,
    /// Port of the log endpoint (0: not served), published in the Node.
    pub(crate) log_port: Mutex<u16>,
    /// Bounds on concurrent exec, attach and port-forward sessions.
    pub(crate) stream_limits: super::streaming::StreamLimits,
    /// What log rotation cut from the front of each live container log.
    pub(crate) log_cuts: super::logrotate::Cuts,
    /// The node's devices, their holders and health (`devices`).
    pub(crate) devices: Mutex<super::devices::Devices>,
    /// Bumped when a held device's health changes.
    pub(crate) device_changes: tokio::sync::watch::Sender<u64>,
    /// The node's one agent binary, linked into host pods (`agent_copy`).
    pub(crate) agent_copy: Option<super::agent_copy::AgentCopy>,
}

/// A pod's namespace (`default` when unset) and name.
pub(crate) fn pod_key(pod: &k8s_openapi::api::core::v1::Pod) -> (String, String) {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    (ns, pod.metadata.name.clone().unwrap_or_default())
}

/// Locks a mutex, recovering from poisoning (the data stays consistent:
/// every critical section is a single insert or remove).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// The directory of pod `uid`.
    pub(crate) fn pod_dir(&self, uid: &str) -> PathBuf {
        self.config.data_dir.join("pods").join(uid)
    }
}
