//! Hands a World's rotated agent token to its agents (`Rekey`): the key
//! the agents derive from it and the lineage of its proc issuer
//! (`controllers::world::secret` invariant 5).
//!
//! Invariants:
//! 1. Once a World's token was rotated in place, each link to each of its
//!    agents carries the current [`Trust`] once, and again whenever it
//!    changes, from a task of its own: neither a reconcile nor another host
//!    waits on an agent (hub invariant 5). A failed `Rekey` is retried with
//!    backoff while the link lasts.
//! 2. What an agent acknowledged is recorded per link: a new link (the
//!    agent restarted and holds only its pod's token, or the operator
//!    restarted) starts from nothing. A rotation ends once every host's
//!    current link acknowledged the current trust ([`super::Hub::rekeyed`]).
//! 3. The key never reaches a log: [`Trust`]'s `Debug` hides it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, warn};

use super::agent::{AgentLink, HostKey, HostReport};

/// Least and most time between two tries of one link's `Rekey`.
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(10);

/// What every agent of a rotated World must hold.
pub struct Trust {
    /// The key agents derive from the World's current token.
    pub secret: Arc<[u8]>,
    /// The lineage of the current key's proc issuer, as text.
    pub lineage: Arc<str>,
    /// A fingerprint of both (never 0): what a link's agent acknowledged.
    pub version: u64,
}

impl Trust {
    /// The trust of `secret` and `lineage`.
    pub fn new(secret: &[u8], lineage: &str) -> Self {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(&(secret.len() as u64).to_be_bytes());
        ctx.update(secret);
        ctx.update(lineage.as_bytes());
        let d = ctx.finish();
        let mut v = [0u8; 8];
        v.copy_from_slice(&d.as_ref()[..8]);
        Trust {
            secret: secret.into(),
            lineage: lineage.into(),
            version: u64::from_be_bytes(v).max(1),
        }
    }
}

impl std::fmt::Debug for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Invariant 3.
        f.debug_struct("Trust")
            .field("version", &self.version)
            .field("lineage", &self.lineage.len())
            .finish_non_exhaustive()
    }
}

/// Starts the sender of one link (invariant 1): it hands the agent the
/// latest trust the returned sender holds, and records in `acked` the
/// version the agent took, and tells the hub (`pushes`), which wakes the
/// World's controller. It ends when the returned sender is dropped (the
/// link is gone).
pub fn sender(
    link: Arc<dyn AgentLink>,
    trust: Option<Arc<Trust>>,
    host: HostKey,
    acked: Arc<AtomicU64>,
    pushes: tokio::sync::mpsc::Sender<HostReport>,
) -> watch::Sender<Option<Arc<Trust>>> {
    let (tx, mut rx) = watch::channel(trust);
    tokio::spawn(async move {
        let mut backoff = RETRY_MIN;
        // Warn once per link; later failures of it are debug.
        let mut warned = false;
        loop {
            let wanted = rx.borrow_and_update().clone();
            let Some(t) = wanted.filter(|t| acked.load(Ordering::Acquire) != t.version) else {
                if rx.changed().await.is_err() {
                    return;
                }
                continue;
            };
            match link.rekey(t.secret.clone(), t.lineage.clone()).await {
                Ok(()) => {
                    debug!(world = %host.world.name, rank = host.rank, "the agent holds the World's rotated token");
                    acked.store(t.version, Ordering::Release);
                    backoff = RETRY_MIN;
                    let _ = pushes
                        .send(HostReport::Rekeyed { host: host.clone() })
                        .await;
                }
                Err(e) => {
                    if warned {
                        debug!(world = %host.world.name, rank = host.rank, error = %e, "cannot hand the agent the World's rotated token; retrying");
                    } else {
                        warn!(world = %host.world.name, namespace = %host.world.namespace, rank = host.rank, error = %e, "cannot hand the agent the World's rotated token (an agent older than this operator refuses Rekey); retrying");
                        warned = true;
                    }
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        r = rx.changed() => if r.is_err() { return },
                    }
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
            }
        }
    });
    tx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trust_is_fingerprinted_by_key_and_lineage_and_hides_its_key() {
        let a = Trust::new(b"0123456789abcdef", "");
        assert_eq!(a.version, Trust::new(b"0123456789abcdef", "").version);
        assert_ne!(a.version, Trust::new(b"0123456789abcdeX", "").version);
        assert_ne!(a.version, Trust::new(b"0123456789abcdef", "00").version);
        assert_ne!(a.version, 0);
        let shown = format!("{a:?}");
        assert!(!shown.contains("0123"), "{shown}");
    }
}
