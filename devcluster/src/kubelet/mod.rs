//! The process kubelet: a Kubernetes Node that runs each pod's containers as
//! local processes, each pod in its own network and UTS namespace (or, with
//! `--pod-network=host`, on its own loopback IP). See `docs/kubelet.md`.
//!
//! Module map: `handle` (start, shutdown, logs API), `node` (Node object,
//! Lease heartbeat), `pods` (the pod watch: workers per bound pod, binding
//! unscheduled pods), `pod` (one pod's worker: volumes, init containers,
//! containers, restarts, probes, status, deletion), `status` (phase,
//! conditions, container statuses), `launch` / `env` / `expand` / `volumes` /
//! `ownership` (fsGroup and token owners)
//! (turning a container spec into a process launch), `process` (fork/exec in
//! a private mount namespace, signals), `probe`, `logs` (files and the
//! endpoint behind `pods/log`), `logrotate` (container log rotation),
//! `streaming` (exec, attach and port-forward endpoints), `devices` (GPUs
//! handed to containers, their health and its test hook), `schedule` (which
//! node an unscheduled pod fits), `serving` (HTTPS and client certificates for a real
//! kube-apiserver), `events`, `ipam` (pod IPs), `net` (pod sandboxes: namespaces,
//! bridge, veths, `/etc` files), `agent_copy` (one agent binary per node,
//! linked into host pods), `config`,
//! `error`, `shared`.
//!
//! Invariants:
//! 1. Every process the kubelet starts belongs to a process group it tracks
//!    until the group is gone; `KubeletHandle::shutdown` (and, as a last
//!    resort, dropping the handle) ends them all.
//! 2. A pod IP belongs to one live pod at a time (`ipam`).
//! 3. Only the pod's worker writes the pod's status; before the pod is
//!    bound, only its `PodScheduled=False` condition is written, by the
//!    binding side (`pods`, `schedule`).
//! 4. A pod's sandbox lives from before its first container starts until
//!    after its last process is gone; the node's bridge from `start` to
//!    `shutdown` (`net`).

mod agent_copy;
mod config;
mod devices;
mod env;
mod error;
mod events;
mod expand;
mod handle;
mod ipam;
mod launch;
mod logrotate;
mod logs;
mod net;
mod node;
mod ownership;
mod pod;
mod pods;
mod probe;
mod process;
mod schedule;
mod serving;
mod shared;
mod status;
mod streaming;
mod volumes;

pub use config::{
    HOSTMESH_IMAGE_PATTERN, ImageEntry, ImageTable, KubeletArgs, KubeletConfig, parse_pod_ip_range,
    parse_taint,
};
pub use error::{KubeletError, Result};
pub use handle::{Kubelet, KubeletHandle, PodBridge, cluster_dns, delete_dead_bridge, run};
pub use logrotate::{
    DEFAULT_MAX_FILES as DEFAULT_CONTAINER_LOG_MAX_FILES,
    DEFAULT_MAX_SIZE as DEFAULT_CONTAINER_LOG_MAX_SIZE, parse_size as parse_log_size,
};
pub use net::{
    BRIDGE_PREFIX, CLUSTER_DNS_IP, CLUSTER_DOMAIN, ClusterDns, DnsPod, DnsSockets, Ipv4Net,
    PodNetwork, PodRange, RangeOrigin, RangeOverlap, VETH_PREFIX, veth_name,
};
