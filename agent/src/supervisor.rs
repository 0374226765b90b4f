//! The agent's side of `--supervisor`: it dials its supervisor, subscribes
//! the supervisor's inbox to its own pushes, and redials with backoff. It
//! joins the server (the agent's actor) and the client (the supervisor's
//! inbox type), so neither of those imports the other.

use std::time::Duration;

use hostmesh_runtime::{ActorRef, Proc};

use super::client::{SUPERVISOR_ACTOR, SupervisorInbox};
use super::protocol::{AgentPush, Subscribe};
use super::server::HostAgent;

/// `--supervisor`: dials the supervisor at `target` (`host:port`, resolved
/// on every attempt) and subscribes it to this agent's pushes; redials with
/// backoff whenever the connection is lost, and each new subscription starts
/// with a full snapshot, so the supervisor misses nothing.
pub(crate) fn dial_supervisor(proc: Proc, agent: ActorRef<HostAgent>, target: String) {
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(100);
        loop {
            match dial_once(&proc, &target).await {
                Ok(peer) => {
                    let mut lost = proc.lost_watch(&peer);
                    if let Some(l) = lost.as_mut() {
                        l.borrow_and_update();
                    }
                    let inbox = match peer.actor(SUPERVISOR_ACTOR, 0) {
                        Ok(id) => ActorRef::<SupervisorInbox>::attest(id),
                        Err(e) => {
                            tracing::error!(error = %e, "supervisor id");
                            return;
                        }
                    };
                    let port = inbox.port::<AgentPush>();
                    if let Err(e) = agent.send(&proc, &Subscribe { port }).await {
                        tracing::warn!(error = %e, "cannot subscribe the supervisor");
                    } else {
                        tracing::info!(supervisor = %peer, "pushing state to the supervisor");
                        backoff = Duration::from_millis(100);
                        match lost.as_mut() {
                            Some(l) => {
                                let _ = l.changed().await;
                            }
                            None => return,
                        }
                        tracing::warn!(supervisor = %peer, "connection to the supervisor lost; redialing");
                    }
                }
                Err(e) => {
                    tracing::warn!(supervisor = %target, error = %e, ?backoff, "cannot reach the supervisor; retrying");
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
    });
}

async fn dial_once(proc: &Proc, target: &str) -> Result<hostmesh_runtime::ProcId, String> {
    // The hosts file, then DNS, without the C library (a static agent in
    // any image resolves as in the pod).
    let addr = *hostmesh_net::lookup_host(target)
        .await
        .map_err(|e| e.to_string())?
        .first()
        .ok_or_else(|| format!("{target} resolves to no address"))?;
    proc.connect(&hostmesh_runtime::ChannelAddr::Tcp(addr))
        .await
        .map_err(|e| e.to_string())
}
