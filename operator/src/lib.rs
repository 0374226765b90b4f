//! hostmesh operator library: the controllers, the supervision hub, and the
//! operability parts (metrics, health endpoint, leader election, logging,
//! `hostmesh status`) used by the `hostmesh` binary.

pub mod health;
pub mod leader;
pub mod metrics;
pub mod telemetry;
