//! placeholder

pub mod kubelet;
