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
    let target = target_dir()?;
    let dir = target.join("helm-venv");
    let python = dir.join("bin").join("python3");
    std::fs::create_dir_all(&target).map_err(|e| format!("creating target dir: {e}"))?;
    let lock_path = target.join("helm-venv.lock");
    let lock = std::fs::File::create(&lock_path)
        .map_err(|e| format!("creating {}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
    if imports_helm(&python) {
        return Ok(python);
    }
    run(Command::new(&system).args(["-m", "venv"]).arg(&dir))?;
    run(Command::new(&python).args(["-m", "pip", "install", "-q", PACKAGE]))?;
    if imports_helm(&python) {
        Ok(python)
    } else {
        Err(format!(
            "{} cannot import helm_python after `pip install {PACKAGE}`",
            python.display()
        ))
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("running {cmd:?}: {e} (is python3 installed?)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed ({}): {}{} (the chart tests need PyPI's {PACKAGE})",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `target/` of the running test: test executables live in
/// `target/<profile>/deps/`.
fn target_dir() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("test executable path: {e}"))?;
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("{} is not under target/<profile>/deps", exe.display()))
}
