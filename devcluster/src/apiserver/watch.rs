//! Owns watch streams: the initial state or the history after a
//! resourceVersion, then live events, filtered by namespace, name and
//! selectors, with bookmarks, timeouts and `410 Gone`.
//!
//! Invariants:
//! 1. A watcher receives each event at most once and in resourceVersion
//!    order: events at or below the last sent resourceVersion are skipped.
//! 2. A watcher that falls behind the broadcast catches up from the
//!    history; if the history no longer reaches back, it gets an ERROR
//!    event with code 410 and the stream ends (the client re-lists).
//! 3. A bookmark carries the resourceVersion of the last event this
//!    watcher was sent (or the start), so resuming from it loses nothing.
//! 4. An object that stops (starts) matching the selectors is sent as
//!    DELETED (ADDED), as the real server's watch cache does.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::handlers::{Request, present};
use super::response::to_vec_ordered;
use super::route::RouteTarget;
use super::selector::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::store::{EventType, Store, WatchEvent};
use super::table;

struct Filter {
    ns: Option<String>,
    name: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn matches(&self, o: &Value) -> bool {
        let m = o.get("metadata");
        let ns = m
            .and_then(|m| m.get("namespace"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let name = m
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("");
        self.ns.as_deref().is_none_or(|n| n == ns)
            && self.name.as_deref().is_none_or(|n| n == name)
            && self.labels.matches(o)
            && self.fields.matches(o)
    }
}

struct Encoder {
    target: RouteTarget,
    table: bool,
    metadata: bool,
    include: Option<String>,
    first: bool,
}

impl Encoder {
    fn event(&mut self, type_: &str, obj: &Value) -> Bytes {
        let o = present(&self.target.info, &self.target.version, obj);
        let o = if self.table && type_ != "BOOKMARK" && type_ != "ERROR" {
            let t = table::table(
                &self.target.info,
                &self.target.version,
                &[o],
                self.include.as_deref(),
                None,
                self.first,
            );
            self.first = false;
            t
        } else if self.metadata && type_ != "ERROR" {
            super::handlers::metadata_only(&o)
        } else {
            o
        };
        let mut line = to_vec_ordered(&json!({"type": type_, "object": o}));
        line.push(b'\n');
        Bytes::from(line)
    }

    /// Whether this watcher sends the stored object unchanged (no Table,
    /// no metadata-only, no version or storage conversion).
    fn plain(&self, obj: &Value) -> bool {
        !self.table
            && !self.metadata
            && obj.get("apiVersion").and_then(Value::as_str)
                == Some(self.target.info.api_version(&self.target.version).as_str())
            && self.target.info.group != "events.k8s.io"
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let o = json!({
            "kind": self.target.info.kind,
            "apiVersion": self.target.info.api_version(&self.target.version),
            "metadata": meta,
        });
        let mut line = to_vec_ordered(&json!({"type": "BOOKMARK", "object": o}));
        line.push(b'\n');
        Bytes::from(line)
    }
}

fn error_line(e: &ApiError) -> Bytes {
    let mut line = to_vec_ordered(&json!({"type": "ERROR", "object": e.to_status()}));
    line.push(b'\n');
    Bytes::from(line)
}

/// Watch settings from the server configuration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WatchConfig {
    pub(crate) bookmark_interval: Duration,
    pub(crate) default_timeout: Duration,
}

/// Starts a watch; the returned receiver yields the response body chunks.
pub(crate) fn start(
    store: Arc<Store>,
    t: &RouteTarget,
    req: &Request,
    cfg: WatchConfig,
    shutdown: CancellationToken,
) -> Result<mpsc::Receiver<Bytes>, ApiError> {
    let fields = req.field_selector(&t.info)?;
    let filter = Filter {
        ns: t.ns.clone(),
        name: t.name.clone(),
        labels: req.label_selector()?,
        fields,
    };
    let timeout = match req.q("timeoutSeconds") {
        Some(s) if !s.is_empty() => Duration::from_secs(s.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "timeoutSeconds {s:?} is not a non-negative integer"
            ))
        })?),
        _ => cfg.default_timeout,
    }
    .min(Duration::from_secs(86_400));
    let bookmarks = req
        .q("allowWatchBookmarks")
        .is_some_and(|b| b == "true" || b == "1");
    let send_initial = req.q("sendInitialEvents").is_some_and(|b| b == "true");
    let rv_param = req.q("resourceVersion").unwrap_or("").to_string();
    let key = t.info.key();

    let (initial, past, rx, start_rv) = {
        let mut st = store.lock();
        if rv_param.is_empty() || rv_param == "0" || send_initial {
            let now = st.rv();
            let initial: Vec<Arc<Value>> = st
                .scan(&key, filter.ns.as_deref(), None)
                .filter(|(_, o)| filter.matches(o))
                .map(|(_, o)| o.clone())
                .collect();
            let (_, rx) = st.subscribe(&key, now)?;
            (initial, Vec::new(), rx, now)
        } else {
            let since = rv_param.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!("resourceVersion {rv_param:?} is not valid: pass the resourceVersion of a list or event"))
            })?;
            match st.subscribe(&key, since) {
                Ok((past, rx)) => (Vec::new(), past, rx, since),
                Err(e) => {
                    // 410 travels as an ERROR event in a 200 stream.
                    let (tx, out) = mpsc::channel(1);
                    let _ = tx.try_send(error_line(&e));
                    return Ok(out);
                }
            }
        }
    };
    let (tx, out) = mpsc::channel::<Bytes>(256);
    let enc = Encoder {
        target: t.clone(),
        table: req.wants_table(),
        metadata: req.wants_metadata(),
        include: req.q("includeObject").map(str::to_string),
        first: true,
    };
    tokio::spawn(run(
        store,
        key,
        filter,
        enc,
        initial,
        past,
        rx,
        start_rv,
        Params {
            timeout,
            bookmarks,
            send_initial,
            interval: cfg.bookmark_interval,
        },
        tx,
        shutdown,
    ));
    Ok(out)
}

struct Params {
    timeout: Duration,
    bookmarks: bool,
    send_initial: bool,
    interval: Duration,
}

#[allow(clippy::too_many_arguments)]
async fn run(
    store: Arc<Store>,
    key: String,
    filter: Filter,
    mut enc: Encoder,
    initial: Vec<Arc<Value>>,
    past: Vec<Arc<WatchEvent>>,
    mut rx: broadcast::Receiver<Arc<WatchEvent>>,
    start_rv: u64,
    p: Params,
    tx: mpsc::Sender<Bytes>,
    shutdown: CancellationToken,
) {
    let mut last = start_rv;
    for o in initial {
        if tx.send(enc.event("ADDED", &o)).await.is_err() {
            return;
        }
    }
    if p.send_initial && p.bookmarks && tx.send(enc.bookmark(last, true)).await.is_err() {
        return;
    }
    for ev in past {
        if !deliver(&tx, &mut enc, &filter, &ev, &mut last).await {
            return;
        }
    }
    let deadline = tokio::time::sleep(p.timeout);
    tokio::pin!(deadline);
    let mut tick = tokio::time::interval(p.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = &mut deadline => return,
            _ = shutdown.cancelled() => return,
            _ = tx.closed() => return,
            _ = tick.tick() => {
                // A resource that stopped being served (its CRD is gone)
                // ends its watches.
                if store.registry().by_key(&key).is_none() {
                    return;
                }
                if p.bookmarks && tx.send(enc.bookmark(last, false)).await.is_err() {
                    return;
                }
            }
            r = rx.recv() => match r {
                Ok(ev) => {
                    if !deliver(&tx, &mut enc, &filter, &ev, &mut last).await {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    let missed = store.lock().replay(&key, last);
                    match missed {
                        Ok(evs) => {
                            for ev in evs {
                                if !deliver(&tx, &mut enc, &filter, &ev, &mut last).await {
                                    return;
                                }
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(error_line(&e)).await;
                            return;
                        }
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}

/// Sends one event if it is new and matches (invariants 1 and 4).
async fn deliver(
    tx: &mpsc::Sender<Bytes>,
    enc: &mut Encoder,
    f: &Filter,
    ev: &WatchEvent,
    last: &mut u64,
) -> bool {
    if ev.rv <= *last {
        return true;
    }
    *last = ev.rv;
    let (object, previous) = ev.objects();
    let now = f.matches(&object);
    let before = previous.as_deref().is_some_and(|p| f.matches(p));
    let type_ = match ev.type_ {
        EventType::Added if now => "ADDED",
        EventType::Deleted if before || now => "DELETED",
        EventType::Modified if now && before => "MODIFIED",
        EventType::Modified if now => "ADDED",
        EventType::Modified if before => "DELETED",
        _ => return true,
    };
    let same_type = matches!(
        (ev.type_, type_),
        (EventType::Added, "ADDED")
            | (EventType::Modified, "MODIFIED")
            | (EventType::Deleted, "DELETED")
    );
    let line = if same_type && enc.plain(&object) {
        // Fan-out: encode once per event, not once per watcher.
        ev.encoded(|| enc.event(type_, &object))
    } else {
        enc.event(type_, &object)
    };
    tx.send(line).await.is_ok()
}
