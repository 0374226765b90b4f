//! hostmesh actor runtime: meshes, identities, transport, procs, actors,
//! ports and supervision (the host agent lives in `host`).

pub mod host;
pub mod mesh;
