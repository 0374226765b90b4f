//! `hostmesh status` as a user runs it: bad arguments and an unreachable
//! cluster exit non-zero with a message that says what to fix.

use std::process::Command;

fn hostmesh(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hostmesh"))
        .args(args)
        .env_remove("KUBECONFIG")
        .env("HOME", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .expect("run hostmesh");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_target_without_kind_is_refused_with_the_expected_form() {
    let (ok, err) = hostmesh(&["status", "trainer"]);
    assert!(!ok);
    assert!(err.contains("KIND/NAME"), "{err}");
    assert!(err.contains("world/trainer"), "{err}");
}

#[test]
fn a_missing_kubeconfig_names_the_file_and_the_fix() {
    let (ok, err) = hostmesh(&[
        "status",
        "world/trainer",
        "--kubeconfig",
        "/nonexistent/hostmesh-kubeconfig",
    ]);
    assert!(!ok);
    assert!(err.contains("/nonexistent/hostmesh-kubeconfig"), "{err}");
    assert!(err.contains("KUBECONFIG"), "{err}");
}
