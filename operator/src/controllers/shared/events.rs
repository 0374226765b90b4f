//! What both controllers' plans decide besides status: Events to publish
//! (severity, reason, message) and the restart backoff they share.

use std::time::Duration;

/// Warning or Normal, as Kubernetes Events have it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

/// An Event to publish on the reconciled object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedEvent {
    /// Normal or Warning.
    pub severity: Severity,
    /// CamelCase reason.
    pub reason: &'static str,
    /// Human message.
    pub note: String,
}

/// An Event of `severity` with `reason` and `note`.
pub fn event(severity: Severity, reason: &'static str, note: String) -> PlannedEvent {
    PlannedEvent {
        severity,
        reason,
        note,
    }
}

/// The restart delay after `restarts` restarts: `backoff * 2^restarts`,
/// capped at `max`.
pub fn backoff_delay(backoff: Duration, max: Duration, restarts: u32) -> Duration {
    backoff.saturating_mul(1u32 << restarts.min(20)).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Duration::from_secs(10);
        let max = Duration::from_secs(300);
        assert_eq!(backoff_delay(b, max, 0), b);
        assert_eq!(backoff_delay(b, max, 2), Duration::from_secs(40));
        assert_eq!(backoff_delay(b, max, 30), max);
    }
}
