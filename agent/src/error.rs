//! The host agent's error type: one enum for configuration, proc management
//! and serving. Every variant names the field or proc involved and, where
//! there is one, the fix.

use std::path::PathBuf;

/// Errors of the host agent.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A configuration setting is missing or invalid.
    #[error("invalid agent setting {setting}: {reason}")]
    Config {
        /// The flag (and environment variable) at fault.
        setting: &'static str,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The shared secret file could not be read or is unusable.
    #[error("agent secret file {path}: {reason} (set --secret-file / HOSTMESH_SECRET_FILE)")]
    Secret {
        /// The file that was read.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A proc spec or request is invalid.
    #[error("invalid proc {name:?}: field {field}: {reason}")]
    InvalidSpec {
        /// The proc name.
        name: String,
        /// The request field at fault.
        field: &'static str,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// `CreateOrUpdate` of an existing proc with a different spec or rank.
    #[error(
        "proc {name:?} already exists with a different {field}; procs cannot be updated in place: \
         stop it and create it under a new name"
    )]
    SpecConflict {
        /// The proc name.
        name: String,
        /// What differs (`spec` or `rank`).
        field: &'static str,
    },
    /// A restart was requested for a proc that is still running.
    #[error(
        "proc {name:?} is still running; stop it before restarting it (incarnation {incarnation})"
    )]
    StillRunning {
        /// The proc name.
        name: String,
        /// The incarnation that was requested.
        incarnation: u32,
    },
    /// The named proc does not exist on this host.
    #[error("no proc named {name:?} on this host")]
    NoSuchProc {
        /// The proc name.
        name: String,
    },
    /// An actor failure was reported for a proc that is not a running
    /// runtime-aware proc.
    #[error("proc {name:?} is not a running runtime-aware proc; only those report actor failures")]
    NotRuntimeAware {
        /// The proc name.
        name: String,
    },
    /// The agent already holds as many procs as its limit allows.
    #[error("this host already holds {limit} procs (--max-procs); stop some or raise the limit")]
    TooManyProcs {
        /// The configured limit.
        limit: usize,
    },
    /// The agent is shutting down and accepts no new procs.
    #[error("the agent is shutting down and accepts no new procs")]
    ShuttingDown,
    /// The actor runtime failed (binding the agent's proc, a call).
    #[error("runtime: {0}")]
    Runtime(String),
    /// An I/O error while serving (listening sockets, signals).
    #[error("{context}: {source}")]
    Io {
        /// What the agent was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl HostError {
    /// An invalid-configuration error for `setting`.
    pub(crate) fn config(setting: &'static str, reason: impl Into<String>) -> Self {
        HostError::Config {
            setting,
            reason: reason.into(),
        }
    }

    /// An invalid-spec error for proc `name`.
    pub(crate) fn spec(name: &str, field: &'static str, reason: impl Into<String>) -> Self {
        HostError::InvalidSpec {
            name: name.to_owned(),
            field,
            reason: reason.into(),
        }
    }

    /// Wraps an I/O error with what the agent was doing.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        HostError::Io {
            context: context.into(),
            source,
        }
    }
}
