//! Cluster in a box: an embedded Kubernetes API server (`apiserver`) and a
//! process kubelet (`kubelet`), plus the Deployment/ReplicaSet controllers
//! (`controllers`, including the EndpointSlice controller) and the cluster
//! DNS server (`dns`), so hostmesh runs and is tested against real
//! Kubernetes clients with no cluster.

pub mod apiserver;
pub mod controllers;
pub mod dns;
pub mod kubelet;
mod streams;
