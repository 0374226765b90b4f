//! `py-spy` (PyPI `py-spy`), the sampler the agent runs for the stacks of a
//! stalled Python proc: the machine's when it has one, else one installed
//! into the virtualenv `target/py-spy-venv` ([`pyvenv`](crate::pyvenv)).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const VENV: crate::pyvenv::Venv = crate::pyvenv::Venv {
    name: "py-spy-venv",
    packages: &["py-spy"],
    // The wheel installs a binary next to the venv's python, no module.
    probe: "import os, sys; sys.exit(0 if os.access(os.path.join(os.path.dirname(sys.executable), 'py-spy'), os.X_OK) else 1)",
};

/// A `py-spy` that runs. Panics with what to do when there is none and it
/// cannot be installed (no `python3`, or no package registry).
pub fn py_spy() -> PathBuf {
    static PY_SPY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PY_SPY
        .get_or_init(|| {
            if runs(Path::new("py-spy")) {
                return Ok(PathBuf::from("py-spy"));
            }
            let python = VENV.python()?;
            Ok(python.with_file_name("py-spy"))
        })
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn runs(py_spy: &Path) -> bool {
    Command::new(py_spy)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}
