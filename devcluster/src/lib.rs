//! Cluster in a box: an embedded Kubernetes API server (`apiserver`) and a
//! process kubelet (`kubelet`), plus the Deployment/ReplicaSet controllers
//! (`controllers`, including the EndpointSlice controller) and the cluster
//! DNS server (`dns`), and `private_dir` (0700 directories for state that
//! holds credentials), so hostmesh runs and is tested against real
//! Kubernetes clients with no cluster.

pub mod apiserver;
pub mod controllers;
pub mod dns;
pub mod kubelet;
pub mod private_dir;
mod streams;
