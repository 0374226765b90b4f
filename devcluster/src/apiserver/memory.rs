//! The server gives memory back (issue 30: churn of 803 Worlds took the
//! embedded API server from 25 MB to 1.04 GB of RSS, and it stayed there).
//!
//! Invariants:
//! 1. Events expire `event_ttl` after they were last written (their
//!    `lastTimestamp`, `series.lastObservedTime`, `eventTime`, managed
//!    fields' times or creation, whichever is latest), as kube-apiserver's
//!    `--event-ttl` (default one hour) has etcd expire them; the deletion
//!    is an ordinary one (watchers see `DELETED`).
//! 2. Every [`SWEEP`] the watch history of every resource is compacted
//!    (store invariant 3), not only of the resources written since: after
//!    churn stops, the events of deleted objects, and the objects in them,
//!    are dropped within the watch window plus a sweep.
//! 3. After a sweep that dropped anything, the allocator returns free pages
//!    to the system (`malloc_trim`), so RSS falls back with the heap.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::handlers::delete_one;
use super::lifecycle::DeleteOpts;
use super::store::Store;

/// How often the sweep runs.
pub(crate) const SWEEP: Duration = Duration::from_secs(10);

/// kube-apiserver's default `--event-ttl`.
pub(crate) const DEFAULT_EVENT_TTL: Duration = Duration::from_secs(3600);

/// The storage key of Events (core and `events.k8s.io` share it).
const EVENTS_KEY: &str = "/events";

/// When an Event was last written (invariant 1).
fn last_written(ev: &Value) -> Option<DateTime<Utc>> {
    let at = |p: &str| {
        ev.pointer(p)
            .and_then(Value::as_str)
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.with_timezone(&Utc))
    };
    let managed = ev
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m["time"].as_str())
        .filter_map(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc));
    [
        "/lastTimestamp",
        "/series/lastObservedTime",
        "/eventTime",
        "/firstTimestamp",
        "/metadata/creationTimestamp",
    ]
    .into_iter()
    .filter_map(at)
    .chain(managed)
    .max()
}

/// The Events written more than `ttl` before `now`: (namespace, name).
fn expired(store: &Store, ttl: Duration, now: DateTime<Utc>) -> Vec<(String, String)> {
    let Ok(ttl) = chrono::Duration::from_std(ttl) else {
        return Vec::new();
    };
    let st = store.lock();
    st.scan(EVENTS_KEY, None, None)
        .filter(|(_, ev)| last_written(ev).is_some_and(|t| t + ttl < now))
        .map(|((ns, name), _)| (ns.clone(), name.clone()))
        .collect()
}

/// Deletes the Events past `ttl` (invariant 1); returns how many.
fn expire_events(store: &Store, ttl: Duration) -> usize {
    let old = expired(store, ttl, Utc::now());
    if old.is_empty() {
        return 0;
    }
    let reg = store.registry();
    let Some(info) = reg.by_key(EVENTS_KEY) else {
        return 0;
    };
    let mut n = 0;
    for (ns, name) in old {
        if delete_one(
            store,
            &info,
            info.preferred(),
            &ns,
            &name,
            &DeleteOpts::default(),
            false,
        )
        .is_ok()
        {
            n += 1;
        }
    }
    store.wrote(false);
    n
}

/// Returns free heap pages to the system (invariant 3).
fn trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Runs the sweep until shutdown.
pub(crate) async fn run(store: Arc<Store>, event_ttl: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let expired = expire_events(&store, event_ttl);
        let dropped = store.lock().compact_all();
        if expired + dropped > 0 {
            debug!(expired, dropped, "memory sweep");
            trim();
        }
    }
}

/// Parses a Go-style duration as kube-apiserver's flags take it (`1h`,
/// `30m`, `90s`, `1h30m`, `500ms`).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad =
        || format!("invalid duration {s:?}: use a number and a unit, e.g. 1h, 30m, 90s, 1h30m");
    let mut total = Duration::ZERO;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(bad)?;
        let (num, tail) = rest.split_at(digits);
        let n: f64 = num.parse().map_err(|_| bad())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let secs = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return Err(bad()),
        };
        total += Duration::try_from_secs_f64(n * secs).map_err(|_| bad())?;
        rest = tail;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_event_is_as_old_as_its_last_write() {
        let ev = json!({
            "metadata": {"creationTimestamp": "2024-01-01T00:00:00Z",
                "managedFields": [{"time": "2024-01-01T00:10:00Z"}]},
            "firstTimestamp": "2024-01-01T00:00:00Z",
            "lastTimestamp": "2024-01-01T00:30:00Z",
        });
        assert_eq!(
            last_written(&ev).unwrap().to_rfc3339(),
            "2024-01-01T00:30:00+00:00"
        );
        let series = json!({"metadata": {"creationTimestamp": "2024-01-01T00:00:00Z"},
            "eventTime": "2024-01-01T00:00:00.000000Z",
            "series": {"count": 3, "lastObservedTime": "2024-01-01T02:00:00.000000Z"}});
        assert_eq!(
            last_written(&series).unwrap().to_rfc3339(),
            "2024-01-01T02:00:00+00:00"
        );
        assert!(last_written(&json!({"metadata": {}})).is_none());
    }

    #[test]
    fn durations_as_kube_apiserver_flags_take_them() {
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        for bad in ["", "1", "h", "1d", "-1h"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("invalid duration"), "{bad}: {e}");
        }
    }
}
