//! The Helm chart checked with real Helm: runs `.ci/chart-check.py`, which
//! lints and renders `charts/hostmesh` with several value sets through
//! helm-python-sdk (Helm v4's library) and checks pod security, RBAC and
//! bad-value errors. Needs `pip install helm-python-sdk` (CI installs it).

use std::path::PathBuf;
use std::process::Command;

#[test]
fn chart_lints_renders_and_meets_its_security_and_rbac_policy() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf();
    let script = root.join(".ci/chart-check.py");
    let out = Command::new(hostmesh_testkit::helm::python())
        .arg(&script)
        .arg(root.join("charts/hostmesh"))
        .output()
        .expect("python3 must be installed to check the chart");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{stderr}\n(needs `pip install helm-python-sdk`)",
        script.display(),
        out.status
    );
    assert!(stdout.contains("chart-check: ok"), "{stdout}");
}
