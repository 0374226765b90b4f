//! Watch streams that recover at once after an API server restart or a
//! `410 Gone`, for every kube-rs watcher hostmesh runs (the operator's
//! controllers, the process kubelet, the controller-manager, the cluster
//! DNS).
//!
//! kube-rs leaves the pacing of a failing watcher to its caller. Its
//! `Controller` puts one back-off (800 ms doubling to 30 s, reset only by an
//! item or after two minutes) on the merged stream of *all* its triggers,
//! so one failing watch pauses the others and every `reconcile_on` trigger
//! behind it; its `default_backoff()` on a single watcher is the same
//! back-off, which a 20 s outage has grown to 30 s by the time the server is
//! back. Measured on the embedded cluster: a World created after the API
//! server came back was reconciled 137 to 154 s later.
//!
//! Invariants:
//! 1. Each watcher has its own back-off ([`recovering`]): one failing
//!    watch delays no other stream.
//! 2. The back-off starts at [`INITIAL`], doubles, never exceeds [`MAX`]
//!    (with jitter down to half, so watchers that failed together do not
//!    retry together), and resets on every item the watcher yields: a
//!    server that is back is listed within [`MAX`] of its return.
//! 3. A `410 Gone` (the resume point is older than the server's history,
//!    which is what a restarted server answers) right after a success is
//!    retried at once: the watcher relists on its next poll. A `410` that
//!    follows an error is paced like any error, so a server that answers
//!    nothing but `410` is not hammered.
//! 4. [`NoBackoff`] is the back-off to give a kube-rs `Controller` whose
//!    trigger streams are [`recovering`] ones: the merged stream is never
//!    paused, so the controller's other triggers (the operator's hub) are
//!    never held back by a watch error.

use std::hash::{BuildHasher as _, Hasher as _};
use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;

/// The first pause after an error.
pub const INITIAL: Duration = Duration::from_millis(200);

/// The longest pause between two attempts (invariant 2).
pub const MAX: Duration = Duration::from_secs(2);

/// The bounded exponential back-off of one watcher (invariant 2).
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff { next: INITIAL }
    }
}

impl WatchBackoff {
    /// The pause before the next attempt (between half and all of the
    /// current step), and the step doubled up to [`MAX`].
    pub fn pause(&mut self) -> Duration {
        let step = self.next;
        self.next = (step * 2).min(MAX);
        // Jitter without a random-number dependency: std's per-instance
        // random hasher keys.
        let r = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let half = step / 2;
        half + half.mul_f64((r % 1024) as f64 / 1023.0)
    }

    /// Back to [`INITIAL`] (a success).
    pub fn reset(&mut self) {
        self.next = INITIAL;
    }
}

/// As a kube-rs back-off, for a `Controller`'s `trigger_backoff` where the
/// watchers are its own (a controller with no other triggers: bounded, one
/// for all its watches).
impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.pause())
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        WatchBackoff::reset(self);
    }
}

/// Whether a watcher error is `410 Gone` (invariant 3): an `ERROR` event
/// in the watch stream, or a watch or list refused with 410.
pub fn is_gone(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 410,
        _ => false,
    }
}

/// `stream` (a kube-rs watcher, or anything built on one that passes its
/// errors through) with its own back-off (invariants 1-3): every error is
/// still yielded, and the next poll of the watcher waits for the pause.
pub fn recovering<T, S>(stream: S) -> impl Stream<Item = Result<T, watcher::Error>> + Send
where
    S: Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    T: Send + 'static,
{
    struct State<T> {
        inner: Pin<Box<dyn Stream<Item = Result<T, watcher::Error>> + Send>>,
        backoff: WatchBackoff,
        pause: Option<Duration>,
        last_ok: bool,
    }
    let state = State {
        inner: stream.boxed(),
        backoff: WatchBackoff::default(),
        pause: None,
        last_ok: true,
    };
    futures::stream::unfold(state, |mut st| async move {
        if let Some(pause) = st.pause.take() {
            tokio::time::sleep(pause).await;
        }
        let item = st.inner.next().await?;
        match &item {
            Ok(_) => {
                st.backoff.reset();
                st.last_ok = true;
            }
            Err(e) => {
                let at_once = st.last_ok && is_gone(e);
                st.last_ok = false;
                if at_once {
                    tracing::debug!(error = %e, "watch expired; relisting at once");
                } else {
                    let pause = st.backoff.pause();
                    tracing::debug!(error = %e, ?pause, "watch failed; retrying");
                    st.pause = Some(pause);
                }
            }
        }
        Some((item, st))
    })
}

/// A back-off that never pauses (invariant 4), for the trigger stream of a
/// kube-rs `Controller` whose watchers are [`recovering`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NoBackoff;

impl Iterator for NoBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl Backoff for NoBackoff {
    fn reset(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn gone() -> watcher::Error {
        watcher::Error::WatchError(Box::new(Status {
            code: 410,
            ..Status::default()
        }))
    }

    fn refused() -> watcher::Error {
        watcher::Error::WatchError(Box::new(Status {
            code: 500,
            ..Status::default()
        }))
    }

    #[test]
    fn the_backoff_starts_small_is_bounded_and_resets() {
        let mut b = WatchBackoff::default();
        let first = b.pause();
        assert!(first >= INITIAL / 2 && first <= INITIAL, "{first:?}");
        for _ in 0..20 {
            let p = b.pause();
            assert!(p <= MAX && p >= INITIAL / 2, "{p:?}");
        }
        assert!(b.pause() >= MAX / 2);
        b.reset();
        assert!(b.pause() <= INITIAL);
    }

    #[test]
    fn only_410_is_gone() {
        assert!(is_gone(&gone()));
        assert!(!is_gone(&refused()));
        assert!(!is_gone(&watcher::Error::NoResourceVersion));
    }

    /// Invariants 2 and 3, on tokio's paused clock: a 410 after a success
    /// costs no time, errors in a row are paced, an item resets the pace.
    #[tokio::test(start_paused = true)]
    async fn errors_are_paced_and_a_410_after_success_is_not() {
        let items: Vec<Result<u32, watcher::Error>> = vec![
            Ok(1),
            Err(gone()),
            Ok(2),
            Err(refused()),
            Err(refused()),
            Err(gone()),
            Ok(3),
            Err(refused()),
            Ok(4),
        ];
        let mut s = std::pin::pin!(recovering(futures::stream::iter(items)));
        let start = tokio::time::Instant::now();
        let mut at = Vec::new();
        while let Some(item) = s.next().await {
            at.push((item.is_ok(), start.elapsed()));
        }
        assert_eq!(at.len(), 9);
        // Ok(1), the 410 and Ok(2) at once.
        assert!(at[2].1.is_zero(), "{at:?}");
        // Errors in a row: each pause about double the one before.
        let p1 = at[4].1 - at[3].1;
        let p2 = at[5].1 - at[4].1;
        let p3 = at[6].1 - at[5].1;
        assert!(p1 >= INITIAL / 2 && p1 <= INITIAL, "{at:?}");
        assert!(p2 >= INITIAL && p2 <= INITIAL * 2, "{at:?}");
        // The 410 after an error was paced too.
        assert!(p3 >= INITIAL * 2, "{at:?}");
        // After Ok(3) the pace starts again from INITIAL.
        let p4 = at[8].1 - at[7].1;
        assert!(p4 <= INITIAL, "{at:?}");
    }
}
