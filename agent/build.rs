//! Gives the agent crate its build id, `HOSTMESH_AGENT_BUILD`: a 64-bit
//! FNV-1a hash, as 16 hex digits, of every file of the workspace crates the
//! agent is built from (`agent`, `runtime`, `mesh`, `net`), of the
//! workspace's `Cargo.lock` and of the build profile. Both binaries that
//! link the agent (the full `hostmesh` and the agent-only `hostmesh-agent`)
//! carry it, so `install-agent` can tell an agent-only build of the same
//! sources from a stale one left in a build folder (`src/install.rs`,
//! invariant 1). The script reruns when any of those files changes; a
//! crate folder that is not there (a packaged crate) is left out.

use std::path::{Path, PathBuf};

/// The workspace crates whose sources make up the agent.
const CRATES: [&str; 4] = ["agent", "runtime", "mesh", "net"];

/// FNV-1a, 64 bits: stable across toolchains, unlike std's hasher.
struct Fnv(u64);

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Every file under `dir`, sorted, skipping hidden entries.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        match e.file_type() {
            Ok(t) if t.is_dir() => files(&path, out),
            Ok(t) if t.is_file() => out.push(path),
            _ => {}
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let workspace = manifest.parent().unwrap_or(&manifest).to_path_buf();
    let mut hash = Fnv(0xcbf2_9ce4_8422_2325);
    let mut inputs = vec![workspace.join("Cargo.lock")];
    for name in CRATES {
        let dir = workspace.join(name);
        if !dir.join("Cargo.toml").is_file() {
            continue;
        }
        println!("cargo:rerun-if-changed={}", dir.display());
        files(&dir, &mut inputs);
    }
    let lock = &inputs[0];
    if lock.is_file() {
        println!("cargo:rerun-if-changed={}", lock.display());
    }
    inputs[1..].sort();
    for path in &inputs {
        let Ok(bytes) = std::fs::read(path) else {
            continue;
        };
        let rel = path.strip_prefix(&workspace).unwrap_or(path);
        hash.write(rel.to_string_lossy().as_bytes());
        hash.write(&[0]);
        hash.write(&bytes);
    }
    for var in ["PROFILE", "OPT_LEVEL", "DEBUG", "TARGET"] {
        hash.write(std::env::var(var).unwrap_or_default().as_bytes());
        hash.write(&[0]);
    }
    println!("cargo:rustc-env=HOSTMESH_AGENT_BUILD={:016x}", hash.0);
}
