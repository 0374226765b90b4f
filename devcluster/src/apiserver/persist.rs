//! Owns optional persistence: with a data directory, every change is
//! appended to a journal before the request that made it is answered, and
//! the whole store is written to `state.json` every few seconds (and on
//! shutdown), after which the journals it covers are removed. A restarted
//! server reads `state.json`, then replays the journals past it, so it
//! keeps every acknowledged object and its resourceVersion counter even
//! when it was SIGKILLed.
//!
//! Invariants:
//! 1. A change is in the journal (the kernel's page cache: a killed
//!    process loses nothing, a lost machine may) before the store's lock
//!    is released, so before any client hears of it.
//! 2. Journals are `journal-<generation>.jsonl`, one change per line; a
//!    snapshot switches to the next generation under the store's lock, so
//!    every change after the snapshot's resourceVersion is in a journal of
//!    a later generation, and a journal is removed only once a snapshot
//!    that covers it is on disk.
//! 3. Replay applies, in generation and line order, the changes whose
//!    resourceVersion is past the store's; a torn last line (a kill in
//!    mid-write) ends the replay of its file.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::ApiServerError;
use super::store::{Snapshot, Store};

/// The state file in `dir`.
pub(crate) fn state_file(dir: &Path) -> PathBuf {
    dir.join("state.json")
}

/// How long writes coalesce before the store is written whole; the
/// journal holds them meanwhile.
const SNAPSHOT_EVERY: Duration = Duration::from_secs(5);

/// One journalled change (invariant 2): `obj` for a create or update, else
/// the deleted object's namespace and name. Borrowed when written (no copy
/// of the object under the store's lock), owned when read back.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Entry<'a> {
    pub(crate) rv: u64,
    pub(crate) key: Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) obj: Option<Cow<'a, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ns: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<Cow<'a, str>>,
}

/// The open journal (invariants 1 and 2).
pub(crate) struct Journal {
    dir: PathBuf,
    generation: u64,
    file: std::fs::File,
    /// Whether a failed append was reported (once per file).
    warned: bool,
}

fn journal_file(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("journal-{generation:020}.jsonl"))
}

/// The journals in `dir`, oldest generation first.
fn journals(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let g = name.strip_prefix("journal-")?.strip_suffix(".jsonl")?;
            Some((g.parse().ok()?, e.path()))
        })
        .collect();
    found.sort();
    found
}

impl Journal {
    /// Opens generation `generation` in `dir` for appending.
    fn open(dir: &Path, generation: u64) -> Result<Self, ApiServerError> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = journal_file(dir, generation);
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| ApiServerError::io(&path, e))?;
        Ok(Journal {
            dir: dir.to_path_buf(),
            generation,
            file,
            warned: false,
        })
    }

    /// Appends one change (invariant 1).
    pub(crate) fn append(&mut self, entry: &Entry<'_>) {
        use std::io::Write as _;
        let mut line = match serde_json::to_vec(entry) {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e, "cannot journal a change");
                return;
            }
        };
        line.push(b'\n');
        if let Err(e) = self.file.write_all(&line)
            && !self.warned
        {
            self.warned = true;
            warn!(error = %e, dir = %self.dir.display(), "cannot append to the journal: a restart may lose changes until the next snapshot");
        }
    }

    /// Switches to the next generation (invariant 2); returns the
    /// generation the new file starts, below which every journal is
    /// covered by the snapshot taken with it.
    pub(crate) fn rotate(&mut self) -> u64 {
        match Journal::open(&self.dir, self.generation + 1) {
            Ok(next) => *self = next,
            Err(e) => {
                warn!(error = %e, "cannot open the next journal; appending to the current one")
            }
        }
        self.generation
    }
}

/// Loads `state.json` from `dir` into the store, if it exists, replays the
/// journals past it (invariant 3) and opens the next journal.
pub(crate) fn load(dir: &Path, store: &Store) -> Result<(), ApiServerError> {
    let path = state_file(dir);
    match std::fs::read(&path) {
        Ok(raw) => {
            let snap: Snapshot =
                serde_json::from_slice(&raw).map_err(|e| ApiServerError::Corrupt {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            store.restore(snap);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(ApiServerError::io(&path, e)),
    }
    let found = journals(dir);
    let mut replayed = 0usize;
    for (_, file) in &found {
        let raw = std::fs::read(file).map_err(|e| ApiServerError::io(file, e))?;
        for line in raw.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            match serde_json::from_slice::<Entry>(line) {
                Ok(entry) => replayed += usize::from(store.replay(entry)),
                Err(e) => {
                    warn!(file = %file.display(), error = %e, "a torn journal line: the rest of this file is skipped");
                    break;
                }
            }
        }
    }
    if replayed > 0 {
        tracing::info!(
            changes = replayed,
            "replayed the journal past the last snapshot"
        );
    }
    store.finish_restore();
    let next = found.last().map_or(0, |(g, _)| g + 1);
    store.set_journal(Journal::open(dir, next)?);
    Ok(())
}

/// Removes the journals below generation `upto`, which a snapshot on
/// disk covers (invariant 2).
fn prune(dir: &Path, upto: u64) {
    for (g, file) in journals(dir) {
        if g < upto
            && let Err(e) = std::fs::remove_file(&file)
        {
            warn!(file = %file.display(), error = %e, "cannot remove a journal the snapshot covers");
        }
    }
}

fn write(dir: &Path, snap: &Snapshot) -> Result<(), ApiServerError> {
    let body = serde_json::to_string(snap).map_err(|e| ApiServerError::Corrupt {
        path: state_file(dir),
        reason: e.to_string(),
    })?;
    super::tls::write_private(&state_file(dir), &body)
}

/// Writes the store whenever it changed, until shutdown, then once more.
pub(crate) async fn run(dir: PathBuf, store: Arc<Store>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = store.persist.notified() => {}
        }
        // Coalesce writes into one file write; the journal holds them
        // meanwhile.
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(SNAPSHOT_EVERY) => {}
        }
        if let Some((snap, upto)) = store.snapshot_if_dirty() {
            let dir = dir.clone();
            match tokio::task::spawn_blocking(move || {
                write(&dir, &snap)?;
                prune(&dir, upto);
                Ok::<(), ApiServerError>(())
            })
            .await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(error = %e, "cannot persist the store"),
                Err(e) => warn!(error = %e, "the persistence task failed"),
            }
        }
    }
    flush(&dir, &store);
}

/// Writes the store now if it changed.
pub(crate) fn flush(dir: &Path, store: &Store) {
    if let Some((snap, upto)) = store.snapshot_if_dirty() {
        match write(dir, &snap) {
            Ok(()) => prune(dir, upto),
            Err(e) => warn!(error = %e, "cannot persist the store on shutdown"),
        }
    }
}
