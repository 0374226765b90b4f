//! The kubelet's error type: one enum for the whole module. Errors caused by a
//! pod's spec name the field at fault and, where there is one, the fix.

use std::path::PathBuf;

/// Everything that can go wrong in the process kubelet.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// A call to the Kubernetes API failed.
    #[error("kubernetes API call failed ({action}): {source}")]
    Api {
        /// What the kubelet was doing.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The API server did not answer in time.
    #[error("kubernetes API call timed out after {timeout:?} ({action})")]
    ApiTimeout {
        /// What the kubelet was doing.
        action: String,
        /// How long it waited.
        timeout: std::time::Duration,
    },
    /// The kubeconfig could not be read or used.
    #[error("cannot load kubeconfig {path:?}: {message}")]
    Kubeconfig {
        /// The file, or `None` for the default search.
        path: Option<PathBuf>,
        /// Why.
        message: String,
    },
    /// A file or directory operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What the kubelet was doing.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The kubelet configuration is invalid.
    #[error("invalid kubelet configuration: {0}")]
    Config(String),
    /// A pod's spec cannot be run as written; the message names the field.
    #[error("{0}")]
    PodSpec(String),
    /// A container's image has no local program and the container gives no
    /// command.
    #[error("{0}")]
    ImageNotMapped(String),
    /// A secret or config map a pod refers to is missing.
    #[error("{0}")]
    MissingReference(String),
    /// A container's process could not be started.
    #[error("cannot start container {container}: {message}")]
    Spawn {
        /// The container name.
        container: String,
        /// Why.
        message: String,
    },
    /// The requested pod, container or log does not exist on this node.
    #[error("not found: {0}")]
    NotFound(String),
    /// Every pod IP of the node's range is in use.
    #[error("no free pod IP left in {0}; delete pods to free addresses")]
    IpsExhausted(String),
    /// A pod's sandbox (network and UTS namespaces) could not be made.
    #[error("cannot create the sandbox of pod {pod}: {source}")]
    Sandbox {
        /// `namespace/name`.
        pod: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl KubeletError {
    /// Wraps a client error with what the kubelet was doing.
    pub(crate) fn api(action: impl Into<String>, source: kube::Error) -> Self {
        Self::Api {
            action: action.into(),
            source,
        }
    }

    /// Wraps an I/O error with the action and the path.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// Result alias for the kubelet.
pub type Result<T, E = KubeletError> = std::result::Result<T, E>;
