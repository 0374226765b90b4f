//! The agent's proc desk: a second runtime proc of the agent, holding a
//! credential of the World's proc issuer (`keys.rs`), where runtime-aware
//! procs check in and report failed actors. Procs never dial the agent's
//! own proc, which takes the World secret and serves the operator's
//! commands.
//!
//! Invariants:
//! 1. The desk serves only [`CheckIn`] and [`ActorFailed`]: a
//!    runtime-aware proc of the World (each holds a credential for its own
//!    name) can check itself in or report an actor of its own failed
//!    (invariant 4), and nothing else: no spawn, stop, address book,
//!    renewal or subscription.
//! 2. The desk listens on the agent's IP, on a port the system picks, and
//!    claims the host's epoch like the agent's proc, so procs of an older
//!    incarnation are refused at the handshake as they are there.
//! 3. No handler returns an error (which would stop the actor): refusals
//!    are replies, as on the agent's proc.
//! 4. A proc checks in and reports actor failures only for itself: the
//!    desk admits a [`CheckIn`] or [`ActorFailed`] only from the proc it
//!    names (the sender's proc name, which the proc proved with its
//!    credential in the handshake, runtime `reader` invariant 1), and a
//!    check-in only at the sender's own address.

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
        h.handle_sent::<CheckIn>().handle_sent::<ActorFailed>();
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
        if let Err(why) = from_itself(cx, &m.name, Some(&m.addr)) {
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

/// Invariant 4: the message came from the proc named `name` (listening
/// at `addr`, when given).
fn from_itself(cx: &Context<ProcDesk>, name: &str, addr: Option<&str>) -> Result<(), String> {
    let Some(sender) = cx.sender() else {
        return Err("the desk cannot tell who sent this".into());
    };
    let from = sender.proc();
    if from.name() != name {
        return Err(format!(
            "proc {:?} sent this for proc {name:?}: a proc checks in and reports only for itself",
            from.name()
        ));
    }
    if let Some(addr) = addr
        && from.addr().to_string() != addr
    {
        return Err(format!(
            "proc {name:?} listens at {}, not {addr}: a proc checks in only itself, at its own address",
            from.addr()
        ));
    }
    Ok(())
}

impl Handler<ActorFailed> for ProcDesk {
    type Reply = Result<(), String>;
    async fn handle(
        &mut self,
        cx: &Context<Self>,
        m: ActorFailed,
    ) -> Result<Self::Reply, ActorError> {
        // Invariant 4.
        if let Err(why) = from_itself(cx, &m.name, None) {
            tracing::warn!(proc = %m.name, actor = %m.actor, %why, "actor failure report refused");
            return Ok(Err(why));
        }
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
