//! A connector for tests and benchmarks that holds back the end of one
//! rank's proc on its way to the hub: wrapped around the real connector, it
//! plays a slow report (the root cause arriving after its collateral) with
//! real agents.
//!
//! Invariant: every other report is passed on at once and in order; the
//! held one is sent after the delay, whatever came in between.

use hostmesh_crds::Rank;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::mpsc;

use super::agent::{AgentConnector, AgentLink, AgentTarget, HostKey, HostReport, LinkError};
use super::{WorldKey, parse_proc_name};

/// `inner`, with the end of the proc of rank `rank` held back `delay`.
pub struct HoldBack {
    /// The connector that dials the agents.
    pub inner: Arc<dyn AgentConnector>,
    /// The rank whose end is held back.
    pub rank: Rank,
    /// How long it is held.
    pub delay: Duration,
}

impl HoldBack {
    fn held(&self, r: &HostReport) -> bool {
        matches!(r, HostReport::ProcState { state, .. }
            if state.status.is_terminal()
                && parse_proc_name(&state.name).is_some_and(|(_, rank)| rank == self.rank))
    }
}

impl AgentConnector for HoldBack {
    fn connect(
        &self,
        target: AgentTarget,
        pushes: mpsc::Sender<HostReport>,
    ) -> BoxFuture<'static, Result<Arc<dyn AgentLink>, LinkError>> {
        let (tx, mut rx) = mpsc::channel::<HostReport>(4096);
        let (rank, delay) = (self.rank, self.delay);
        let filter = HoldBack {
            inner: self.inner.clone(),
            rank,
            delay,
        };
        tokio::spawn(async move {
            while let Some(r) = rx.recv().await {
                if filter.held(&r) {
                    let p = pushes.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let _ = p.send(r).await;
                    });
                } else if pushes.send(r).await.is_err() {
                    return;
                }
            }
        });
        self.inner.connect(target, tx)
    }

    fn forget_host(&self, host: &HostKey) {
        self.inner.forget_host(host);
    }

    fn forget_world(&self, world: &WorldKey) {
        self.inner.forget_world(world);
    }
}
