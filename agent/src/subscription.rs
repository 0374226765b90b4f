//! One subscriber's stream of pushes: a full snapshot first, then every
//! state change in sequence order, and a heartbeat with a digest of all proc
//! states every interval.
//!
//! Invariants:
//! 1. Nothing is lost: the snapshot is taken after the subscription to
//!    changes, and changes it already covers (by sequence number) are
//!    skipped; a subscriber that falls behind the change buffer gets a fresh
//!    snapshot instead of a gap.
//! 2. Heartbeats keep coming at the interval whatever the change rate.

use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::{Interval, MissedTickBehavior};

use super::manager::ProcManager;
use super::protocol::{AgentPush, ProcStateChanged};

/// A stream of [`AgentPush`]es for one subscriber.
#[derive(Debug)]
pub struct Subscription {
    manager: ProcManager,
    events: broadcast::Receiver<ProcStateChanged>,
    heartbeat: Interval,
    need_snapshot: bool,
    seq: u64,
}

impl Subscription {
    /// Subscribes to `manager`; the first push is a snapshot.
    pub fn new(manager: ProcManager, interval: Duration) -> Self {
        let events = manager.subscribe();
        let mut heartbeat =
            tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Subscription {
            manager,
            events,
            heartbeat,
            need_snapshot: true,
            seq: 0,
        }
    }

    /// The next push (invariants 1 and 2).
    pub async fn next(&mut self) -> AgentPush {
        loop {
            if self.need_snapshot {
                self.need_snapshot = false;
                return self.snapshot();
            }
            tokio::select! {
                biased;
                ev = self.events.recv() => match ev {
                    Ok(ev) if ev.state.seq <= self.seq => continue,
                    Ok(ev) => {
                        self.seq = ev.state.seq;
                        return AgentPush::Changed(ev);
                    }
                    Err(RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "subscriber fell behind; sending a snapshot");
                        self.need_snapshot = true;
                    }
                    Err(RecvError::Closed) => {
                        // The manager is gone; only heartbeats remain.
                        self.heartbeat.tick().await;
                        return self.heartbeat_push();
                    }
                },
                _ = self.heartbeat.tick() => return self.heartbeat_push(),
            }
        }
    }

    fn snapshot(&mut self) -> AgentPush {
        let (seq, procs) = self.manager.snapshot();
        self.seq = seq;
        let id = self.manager.identity();
        let fence = self.manager.fence();
        AgentPush::Snapshot {
            host_rank: id.host_rank,
            agent_addr: id.addr.to_string(),
            seq,
            procs,
            sent_at_ms: super::manager::now_ms(),
            epoch: fence.epoch(),
            fenced: fence.fenced(),
        }
    }

    fn heartbeat_push(&mut self) -> AgentPush {
        let (seq, digest, procs) = self.manager.heartbeat();
        AgentPush::Heartbeat {
            host_rank: self.manager.identity().host_rank,
            seq,
            digest,
            procs,
            sent_at_ms: super::manager::now_ms(),
            epoch: self.manager.fence().epoch(),
            fenced: self.manager.fence().fenced(),
        }
    }
}
