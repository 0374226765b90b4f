//! Work in another network namespace without moving the kubelet there: a
//! dedicated short-lived thread enters (or creates) the namespace, does its
//! work and exits.
//!
//! Invariants:
//! 1. Only the dedicated thread ever changes namespace; the runtime's
//!    threads stay in the kubelet's own namespaces.
//! 2. A pod's namespaces have no name in the filesystem: they live exactly
//!    as long as a descriptor (or a socket, or a process) refers to them, so
//!    a kubelet killed with SIGKILL leaks none.

use std::fs::File;
use std::os::fd::{AsRawFd as _, OwnedFd};

/// Runs `f` on a new thread inside the network namespace `netns`.
pub(crate) async fn in_netns<R: Send + 'static>(
    netns: OwnedFd,
    f: impl FnOnce() -> R + Send + 'static,
) -> std::io::Result<R> {
    on_thread(move || {
        // SAFETY: setns(2) on a descriptor we own, on this thread only.
        if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(f())
    })
    .await?
}

/// The network and UTS namespaces of one pod.
#[derive(Debug)]
pub(crate) struct PodNamespaces {
    /// `/proc/<tid>/ns/net` of the thread that made it.
    pub(crate) net: OwnedFd,
    /// `/proc/<tid>/ns/uts`, with the pod's hostname.
    pub(crate) uts: OwnedFd,
}

/// Makes a new network and UTS namespace with `hostname` set in it.
pub(crate) async fn new_pod_namespaces(hostname: &str) -> std::io::Result<PodNamespaces> {
    let hostname = hostname.to_string();
    on_thread(move || {
        // SAFETY: unshare(2) affects only this (dedicated) thread.
        if unsafe { libc::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWUTS) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: sethostname(2) reads `len` bytes of a live buffer.
        if unsafe { libc::sethostname(hostname.as_ptr().cast(), hostname.len()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let open = |kind: &str| -> std::io::Result<OwnedFd> {
            Ok(File::open(format!("/proc/thread-self/ns/{kind}"))?.into())
        };
        Ok(PodNamespaces {
            net: open("net")?,
            uts: open("uts")?,
        })
    })
    .await?
}

async fn on_thread<R: Send + 'static>(
    f: impl FnOnce() -> R + Send + 'static,
) -> std::io::Result<R> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("kubelet-netns".into())
        .spawn(move || {
            let _ = tx.send(f());
        })?;
    rx.await
        .map_err(|_| std::io::Error::other("the namespace thread panicked"))
}
