//! Status-write coalescing: the first failure of an object is written at
//! once; other changes at most once per interval per object, however many
//! hosts report.
//!
//! Invariants:
//! 1. An object marked urgent is due immediately, at most once per urgent
//!    episode (a burst of failures is one immediate write, then the rest
//!    wait for the interval).
//! 2. A non-urgent mark is due no earlier than `interval` after the
//!    object's previous write; many marks in between are one write.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
struct Entry {
    last_write: Option<Instant>,
    due: Option<Instant>,
    urgent_used: bool,
}

/// Coalesces change notifications per key.
#[derive(Debug)]
pub struct Coalescer<K: Ord + Hash + Clone> {
    interval: Duration,
    entries: HashMap<K, Entry>,
    queue: BTreeSet<(Instant, K)>,
}

impl<K: Ord + Hash + Clone> Coalescer<K> {
    /// A coalescer writing each key at most once per `interval`.
    pub fn new(interval: Duration) -> Self {
        Coalescer {
            interval,
            entries: HashMap::new(),
            queue: BTreeSet::new(),
        }
    }

    /// Notes a change of `key` at `now`; `urgent` for a first failure.
    pub fn mark(&mut self, key: K, urgent: bool, now: Instant) {
        let e = self.entries.entry(key.clone()).or_insert(Entry {
            last_write: None,
            due: None,
            urgent_used: false,
        });
        let at = if urgent && !e.urgent_used {
            e.urgent_used = true;
            now
        } else {
            e.last_write.map_or(now, |w| (w + self.interval).max(now))
        };
        match e.due {
            Some(d) if d <= at => {}
            Some(d) => {
                self.queue.remove(&(d, key.clone()));
                e.due = Some(at);
                self.queue.insert((at, key));
            }
            None => {
                e.due = Some(at);
                self.queue.insert((at, key));
            }
        }
    }

    /// Ends an urgent episode (the object is healthy again).
    pub fn reset_urgent(&mut self, key: &K) {
        if let Some(e) = self.entries.get_mut(key) {
            e.urgent_used = false;
        }
    }

    /// Removes and returns the keys due at `now`, recording their write.
    pub fn pop_due(&mut self, now: Instant) -> Vec<K> {
        let mut out = Vec::new();
        while let Some((at, _)) = self.queue.first() {
            if *at > now {
                break;
            }
            if let Some((_, key)) = self.queue.pop_first() {
                if let Some(e) = self.entries.get_mut(&key) {
                    e.due = None;
                    e.last_write = Some(now);
                }
                out.push(key);
            }
        }
        out
    }

    /// When the next key is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.queue.first().map(|(d, _)| *d)
    }

    /// Forgets `key`.
    pub fn remove(&mut self, key: &K) {
        if let Some(e) = self.entries.remove(key)
            && let Some(d) = e.due
        {
            self.queue.remove(&(d, key.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_failure_at_once_then_one_per_interval() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = Coalescer::new(ms(1000));
        c.mark("w", false, t0);
        assert_eq!(c.pop_due(t0), ["w"]);
        // A storm of changes: nothing before the interval, then one write.
        for i in 0..100 {
            c.mark("w", false, t0 + ms(i));
        }
        assert!(c.pop_due(t0 + ms(999)).is_empty());
        assert_eq!(c.next_due(), Some(t0 + ms(1000)));
        // A first failure jumps the queue once.
        c.mark("w", true, t0 + ms(200));
        assert_eq!(c.pop_due(t0 + ms(200)), ["w"]);
        c.mark("w", true, t0 + ms(300));
        assert!(c.pop_due(t0 + ms(300)).is_empty(), "second failure waits");
        assert_eq!(c.pop_due(t0 + ms(1200)), ["w"]);
        c.reset_urgent(&"w");
        c.mark("w", true, t0 + ms(1300));
        assert_eq!(c.pop_due(t0 + ms(1300)), ["w"]);
        c.mark("w", false, t0 + ms(1400));
        c.remove(&"w");
        assert!(c.pop_due(t0 + ms(9999)).is_empty());
    }
}
