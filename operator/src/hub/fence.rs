//! The hub's side of rank epochs and fencing (docs/architecture.md, "Rank
//! epochs and fencing"): which pushes of an agent are refused, and the
//! per-link task that renews an agent's lease after its heartbeats.
//!
//! Invariants:
//! 1. A push counts only from an agent of its pod's epoch that has not
//!    fenced itself ([`refusal`]); an older epoch is a stale copy of the
//!    rank (the pod's address reused), a newer one cannot be this pod's.
//! 2. A `Renew` is sent only after a heartbeat of the agent reached the
//!    hub, at most once per [`RENEW_EVERY`], from the link's own task: an
//!    agent that is not heard gets no renewal, so it fences itself within
//!    its fence timeout of the last heartbeat the hub counted.

use std::sync::Arc;
use std::time::Duration;

use hostmesh_agent::EpochVerdict;
use tracing::{debug, warn};

use super::agent::{AgentLink, HostKey};

/// Least time between two renewals of one agent.
pub const RENEW_EVERY: Duration = Duration::from_millis(500);

/// How a fenced agent's refusal begins: a host whose link error starts so
/// has ended its procs and is replaced at once.
pub const FENCED: &str = "the agent fenced itself";

/// Why a push from an agent reporting `agent_epoch` (and `fenced`) is
/// refused, when its pod is of `pod_epoch` (invariant 1).
pub fn refusal(pod_epoch: u64, agent_epoch: u64, fenced: Option<&str>) -> Option<String> {
    if let Some(why) = fenced {
        return Some(format!("{FENCED}: {why}"));
    }
    match agent_epoch.cmp(&pod_epoch) {
        std::cmp::Ordering::Equal => None,
        std::cmp::Ordering::Less => Some(format!(
            "a stale agent answers at this pod's address: epoch {agent_epoch}, the pod's is {pod_epoch}"
        )),
        std::cmp::Ordering::Greater => Some(format!(
            "the agent is of epoch {agent_epoch}, newer than its pod's {pod_epoch}"
        )),
    }
}

/// Renews `link`'s agent at `epoch` each time the returned sender is
/// poked (a heartbeat counted), at most once per [`RENEW_EVERY`]
/// (invariant 2). Ends when the sender is dropped.
pub(crate) fn renewer(
    link: Arc<dyn AgentLink>,
    epoch: u64,
    host: HostKey,
) -> tokio::sync::watch::Sender<()> {
    let (tx, mut rx) = tokio::sync::watch::channel(());
    rx.mark_unchanged();
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            match link.renew(epoch).await {
                Ok(EpochVerdict::Current) => {}
                Ok(EpochVerdict::Replaced) => {
                    warn!(world = %host.world.name, rank = host.rank, epoch, "a stale agent learned it was replaced and fenced itself");
                }
                Ok(EpochVerdict::Older) => {
                    debug!(world = %host.world.name, rank = host.rank, epoch, "the agent is newer than its pod's epoch");
                }
                Err(e) => {
                    debug!(world = %host.world.name, rank = host.rank, error = %e, "renewal not delivered");
                }
            }
            tokio::time::sleep(RENEW_EVERY).await;
        }
    });
    tx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_pods_epoch_unfenced_counts() {
        assert_eq!(refusal(5, 5, None), None);
        let stale = refusal(5, 4, None).unwrap();
        assert!(
            stale.contains("stale") && stale.contains("epoch 4"),
            "{stale}"
        );
        assert!(refusal(5, 6, None).unwrap().contains("newer"));
        let fenced = refusal(5, 5, Some("no contact for 70s")).unwrap();
        assert!(fenced.contains("fenced itself: no contact"), "{fenced}");
        // Pods and agents from before epochs (0 and 0) still count.
        assert_eq!(refusal(0, 0, None), None);
    }
}
