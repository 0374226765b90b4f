//! The hub's own stalls (issue 30, item 4). When the operator's process is
//! paused (SIGSTOP, a frozen VM, a throttled CPU, a runtime that cannot
//! schedule the hub), the agents go on heartbeating, but their pushes wait
//! unread in the links' buffers; on waking, every heartbeat deadline has
//! passed, and judging them then would expire every host for the
//! operator's own silence.
//!
//! The hub's loop states when it means to wake ([`PauseDetector::expect`]:
//! at the latest a second ahead, its longest sleep); a wake later than
//! that by more than [`PAUSE_THRESHOLD`] is a stall of the operator, not of
//! the agents ([`PauseDetector::woke`]), and the hub moves every live
//! heartbeat deadline later by the whole delay before it judges any
//! ([`super::heartbeat::HeartbeatIndex::postpone`]).
//!
//! Invariants:
//! 1. A stall counts against no host: a host is expired only after
//!    `healthTimeout` of silence while the hub was awake to hear it.
//! 2. A stall is reported once, by the first wake after it.
//! 3. `Instant` is the monotonic clock, which runs on while the process is
//!    stopped, so a stall shows as a late wake whatever the wall clock did.

use std::time::{Duration, Instant};

/// Lateness of a wake that counts as a stall of the operator: well above
/// the scheduling delay of a loaded runtime, well under any
/// `healthTimeout`.
pub const PAUSE_THRESHOLD: Duration = Duration::from_millis(1500);

/// Tells late wakes of the hub's loop (module doc).
#[derive(Debug, Default)]
pub struct PauseDetector {
    expected: Option<Instant>,
}

impl PauseDetector {
    /// The loop means to wake at `at` at the latest.
    pub fn expect(&mut self, at: Instant) {
        self.expected = Some(at);
    }

    /// The loop woke at `now`: how long it stalled, if it was late by more
    /// than [`PAUSE_THRESHOLD`] (once per [`PauseDetector::expect`]).
    pub fn woke(&mut self, now: Instant) -> Option<Duration> {
        let late = now.saturating_duration_since(self.expected.take()?);
        (late > PAUSE_THRESHOLD).then_some(late)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_late_wake_is_a_stall_and_it_is_reported_once() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut p = PauseDetector::default();
        assert_eq!(p.woke(t0), None, "nothing expected yet");
        p.expect(t0 + s);
        assert_eq!(p.woke(t0 + s / 2), None, "early (a push)");
        p.expect(t0 + s);
        assert_eq!(p.woke(t0 + 2 * s), None, "a loaded runtime's delay");
        p.expect(t0 + s);
        assert_eq!(p.woke(t0 + 31 * s), Some(30 * s), "SIGSTOP for 30 s");
        assert_eq!(p.woke(t0 + 32 * s), None, "reported once");
    }
}
