//! The last-heartbeat index: which hosts have gone silent, found in
//! O(expired) per check rather than O(hosts).
//!
//! Invariants:
//! 1. Each live key is in `deadlines` exactly once, at `last heartbeat +
//!    timeout`; `by_key` maps it back, so a heartbeat moves it in O(log n).
//! 2. [`HeartbeatIndex::pop_expired`] walks `deadlines` from the earliest and
//!    stops at the first deadline in the future; expired keys leave the
//!    index (they come back with their next heartbeat).

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Ordered deadlines keyed by `K`.
#[derive(Debug)]
pub struct HeartbeatIndex<K: Ord + Hash + Clone> {
    deadlines: BTreeSet<(Instant, K)>,
    by_key: HashMap<K, Instant>,
}

impl<K: Ord + Hash + Clone> Default for HeartbeatIndex<K> {
    fn default() -> Self {
        HeartbeatIndex {
            deadlines: BTreeSet::new(),
            by_key: HashMap::new(),
        }
    }
}

impl<K: Ord + Hash + Clone> HeartbeatIndex<K> {
    /// Records a heartbeat from `key` at `now`; it expires after `timeout`.
    /// Returns true when the key was not in the index (new or expired).
    pub fn beat(&mut self, key: K, now: Instant, timeout: Duration) -> bool {
        let deadline = now + timeout;
        match self.by_key.insert(key.clone(), deadline) {
            Some(old) => {
                self.deadlines.remove(&(old, key.clone()));
                self.deadlines.insert((deadline, key));
                false
            }
            None => {
                self.deadlines.insert((deadline, key));
                true
            }
        }
    }

    /// Removes `key` (host gone).
    pub fn remove(&mut self, key: &K) {
        if let Some(old) = self.by_key.remove(key) {
            self.deadlines.remove(&(old, key.clone()));
        }
    }

    /// The current expiry deadline of `key` (its last heartbeat plus the
    /// timeout it was given), if it is live.
    pub fn deadline(&self, key: &K) -> Option<Instant> {
        self.by_key.get(key).copied()
    }

    /// Whether `key` is live (heartbeat within its timeout, not yet popped).
    pub fn contains(&self, key: &K) -> bool {
        self.by_key.contains_key(key)
    }

    /// Removes and returns every key whose deadline is at or before `now`.
    pub fn pop_expired(&mut self, now: Instant) -> Vec<K> {
        let mut out = Vec::new();
        while let Some(first) = self.deadlines.first() {
            if first.0 > now {
                break;
            }
            if let Some((_, key)) = self.deadlines.pop_first() {
                self.by_key.remove(&key);
                out.push(key);
            }
        }
        out
    }

    /// Moves every deadline `by` later: the hub itself stalled for that
    /// long ([`super::pause`]), so the silence counts against no key.
    pub fn postpone(&mut self, by: Duration) {
        self.deadlines = std::mem::take(&mut self.deadlines)
            .into_iter()
            .map(|(d, k)| (d + by, k))
            .collect();
        for d in self.by_key.values_mut() {
            *d += by;
        }
    }

    /// The earliest deadline, to sleep until.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(d, _)| *d)
    }

    /// Number of live keys.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether no key is live.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

/// What the supervision hub knows about a host's agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// No heartbeat seen from this pod's agent yet.
    Unknown,
    /// Heartbeats arrive within `healthTimeout`.
    Alive,
    /// Heartbeats stopped for longer than `healthTimeout`.
    Expired,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_pops_only_the_silent() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut idx = HeartbeatIndex::default();
        assert!(idx.beat("a", t0, 10 * s));
        assert!(idx.beat("b", t0, 10 * s));
        assert!(!idx.beat("a", t0 + 5 * s, 10 * s));
        assert!(idx.pop_expired(t0 + 9 * s).is_empty());
        assert_eq!(idx.pop_expired(t0 + 10 * s), ["b"]);
        assert!(!idx.contains(&"b") && idx.contains(&"a"));
        assert_eq!(idx.next_deadline(), Some(t0 + 15 * s));
        assert!(idx.beat("b", t0 + 11 * s, 10 * s), "comes back");
        idx.remove(&"a");
        assert_eq!(idx.len(), 1);
        assert_eq!(idx.pop_expired(t0 + 100 * s), ["b"]);
        assert!(idx.is_empty());
    }

    #[test]
    fn a_postponed_index_expires_as_late_as_the_stall() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut idx = HeartbeatIndex::default();
        idx.beat("a", t0, 10 * s);
        idx.beat("b", t0 + 3 * s, 10 * s);
        // The hub stalled 30 s from t0 + 5 s: a and b had 5 s and 8 s left.
        idx.postpone(30 * s);
        assert!(idx.pop_expired(t0 + 35 * s).is_empty());
        assert_eq!(idx.deadline(&"a"), Some(t0 + 40 * s));
        assert_eq!(idx.pop_expired(t0 + 40 * s), ["a"]);
        assert_eq!(idx.next_deadline(), Some(t0 + 43 * s));
        assert!(!idx.beat("b", t0 + 41 * s, 10 * s), "still live");
        assert_eq!(idx.pop_expired(t0 + 51 * s), ["b"]);
    }

    #[test]
    fn checking_ten_thousand_live_hosts_touches_only_expired() {
        let t0 = Instant::now();
        let mut idx = HeartbeatIndex::default();
        for k in 0..10_000u32 {
            idx.beat(k, t0, Duration::from_secs(10 + u64::from(k % 2)));
        }
        let expired = idx.pop_expired(t0 + Duration::from_secs(10));
        assert_eq!(expired.len(), 5_000);
        assert!(expired.iter().all(|k| k % 2 == 0));
        assert_eq!(idx.len(), 5_000);
    }
}
