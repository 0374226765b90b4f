//! Pythons with Monarch for the Monarch tests: PyPI `torchmonarch` (the
//! release hostmesh is tested against, and the newest 0.8 nightly, the
//! next client contract) and `kubernetes` (which Monarch's `KubernetesJob`
//! needs), each in a virtualenv under `target/` ([`crate::pyvenv`]).

use std::path::PathBuf;
use std::sync::OnceLock;

/// The Monarch release the tests run.
pub const TORCHMONARCH: &str = "torchmonarch==0.7.0";

/// The next Monarch the tests run too: the newest 0.8 pre-release PyPI
/// served when it was pinned (`pip index versions torchmonarch --pre`).
/// Its client wants each worker pod to declare its service identity
/// (`MONARCH_SERVICE_PROC_IDS` or `MONARCH_POD_UID`).
pub const TORCHMONARCH_NEXT: &str = "torchmonarch==0.8.0.dev20261027";

/// The venv: Monarch and the Kubernetes client (no torch is pulled in).
pub const VENV: crate::pyvenv::Venv = crate::pyvenv::Venv {
    name: "monarch-venv",
    packages: &[TORCHMONARCH, "kubernetes"],
    probe: "import monarch.actor, monarch.job.kubernetes, kubernetes",
};

/// The venv of [`TORCHMONARCH_NEXT`].
pub const NEXT_VENV: crate::pyvenv::Venv = crate::pyvenv::Venv {
    name: "monarch-next-venv",
    packages: &[TORCHMONARCH_NEXT, "kubernetes"],
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

/// [`NEXT_VENV`]'s `python3`, made on first use, as [`python`].
pub fn python_next() -> PathBuf {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PYTHON
        .get_or_init(|| NEXT_VENV.python())
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}
