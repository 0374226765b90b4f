//! hostmesh operator library: the controllers, the supervision hub, the
//! cluster-in-a-box glue, and the operability parts (metrics, health
//! endpoint, leader election, logging, `hostmesh status`) used by the
//! `hostmesh` binary.

pub mod health;
pub mod leader;
pub mod manifest;
pub mod metrics;
pub mod status;
pub mod telemetry;
