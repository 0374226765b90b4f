//! Process-wide allocator settings for the long-running hostmesh
//! processes (agent, operator, API server, kubelet). glibc's malloc keeps
//! up to eight arenas per core, each growing on its own, and returns freed
//! memory inside a heap to the system only when asked: a process whose
//! live heap is 40 MB after a burst (a thousand pods listed, a thousand
//! address books sent) stayed at twice that resident. Two arenas and a
//! trim every [`TRIM_EVERY`] bring its resident memory back near its live
//! heap.
//!
//! Invariants:
//! 1. [`tune`] is called once, first thing in `main`, before other threads
//!    exist (the arena limit applies to arenas made afterwards); later
//!    calls do nothing.
//! 2. Elsewhere than glibc it does nothing.

use std::time::Duration;

/// How often freed memory is handed back to the system.
pub const TRIM_EVERY: Duration = Duration::from_secs(10);
/// Malloc arenas (glibc's default is eight per core).
pub const ARENAS: i32 = 2;

/// Applies the settings (invariant 1) and starts the trimming thread.
pub fn tune() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            // SAFETY: mallopt(3) only sets a malloc parameter.
            unsafe {
                libc::mallopt(libc::M_ARENA_MAX, ARENAS);
            }
            let spawned = std::thread::Builder::new()
                .name("hostmesh-trim".into())
                .spawn(|| {
                    loop {
                        std::thread::sleep(TRIM_EVERY);
                        // SAFETY: malloc_trim(3) takes the arenas' locks
                        // itself; it frees nothing that is in use.
                        unsafe {
                            libc::malloc_trim(0);
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start the malloc trimming thread");
            }
        }
    });
}
