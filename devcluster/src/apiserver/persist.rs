//! Owns optional persistence: with a data directory the store is written
//! to `state.json` shortly after every change (and on shutdown), and read
//! back on start, so a restarted server keeps its objects and its
//! resourceVersion counter.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::ApiServerError;
use super::store::{Snapshot, Store};

/// The state file in `dir`.
pub(crate) fn state_file(dir: &Path) -> PathBuf {
    dir.join("state.json")
}

/// Loads `state.json` from `dir` into the store, if it exists.
pub(crate) fn load(dir: &Path, store: &Store) -> Result<(), ApiServerError> {
    let path = state_file(dir);
    let raw = match std::fs::read(&path) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ApiServerError::io(&path, e)),
    };
    let snap: Snapshot = serde_json::from_slice(&raw).map_err(|e| ApiServerError::Corrupt {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    store.restore(snap);
    Ok(())
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
        // Coalesce bursts of writes into one file write.
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(snap) = store.snapshot_if_dirty() {
            let dir = dir.clone();
            match tokio::task::spawn_blocking(move || write(&dir, &snap)).await {
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
    if let Some(snap) = store.snapshot_if_dirty()
        && let Err(e) = write(dir, &snap)
    {
        warn!(error = %e, "cannot persist the store on shutdown");
    }
}
