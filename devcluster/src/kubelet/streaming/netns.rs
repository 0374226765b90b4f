//! Entering a container's network and UTS namespaces from a dedicated
//! thread (`setns(2)` on those two namespaces is per thread): exec's
//! processes are forked from such a thread, and port-forward's sockets are
//! made on one (a socket keeps the namespace it was made in).
//!
//! Invariant: only threads made here enter namespaces; no tokio worker
//! thread ever changes namespace.

use std::os::fd::AsRawFd as _;
use std::os::unix::fs::MetadataExt as _;

/// Whether process `pid`'s namespace `kind` (`net`, `uts`) differs from
/// the kubelet's.
pub(crate) fn differs(pid: i32, kind: &str) -> std::io::Result<bool> {
    let mine = std::fs::metadata(format!("/proc/self/ns/{kind}"))?;
    let theirs = std::fs::metadata(format!("/proc/{pid}/ns/{kind}"))?;
    Ok((mine.dev(), mine.ino()) != (theirs.dev(), theirs.ino()))
}

/// The namespaces of `pid` the calling thread must enter to be where the
/// container is (network, UTS), with their `setns` flags.
pub(crate) fn to_enter(pid: i32) -> std::io::Result<Vec<(std::fs::File, libc::c_int)>> {
    let mut out = Vec::new();
    for (kind, flag) in [("net", libc::CLONE_NEWNET), ("uts", libc::CLONE_NEWUTS)] {
        if differs(pid, kind)? {
            out.push((std::fs::File::open(format!("/proc/{pid}/ns/{kind}"))?, flag));
        }
    }
    Ok(out)
}

/// Moves the calling thread into `namespaces` (from [`to_enter`]). Call it
/// only on a thread made for this purpose.
pub(crate) fn enter(namespaces: &[(std::fs::File, libc::c_int)]) -> std::io::Result<()> {
    for (file, flag) in namespaces {
        // SAFETY: setns(2) on an open namespace descriptor; affects only
        // the calling thread for net and uts.
        if unsafe { libc::setns(file.as_raw_fd(), *flag) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A short, stable name of `pid`'s network namespace for messages
/// (`net:[4026531840]`).
pub(crate) fn describe(pid: i32) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/net"))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| format!("/proc/{pid}/ns/net"))
}
