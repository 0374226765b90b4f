//! `hostmesh --version`: the crate version and the git revision the binary
//! was built from (cli/build.rs; `unknown` without git).

use std::process::Command;

#[test]
fn version_names_the_crate_version_and_the_git_revision() {
    let out = Command::new(env!("CARGO_BIN_EXE_hostmesh"))
        .arg("--version")
        .output()
        .expect("run hostmesh");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let rev = env!("HOSTMESH_GIT_REVISION");
    assert_eq!(
        text.trim(),
        format!("hostmesh {} (git {rev})", env!("CARGO_PKG_VERSION"))
    );
    // `git rev-parse --short=12`, a full hash passed to an image build, or
    // `unknown`.
    assert!(
        rev == "unknown" || (rev.len() >= 12 && rev.chars().all(|c| c.is_ascii_hexdigit())),
        "{rev}"
    );
}
