//! A World's address book as the hub sends it: the whole book once per
//! agent link, then only what changed ([`BookLog`]), so a host that joins,
//! leaves or is replaced costs one entry per agent, O(hosts) per change,
//! not the whole book to every agent (O(hosts²)).
//!
//! Invariants:
//! 1. Every change of the book (a sync of the World that adds, removes or
//!    readdresses hosts, or changes an epoch) raises the version by one;
//!    the log records which ranks each version changed.
//! 2. A patch from `base` lists every rank changed after `base`, with its
//!    current entry, so applying it to the book of version `base` gives the
//!    current book; a `base` older than the log reaches gets the whole book.
//! 3. The log holds at most [`BookLog::MAX_LOG`] or the book's size of
//!    changes, whichever is larger: a patch is never longer than the whole
//!    book would be by more than that bound.
//! 4. One sender task per agent link sends the latest book only: the whole
//!    book first, then patches on top of what the agent acknowledged; an
//!    agent that holds another version is sent the whole book again.
//! 5. At most [`FULL_BOOKS`] whole books are built and in flight at once,
//!    so a thousand agents connecting together cost a few books of memory,
//!    not a thousand.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hostmesh_crds::Rank;
use tracing::debug;

use super::WorldAgents;
use super::agent::{AgentLink, BookAck, BookUpdate, HostKey};

/// A World's book, its version and its recent changes.
#[derive(Debug, Default)]
pub struct BookLog {
    version: u64,
    entries: BTreeMap<Rank, (SocketAddr, u64)>,
    /// `(version, rank)` of each change, oldest first (invariant 1).
    log: VecDeque<(u64, Rank)>,
    /// The oldest base a patch can start from (invariant 3).
    floor: u64,
}

impl BookLog {
    /// Fewest changes kept, whatever the book's size.
    pub const MAX_LOG: usize = 64;

    /// The current version (0: never set).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Brings the book in line with `agents`; returns whether it changed
    /// (invariant 1).
    pub fn update(&mut self, agents: &WorldAgents) -> bool {
        let next: BTreeMap<Rank, (SocketAddr, u64)> = agents
            .hosts
            .iter()
            .map(|(r, (_, a))| (*r, (*a, agents.epochs.get(r).copied().unwrap_or(0))))
            .collect();
        let mut changed: BTreeSet<Rank> = BTreeSet::new();
        for (r, e) in &next {
            if self.entries.get(r) != Some(e) {
                changed.insert(*r);
            }
        }
        for r in self.entries.keys() {
            if !next.contains_key(r) {
                changed.insert(*r);
            }
        }
        if changed.is_empty() && self.version > 0 {
            return false;
        }
        self.version += 1;
        self.entries = next;
        for r in changed {
            self.log.push_back((self.version, r));
        }
        let cap = Self::MAX_LOG.max(self.entries.len());
        while self.log.len() > cap {
            if let Some((v, _)) = self.log.pop_front() {
                self.floor = self.floor.max(v);
            }
        }
        true
    }

    /// The whole book.
    pub fn full(&self) -> BookUpdate {
        BookUpdate::Full {
            version: self.version,
            hosts: self
                .entries
                .iter()
                .map(|(r, (a, e))| (*r, *a, *e))
                .collect(),
        }
    }

    /// Whether a patch from `base` is possible (else the whole book).
    pub fn reaches(&self, base: u64) -> bool {
        base > 0 && base >= self.floor && base <= self.version
    }

    /// The changes after `base` (invariant 2), or the whole book when
    /// the log does not reach back to `base`.
    pub fn since(&self, base: u64) -> BookUpdate {
        if !self.reaches(base) {
            return self.full();
        }
        let ranks: BTreeSet<Rank> = self
            .log
            .iter()
            .rev()
            .take_while(|(v, _)| *v > base)
            .map(|(_, r)| *r)
            .collect();
        BookUpdate::Patch {
            base,
            version: self.version,
            len: self.len(),
            changes: ranks
                .into_iter()
                .map(|r| match self.entries.get(&r) {
                    Some((a, e)) => (r, Some(*a), *e),
                    None => (r, None, 0),
                })
                .collect(),
        }
    }

    /// The book's length: one past the highest rank with an entry.
    fn len(&self) -> usize {
        self.entries.keys().next_back().map_or(0, |r| r + 1)
    }
}

/// Whole books built and in flight at once, over every World (invariant 5).
pub const FULL_BOOKS: usize = 16;
static FULL_BOOK_PERMITS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(FULL_BOOKS);

/// First and longest wait before an undelivered address book is sent again.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Sends `link`'s agent the World's book, then every change, from a task
/// of its own (invariant 4): a hung agent holds up only this task (each
/// call ends at the client's call timeout), never a reconcile or another
/// host. A book that was not delivered is sent again with a backoff until
/// it is. The task ends when the returned sender is dropped (the link
/// dropped, or the host left); sending it a version wakes the task.
pub fn sender(
    link: Arc<dyn AgentLink>,
    book: Arc<Mutex<BookLog>>,
    host: HostKey,
) -> tokio::sync::watch::Sender<u64> {
    let current = lock(&book).version();
    let (tx, mut rx) = tokio::sync::watch::channel(current);
    tokio::spawn(async move {
        let mut backoff = RETRY_MIN;
        // The version the agent holds (0: none yet, send the whole book).
        let mut acked = 0;
        loop {
            let wanted = *rx.borrow_and_update();
            if acked >= wanted && acked > 0 {
                if rx.changed().await.is_err() {
                    return;
                }
                continue;
            }
            let whole = !lock(&book).reaches(acked);
            let permit = match whole {
                true => FULL_BOOK_PERMITS.acquire().await.ok(),
                false => None,
            };
            let update = lock(&book).since(acked);
            let version = update.version();
            let sent = link.send_book(update).await;
            drop(permit);
            match sent {
                Ok(BookAck::Applied) => {
                    backoff = RETRY_MIN;
                    acked = version;
                }
                Ok(BookAck::Holds(v)) => {
                    debug!(world = %host.world.name, rank = host.rank, holds = v, "the agent holds another book version; sending the whole book");
                    acked = 0;
                }
                // Not delivered (the agent's actor not up yet, a call
                // timeout): the agent needs the book to start any rank but
                // 0's procs, so it is sent again, or a newer one as soon as
                // there is one.
                Err(e) => {
                    debug!(world = %host.world.name, rank = host.rank, error = %e, retry_in = ?backoff, "sending the address book failed");
                    tokio::select! {
                        r = rx.changed() => if r.is_err() { return },
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
            }
        }
    });
    tx
}

pub(super) fn lock(book: &Mutex<BookLog>) -> std::sync::MutexGuard<'_, BookLog> {
    book.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agents(hosts: &[(Rank, u8, u64)]) -> WorldAgents {
        WorldAgents {
            secret: Arc::from(&b"0123456789abcdef"[..]),
            previous: None,
            trust: None,
            health_timeout: Duration::from_secs(10),
            heartbeat_interval: hostmesh_crds::validate::DEFAULT_HEARTBEAT_INTERVAL,
            hosts: hosts
                .iter()
                .map(|(r, ip, _)| {
                    (
                        *r,
                        (format!("uid-{r}"), SocketAddr::from(([10, 0, 0, *ip], 1))),
                    )
                })
                .collect(),
            epochs: hosts.iter().map(|(r, _, e)| (*r, *e)).collect(),
        }
    }

    /// Applies `u` to `book` as an agent does; `false` when it does not
    /// apply (another base).
    fn apply(book: &mut (u64, BTreeMap<Rank, (SocketAddr, u64)>), u: &BookUpdate) -> bool {
        match u {
            BookUpdate::Full { version, hosts } => {
                book.0 = *version;
                book.1 = hosts.iter().map(|(r, a, e)| (*r, (*a, *e))).collect();
            }
            BookUpdate::Patch {
                base,
                version,
                changes,
                ..
            } => {
                if *base != book.0 {
                    return false;
                }
                for (r, a, e) in changes {
                    match a {
                        Some(a) => book.1.insert(*r, (*a, *e)),
                        None => book.1.remove(r),
                    };
                }
                book.0 = *version;
            }
        }
        true
    }

    /// Invariants 1 and 2: a patch from any version the log reaches turns
    /// that version's book into the current one, and lists only the
    /// changed ranks.
    #[test]
    fn patches_carry_only_the_changes() {
        let mut log = BookLog::default();
        assert!(log.update(&agents(&[(0, 1, 5), (1, 2, 5)])));
        let v1 = (log.version(), {
            let mut b = (0, BTreeMap::new());
            apply(&mut b, &log.full());
            b.1
        });
        assert!(
            !log.update(&agents(&[(0, 1, 5), (1, 2, 5)])),
            "no change, no version"
        );
        assert!(log.update(&agents(&[(0, 1, 5), (1, 2, 5), (2, 3, 5)])));
        assert!(log.update(&agents(&[(0, 1, 5), (1, 4, 6), (2, 3, 5)])));
        assert!(log.update(&agents(&[(1, 4, 6), (2, 3, 5)])));
        let mut book = v1;
        let patch = log.since(book.0);
        let BookUpdate::Patch { changes, len, .. } = &patch else {
            panic!("a patch, got {patch:?}");
        };
        assert_eq!(changes.len(), 3, "ranks 0, 1, 2 changed: {changes:?}");
        assert_eq!(*len, 3);
        assert!(apply(&mut book, &patch));
        let mut whole = (0, BTreeMap::new());
        apply(&mut whole, &log.full());
        assert_eq!(book, whole);
        assert_eq!(book.1.len(), 2);
    }

    /// Invariant 3: a base the log no longer reaches gets the whole book.
    #[test]
    fn an_old_base_gets_the_whole_book() {
        let mut log = BookLog::default();
        for epoch in 1..(BookLog::MAX_LOG as u64 + 10) {
            log.update(&agents(&[(0, 1, 1), (1, 2, epoch)]));
        }
        assert!(matches!(log.since(1), BookUpdate::Full { .. }));
        assert!(
            matches!(log.since(log.version() - 1), BookUpdate::Patch { ref changes, .. } if changes.len() == 1)
        );
        assert!(matches!(log.since(0), BookUpdate::Full { .. }));
    }
}
