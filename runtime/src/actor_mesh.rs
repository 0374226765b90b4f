//! Actor meshes (todo).
