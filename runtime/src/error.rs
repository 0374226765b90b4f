//! The error type of the proc, actor, port and actor-mesh APIs.

use std::time::Duration;

use crate::channel::ChannelError;
use crate::id::{ActorId, IdError};
use hostmesh_mesh::MeshError;

/// Why an actor did not start: the actor-start boundary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// Its constructor (`RemoteSpawn::new`) returned an error.
    #[error("construction failed: {0}")]
    New(String),
    /// Its `init` hook returned an error.
    #[error("init failed: {0}")]
    Init(String),
    /// Its `init` hook panicked.
    #[error("init panicked: {0}")]
    Panicked(String),
    /// Its task ended before `init` finished (the runtime is shutting down).
    #[error("the actor task ended during init")]
    TaskEnded,
}

/// Errors from procs, actors, ports and actor meshes.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// An identity is invalid.
    #[error(transparent)]
    Id(#[from] IdError),
    /// A transport failure (connecting, authenticating, framing).
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// A mesh could not be built or sliced.
    #[error(transparent)]
    Mesh(#[from] MeshError),
    /// The proc's credential cannot be used.
    #[error(transparent)]
    Credential(#[from] crate::channel::credential::CredentialError),
    /// The proc could not listen on its address.
    #[error("cannot listen on {addr}: {source} (is the address in use or not local?)")]
    Listen {
        /// The address.
        addr: String,
        /// The socket error.
        source: std::io::Error,
    },
    /// An actor with this id already runs on the proc.
    #[error("actor {0} already exists on this proc: choose another name")]
    ActorExists(Box<ActorId>),
    /// A message could not be encoded.
    #[error("cannot encode message: {0}")]
    Encode(String),
    /// A reply could not be decoded as the expected type.
    #[error(
        "cannot decode the reply from {from}: {reason} (do both sides use the same message types?)"
    )]
    Decode {
        /// Who replied.
        from: String,
        /// The decoding error.
        reason: String,
    },
    /// No reply in time.
    #[error("call to {dest} timed out after {timeout:?}")]
    Timeout {
        /// The port called (text form).
        dest: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The call's message was undeliverable or its handler failed.
    #[error("call to {dest} failed: {reason}")]
    CallFailed {
        /// The port called (text form).
        dest: String,
        /// Why.
        reason: String,
    },
    /// The connection to the callee's proc was lost while waiting.
    #[error("connection to {peer} lost while waiting for a reply from {dest}")]
    ConnectionLost {
        /// The callee's proc (text form).
        peer: String,
        /// The port called (text form).
        dest: String,
    },
    /// The port's receiver is gone or the proc shut down.
    #[error("port closed")]
    PortClosed,
    /// Remote spawn of a type the proc does not know.
    #[error(
        "actor type {type_name} is not registered on proc {proc}: register it with ProcBuilder::register"
    )]
    NotRegistered {
        /// The type name.
        type_name: String,
        /// The proc asked (text form).
        proc: String,
    },
    /// An actor did not start.
    #[error("actor {actor} failed to start: {reason}")]
    SpawnFailed {
        /// The actor.
        actor: String,
        /// Why.
        #[source]
        reason: StartError,
    },
    /// Some ranks of a mesh operation failed; each entry is `(rank, reason)`.
    #[error("{op} failed on {} of {total} ranks: {}", failed.len(), summarize(failed))]
    Ranks {
        /// The operation (`spawn`, `call`).
        op: &'static str,
        /// Number of ranks addressed.
        total: usize,
        /// The failed ranks with their reasons.
        failed: Vec<(usize, String)>,
    },
}

fn summarize(failed: &[(usize, String)]) -> String {
    let mut s = String::new();
    for (i, (rank, reason)) in failed.iter().enumerate() {
        if i == 8 {
            s.push_str(&format!("; and {} more", failed.len() - 8));
            break;
        }
        if i > 0 {
            s.push_str("; ");
        }
        s.push_str(&format!("rank {rank}: {reason}"));
    }
    s
}

/// The error an actor's handler or hook returns; it stops the actor with
/// `Failed(message)`. Any `std::error::Error` converts with `?`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActorError {
    message: String,
}

impl ActorError {
    /// An error with this message.
    pub fn new(message: impl std::fmt::Display) -> Self {
        ActorError {
            message: message.to_string(),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for ActorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for ActorError {
    fn from(e: E) -> Self {
        ActorError::new(e)
    }
}
