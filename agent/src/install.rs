//! `install-agent`: puts the agent binary into a host pod's shared volume
//! (the `hostmesh-install` init container, docs/architecture.md "Host
//! pods").
//!
//! Invariants:
//! 1. What is installed is the agent-only build, `hostmesh-agent`
//!    ([`AGENT_BINARY`]), when it lies beside the running executable (the
//!    image ships both) and carries the same build id ([`BUILD`], the hash
//!    of the agent's sources, `build.rs`); otherwise the running executable
//!    itself (the full `hostmesh`, which also serves `agent`). A build
//!    folder keeps an agent-only build from an earlier `cargo build` when
//!    `cargo run --bin hostmesh` rebuilds only the full one: that stale
//!    agent is never installed.
//! 2. A destination that already holds the same bytes is left as it is
//!    (the process kubelet links one copy per node there before the init
//!    container runs): nothing is copied.
//! 3. Otherwise the binary is hard-linked when the destination is on the
//!    same mount, else copied, through a temporary file renamed into place,
//!    mode 0755: a reader never sees a partial binary.

use std::io::Read as _;
use std::path::{Path, PathBuf};

/// The agent-only binary's file name (invariant 1).
pub const AGENT_BINARY: &str = "hostmesh-agent";

/// This build's id: the hash of the agent's sources (`build.rs`).
pub const BUILD: &str = env!("HOSTMESH_AGENT_BUILD");

/// How every binary that links the agent carries [`BUILD`] in its bytes,
/// to be found there by [`build_of`].
const MARKER: &str = concat!("hostmesh-agent-build:", env!("HOSTMESH_AGENT_BUILD"), ";");

/// The build id a binary at `path` carries (its marker, [`MARKER`]);
/// `None` when it has none or cannot be read.
pub fn build_of(path: &Path) -> Option<String> {
    static FIND: std::sync::LazyLock<regex::bytes::Regex> = std::sync::LazyLock::new(|| {
        regex::bytes::Regex::new(r"hostmesh-agent-build:([0-9a-f]{16});").expect("a valid regex")
    });
    if is_running_executable(path) {
        return Some(BUILD.to_string());
    }
    let bytes = std::fs::read(path).ok()?;
    let id = FIND.captures(&bytes)?.get(1)?;
    String::from_utf8(id.as_bytes().to_vec()).ok()
}

/// Whether `path` is this process's own executable (its build is
/// [`BUILD`], nothing to read).
fn is_running_executable(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let (Ok(a), Ok(b)) = (std::fs::metadata(path), std::fs::metadata("/proc/self/exe")) else {
        return false;
    };
    // The marker is referenced here, so every binary that can install the
    // agent carries it.
    std::hint::black_box(MARKER);
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// Why the agent could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("cannot install the agent to {}: {what}", to.display())]
pub struct InstallError {
    /// The destination.
    pub to: PathBuf,
    /// The step that failed.
    pub what: String,
    /// The system's reason.
    #[source]
    pub source: std::io::Error,
}

/// The binary `install-agent` run from `exe` installs (invariant 1).
pub fn agent_source(exe: &Path) -> PathBuf {
    let beside = exe.with_file_name(AGENT_BINARY);
    if beside == exe || !beside.is_file() {
        return exe.to_path_buf();
    }
    let (ours, theirs) = (build_of(exe), build_of(&beside));
    if ours.is_some() && ours == theirs {
        beside
    } else {
        tracing::debug!(
            beside = %beside.display(),
            ?ours,
            ?theirs,
            "the agent-only build beside is of other sources; installing the executable itself"
        );
        exe.to_path_buf()
    }
}

/// Whether `a` and `b` hold the same bytes (invariant 2).
pub fn same_bytes(a: &Path, b: &Path) -> std::io::Result<bool> {
    let (ma, mb) = (std::fs::metadata(a)?, std::fs::metadata(b)?);
    if ma.len() != mb.len() {
        return Ok(false);
    }
    {
        use std::os::unix::fs::MetadataExt as _;
        if ma.dev() == mb.dev() && ma.ino() == mb.ino() {
            return Ok(true);
        }
    }
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok(true);
        }
        fb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// Installs the agent at `to` for the running executable `exe`
/// (invariants 1-3).
pub fn install(exe: &Path, to: &Path) -> Result<(), InstallError> {
    use std::os::unix::fs::PermissionsExt as _;
    let err = |what: String| {
        let to = to.to_path_buf();
        move |source| InstallError { to, what, source }
    };
    let mut source = agent_source(exe);
    // The running program is read through /proc/self/exe, which reaches it
    // even where this user cannot enter the directories above it (the
    // process kubelet runs the image's program from wherever it is).
    if source == exe && Path::new("/proc/self/exe").exists() {
        source = PathBuf::from("/proc/self/exe");
    }
    if to.exists() && same_bytes(&source, to).unwrap_or(false) {
        return Ok(());
    }
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).map_err(err(format!("creating {}", dir.display())))?;
    }
    let tmp = to.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let link_from: &Path = if source == Path::new("/proc/self/exe") {
        exe
    } else {
        &source
    };
    let linked = std::fs::hard_link(link_from, &tmp).is_ok();
    if !linked {
        std::fs::copy(&source, &tmp).map_err(err(format!(
            "copying {} to {}",
            source.display(),
            tmp.display()
        )))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .map_err(err(format!("making {} executable", tmp.display())))?;
    }
    std::fs::rename(&tmp, to).map_err(err(format!("renaming {} into place", tmp.display())))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_only_build_beside_the_executable_is_installed() {
        let dir = tempfile::tempdir().unwrap();
        let full = dir.path().join("hostmesh");
        std::fs::write(&full, format!("full build {MARKER} end")).unwrap();
        assert_eq!(agent_source(&full), full, "alone: the executable itself");
        let small = dir.path().join(AGENT_BINARY);
        let agent = format!("agent build {MARKER}");
        std::fs::write(&small, &agent).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&small, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(agent_source(&full), small);
        assert_eq!(agent_source(&small), small);
        let to = dir.path().join("vol/bin/hostmesh");
        install(&full, &to).unwrap();
        assert_eq!(std::fs::read(&to).unwrap(), agent.as_bytes());
        let mode = std::fs::metadata(&to).unwrap().permissions().mode();
        assert_eq!(mode & 0o111, 0o111, "executable: {mode:o}");
        assert!(!to.with_extension("tmp").exists());
    }

    /// `cargo run --bin hostmesh` rebuilds the full binary alone: the
    /// agent-only build an earlier `cargo build` left beside it is of other
    /// sources, and the executable itself is installed.
    #[test]
    fn a_stale_agent_only_build_beside_the_executable_is_not_installed() {
        let dir = tempfile::tempdir().unwrap();
        let full = dir.path().join("hostmesh");
        std::fs::write(&full, format!("full build {MARKER}")).unwrap();
        let small = dir.path().join(AGENT_BINARY);
        std::fs::write(&small, "agent hostmesh-agent-build:0123456789abcdef; end").unwrap();
        assert_eq!(build_of(&small).as_deref(), Some("0123456789abcdef"));
        assert_eq!(build_of(&full).as_deref(), Some(BUILD));
        assert_eq!(agent_source(&full), full, "stale: the executable itself");
        std::fs::write(&small, "an agent without a build id").unwrap();
        assert_eq!(build_of(&small), None);
        assert_eq!(agent_source(&full), full, "unknown: the executable itself");
        // The running executable is known without reading it.
        let me = std::env::current_exe().unwrap();
        assert_eq!(build_of(&me).as_deref(), Some(BUILD));
        assert_eq!(BUILD.len(), 16);
    }

    #[test]
    fn a_destination_with_the_same_bytes_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join(AGENT_BINARY);
        let agent = format!("agent build {MARKER}");
        std::fs::write(&small, &agent).unwrap();
        let other = dir.path().join("other");
        std::fs::write(&other, format!("full build {MARKER}")).unwrap();
        let to = dir.path().join("hostmesh");
        std::fs::write(&to, &agent).unwrap();
        let before = std::fs::metadata(&to).unwrap();
        install(&other, &to).unwrap();
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(
            std::fs::metadata(&to).unwrap().ino(),
            before.ino(),
            "not replaced"
        );
        std::fs::write(&to, agent.replace("build", "buile")).unwrap();
        assert!(!same_bytes(&small, &to).unwrap());
        install(&other, &to).unwrap();
        assert_eq!(
            std::fs::read(&to).unwrap(),
            agent.as_bytes(),
            "different bytes are replaced"
        );
    }
}
