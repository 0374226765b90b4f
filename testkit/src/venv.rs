//! Python packages from PyPI for tests, so `cargo nextest run --workspace`
//! needs nothing installed by hand: a virtualenv under the build's target
//! directory gets the package installed once, behind a file lock (test
//! processes run side by side). [`helm`](crate::helm) uses it for Helm,
//! [`py_spy`] for the stack sampler the agent runs on stalls.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The virtualenv `target/<name>` with PyPI's `package` installed: made on
/// first use unless `ready(dir)` already holds. The error says what to do
/// (no `python3`, no package registry).
pub fn venv(name: &str, package: &str, ready: impl Fn(&Path) -> bool) -> Result<PathBuf, String> {
    let target = target_dir()?;
    let dir = target.join(name);
    std::fs::create_dir_all(&target).map_err(|e| format!("creating target dir: {e}"))?;
    let lock_path = target.join(format!("{name}.lock"));
    let lock = std::fs::File::create(&lock_path)
        .map_err(|e| format!("creating {}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
    if ready(&dir) {
        return Ok(dir);
    }
    let python = dir.join("bin").join("python3");
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&dir),
        package,
    )?;
    run(
        Command::new(&python).args(["-m", "pip", "install", "-q", package]),
        package,
    )?;
    if ready(&dir) {
        Ok(dir)
    } else {
        Err(format!(
            "{} is not usable after `pip install {package}`",
            dir.display()
        ))
    }
}

/// `py-spy` (PyPI `py-spy`): the one on `PATH`, else one installed into
/// `target/py-spy-venv`. Panics with what to do when neither works.
pub fn py_spy() -> PathBuf {
    static PY_SPY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PY_SPY
        .get_or_init(|| {
            let runs = |p: &Path| {
                Command::new(p)
                    .arg("--version")
                    .output()
                    .is_ok_and(|o| o.status.success())
            };
            if runs(Path::new("py-spy")) {
                return Ok(PathBuf::from("py-spy"));
            }
            let bin = |dir: &Path| dir.join("bin").join("py-spy");
            venv("py-spy-venv", "py-spy", |d| runs(&bin(d))).map(|d| bin(&d))
        })
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn run(cmd: &mut Command, package: &str) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("running {cmd:?}: {e} (is python3 installed?)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed ({}): {}{} (the test needs PyPI's {package})",
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
