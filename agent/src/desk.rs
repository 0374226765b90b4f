//! The agent's proc desk: a second runtime proc of the agent, holding a
//! credential of the World's proc issuer (`keys.rs`), where runtime-aware
//! procs check in and report failed actors. Procs never dial the agent's
//! own proc, which takes the World secret and serves the operator's
//! commands.
//!
//! Invariants:
//! 1. The desk serves only [`CheckIn`] and [`ActorFailed`]: a
//!    runtime-aware proc of the World (each holds a credential for its own
//!    name) can check a proc of this host in or report an actor of it
//!    failed, and nothing else: no spawn, stop, address book, renewal or
//!    subscription.
//! 2. The desk listens on the agent's IP, on a port the system picks, and
//!    claims the host's epoch like the agent's proc, so procs of an older
//!    incarnation are refused at the handshake as they are there.
//! 3. No handler returns an error (which would stop the actor): refusals
//!    are replies, as on the agent's proc.
//! 4. A check-in is admitted only once the desk has dialed the address it
//!    names and the proc there proved, with its credential, to be the proc
//!    the check-in names: the address the agent publishes for a proc is
//!    served by that proc.

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
    async fn handle(&mut self, cx: &Context<Self>, m: CheckIn) -> Result<Self::Reply, ActorError> {
        // Invariant 4.
        if let Err(why) = confirm(cx, &m).await {
            tracing::warn!(proc = %m.name, addr = %m.addr, %why, "check-in refused");
            return Ok(Err(why));
        }
        tracing::info!(proc = %m.name, addr = %m.addr, "runtime-aware proc checked in");
        Ok(self
            .manager
            .check_in(&m.name, m.addr)
            .map_err(|e| e.to_string()))
    }
}

/// Invariant 4: the proc at `m.addr` is the proc named `m.name`.
async fn confirm(cx: &Context<ProcDesk>, m: &CheckIn) -> Result<(), String> {
    let addr: ChannelAddr = m
        .addr
        .parse()
        .map_err(|e| format!("check-in address {:?} is not a proc address: {e}", m.addr))?;
    let reached = cx
        .proc_ref()
        .connect(&addr)
        .await
        .map_err(|e| format!("cannot reach {} to confirm the check-in: {e}", m.addr))?;
    if reached.name() != m.name {
        return Err(format!(
            "{} is served by proc {:?}, not {:?}: a proc checks in only itself",
            m.addr,
            reached.name(),
            m.name
        ));
    }
    Ok(())
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
