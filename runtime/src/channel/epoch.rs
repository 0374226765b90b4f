//! Rank epochs in the handshake: a proc may claim the rank and epoch of the
//! host copy it belongs to, and refuses peers whose claim is older than the
//! epoch it knows for that rank (docs/architecture.md, "Rank epochs and
//! fencing"). A replaced host's stale copy can then open no connection to a
//! proc that knows of its replacement.
//!
//! Invariants:
//! 1. Claims are part of the authenticated transcript, so they cannot be
//!    changed on the wire.
//! 2. A table's epochs only grow ([`EpochTable::raise`]).
//! 3. A peer without a claim (an operator, a client) is never refused for
//!    it; a claim is refused only when the table knows a newer epoch for
//!    its rank. The check applies to connections made after the epoch was
//!    raised; a connection opened before stays until it drops.

use hostmesh_mesh::Rank;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

/// The host copy a proc belongs to: its host rank and that rank's epoch.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EpochClaim {
    /// Host rank.
    pub rank: Rank,
    /// The rank's epoch the proc's host copy was started with.
    pub epoch: u64,
}

impl std::fmt::Display for EpochClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} epoch {}", self.rank, self.epoch)
    }
}

/// The newest epoch a proc knows for each rank; shared by its transport
/// and whoever learns of replacements (the agent, from the address book).
#[derive(Clone, Debug, Default)]
pub struct EpochTable(Arc<RwLock<BTreeMap<Rank, u64>>>);

impl EpochTable {
    /// Records that `rank` is at `epoch` (invariant 2: a lower one changes
    /// nothing).
    pub fn raise(&self, rank: Rank, epoch: u64) {
        let mut t = self.0.write().unwrap_or_else(|p| p.into_inner());
        let e = t.entry(rank).or_default();
        *e = (*e).max(epoch);
    }

    /// The newest epoch known for `rank`.
    pub fn current(&self, rank: Rank) -> Option<u64> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&rank)
            .copied()
    }

    /// Whether a peer with `claim` may connect (invariant 3); the error
    /// says why not.
    pub fn admit(&self, claim: Option<&EpochClaim>) -> Result<(), String> {
        let Some(c) = claim else {
            return Ok(());
        };
        match self.current(c.rank) {
            Some(now) if now > c.epoch => Err(format!(
                "stale peer: it is {c}, but rank {} is at epoch {now} (it was replaced)",
                c.rank
            )),
            _ => Ok(()),
        }
    }
}

/// What a transport says of itself and checks of peers.
#[derive(Clone, Debug, Default)]
pub(crate) struct Epochs {
    /// This proc's claim, sent in the handshake.
    pub(crate) own: Option<EpochClaim>,
    /// Epochs peers are checked against.
    pub(crate) table: EpochTable,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_claims_are_refused_once_a_newer_epoch_is_known() {
        let t = EpochTable::default();
        let old = EpochClaim { rank: 1, epoch: 5 };
        assert!(t.admit(Some(&old)).is_ok(), "nothing known yet");
        assert!(t.admit(None).is_ok());
        t.raise(1, 5);
        assert!(t.admit(Some(&old)).is_ok(), "the current epoch");
        t.raise(1, 6);
        t.raise(1, 3); // never lowers
        assert_eq!(t.current(1), Some(6));
        let e = t.admit(Some(&old)).unwrap_err();
        assert!(e.contains("rank 1 epoch 5") && e.contains("epoch 6"), "{e}");
        assert!(t.admit(Some(&EpochClaim { rank: 2, epoch: 1 })).is_ok());
        assert!(
            t.admit(None).is_ok(),
            "unclaimed peers are not epoch-checked"
        );
    }
}
