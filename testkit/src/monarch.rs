//! A Python with Monarch for the Monarch tests: PyPI `torchmonarch` (the
//! version hostmesh is tested against) and `kubernetes` (which Monarch's
//! `KubernetesJob` needs) in a virtualenv under `target/` ([`crate::pyvenv`]).

use std::path::PathBuf;
use std::sync::OnceLock;

/// The Monarch release the tests run.
pub const TORCHMONARCH: &str = "torchmonarch==0.7.0";

/// The venv: Monarch and the Kubernetes client (no torch is pulled in).
pub const VENV: crate::pyvenv::Venv = crate::pyvenv::Venv {
    name: "monarch-venv",
    packages: &[TORCHMONARCH, "kubernetes"],
    probe: "import monarch.actor, monarch.job.kubernetes, kubernetes",
};

/// The venv's `python3`, made on first use. Panics with what to do when it
/// cannot be made (no `python3`, no package registry).
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PYTHON
        .get_or_init(|| VENV.python())
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}
