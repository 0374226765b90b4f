//! Publishes Events so that each distinct message is its own Event.
//!
//! kube's [`Recorder`] folds repeats into one Event series keyed by type,
//! reason and the object, not by the message: a second `Restarting` with
//! "restart 2 of 2" only bumped the series of the first Event, which still
//! said "restart 1 of 2". Here every distinct (object, type, reason, note)
//! gets its own recorder, so an exact repeat still counts in that Event's
//! series while a new message is a new Event users see as the latest.
//!
//! Invariants:
//! 1. The same note on the same object and reason goes to the same Event
//!    (its series count grows); a different note never reuses an Event.
//! 2. At most [`MAX_SERIES`] recorders are kept; the oldest goes first, so
//!    the memory is bounded however many messages a run produces (a repeat
//!    of an evicted message starts a new Event, as after a restart).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, Recorder, Reporter};

/// Distinct messages remembered at once (invariant 2).
pub const MAX_SERIES: usize = 1024;

type Key = (String, String, String, String);

/// Event publisher with one series per distinct message.
pub struct NoteRecorder {
    client: Client,
    reporter: Reporter,
    series: Mutex<(HashMap<Key, Recorder>, VecDeque<Key>)>,
}

impl NoteRecorder {
    /// A publisher reporting as `reporter`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        NoteRecorder {
            client,
            reporter,
            series: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    /// The recorder of `ev` on `reference` (invariant 1), made on first use.
    fn recorder(&self, ev: &Event, reference: &ObjectReference) -> Recorder {
        let key = (
            reference.uid.clone().unwrap_or_else(|| {
                format!(
                    "{}/{}/{}",
                    reference.kind.as_deref().unwrap_or_default(),
                    reference.namespace.as_deref().unwrap_or_default(),
                    reference.name.as_deref().unwrap_or_default()
                )
            }),
            format!("{:?}", ev.type_),
            ev.reason.clone(),
            ev.note.clone().unwrap_or_default(),
        );
        let mut guard = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *guard;
        if let Some(r) = map.get(&key) {
            return r.clone();
        }
        while map.len() >= MAX_SERIES {
            let Some(old) = order.pop_front() else { break };
            map.remove(&old);
        }
        let r = Recorder::new(self.client.clone(), self.reporter.clone());
        map.insert(key.clone(), r.clone());
        order.push_back(key);
        r
    }

    /// Publishes `ev` on `reference`.
    pub async fn publish(
        &self,
        ev: &Event,
        reference: &ObjectReference,
    ) -> Result<(), kube::Error> {
        self.recorder(ev, reference).publish(ev, reference).await
    }
}
