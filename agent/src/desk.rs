//! The agent's proc desk: a second runtime proc of the agent, keyed with
//! the World's runtime key (`keys.rs`), where runtime-aware procs check in
//! and report failed actors. Procs never dial the agent's own proc, which
//! takes the World secret and serves the operator's commands.
//!
//! Invariants:
//! 1. The desk serves only [`CheckIn`] and [`ActorFailed`]: whoever holds
//!    the runtime key (every runtime-aware proc of the World) can mark a
//!    proc of this host checked in or report an actor of it failed, and
//!    nothing else: no spawn, stop, address book, renewal or subscription.
//! 2. The desk listens on the agent's IP, on a port the system picks, and
//!    claims the host's epoch like the agent's proc, so procs of an older
//!    incarnation are refused at the handshake as they are there.
//! 3. No handler returns an error (which would stop the actor): refusals
//!    are replies, as on the agent's proc.

use hostmesh_runtime::{
    Actor, ActorError, ActorRef, ChannelAddr, Context, Handler, Handlers, ProcId,
};

use super::manager::ProcManager;
use super::protocol::{ActorFailed, CheckIn};
use super::server::{AGENT_PROC_NAME, HOST_AGENT_ACTOR};

/// The actor runtime-aware procs talk to on their agent (invariant 1).
pub struct ProcDesk {
    manager: ProcManager,
}

impl ProcDesk {
    /// A desk over `manager`.
    pub fn new(manager: ProcManager) -> Self {
        ProcDesk { manager }
    }
}

impl Actor for ProcDesk {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<CheckIn>().handle::<ActorFailed>();
    }

    async fn handle_undeliverable(
        &mut self,
        _cx: &Context<Self>,
        message: hostmesh_runtime::Undeliverable,
    ) -> Result<(), ActorError> {
        // Replies to procs that went away: nothing to do, never fatal.
        tracing::debug!(%message, "reply from the proc desk undeliverable");
        Ok(())
    }
}

impl Handler<CheckIn> for ProcDesk {
    type Reply = Result<(), String>;
    async fn handle(&mut self, _cx: &Context<Self>, m: CheckIn) -> Result<Self::Reply, ActorError> {
        tracing::info!(proc = %m.name, addr = %m.addr, "runtime-aware proc checked in");
        Ok(self
            .manager
            .check_in(&m.name, m.addr)
            .map_err(|e| e.to_string()))
    }
}

impl Handler<ActorFailed> for ProcDesk {
    type Reply = Result<(), String>;
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        m: ActorFailed,
    ) -> Result<Self::Reply, ActorError> {
        Ok(self
            .manager
            .actor_failed(&m.name, m.actor, &m.reason)
            .map_err(|e| e.to_string()))
    }
}

/// The desk of the agent whose desk listens at `addr` (what
/// `HOSTMESH_AGENT_ADDR` holds in a proc's environment).
pub fn desk_ref(
    addr: std::net::SocketAddr,
) -> Result<ActorRef<ProcDesk>, hostmesh_runtime::id::IdError> {
    let proc = ProcId::new(ChannelAddr::Tcp(addr), AGENT_PROC_NAME)?;
    Ok(ActorRef::attest(proc.actor(HOST_AGENT_ACTOR, 0)?))
}
