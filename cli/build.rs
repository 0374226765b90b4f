//! Gives the `hostmesh` binary its git revision (`hostmesh --version`) as
//! `HOSTMESH_GIT_REVISION`: the environment variable of that name when set
//! (an image build whose context has no `.git` passes it as a build
//! argument), else `git rev-parse --short=12 HEAD`, else `unknown` (a source
//! tarball, or no git installed).

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=HOSTMESH_GIT_REVISION");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());

    let from_env = std::env::var("HOSTMESH_GIT_REVISION")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let revision = match from_env {
        Some(r) => r,
        None => {
            // Rebuild when HEAD moves: HEAD itself (a checkout), the branch it
            // names (a commit) and packed-refs (a gc). Worktrees keep HEAD in
            // their own git dir and branches in the common one.
            if let (Some(git_dir), Some(common)) = (
                git(&dir, &["rev-parse", "--absolute-git-dir"]),
                git(
                    &dir,
                    &["rev-parse", "--path-format=absolute", "--git-common-dir"],
                ),
            ) {
                let mut watch = vec![format!("{git_dir}/HEAD"), format!("{common}/packed-refs")];
                if let Some(branch) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
                    watch.push(format!("{common}/{branch}"));
                }
                // A path that does not exist would rerun this script on
                // every build.
                for path in watch.iter().filter(|p| Path::new(p).exists()) {
                    println!("cargo:rerun-if-changed={path}");
                }
            }
            git(&dir, &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
        }
    };
    println!("cargo:rustc-env=HOSTMESH_GIT_REVISION={revision}");
}
