//! Monarch workers on a World (`spec.monarch`): the option that makes every
//! host run a Monarch worker as a proc the agent supervises, labelled and
//! configured as Monarch's `KubernetesJob` expects (docs/monarch.md).
//!
//! Invariants:
//! 1. A mesh name is one Monarch accepts: at most 63 lowercase letters and
//!    digits, starting with a letter (`KubernetesJob.add_mesh`'s rule).
//! 2. The worker port never equals the agent's port or its health port.
//! 3. `clientSelector` is a label selector a real API server accepts
//!    ([`crate::selector`]); it names who may dial the worker port when
//!    the operator writes NetworkPolicies, and nothing in the pods.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::field::FieldError;

/// Monarch's default worker port (`MONARCH_PORT`).
pub const DEFAULT_MONARCH_PORT: u16 = 26600;
/// Longest mesh name Monarch accepts (an RFC 1123 label).
pub const MAX_MESH_NAME: usize = 63;

/// Pod label Monarch's attach mode selects workers by.
pub const LABEL_APP_NAME: &str = "app.kubernetes.io/name";
/// Value of [`LABEL_APP_NAME`] on Monarch worker pods.
pub const APP_NAME_WORKER: &str = "monarch-worker";
/// Pod label naming the Monarch mesh a worker belongs to.
pub const LABEL_MESH_NAME: &str = "monarch.pytorch.org/mesh-name";
/// Pod label Monarch takes a worker's rank from (a StatefulSet's pod index).
pub const LABEL_POD_INDEX: &str = "apps.kubernetes.io/pod-index";
/// Container env: the worker port.
pub const ENV_PORT: &str = "MONARCH_PORT";
/// Container env: the worker's rank among the mesh's workers.
pub const ENV_SERVICE_PROC_RANK: &str = "MONARCH_SERVICE_PROC_RANK";
/// Container env: the JSON list of service proc ids (set by a provisioning
/// client; passed through untouched).
pub const ENV_SERVICE_PROC_IDS: &str = "MONARCH_SERVICE_PROC_IDS";
/// Container env: `tls` when the worker serves Monarch's TLS transport
/// (`spec.monarch.transport: Tls`); read by the default worker bootstrap.
pub const ENV_TRANSPORT: &str = "HOSTMESH_MONARCH_TRANSPORT";
/// Where Monarch's TLS transport reads its certificate, key and CA by
/// default (`HYPERACTOR_TLS_CERT`, `_KEY`, `_CA`), and where a host pod
/// of a `Tls` World mounts its Secret.
pub const TLS_DIR: &str = "/etc/hyperactor/tls";
/// Container env: the pod's uid (downward API `metadata.uid`), from which
/// Monarch 0.8 derives a worker's service identity when no
/// [`ENV_SERVICE_PROC_IDS`] is declared.
pub const ENV_POD_UID: &str = "MONARCH_POD_UID";

/// Monarch workers on every host of a World.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MonarchSpec {
    /// The Monarch mesh name (`monarch.pytorch.org/mesh-name` on every host
    /// pod); the name a client passes to `KubernetesJob.add_mesh`. Default:
    /// the World's name. Lowercase letters and digits, starting with a
    /// letter, at most 63 characters (Monarch's own rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh_name: Option<String>,
    /// The worker port, given to the worker and to clients as
    /// `MONARCH_PORT`. Default 26600 (Monarch's). Must differ from the
    /// World's `spec.port` and from the agent's health port 26601.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
    /// The worker's command line. Default: Monarch's own worker bootstrap
    /// (`python -u -c ...` running `run_worker_loop_forever` on
    /// `tcp://<fqdn>:<port>@tcp://0.0.0.0:<port>`), so the image needs only
    /// `python` with `torchmonarch` installed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The pods, in the World's namespace, that run Monarch clients of this
    /// World (`KubernetesJob` attach mode) and so may dial the worker port
    /// when the operator writes a NetworkPolicy per World (the chart's
    /// `networkPolicy.enabled`, docs/operations.md). The World's own pods
    /// may always dial it. Unset: no other pod may; `{}`: every pod of the
    /// namespace. A client outside the cluster reaches the workers through
    /// `kubectl port-forward`, which needs no entry here. Changing it
    /// changes only the policy, never the host pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_selector: Option<LabelSelector>,
    /// The transport of Monarch's own channels to and from the workers.
    /// `Tcp` (the default) is what Monarch's `KubernetesJob` dials: it
    /// builds `tcp://` worker addresses itself, in 0.7 and 0.8 alike, and
    /// any peer that reaches the port is trusted. `Tls`: every worker
    /// serves mutual TLS 1.3 on `tls://<its FQDN>:<port>`, verified against
    /// a CA of this World's own; each host gets its certificate in the
    /// Secret `<world>-host-<rank>-tls` (mounted at `/etc/hyperactor/tls`),
    /// and clients get theirs, with the CA, in `<world>-monarch-client`
    /// (named in `status.monarch.clientSecret`). A peer without a
    /// certificate of this World's CA is refused (docs/monarch.md, "TLS").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<MonarchTransport>,
}

/// What a client of a Monarch World's TLS transport needs (World
/// `status.monarch`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MonarchStatus {
    /// The `kubernetes.io/tls` Secret holding a client certificate
    /// (`tls.crt`, `tls.key`) and the World's CA (`ca.crt`): mount it at
    /// `/etc/hyperactor/tls` in a client pod, or point
    /// `HYPERACTOR_TLS_CERT`, `_KEY` and `_CA` at its keys.
    pub client_secret: String,
}

/// How Monarch's channels reach the workers (`spec.monarch.transport`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum MonarchTransport {
    /// Plain TCP, what `KubernetesJob` dials (the default).
    #[default]
    Tcp,
    /// Mutual TLS 1.3 verified against the World's own CA.
    Tls,
}

impl MonarchSpec {
    /// The worker port, defaulted.
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(DEFAULT_MONARCH_PORT)
    }

    /// Whether the workers serve verified TLS.
    pub fn tls(&self) -> bool {
        self.transport == Some(MonarchTransport::Tls)
    }

    /// The mesh name, defaulted to the World's name.
    pub fn mesh_name<'a>(&'a self, world: &'a str) -> &'a str {
        self.mesh_name.as_deref().unwrap_or(world)
    }
}

/// Why `name` is not a mesh name Monarch accepts, or `None` when it is
/// (invariant 1).
pub fn mesh_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if name.len() > MAX_MESH_NAME {
        Some("is longer than 63 characters")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        Some("may hold only lowercase letters and digits (Monarch refuses '-' and '.')")
    } else if !name.as_bytes()[0].is_ascii_lowercase() {
        Some("must start with a letter")
    } else {
        None
    }
}

/// The agent's plain-HTTP health port, which no worker may take.
pub const AGENT_HEALTH_PORT: u16 = 26601;

/// Checks `spec.monarch` of the World `world` whose agent listens on
/// `agent_port` (invariants 1 and 2); each error names the field and the fix.
pub fn check(world: &str, spec: &MonarchSpec, agent_port: u16) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mesh = spec.mesh_name(world);
    if let Some(problem) = mesh_name_problem(mesh) {
        let whose = if spec.mesh_name.is_some() {
            format!("{mesh:?}")
        } else {
            format!("unset, so it defaults to the World's name {mesh:?}, which")
        };
        errs.push(FieldError::new(
            "spec.monarch.meshName",
            format!(
                "is {whose} {problem}; Monarch's KubernetesJob.add_mesh refuses it. \
                 Set spec.monarch.meshName to lowercase letters and digits starting \
                 with a letter, e.g. \"trainer\""
            ),
        ));
    }
    let port = spec.port();
    if port == 0 || port == agent_port || port == AGENT_HEALTH_PORT {
        let taken = if port == 0 {
            "is not a port".to_string()
        } else if port == agent_port {
            format!("is the agent's port (spec.port {agent_port})")
        } else {
            format!("is the agent's health port {AGENT_HEALTH_PORT}")
        };
        errs.push(FieldError::new(
            "spec.monarch.port",
            format!(
                "{port} {taken}; give the Monarch worker its own port, e.g. {DEFAULT_MONARCH_PORT} \
                 (Monarch's default) with spec.port left at its default"
            ),
        ));
    }
    if let Some(sel) = &spec.client_selector {
        errs.extend(crate::selector::check("spec.monarch.clientSelector", sel));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_the_field_and_fix() {
        let ok = MonarchSpec::default();
        assert!(check("trainer", &ok, 26602).is_empty());
        let e = check("my-world", &ok, 26602);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].field, "spec.monarch.meshName");
        assert!(e[0].message.contains("\"my-world\""), "{}", e[0].message);
        assert!(e[0].message.contains("defaults to the World's name"));
        let named = MonarchSpec {
            mesh_name: Some("Bad.Name".into()),
            ..Default::default()
        };
        assert!(check("my-world", &named, 26602)[0].message.contains("e.g."));
        for (port, why) in [
            (26602, "agent's port"),
            (26601, "health port"),
            (0, "not a port"),
        ] {
            let s = MonarchSpec {
                port: Some(port),
                ..Default::default()
            };
            let e = check("w", &s, 26602);
            assert_eq!(e.len(), 1, "{port}");
            assert_eq!(e[0].field, "spec.monarch.port");
            assert!(e[0].message.contains(why), "{}", e[0].message);
            assert!(e[0].message.contains("26600"), "{}", e[0].message);
        }
    }

    #[test]
    fn mesh_names_follow_monarch() {
        assert_eq!(mesh_name_problem("trainer2"), None);
        assert!(mesh_name_problem("").is_some());
        assert!(mesh_name_problem("my-mesh").is_some());
        assert!(mesh_name_problem("2mesh").is_some());
        assert!(mesh_name_problem("Mesh").is_some());
        assert!(mesh_name_problem(&"a".repeat(64)).is_some());
        assert_eq!(mesh_name_problem(&"a".repeat(63)), None);
    }

    #[test]
    fn defaults() {
        let m = MonarchSpec::default();
        assert_eq!(m.port(), 26600);
        assert_eq!(m.mesh_name("w"), "w");
    }
}
