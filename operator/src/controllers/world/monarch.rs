//! What `spec.monarch` adds to a host pod (docs/monarch.md): the labels and
//! environment Monarch's `KubernetesJob` attach mode reads, the worker's
//! container port, and the agent settings that make the agent run the
//! worker as a supervised proc.
//!
//! Invariants:
//! 1. Pods carry `app.kubernetes.io/name=monarch-worker`,
//!    `monarch.pytorch.org/mesh-name=<mesh>` and
//!    `apps.kubernetes.io/pod-index=<host rank>`: the default selector and
//!    rank label of `KubernetesJob.add_mesh`.
//! 2. The host container's `MONARCH_PORT`, `MONARCH_SERVICE_PROC_RANK`
//!    and `MONARCH_POD_UID` (the downward API's `metadata.uid`) are the
//!    operator's (a template's own are replaced); a template's
//!    `MONARCH_SERVICE_PROC_IDS` passes through untouched, and none is
//!    invented. Monarch 0.8's client takes a worker's service identity
//!    from `MONARCH_SERVICE_PROC_IDS` when the pod declares it, else from
//!    the pod's uid, and refuses a pod that declares neither; 0.7's dials
//!    plain addresses (the legacy identity) and ignores both.
//! 3. The default worker command behaves as Monarch's own bootstrap:
//!    `run_worker_loop_forever` on
//!    `tcp://<fqdn>:<port>@tcp://0.0.0.0:<port>` (on `tls://<fqdn>:<port>`
//!    when `HYPERACTOR_TLS_CERT` is set), with the service identity
//!    the client will expect: from `MONARCH_SERVICE_PROC_IDS` when set,
//!    else from `MONARCH_POD_UID` where the installed Monarch derives
//!    identities from uids (0.8), else none (0.7).
//! 4. A `Tls` World's host container mounts its host's certificate Secret
//!    ([`monarch_tls`](super::monarch_tls) invariant 2) read-only at
//!    [`TLS_DIR`](api::TLS_DIR) and names its three files in
//!    `HYPERACTOR_TLS_CERT`, `_KEY` and `_CA`, which Monarch's transport
//!    reads and the bootstrap takes as the sign to serve TLS; a `Tcp`
//!    World's carries neither.

use hostmesh_agent::contract;
use hostmesh_crds::Rank;
use hostmesh_crds::monarch::{self as api, MonarchSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, ObjectFieldSelector, SecretVolumeSource,
    Volume, VolumeMount,
};

use super::desired::env;
use std::collections::BTreeMap;

/// Name of the worker's container port.
pub const PORT_NAME: &str = "monarch";

/// The worker bootstrap run when `spec.monarch.command` is empty
/// (invariant 3).
pub const BOOTSTRAP: &str = "\
import os, socket
from monarch.actor import run_worker_loop_forever
from monarch._src.job import service_identity as si
port = os.environ.get('MONARCH_PORT', '26600')
address = 'tcp://%s:%s@tcp://0.0.0.0:%s' % (socket.getfqdn(), port, port)
if os.environ.get('HYPERACTOR_TLS_CERT'):
    address = 'tls://%s:%s' % (socket.getfqdn(), port)
if os.environ.get('MONARCH_SERVICE_PROC_IDS'):
    address = si.service_proc_addr(address, si.ranked_service_proc_id_from_env())
elif os.environ.get('MONARCH_POD_UID') and hasattr(si, 'service_proc_id_from_uuid'):
    address = si.service_proc_addr(address, si.service_proc_id_from_uuid(os.environ['MONARCH_POD_UID']))
run_worker_loop_forever(address=address, ca='trust_all_connections')
";

/// The worker's command line: the spec's, else `python -u -c BOOTSTRAP`.
pub fn command(spec: &MonarchSpec) -> Vec<String> {
    if spec.command.is_empty() {
        ["python", "-u", "-c", BOOTSTRAP]
            .map(str::to_string)
            .to_vec()
    } else {
        spec.command.clone()
    }
}

/// Invariant 1: the labels attach mode selects and ranks workers by.
pub fn labels(spec: &MonarchSpec, world: &str, rank: Rank) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            api::LABEL_APP_NAME.to_string(),
            api::APP_NAME_WORKER.to_string(),
        ),
        (
            api::LABEL_MESH_NAME.to_string(),
            spec.mesh_name(world).to_string(),
        ),
        (api::LABEL_POD_INDEX.to_string(), rank.to_string()),
    ])
}

/// The variables naming a TLS worker's certificate, key and CA, and the
/// files of its Secret they name (invariant 4).
const TLS_FILES: [(&str, &str); 3] = [
    ("HYPERACTOR_TLS_CERT", "tls.crt"),
    ("HYPERACTOR_TLS_KEY", "tls.key"),
    ("HYPERACTOR_TLS_CA", "ca.crt"),
];
/// The volume of a TLS host's certificate Secret.
const TLS_VOLUME: &str = "monarch-tls";

/// Invariant 4: the host's certificate Secret as a volume of the pod.
pub fn tls_volume(spec: &MonarchSpec, world: &str, rank: Rank, volumes: &mut Vec<Volume>) {
    volumes.retain(|v| v.name != TLS_VOLUME);
    if spec.tls() {
        volumes.push(Volume {
            name: TLS_VOLUME.to_string(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(super::monarch_tls::host_name(world, rank)),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
}

/// Invariants 2 and 4 and the agent's worker settings, on the host
/// container; and the worker's container port.
pub fn configure_host(spec: &MonarchSpec, rank: Rank, host: &mut Container) {
    let port = spec.port();
    let envs = host.env.get_or_insert_with(Vec::new);
    envs.retain(|e| {
        e.name != api::ENV_PORT
            && e.name != api::ENV_SERVICE_PROC_RANK
            && e.name != api::ENV_POD_UID
            && TLS_FILES.iter().all(|(v, _)| e.name != *v)
    });
    if spec.tls() {
        envs.extend(TLS_FILES.map(|(var, file)| env(var, format!("{}/{file}", api::TLS_DIR))));
    }
    let mounts = host.volume_mounts.get_or_insert_with(Vec::new);
    mounts.retain(|m| m.name != TLS_VOLUME);
    if spec.tls() {
        mounts.push(VolumeMount {
            name: TLS_VOLUME.to_string(),
            mount_path: api::TLS_DIR.to_string(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    let envs = host.env.get_or_insert_with(Vec::new);
    let cmd = serde_json::to_string(&command(spec)).unwrap_or_else(|_| "[]".to_string());
    envs.extend([
        env(api::ENV_PORT, port.to_string()),
        env(api::ENV_SERVICE_PROC_RANK, rank.to_string()),
        EnvVar {
            name: api::ENV_POD_UID.to_string(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.uid".to_string(),
                    api_version: None,
                }),
                ..Default::default()
            }),
        },
        env(contract::env::MONARCH_COMMAND, cmd),
        env(contract::env::MONARCH_PORT, port.to_string()),
    ]);
    let ports = host.ports.get_or_insert_with(Vec::new);
    ports.retain(|p| p.container_port != i32::from(port) && p.name.as_deref() != Some(PORT_NAME));
    ports.push(ContainerPort {
        name: Some(PORT_NAME.to_string()),
        container_port: i32::from(port),
        protocol: Some("TCP".to_string()),
        ..Default::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_command_is_the_bootstrap() {
        let c = command(&MonarchSpec::default());
        assert_eq!(c[..3], ["python", "-u", "-c"]);
        assert!(c[3].contains("run_worker_loop_forever"));
        assert!(c[3].contains("@tcp://0.0.0.0:"));
        let own = MonarchSpec {
            command: vec!["w".into()],
            ..Default::default()
        };
        assert_eq!(command(&own), ["w"]);
    }

    /// Invariant 4: a TLS World's host mounts its own certificate Secret
    /// and names its files; a TCP World's carries neither, even when its
    /// template did.
    #[test]
    fn a_tls_host_mounts_its_certificate_and_names_its_files() {
        let tls = MonarchSpec {
            transport: Some(api::MonarchTransport::Tls),
            ..Default::default()
        };
        let mut host = Container::default();
        let mut volumes = Vec::new();
        configure_host(&tls, 2, &mut host);
        tls_volume(&tls, "w", 2, &mut volumes);
        let env: BTreeMap<_, _> = host
            .env
            .clone()
            .unwrap()
            .into_iter()
            .filter_map(|e| Some((e.name, e.value?)))
            .collect();
        assert_eq!(env["HYPERACTOR_TLS_CERT"], "/etc/hyperactor/tls/tls.crt");
        assert_eq!(env["HYPERACTOR_TLS_KEY"], "/etc/hyperactor/tls/tls.key");
        assert_eq!(env["HYPERACTOR_TLS_CA"], "/etc/hyperactor/tls/ca.crt");
        let mounts = host.volume_mounts.clone().unwrap();
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].mount_path, "/etc/hyperactor/tls");
        assert_eq!(mounts[0].read_only, Some(true));
        assert_eq!(volumes.len(), 1);
        assert_eq!(
            volumes[0].secret.as_ref().unwrap().secret_name.as_deref(),
            Some("w-host-2-tls")
        );
        assert!(command(&tls)[3].contains("'tls://%s:%s'"));
        // Back to TCP: nothing of it is left.
        let tcp = MonarchSpec::default();
        configure_host(&tcp, 2, &mut host);
        tls_volume(&tcp, "w", 2, &mut volumes);
        assert!(
            host.env
                .unwrap()
                .iter()
                .all(|e| !e.name.starts_with("HYPERACTOR_TLS"))
        );
        assert!(host.volume_mounts.unwrap().is_empty());
        assert!(volumes.is_empty());
    }

    #[test]
    fn host_env_keeps_the_template_ids_and_replaces_port_and_rank() {
        let mut host = Container {
            env: Some(vec![
                env(api::ENV_SERVICE_PROC_IDS, "[\"a\",\"b\"]"),
                env(api::ENV_PORT, "1"),
                env(api::ENV_POD_UID, "spoof"),
            ]),
            ..Default::default()
        };
        let spec = MonarchSpec {
            port: Some(27000),
            ..Default::default()
        };
        configure_host(&spec, 1, &mut host);
        let all = host.env.unwrap();
        let uid = all
            .iter()
            .filter(|e| e.name == api::ENV_POD_UID)
            .collect::<Vec<_>>();
        assert_eq!(uid.len(), 1, "the template's own is replaced");
        assert_eq!(
            uid[0]
                .value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "metadata.uid"
        );
        let env: BTreeMap<_, _> = all
            .into_iter()
            .filter_map(|e| Some((e.name, e.value?)))
            .collect();
        assert_eq!(env[api::ENV_SERVICE_PROC_IDS], "[\"a\",\"b\"]");
        assert_eq!(env[api::ENV_PORT], "27000");
        assert_eq!(env[api::ENV_SERVICE_PROC_RANK], "1");
        assert_eq!(env[contract::env::MONARCH_PORT], "27000");
        let cmd: Vec<String> = serde_json::from_str(&env[contract::env::MONARCH_COMMAND]).unwrap();
        assert_eq!(cmd, command(&spec));
        let ports = host.ports.unwrap();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].name.as_deref(), Some(PORT_NAME));
        assert_eq!(ports[0].container_port, 27000);
    }
}
