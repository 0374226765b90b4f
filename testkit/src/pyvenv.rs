//! Python virtualenvs for tests that need a PyPI package: created once
//! under the build's `target/` directory (behind a file lock, since test
//! processes run side by side) with `pip install` from PyPI, so
//! `cargo nextest run --workspace` needs nothing installed by hand first.
//!
//! Invariants:
//! 1. A venv counts as ready only when its Python runs the venv's probe
//!    (the imports the tests need); a half-made one is completed, not
//!    trusted.
//! 2. One process at a time creates or completes a venv (a lock file next
//!    to it); the others wait and then find it ready.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A virtualenv a test needs.
#[derive(Debug, Clone, Copy)]
pub struct Venv {
    /// Its directory name under `target/` (e.g. `monarch-venv`).
    pub name: &'static str,
    /// `pip install` arguments (requirements such as `torchmonarch==0.7.0`).
    pub packages: &'static [&'static str],
    /// Python code that succeeds once the packages are usable.
    pub probe: &'static str,
}

impl Venv {
    /// The venv's `python3`, creating and filling the venv on first use
    /// (invariants 1, 2). The error says what failed and what to do.
    pub fn python(&self) -> Result<PathBuf, String> {
        let target = target_dir()?;
        self.python_in(&target)
    }

    /// Like [`Venv::python`], with the venv under `dir`.
    pub fn python_in(&self, dir: &Path) -> Result<PathBuf, String> {
        let venv = dir.join(self.name);
        let python = venv.join("bin").join("python3");
        if self.works(&python) {
            return Ok(python);
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let lock_path = dir.join(format!("{}.lock", self.name));
        let lock = std::fs::File::create(&lock_path)
            .map_err(|e| format!("creating {}: {e}", lock_path.display()))?;
        lock.lock()
            .map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
        if self.works(&python) {
            return Ok(python);
        }
        if !python.exists() {
            self.run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        }
        if !self.packages.is_empty() {
            self.run(
                Command::new(&python)
                    .args(["-m", "pip", "install", "-q"])
                    .args(self.packages),
            )?;
        }
        if self.works(&python) {
            Ok(python)
        } else {
            Err(format!(
                "{} cannot run {:?} after `pip install {}`",
                python.display(),
                self.probe,
                self.packages.join(" ")
            ))
        }
    }

    /// Whether `python` runs the probe.
    pub fn works(&self, python: &Path) -> bool {
        Command::new(python)
            .args(["-c", self.probe])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    fn run(&self, cmd: &mut Command) -> Result<(), String> {
        let out = cmd
            .output()
            .map_err(|e| format!("running {cmd:?}: {e} (is python3 installed?)"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{cmd:?} failed ({}): {}{} (these tests need PyPI's {})",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.packages.join(" ")
            ))
        }
    }
}

/// `target/` of the running test: test executables live in
/// `target/<profile>/deps/`, binaries in `target/<profile>/`.
pub fn target_dir() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("test executable path: {e}"))?;
    let dir = exe
        .parent()
        .ok_or_else(|| format!("{} has no directory", exe.display()))?;
    let profile = if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent()
    } else {
        Some(dir)
    };
    profile
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("{} is not under target/<profile>/", exe.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_working_system_python_is_not_reinstalled_and_a_broken_probe_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let ok = Venv {
            name: "v",
            packages: &[],
            probe: "import json",
        };
        assert!(ok.works(Path::new("python3")));
        // No packages to install: the venv is made and the probe passes.
        let python = ok.python_in(dir.path()).unwrap();
        assert!(python.starts_with(dir.path()));
        let broken = Venv {
            name: "v",
            packages: &[],
            probe: "import no_such_module_here",
        };
        let e = broken.python_in(dir.path()).unwrap_err();
        assert!(e.contains("no_such_module_here"), "{e}");
    }
}
