//! Real Helm for the chart tests: a Python interpreter that can import
//! `helm_python` (PyPI `helm-python-sdk`, Helm v4's library). When the
//! machine's `python3` lacks it, a virtualenv under the build's target
//! directory gets it installed once (behind a file lock, since test
//! processes run side by side), so `cargo nextest run --workspace` needs
//! nothing installed by hand first.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The PyPI package that carries Helm.
const PACKAGE: &str = "helm-python-sdk";

/// A `python3` that imports `helm_python`: the machine's, or one in a
/// virtualenv under `target/` set up on first use. Panics with what to do
/// when neither works (no `python3`, or no package registry).
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PYTHON
        .get_or_init(find_or_install)
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn imports_helm(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import helm_python"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn find_or_install() -> Result<PathBuf, String> {
    let system = PathBuf::from("python3");
    if imports_helm(&system) {
        return Ok(system);
    }
    crate::pyvenv::Venv {
        name: "helm-venv",
        packages: &[PACKAGE],
        probe: "import helm_python",
    }
    .python()
}
