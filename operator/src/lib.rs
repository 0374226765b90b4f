//! hostmesh operator: controllers, supervision hub, and the cluster-in-a-box glue.

pub mod manifest;
