//! Bounds on connections that have not authenticated yet: at most
//! `max_pending_handshakes` handshakes under way per transport and at most
//! `max_pending_per_source` from one source address, so whoever can reach a
//! port cannot grow the proc's memory with idle or garbage connections; a
//! connection over a bound is closed at once. Handshake failures are logged
//! at most once per interval, with the count of those not logged.
//!
//! Invariants:
//! 1. A slot is taken before a connection's handshake task is spawned and
//!    given back when that task ends, however it ends (the guard's drop).
//! 2. The per-source table holds only sources with a handshake under way.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a handshake failure (or a refusal) is logged at most.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The pending-handshake bounds of one transport.
#[derive(Debug)]
pub(crate) struct Admission {
    max_total: usize,
    max_per_source: usize,
    state: Mutex<PendingHandshake>,
}

#[derive(Debug, Default)]
struct PendingHandshake {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

/// Why a connection was refused before its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Too many handshakes under way on this transport.
    Total(usize),
    /// Too many handshakes under way from this source address.
    Source(usize),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Total(n) => write!(f, "{n} handshakes already under way"),
            Refusal::Source(n) => write!(f, "{n} handshakes already under way from this address"),
        }
    }
}

/// A pending handshake's slot; given back on drop (invariant 1).
#[derive(Debug)]
pub(crate) struct AdmitSlot {
    admission: Arc<Admission>,
    source: Option<IpAddr>,
}

impl Admission {
    /// Bounds of `max_total` handshakes, `max_per_source` from one address.
    pub(crate) fn new(max_total: usize, max_per_source: usize) -> Arc<Self> {
        Arc::new(Admission {
            max_total: max_total.max(1),
            max_per_source: max_per_source.max(1),
            state: Mutex::new(PendingHandshake::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PendingHandshake> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a handshake from `source` (`None`: a Unix socket), or why
    /// not.
    pub(crate) fn admit(self: &Arc<Self>, source: Option<IpAddr>) -> Result<AdmitSlot, Refusal> {
        let mut st = self.lock();
        if st.total >= self.max_total {
            return Err(Refusal::Total(st.total));
        }
        if let Some(ip) = source {
            let n = st.by_source.entry(ip).or_default();
            if *n >= self.max_per_source {
                return Err(Refusal::Source(*n));
            }
            *n += 1;
        }
        st.total += 1;
        Ok(AdmitSlot {
            admission: self.clone(),
            source,
        })
    }

    /// Handshakes under way.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.lock().total
    }
}

impl Drop for AdmitSlot {
    fn drop(&mut self) {
        let mut st = self.admission.lock();
        st.total = st.total.saturating_sub(1);
        if let Some(ip) = self.source
            && let Some(n) = st.by_source.get_mut(&ip)
        {
            *n -= 1;
            if *n == 0 {
                st.by_source.remove(&ip);
            }
        }
    }
}

/// Logs at most once per interval; counts what it held back.
#[derive(Debug, Default)]
pub(crate) struct WarnLimiter {
    state: Mutex<(Option<Instant>, u64)>,
}

impl WarnLimiter {
    /// `Some(suppressed)` when a warning may be logged now (with how many
    /// were held back since the last one), `None` when it is held back.
    pub(crate) fn allow(&self, now: Instant) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match st.0 {
            Some(last) if now.duration_since(last) < WARN_EVERY => {
                st.1 += 1;
                None
            }
            _ => {
                st.0 = Some(now);
                Some(std::mem::take(&mut st.1))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_hold_and_slots_come_back() {
        let a = Admission::new(3, 2);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let s1 = a.admit(Some(ip)).unwrap();
        let s2 = a.admit(Some(ip)).unwrap();
        assert_eq!(a.admit(Some(ip)).unwrap_err(), Refusal::Source(2));
        let s3 = a.admit(Some(other)).unwrap();
        assert_eq!(a.admit(None).unwrap_err(), Refusal::Total(3));
        drop(s1);
        let s4 = a.admit(Some(ip)).unwrap();
        drop((s2, s3, s4));
        assert_eq!(a.pending(), 0);
        assert!(a.lock().by_source.is_empty(), "invariant 2");
    }

    #[test]
    fn warnings_are_limited_and_count_what_was_held_back() {
        let w = WarnLimiter::default();
        let t0 = Instant::now();
        assert_eq!(w.allow(t0), Some(0));
        assert_eq!(w.allow(t0 + Duration::from_secs(1)), None);
        assert_eq!(w.allow(t0 + Duration::from_secs(2)), None);
        assert_eq!(w.allow(t0 + WARN_EVERY + Duration::from_secs(1)), Some(2));
    }
}
