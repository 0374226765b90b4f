//! hostmesh end-to-end test support.
