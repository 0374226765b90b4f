//! Each agent's clock offset, estimated from the hub's receipt of its
//! heartbeats and snapshots, and the correction of agent times to the hub's
//! clock.
//!
//! A push carries the agent's wall clock when it was sent (`a`); the hub
//! notes its own when it arrives (`h`). `h - a` is the agent's offset plus
//! the one-way delay, never less than the offset, so the smallest sample is
//! the best estimate (NTP keeps the minimum-delay sample for the same
//! reason). With one-way samples the estimate is late by the smallest delay
//! seen, which on a cluster network is well under a millisecond.
//!
//! Invariants:
//! 1. Memory is bounded: the last [`WINDOW`] samples only, so a clock that
//!    is stepped or drifts is followed within [`WINDOW`] heartbeats.
//! 2. A corrected time is never later than when the hub received the report
//!    ([`AgentClock::to_hub`] takes that bound).
//! 3. Without a sample yet the agent's clock is taken as it is (offset 0).

use std::collections::VecDeque;

use k8s_openapi::jiff::Timestamp;

/// Samples kept per agent (a minute of heartbeats at the default 1 s).
pub const WINDOW: usize = 64;

/// One clock sample: the agent's send time and the hub's receipt time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockSample {
    /// The agent's wall clock when it sent the push, ms since the epoch.
    pub agent_ms: u64,
    /// The hub's wall clock when the push arrived.
    pub hub: Timestamp,
}

impl ClockSample {
    /// A sample of a push the agent sent at `agent_ms`, arriving now.
    pub fn now(agent_ms: u64) -> Self {
        ClockSample {
            agent_ms,
            hub: Timestamp::now(),
        }
    }
}

/// The offset estimate of one agent (module doc).
#[derive(Clone, Debug, Default)]
pub struct AgentClock {
    /// `hub - agent` in milliseconds, newest last.
    samples: VecDeque<i64>,
}

fn ms(t: Timestamp) -> i64 {
    t.as_millisecond()
}

impl AgentClock {
    /// Adds a sample; the oldest goes beyond [`WINDOW`].
    pub fn add(&mut self, s: ClockSample) {
        let agent = i64::try_from(s.agent_ms).unwrap_or(i64::MAX);
        if agent == 0 {
            return; // an agent with no clock (before the epoch)
        }
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(ms(s.hub).saturating_sub(agent));
    }

    /// The estimated offset (`hub - agent`, ms), once there is a sample.
    pub fn offset_ms(&self) -> Option<i64> {
        self.samples.iter().copied().min()
    }

    /// The agent time `agent_ms` on the hub's clock, no later than
    /// `received` (invariant 2); `None` for a missing time (0).
    pub fn to_hub(&self, agent_ms: u64, received: Timestamp) -> Option<Timestamp> {
        if agent_ms == 0 {
            return None;
        }
        let agent = i64::try_from(agent_ms).ok()?;
        let t = Timestamp::from_millisecond(agent.saturating_add(self.offset_ms().unwrap_or(0)))
            .ok()?;
        Some(t.min(received))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(ms).unwrap()
    }

    const T0: i64 = 1_700_000_000_000;

    #[test]
    fn a_skewed_clock_is_corrected_by_the_minimum_delay_sample() {
        // The agent's clock is 5 s behind the hub's; delays vary 1..200 ms.
        let skew = 5_000;
        let mut c = AgentClock::default();
        for (i, delay) in [120, 3, 200, 1, 45, 80].into_iter().enumerate() {
            let sent = T0 + i as i64 * 1000;
            c.add(ClockSample {
                agent_ms: (sent - skew) as u64,
                hub: at(sent + delay),
            });
        }
        assert_eq!(c.offset_ms(), Some(skew + 1), "the 1 ms sample wins");
        // A failure at agent time t is placed at t + skew (+1 ms).
        let failed = (T0 + 10_000 - skew) as u64;
        assert_eq!(c.to_hub(failed, at(T0 + 60_000)), Some(at(T0 + 10_000 + 1)));
    }

    #[test]
    fn delayed_samples_never_move_the_estimate_up() {
        let mut c = AgentClock::default();
        c.add(ClockSample {
            agent_ms: T0 as u64,
            hub: at(T0 + 2),
        });
        // A push stuck for 30 s in a queue.
        c.add(ClockSample {
            agent_ms: (T0 + 1000) as u64,
            hub: at(T0 + 31_000),
        });
        assert_eq!(c.offset_ms(), Some(2));
    }

    #[test]
    fn a_clock_ahead_of_the_hub_and_the_receipt_bound() {
        // The agent is 3 s ahead.
        let mut c = AgentClock::default();
        c.add(ClockSample {
            agent_ms: (T0 + 3_000) as u64,
            hub: at(T0 + 1),
        });
        assert_eq!(c.offset_ms(), Some(-2_999));
        // Never later than the receipt (invariant 2).
        let got = c.to_hub((T0 + 10_000) as u64, at(T0 + 5_000)).unwrap();
        assert_eq!(got, at(T0 + 5_000));
        assert_eq!(c.to_hub(0, at(T0)), None, "no time, no correction");
    }

    #[test]
    fn memory_is_bounded_and_a_stepped_clock_is_followed() {
        let mut c = AgentClock::default();
        c.add(ClockSample {
            agent_ms: T0 as u64,
            hub: at(T0 - 60_000),
        });
        assert_eq!(c.offset_ms(), Some(-60_000));
        // The agent's clock was stepped back into line: after WINDOW newer
        // samples the old one is gone.
        for i in 0..WINDOW as i64 {
            c.add(ClockSample {
                agent_ms: (T0 + i) as u64,
                hub: at(T0 + i + 1),
            });
        }
        assert_eq!(c.samples.len(), WINDOW);
        assert_eq!(c.offset_ms(), Some(1));
    }

    #[test]
    fn without_samples_the_agent_clock_stands() {
        let c = AgentClock::default();
        assert_eq!(c.to_hub(T0 as u64, at(T0 + 100)), Some(at(T0)), "offset 0");
    }
}
