//! What `hostmesh up` leaves on disk, and the reaper that removes it when
//! `up` cannot (kill -9, an OOM kill, a crash).
//!
//! `up` keeps its state in its data directory (made private: 0700, ours):
//! the kubeconfig (the API server's bearer token), the kubelet's directory
//! (pod volumes with the World and service-account tokens, container logs)
//! and its own log. Before the cluster starts, `up` starts a reaper: a copy
//! of the `hostmesh` executable (`hostmesh up-reaper`, hidden) whose stdin
//! is a pipe from `up`. The reaper only reads that pipe; `up`'s death, however
//! it dies, closes it.
//!
//! Invariants:
//! 1. A clean exit of `up` writes [`DISARM`] before the pipe closes; the
//!    reaper then exits and touches nothing (`up` removed its state itself,
//!    keeping its log when it failed).
//! 2. End of file without [`DISARM`] means `up` died: the reaper removes
//!    every path of [`state_paths`] and then the data directory if it is
//!    empty. The containers died with `up` (parent-death signal), so no
//!    process, mount or token is left. The pod bridge `up` noted
//!    ([`Reaper::note_bridge`]) is deleted too, unless another kubelet has
//!    claimed its /24 since.
//! 3. The reaper runs in its own process group, so the terminal's Ctrl-C
//!    reaches `up` (which tears down) and not the reaper.
//! 4. Only what `up` itself creates is removed: other files in a data
//!    directory the user chose stay.

use std::io::{BufRead as _, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

/// The hidden subcommand that runs the reaper.
pub const SUBCOMMAND: &str = "up-reaper";

/// The line a clean exit sends (invariant 1).
pub const DISARM: &str = "exit";

/// Line prefixes naming the pod bridge and its claim file (invariant 2).
const BRIDGE: &str = "bridge ";
const CLAIM: &str = "claim ";

/// `up`'s log file in the data directory.
pub const LOG_FILE: &str = "hostmesh.log";

/// Everything `up` creates in `data_dir`: the kubeconfig, the kubelet's
/// directory and the log (invariant 4).
pub fn state_paths(data_dir: &Path) -> [PathBuf; 3] {
    [
        data_dir.join("kubeconfig"),
        data_dir.join("kubelet"),
        data_dir.join(LOG_FILE),
    ]
}

/// Removes `up`'s state from `data_dir` (the log too unless `keep_log`),
/// then the directory itself when nothing else is in it.
pub fn remove_state(data_dir: &Path, keep_log: bool) -> std::io::Result<()> {
    let mut first_error = None;
    for path in state_paths(data_dir) {
        if keep_log && path.ends_with(LOG_FILE) {
            continue;
        }
        if let Err(e) = hostmesh_devcluster::private_dir::remove(&path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove");
            first_error.get_or_insert(e);
        }
    }
    // Fails (and stays) when the user keeps other files there.
    let _ = std::fs::remove_dir(data_dir);
    first_error.map_or(Ok(()), Err)
}

/// A running reaper; [`Reaper::disarm`] on a clean exit.
#[derive(Debug)]
pub struct Reaper {
    child: Child,
    pipe: Option<ChildStdin>,
}

impl Reaper {
    /// Starts `hostmesh_binary up-reaper DATA_DIR` with its stdin a pipe
    /// from this process (close-on-exec here, so no container inherits it).
    pub fn start(hostmesh_binary: &Path, data_dir: &Path) -> std::io::Result<Self> {
        let data_dir = std::path::absolute(data_dir)?;
        let mut child = Command::new(hostmesh_binary)
            .arg(SUBCOMMAND)
            .arg(&data_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let pipe = child.stdin.take();
        Ok(Self { child, pipe })
    }

    /// Tells the reaper the kubelet's pod bridge, to delete if `up` dies.
    pub fn note_bridge(&mut self, bridge: &hostmesh_devcluster::kubelet::PodBridge) {
        if let Some(pipe) = &mut self.pipe {
            let _ = writeln!(pipe, "{CLAIM}{}", bridge.claim.display());
            let _ = writeln!(pipe, "{BRIDGE}{}", bridge.name);
        }
    }

    /// Tells the reaper `up` exits cleanly, and waits for it (invariant 1).
    pub fn disarm(mut self) {
        if let Some(mut pipe) = self.pipe.take() {
            let _ = writeln!(pipe, "{DISARM}");
        }
        let _ = self.child.wait();
    }
}

/// The reaper's body: waits for the end of stdin, and cleans `data_dir`
/// unless `up` disarmed it (invariant 2).
pub fn run(data_dir: &Path) -> std::io::Result<()> {
    let mut disarmed = false;
    let (mut claim, mut bridge) = (None, None);
    let mut line = String::new();
    let mut stdin = std::io::stdin().lock();
    loop {
        line.clear();
        match stdin.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let l = line.trim_end_matches('\n');
                if l == DISARM {
                    disarmed = true;
                } else if let Some(c) = l.strip_prefix(CLAIM) {
                    claim = Some(PathBuf::from(c));
                } else if let Some(b) = l.strip_prefix(BRIDGE) {
                    bridge = Some(b.to_owned());
                }
            }
        }
    }
    if disarmed {
        return Ok(());
    }
    if let (Some(claim), Some(name)) = (claim, bridge) {
        delete_bridge(hostmesh_devcluster::kubelet::PodBridge { name, claim });
    }
    // A container that was still being started may create a file as it
    // dies: a few passes, each removing what the last one missed.
    let mut outcome = Ok(());
    for _ in 0..5 {
        outcome = remove_state(data_dir, false);
        if outcome.is_ok() && state_paths(data_dir).iter().all(|p| !p.exists()) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    outcome
}

/// Deletes the dead kubelet's bridge (best effort: a bridge left behind is
/// deleted by the next kubelet that claims its /24).
fn delete_bridge(bridge: hostmesh_devcluster::kubelet::PodBridge) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::warn!(error = %e, "cannot delete the pod bridge");
            return;
        }
    };
    if let Err(e) = rt.block_on(hostmesh_devcluster::kubelet::delete_dead_bridge(&bridge)) {
        tracing::warn!(bridge = %bridge.name, error = %e, "cannot delete the pod bridge");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_only_what_up_creates_and_then_an_empty_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        std::fs::create_dir_all(data.join("kubelet/pods/u/volumes/s")).unwrap();
        std::fs::write(data.join("kubelet/pods/u/volumes/s/token"), b"t").unwrap();
        std::fs::write(data.join("kubeconfig"), b"k").unwrap();
        std::fs::write(data.join(LOG_FILE), b"l").unwrap();
        remove_state(&data, true).unwrap();
        assert!(data.join(LOG_FILE).exists());
        assert!(!data.join("kubelet").exists() && !data.join("kubeconfig").exists());
        remove_state(&data, false).unwrap();
        assert!(!data.exists());

        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("mine.txt"), b"user's").unwrap();
        std::fs::write(data.join("kubeconfig"), b"k").unwrap();
        remove_state(&data, false).unwrap();
        assert!(data.join("mine.txt").exists() && !data.join("kubeconfig").exists());
    }
}
