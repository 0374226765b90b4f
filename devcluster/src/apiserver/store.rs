//! Owns the object store: every object as JSON keyed by resource
//! (`group/plural`), namespace and name, one global resourceVersion counter,
//! and a bounded history of watch events per resource.
//!
//! Invariants:
//! 1. Every write takes the one lock, assigns the next resourceVersion,
//!    stores the object, appends the event to the history and broadcasts it,
//!    all before releasing the lock, so watchers see writes in
//!    resourceVersion order, each once.
//! 2. A write that changes nothing stores nothing and emits no event.
//! 3. A resource's history serves watches from its start on: the floor (0,
//!    or the restored resourceVersion after a restart; never "now": a
//!    resource nobody wrote yet has missed nothing) until an event leaves
//!    the history, then the resourceVersion just before the oldest event
//!    still kept, as kube-apiserver's watch cache (`too old resource
//!    version: <rv> (<oldest kept - 1>)`): a watch from an older
//!    resourceVersion is answered with 410 Gone, even when no event after
//!    it was lost. Events leave the history past `history_limit` per
//!    resource and once older than the watch window (kube-apiserver's etcd
//!    compaction, every 5 minutes by default): at the resource's next write
//!    or watch, and at the latest at the next memory sweep (`memory.rs`).
//! 4. An object with a deletionTimestamp, no finalizers and no pending grace
//!    period is removed by the write that reaches that state.
//! 5. The last [`LIVE_EVENTS`] events of a resource hold their objects as
//!    values; older ones hold them packed as deflated JSON (a pod as a
//!    value costs several times its JSON, and its JSON several times its
//!    deflated form), parsed again only for a watcher that
//!    catches up from that far back. A history of thousands of pod
//!    versions so costs a few kilobytes per version, not tens; a packed
//!    event shares its previous object with the event that wrote it while
//!    the history holds that one (each version is packed once).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::{Notify, broadcast};

use super::auth::rbac;
use super::registry::{Registry, ResourceInfo};
use super::status::ApiError;

/// Key of an object inside one resource: `(namespace, name)`.
pub(crate) type ObjKey = (String, String);

/// Kind of a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change to one object.
#[derive(Debug)]
pub(crate) struct WatchEvent {
    pub(crate) type_: EventType,
    pub(crate) rv: u64,
    /// The object and the one before the change (for selector
    /// transitions): values while the event is recent, packed as JSON once
    /// it is not (invariant 5).
    body: Mutex<Body>,
    /// The event's wire line as stored (encoded once, shared by every
    /// watcher that needs it unchanged); dropped when the event is packed.
    encoded: Mutex<Option<bytes::Bytes>>,
    /// When the write happened (events older than the window are
    /// compacted).
    pub(crate) at: std::time::Instant,
}

#[derive(Debug)]
enum Body {
    Live {
        object: Arc<Value>,
        previous: Option<Arc<Value>>,
    },
    Packed {
        object: bytes::Bytes,
        previous: Option<bytes::Bytes>,
    },
}

/// Events of a resource kept as values (the rest of its history is packed,
/// invariant 5): what watchers that keep up read.
const LIVE_EVENTS: usize = 64;

impl WatchEvent {
    fn new(type_: EventType, rv: u64, object: Arc<Value>, previous: Option<Arc<Value>>) -> Self {
        WatchEvent {
            type_,
            rv,
            body: Mutex::new(Body::Live { object, previous }),
            encoded: Mutex::new(None),
            at: std::time::Instant::now(),
        }
    }

    fn body(&self) -> MutexGuard<'_, Body> {
        self.body.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The object after the change and the one before it (a packed event
    /// is parsed again).
    pub(crate) fn objects(&self) -> (Arc<Value>, Option<Arc<Value>>) {
        let parse = |b: &bytes::Bytes| Arc::new(unpack(b));
        match &*self.body() {
            Body::Live { object, previous } => (object.clone(), previous.clone()),
            Body::Packed { object, previous } => (parse(object), previous.as_ref().map(parse)),
        }
    }

    /// The wire line `encode` makes of the event, made once while the
    /// event is live.
    pub(crate) fn encoded(&self, encode: impl FnOnce() -> bytes::Bytes) -> bytes::Bytes {
        let mut enc = self.encoded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(line) = &*enc {
            return line.clone();
        }
        let line = encode();
        if matches!(&*self.body(), Body::Live { .. }) {
            *enc = Some(line.clone());
        }
        line
    }

    /// Packs the event's objects as JSON (invariant 5). `prior` is the
    /// packed object of the event that wrote this one's previous object,
    /// when the history still holds it: shared, not packed a second time.
    fn pack(&self, prior: Option<bytes::Bytes>) {
        let mut body = self.body();
        if let Body::Live { object, previous } = &*body {
            *body = Body::Packed {
                object: packed(object),
                previous: previous
                    .as_deref()
                    .map(|p| prior.unwrap_or_else(|| packed(p))),
            };
        }
        drop(body);
        *self.encoded.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The resourceVersion of the object this event replaced.
    fn previous_rv(&self) -> Option<u64> {
        match &*self.body() {
            Body::Live {
                previous: Some(p), ..
            } => p
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .and_then(|v| v.parse().ok()),
            _ => None,
        }
    }

    /// The object as packed JSON, once the event is packed.
    fn packed_object(&self) -> Option<bytes::Bytes> {
        match &*self.body() {
            Body::Packed { object, .. } => Some(object.clone()),
            Body::Live { .. } => None,
        }
    }
}

/// An object packed for the history (invariant 5): its JSON, deflated
/// (objects' JSON shrinks several times, and packed events are read only by
/// a watcher catching up from far back), exactly as long as it is (a Vec's
/// spare capacity would stay allocated for as long as the event is kept).
fn packed(v: &Value) -> bytes::Bytes {
    let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    let deflated = serde_json::to_writer(&mut z, v)
        .ok()
        .and_then(|()| z.finish().ok())
        .unwrap_or_default();
    bytes::Bytes::from(deflated.into_boxed_slice())
}

/// The object [`packed`] packed (`null` if the bytes are not its output).
fn unpack(b: &[u8]) -> Value {
    serde_json::from_reader(flate2::read::DeflateDecoder::new(b)).unwrap_or(Value::Null)
}

struct ResourceState {
    objects: BTreeMap<ObjKey, Arc<Value>>,
    history: VecDeque<Arc<WatchEvent>>,
    /// The floor, then the resourceVersion of the last event that left
    /// the history.
    compacted: u64,
    /// Whether any event left the history (invariant 3).
    evicted: bool,
    tx: broadcast::Sender<Arc<WatchEvent>>,
}

impl ResourceState {
    fn new(compacted: u64) -> Self {
        Self {
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            compacted,
            evicted: false,
            tx: broadcast::channel(4096).0,
        }
    }

    /// The oldest resourceVersion a watch may start from (invariant 3).
    fn start(&self) -> u64 {
        match self.history.front() {
            Some(first) if self.evicted => (first.rv - 1).max(self.compacted),
            _ => self.compacted,
        }
    }
}

/// Past events after a resourceVersion and a receiver for later ones.
pub(crate) type WatchSubscription = (Vec<Arc<WatchEvent>>, broadcast::Receiver<Arc<WatchEvent>>);

/// The locked state.
pub(crate) struct StoreState {
    rv: u64,
    /// The resourceVersion the history starts at (the restored one after a
    /// restart, else 0): no event of any resource before it is kept.
    floor: u64,
    pub(crate) registry: Registry,
    resources: HashMap<String, ResourceState>,
    history_limit: usize,
    /// How long an event stays in the history.
    window: std::time::Duration,
    dirty: bool,
    /// The journal every change goes to first, with a data directory
    /// (`persist` invariant 1).
    journal: Option<super::persist::Journal>,
    /// The RBAC index; dropped by every write to an RBAC resource and
    /// rebuilt by the next request that needs it.
    rbac: Option<Arc<rbac::Index>>,
    /// Counts writes to RBAC resources (the aggregation controller
    /// re-aggregates when it moves).
    rbac_writes: u64,
}

impl StoreState {
    /// How many writes to RBAC resources happened so far.
    pub(crate) fn rbac_writes(&self) -> u64 {
        self.rbac_writes
    }

    /// The RBAC index of the stored roles and bindings.
    pub(crate) fn rbac_index(&mut self) -> Arc<rbac::Index> {
        if let Some(i) = &self.rbac {
            return i.clone();
        }
        let objs = |key: &str| -> Vec<Arc<Value>> {
            self.resources
                .get(key)
                .map(|r| r.objects.values().cloned().collect())
                .unwrap_or_default()
        };
        let (cr, r, crb, rb) = (
            objs(rbac::CLUSTER_ROLES),
            objs(rbac::ROLES),
            objs(rbac::CLUSTER_ROLE_BINDINGS),
            objs(rbac::ROLE_BINDINGS),
        );
        let index = Arc::new(rbac::Index::build(
            cr.iter().map(|v| &**v),
            r.iter().map(|v| &**v),
            crb.iter().map(|v| &**v),
            rb.iter().map(|v| &**v),
        ));
        self.rbac = Some(index.clone());
        index
    }

    fn res(&mut self, key: &str) -> &mut ResourceState {
        // A resource seen for the first time has had no events since the
        // floor (any write would have created its state).
        let compacted = self.floor;
        self.resources
            .entry(key.to_string())
            .or_insert_with(|| ResourceState::new(compacted))
    }

    /// The current global resourceVersion.
    pub(crate) fn rv(&self) -> u64 {
        self.rv
    }

    /// One object.
    pub(crate) fn get(&self, key: &str, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.resources
            .get(key)?
            .objects
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Objects of a resource, optionally one namespace, in key order,
    /// starting after `after`.
    pub(crate) fn scan<'a>(
        &'a self,
        key: &str,
        ns: Option<&'a str>,
        after: Option<&'a ObjKey>,
    ) -> Box<dyn Iterator<Item = (&'a ObjKey, &'a Arc<Value>)> + 'a> {
        let Some(r) = self.resources.get(key) else {
            return Box::new(std::iter::empty());
        };
        use std::ops::Bound;
        let start = match after {
            Some(k) => Bound::Excluded(k.clone()),
            None => match ns {
                Some(ns) => Bound::Included((ns.to_string(), String::new())),
                None => Bound::Unbounded,
            },
        };
        Box::new(
            r.objects
                .range((start, Bound::Unbounded))
                .take_while(move |((n, _), _)| ns.is_none_or(|ns| n == ns)),
        )
    }

    /// Keys of every resource that has objects.
    pub(crate) fn resource_keys(&self) -> Vec<String> {
        self.resources
            .iter()
            .filter(|(_, r)| !r.objects.is_empty())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Stores `obj` (create or replace), assigning the next resourceVersion.
    /// Returns the stored object.
    pub(crate) fn put(&mut self, key: &str, ns: &str, name: &str, mut obj: Value) -> Arc<Value> {
        let deleting = obj
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|v| !v.is_null());
        let no_finalizers = obj
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(|f| f.is_empty());
        let no_grace = obj
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            == 0;
        let ns_pending = key == "/namespaces"
            && obj
                .pointer("/spec/finalizers")
                .and_then(Value::as_array)
                .is_some_and(|f| !f.is_empty());
        if deleting
            && no_finalizers
            && no_grace
            && !ns_pending
            && let Some(gone) = self.remove(key, ns, name)
        {
            return gone;
        }
        self.rv += 1;
        let rv = self.rv;
        obj["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let obj = Arc::new(obj);
        let limit = (self.history_limit, self.window);
        let r = self.res(key);
        let previous = r
            .objects
            .insert((ns.to_string(), name.to_string()), obj.clone());
        let type_ = if previous.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        Self::record(r, limit, WatchEvent::new(type_, rv, obj.clone(), previous));
        self.dirty = true;
        if let Some(j) = &mut self.journal {
            j.append(&super::persist::Entry {
                rv,
                key: key.into(),
                obj: Some(std::borrow::Cow::Borrowed(&*obj)),
                ns: None,
                name: None,
            });
        }
        if key == CRD_KEY {
            self.rebuild_registry();
            super::aggregator::sync(self);
        }
        if rbac::is_rbac_key(key) {
            self.rbac = None;
            self.rbac_writes += 1;
        }
        obj
    }

    /// Removes an object; the DELETED event carries a new resourceVersion.
    pub(crate) fn remove(&mut self, key: &str, ns: &str, name: &str) -> Option<Arc<Value>> {
        let k = (ns.to_string(), name.to_string());
        let previous = self.resources.get_mut(key)?.objects.remove(&k)?;
        self.rv += 1;
        let rv = self.rv;
        let mut obj = (*previous).clone();
        obj["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let obj = Arc::new(obj);
        let limit = (self.history_limit, self.window);
        let r = self.res(key);
        Self::record(
            r,
            limit,
            WatchEvent::new(EventType::Deleted, rv, obj.clone(), Some(previous)),
        );
        self.dirty = true;
        if let Some(j) = &mut self.journal {
            j.append(&super::persist::Entry {
                rv,
                key: key.into(),
                obj: None,
                ns: Some(ns.into()),
                name: Some(name.into()),
            });
        }
        if key == CRD_KEY {
            self.rebuild_registry();
            super::aggregator::sync(self);
        }
        if rbac::is_rbac_key(key) {
            self.rbac = None;
            self.rbac_writes += 1;
        }
        Some(obj)
    }

    fn record(r: &mut ResourceState, limit: (usize, std::time::Duration), ev: WatchEvent) {
        let ev = Arc::new(ev);
        r.history.push_back(ev.clone());
        if let Some(old) = r
            .history
            .len()
            .checked_sub(LIVE_EVENTS + 1)
            .and_then(|i| r.history.get(i))
        {
            // The event that wrote the previous object is older, so packed
            // already (events pack oldest first).
            let prior = old.previous_rv().and_then(|prv| {
                let i = r.history.binary_search_by_key(&prv, |e| e.rv).ok()?;
                r.history[i].packed_object()
            });
            old.pack(prior);
        }
        while r.history.len() > limit.0 {
            if let Some(old) = r.history.pop_front() {
                r.compacted = old.rv;
                r.evicted = true;
            }
        }
        Self::compact(r, limit.1);
        // No receivers is fine: nobody watches this resource right now.
        let _ = r.tx.send(ev);
    }

    /// Drops the events older than `window` (invariant 3); returns how
    /// many.
    fn compact(r: &mut ResourceState, window: std::time::Duration) -> usize {
        let mut dropped = 0;
        while let Some(old) = r.history.front() {
            if old.at.elapsed() <= window {
                break;
            }
            r.compacted = old.rv;
            r.evicted = true;
            r.history.pop_front();
            dropped += 1;
        }
        if dropped > 0 && r.history.capacity() > 4 * r.history.len().max(64) {
            r.history.shrink_to_fit();
        }
        dropped
    }

    /// Compacts every resource's history, written lately or not (invariant
    /// 3; `memory.rs`); returns how many events were dropped.
    pub(crate) fn compact_all(&mut self) -> usize {
        let window = self.window;
        self.resources
            .values_mut()
            .map(|r| Self::compact(r, window))
            .sum()
    }

    fn rebuild_registry(&mut self) {
        let crds: Vec<Value> = self
            .resources
            .get(CRD_KEY)
            .map(|r| r.objects.values().map(|v| (**v).clone()).collect())
            .unwrap_or_default();
        self.registry.set_crds(crds.iter());
    }

    /// Events of a resource after `since`, and a receiver for later ones;
    /// 410 when the history no longer reaches back to `since`.
    pub(crate) fn subscribe(
        &mut self,
        key: &str,
        since: u64,
    ) -> Result<WatchSubscription, ApiError> {
        let window = self.window;
        let r = self.res(key);
        Self::compact(r, window);
        if since < r.start() {
            return Err(too_old(since, r.start()));
        }
        let past = r.history.iter().filter(|e| e.rv > since).cloned().collect();
        Ok((past, r.tx.subscribe()))
    }

    /// Events after `since` still in the history (a lagging watcher catches
    /// up with these), or 410.
    pub(crate) fn replay(
        &mut self,
        key: &str,
        since: u64,
    ) -> Result<Vec<Arc<WatchEvent>>, ApiError> {
        let window = self.window;
        let r = self.res(key);
        Self::compact(r, window);
        if since < r.start() {
            return Err(too_old(since, r.start()));
        }
        Ok(r.history.iter().filter(|e| e.rv > since).cloned().collect())
    }
}

/// kube-apiserver's watch cache message: the asked resourceVersion and
/// the oldest one the history serves.
fn too_old(rv: u64, compacted: u64) -> ApiError {
    ApiError::gone(format!("too old resource version: {rv} ({compacted})"))
}

/// The storage key of CRDs.
pub(crate) const CRD_KEY: &str = "apiextensions.k8s.io/customresourcedefinitions";

/// The shared store.
pub(crate) struct Store {
    state: Mutex<StoreState>,
    /// Woken after deletions and finalizer changes (garbage collector).
    pub(crate) gc: Notify,
    /// Woken after writes (persistence).
    pub(crate) persist: Notify,
    /// The CA certificate (PEM) every namespace's `kube-root-ca.crt` holds.
    pub(crate) root_ca: std::sync::OnceLock<String>,
}

/// A snapshot for persistence: resourceVersion and objects per resource.
#[derive(serde::Serialize, serde::Deserialize, Default)]
pub(crate) struct Snapshot {
    pub(crate) rv: u64,
    pub(crate) resources: BTreeMap<String, Vec<Value>>,
}

impl Store {
    /// An empty store keeping at most `history_limit` events per resource,
    /// none older than `window`.
    pub(crate) fn new(history_limit: usize, window: std::time::Duration) -> Self {
        Self {
            state: Mutex::new(StoreState {
                rv: 0,
                floor: 0,
                registry: Registry::new(),
                resources: HashMap::new(),
                history_limit: history_limit.max(1),
                window,
                dirty: false,
                journal: None,
                rbac: None,
                rbac_writes: 0,
            }),
            gc: Notify::new(),
            persist: Notify::new(),
            root_ca: std::sync::OnceLock::new(),
        }
    }

    /// Locks the state.
    pub(crate) fn lock(&self) -> MutexGuard<'_, StoreState> {
        // A panic while holding the lock would be a bug; keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current registry.
    pub(crate) fn registry(&self) -> Registry {
        self.lock().registry.clone()
    }

    /// Replaces the contents with a snapshot (startup only).
    pub(crate) fn restore(&self, snap: Snapshot) {
        let mut st = self.lock();
        st.rv = snap.rv;
        st.floor = snap.rv;
        for (key, objs) in snap.resources {
            let rv = st.rv;
            let r = st
                .resources
                .entry(key)
                .or_insert_with(|| ResourceState::new(rv));
            for o in objs {
                let ns = o
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let name = o
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                r.objects.insert((ns, name), Arc::new(o));
            }
        }
        st.rebuild_registry();
        st.rbac = None;
    }

    /// Applies one journalled change past the store's resourceVersion
    /// (startup only; `persist` invariant 3). Returns whether it applied.
    pub(crate) fn replay(&self, e: super::persist::Entry<'_>) -> bool {
        let mut st = self.lock();
        if e.rv <= st.rv {
            return false;
        }
        st.rv = e.rv;
        let rv = st.rv;
        let r = st
            .resources
            .entry(e.key.into_owned())
            .or_insert_with(|| ResourceState::new(rv));
        match e.obj.map(std::borrow::Cow::into_owned) {
            Some(o) => {
                let at = |p: &str| {
                    o.pointer(p)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                let k = (at("/metadata/namespace"), at("/metadata/name"));
                r.objects.insert(k, Arc::new(o));
            }
            None => {
                let owned =
                    |c: Option<std::borrow::Cow<'_, str>>| c.unwrap_or_default().into_owned();
                r.objects.remove(&(owned(e.ns), owned(e.name)));
            }
        }
        st.dirty = true;
        true
    }

    /// Ends a restore: no history before the restored resourceVersion,
    /// the registry and RBAC index from the restored objects.
    pub(crate) fn finish_restore(&self) {
        let mut st = self.lock();
        st.floor = st.rv;
        let rv = st.rv;
        for r in st.resources.values_mut() {
            r.compacted = r.compacted.max(rv);
        }
        st.rebuild_registry();
        st.rbac = None;
    }

    /// Sends every change from now on to `journal` first.
    pub(crate) fn set_journal(&self, journal: super::persist::Journal) {
        self.lock().journal = Some(journal);
    }

    /// A snapshot when something changed since the last one, and the
    /// journal generation below which the snapshot covers every journal
    /// (`persist` invariant 2).
    pub(crate) fn snapshot_if_dirty(&self) -> Option<(Snapshot, u64)> {
        let mut st = self.lock();
        if !st.dirty {
            return None;
        }
        st.dirty = false;
        let upto = st.journal.as_mut().map_or(0, |j| j.rotate());
        let resources = st
            .resources
            .iter()
            .filter(|(_, r)| !r.objects.is_empty())
            .map(|(k, r)| {
                (
                    k.clone(),
                    r.objects.values().map(|v| (**v).clone()).collect(),
                )
            })
            .collect();
        Some((
            Snapshot {
                rv: st.rv,
                resources,
            },
            upto,
        ))
    }

    /// Notifies the background tasks after a write.
    pub(crate) fn wrote(&self, gc: bool) {
        self.persist.notify_one();
        if gc {
            self.gc.notify_one();
        }
    }
}

/// Checks that a namespaced object's namespace exists and is not
/// terminating.
pub(crate) fn check_namespace(
    st: &StoreState,
    info: &ResourceInfo,
    ns: &str,
    name: &str,
) -> Result<(), ApiError> {
    if !info.namespaced {
        return Ok(());
    }
    match st.get("/namespaces", "", ns) {
        None => Err(ApiError::not_found("", "namespaces", ns)),
        Some(n)
            if n.pointer("/metadata/deletionTimestamp")
                .is_some_and(|v| !v.is_null()) =>
        {
            // As the NamespaceLifecycle admission: the object's resource
            // and name, and a `NamespaceTerminating` cause.
            let mut e = ApiError::forbidden_on(
                &info.group,
                &info.plural,
                name,
                &format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                ),
            );
            if let Some(d) = e.details.as_mut() {
                d["causes"] = serde_json::json!([{
                    "reason": "NamespaceTerminating",
                    "message": format!("namespace {ns} is being terminated"),
                    "field": "metadata.namespace",
                }]);
            }
            Err(e)
        }
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    fn pods_key(store: &Store) -> String {
        store
            .registry()
            .all()
            .find(|r| r.builtin && r.plural == "pods")
            .expect("pods")
            .key()
    }

    /// Invariant 5: a watcher catching up from far back sees every
    /// version with the one before it, though the history packed them and
    /// shares each version between the event that wrote it and the next.
    #[test]
    fn packed_history_keeps_every_version_and_its_predecessor_once() {
        let store = Store::new(10_000, Duration::from_secs(300));
        let key = pods_key(&store);
        let writes = LIVE_EVENTS + 40;
        {
            let mut st = store.lock();
            for i in 0..writes {
                // Two pods written in turn: each event's previous object
                // is two events back.
                let name = format!("p{}", i % 2);
                st.put(
                    &key,
                    "ns",
                    &name,
                    json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": name, "namespace": "ns", "labels": {"v": i.to_string()}}}),
                );
            }
        }
        let events = store.lock().replay(&key, 0).unwrap();
        assert_eq!(events.len(), writes);
        let mut shared = 0;
        for (i, ev) in events.iter().enumerate() {
            let (object, previous) = ev.objects();
            assert_eq!(object["metadata"]["labels"]["v"], i.to_string());
            match i {
                0 | 1 => assert!(previous.is_none(), "event {i} created its pod"),
                _ => assert_eq!(
                    previous.expect("a previous object")["metadata"]["labels"]["v"],
                    (i - 2).to_string(),
                    "event {i}"
                ),
            }
            if let (
                Body::Packed {
                    previous: Some(p), ..
                },
                Some(prior),
            ) = (&*ev.body(), i.checked_sub(2).map(|j| &events[j]))
                && let Body::Packed { object, .. } = &*prior.body()
            {
                shared += usize::from(p.as_ptr() == object.as_ptr());
            }
        }
        // Every packed event but the first two (whose predecessors created
        // them) shares its previous object with an earlier packed event.
        assert_eq!(shared, writes - LIVE_EVENTS - 2);
    }
}
