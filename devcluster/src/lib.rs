//! Cluster in a box: an embedded Kubernetes API server (`apiserver`) and a
//! process kubelet (`kubelet`), so hostmesh runs and is tested against real
//! Kubernetes clients with no cluster.

pub mod apiserver;
pub mod kubelet;
