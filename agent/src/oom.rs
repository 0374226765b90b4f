//! Whether the kernel's OOM killer took a proc: the OOM-kill count of the
//! memory cgroup the proc runs in, read when it starts and again when it is
//! killed. cgroup v2 keeps it in `memory.events`, v1 in
//! `memory.oom_control` (both as an `oom_kill N` line).
//!
//! Invariants:
//! 1. Reading never fails loudly: no cgroup, no memory controller or no
//!    counter means "not known to be an OOM kill", never an error.
//! 2. A rise of the count while the proc lived, with the proc ended by
//!    SIGKILL, is an OOM kill. Procs sharing a cgroup (every proc of a pod)
//!    share its count, so a proc SIGKILLed by someone else while a sibling
//!    is OOM-killed reads as OOM-killed too.

use std::path::{Path, PathBuf};

/// Where cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The OOM-kill counter of one cgroup.
#[derive(Debug, Clone)]
pub(crate) struct OomCounter {
    file: Option<PathBuf>,
}

impl OomCounter {
    /// The counter of the memory cgroup of process `pid` (`/proc/<pid>/cgroup`).
    pub(crate) fn of_pid(pid: u32) -> Self {
        let file = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .ok()
            .and_then(|c| counter_file(&c, Path::new(CGROUP_ROOT)));
        OomCounter { file }
    }

    /// OOM kills in the cgroup so far, if the counter can be read.
    pub(crate) fn count(&self) -> Option<u64> {
        let text = std::fs::read_to_string(self.file.as_ref()?).ok()?;
        oom_kills(&text)
    }
}

/// The file holding the OOM-kill count for a process whose
/// `/proc/<pid>/cgroup` reads `proc_cgroup`, with hierarchies under `root`:
/// the v2 `memory.events` (on `root` or, on a hybrid host, `root/unified`)
/// when it exists, else the v1 memory controller's `memory.oom_control`.
pub(crate) fn counter_file(proc_cgroup: &str, root: &Path) -> Option<PathBuf> {
    let mut v1 = None;
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(hier), Some(controllers), Some(path)) =
            (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        if hier == "0" && controllers.is_empty() {
            v2 = [root.join(rel), root.join("unified").join(rel)]
                .into_iter()
                .map(|d| d.join("memory.events"))
                .find(|f| f.exists());
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(root.join("memory").join(rel).join("memory.oom_control"))
                .filter(|f| f.exists());
        }
    }
    v2.or(v1)
}

/// The `oom_kill N` count in a `memory.events` or `memory.oom_control` text.
pub(crate) fn oom_kills(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_read_from_v1_and_v2_files() {
        assert_eq!(
            oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"),
            Some(3)
        );
        assert_eq!(
            oom_kills("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n"),
            Some(2)
        );
        assert_eq!(oom_kills("low 0\n"), None);
    }

    #[test]
    fn v2_is_preferred_and_v1_is_the_fallback() {
        let root = tempfile::tempdir().unwrap();
        let v1 = root.path().join("memory/pod/a");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.oom_control"), "oom_kill 0\n").unwrap();
        let hybrid = "4:memory:/pod/a\n0::/pod/a\n";
        assert_eq!(
            counter_file(hybrid, root.path()),
            Some(v1.join("memory.oom_control")),
            "no v2 memory.events: v1"
        );
        let v2 = root.path().join("unified/pod/a");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v2.join("memory.events"), "oom_kill 0\n").unwrap();
        assert_eq!(
            counter_file(hybrid, root.path()),
            Some(v2.join("memory.events"))
        );
        assert_eq!(counter_file("garbage", root.path()), None);
        assert_eq!(counter_file("", root.path()), None);
    }
}
