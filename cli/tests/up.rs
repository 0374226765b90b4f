//! `hostmesh up`, the README's first command, run as a new user would: the
//! binary and the quickstart in a fresh directory that only its owner can
//! enter (as `mktemp -d` and many home directories are), until Ready.
//! The restricted `hostmesh-install` init container (a non-root user) must
//! still install the agent from there.

use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

#[test]
fn up_runs_the_quickstart_from_a_directory_only_its_owner_can_enter() {
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "hostmesh up needs root (mount namespaces); CI runs as root"
        );
        return;
    }
    let home = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let repo = home.path().join("checkout");
    std::fs::create_dir_all(repo.join("examples")).unwrap();
    let bin = repo.join("hostmesh");
    std::fs::copy(env!("CARGO_BIN_EXE_hostmesh"), &bin).expect("copy the binary");
    let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/quickstart.yaml");
    std::fs::copy(quickstart, repo.join("examples/quickstart.yaml")).unwrap();
    let out = Command::new(&bin)
        .args(["up", "examples/quickstart.yaml", "--exit-when-ready"])
        .current_dir(&repo)
        .output()
        .expect("run hostmesh up");
    let log = std::fs::read_to_string(repo.join(".hostmesh/hostmesh.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "hostmesh up failed: {}\n{}\n--- log tail ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        &log[log.len().saturating_sub(4000)..]
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("everything is Ready"), "{stdout}");
}
