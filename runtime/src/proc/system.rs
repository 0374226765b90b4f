//! The system actor every proc runs as `_proc[0]`: spawns registered actor
//! types for remote callers (actor meshes) and forwards undeliverables of
//! messages the proc itself sent to the supervision sink.

use serde::{Deserialize, Serialize};

use crate::actor::{Actor, Context, Handler, Handlers};
use crate::error::ActorError;
use crate::id::ActorId;
use crate::port::PortRef;
use crate::supervision::{ActorStatus, SupervisionEvent, Undeliverable};

/// Spawn an actor of a registered type on the receiving proc.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpawnActor {
    /// The actor type (`std::any::type_name` of the type).
    pub type_name: String,
    /// The new actor's name (it gets index 0).
    pub name: String,
    /// The postcard-encoded parameters.
    pub params: Vec<u8>,
    /// Where the actor's supervision events go (else the proc's sink).
    pub owner: Option<PortRef<SupervisionEvent>>,
}

/// The system actor.
pub struct ProcAgent;

impl Actor for ProcAgent {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<SpawnActor>();
    }

    async fn handle_undeliverable(
        &mut self,
        cx: &Context<Self>,
        message: Undeliverable,
    ) -> Result<(), ActorError> {
        cx.proc_ref().report(SupervisionEvent {
            actor: cx.actor_id().clone(),
            status: ActorStatus::Failed(message.to_string()),
            cause: None,
        });
        Ok(())
    }
}

impl Handler<SpawnActor> for ProcAgent {
    type Reply = Result<ActorId, String>;

    async fn handle(
        &mut self,
        cx: &Context<Self>,
        m: SpawnActor,
    ) -> Result<Self::Reply, ActorError> {
        let proc = cx.proc_ref();
        let Some(spawn) = proc.registry_spawn(&m.type_name) else {
            return Ok(Err(crate::RuntimeError::NotRegistered {
                type_name: m.type_name,
                proc: proc.id().to_string(),
            }
            .to_string()));
        };
        // Errors go back to the caller; they do not stop the system actor.
        Ok(spawn(proc.clone(), m.name, m.params.into(), m.owner)
            .await
            .map_err(|e| e.to_string()))
    }
}
