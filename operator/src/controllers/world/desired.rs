//! The objects a World asks for, built as plain data from the World alone
//! (no client): the headless Service, the agent Secret and one Pod per host
//! rank (docs/architecture.md, "Host pods").
//!
//! Invariants:
//! 1. Every object carries a controller owner reference to its World.
//! 2. User labels and annotations from the template are kept; ours are added
//!    (ours win on a key clash).
//! 3. `hostmesh.dev/template-hash` hashes everything the operator derives a
//!    pod from (template, port, agent settings, agent image, `spec.monarch`
//!    when set) and nothing it
//!    does not, so admission-webhook mutations never look like drift.

use hostmesh_agent::contract::{self, BIN_DIR, BIN_PATH, HEALTH_PORT};
use hostmesh_crds::Rank;
use std::collections::BTreeMap;

use hostmesh_crds::World;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, ObjectFieldSelector, Pod, PodSchedulingGate, PodSpec, PodTemplateSpec, Probe,
    SeccompProfile, Secret, SecretKeySelector, SecurityContext, Service, ServicePort, ServiceSpec,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource as _, ResourceExt as _};

use super::kueue::Placement;
use super::kueue::workload::{
    ANNOTATION_WORKLOAD, LABEL_POD_SET, LABEL_TAS, POD_SET, TOPOLOGY_GATE,
};
use crate::OperatorError;

/// Label: the World a pod belongs to.
pub const LABEL_WORLD: &str = "hostmesh.dev/world";
/// Label: the host rank of a pod.
pub const LABEL_RANK: &str = "hostmesh.dev/rank";
/// Label: who manages the object.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Annotation: hash of the desired pod template.
pub const ANNOTATION_TEMPLATE_HASH: &str = "hostmesh.dev/template-hash";
/// Annotation on host pods: a short hash of the agent token they hold, so
/// pods holding a replaced token are found and replaced.
pub const ANNOTATION_SECRET_HASH: &str = "hostmesh.dev/secret-hash";

/// The first 8 hex digits of SHA-256 of the agent key: enough to tell
/// tokens apart, nothing to recover one from.
pub fn secret_hash(key: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, key);
    digest.as_ref()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
/// User the install container runs as (the image's non-root user).
const INSTALL_UID: i64 = 65532;
const BIN_VOLUME: &str = "hostmesh-bin";
/// A failed container's termination message is the tail of its log, so the
/// agent's and the installer's own errors reach status.
const FALLBACK_TO_LOGS: &str = "FallbackToLogsOnError";

/// Name of host pod `rank` of World `world`.
pub fn pod_name(world: &str, rank: Rank) -> String {
    format!("{world}-host-{rank}")
}

/// Name of a World's agent Secret.
pub fn secret_name(world: &str) -> String {
    format!("{world}-agent")
}

pub(super) fn owned_meta(world: &World, name: String) -> Result<ObjectMeta, OperatorError> {
    let owner = world
        .controller_owner_ref(&())
        .ok_or_else(|| OperatorError::MissingField("World metadata.uid"))?;
    Ok(ObjectMeta {
        name: Some(name),
        namespace: world.namespace(),
        owner_references: Some(vec![owner]),
        labels: Some(BTreeMap::from([
            (LABEL_WORLD.to_string(), world.name_any()),
            (LABEL_MANAGED_BY.to_string(), "hostmesh".to_string()),
        ])),
        ..Default::default()
    })
}

/// The headless Service `<world>` giving host pods stable DNS names.
pub fn service(world: &World) -> Result<Service, OperatorError> {
    let name = world.name_any();
    Ok(Service {
        metadata: owned_meta(world, name.clone())?,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            selector: Some(BTreeMap::from([(LABEL_WORLD.to_string(), name)])),
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![ServicePort {
                name: Some("hostmesh".to_string()),
                port: i32::from(world.spec.port),
                target_port: Some(IntOrString::Int(i32::from(world.spec.port))),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The agent Secret `<world>-agent` with `token`: the 32 random bytes as
/// 64 hex digits (text with no whitespace, so the key the agent derives from
/// the file is exactly these bytes). Created once, never rewritten: rotating
/// it would cut every agent off.
pub fn secret(world: &World, random: [u8; 32]) -> Result<Secret, OperatorError> {
    let token: String = random.iter().map(|b| format!("{b:02x}")).collect();
    Ok(Secret {
        metadata: owned_meta(world, secret_name(&world.name_any()))?,
        type_: Some("Opaque".to_string()),
        data: Some(BTreeMap::from([(
            contract::SECRET_KEY.to_string(),
            ByteString(token.into_bytes()),
        )])),
        ..Default::default()
    })
}

/// The injected install container meets the `restricted` Pod Security
/// Standard on its own (non-root, no privilege escalation, no capabilities,
/// the runtime's seccomp profile, read-only root: it writes only to its
/// volume), so a World whose template is restricted stays admissible in a
/// namespace that enforces it.
fn install_security_context() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(INSTALL_UID),
        run_as_group: Some(INSTALL_UID),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            add: None,
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            localhost_profile: None,
        }),
        ..Default::default()
    }
}

/// Hash of everything a host pod is derived from (invariant 3).
pub fn template_hash(world: &World, agent_image: &str) -> String {
    let mut input = serde_json::json!({
        "template": world.spec.template,
        "port": world.spec.port,
        "agent": world.spec.agent,
        "agentImage": agent_image,
    });
    // Only when set, so Worlds without it keep their hash (gang invariant 2).
    if let Some(s) = &world.spec.scheduling {
        input["scheduling"] = serde_json::json!(s);
    }
    if let Some(m) = &world.spec.monarch {
        // `clientSelector` shapes only the NetworkPolicy, not a pod.
        let m = hostmesh_crds::monarch::MonarchSpec {
            client_selector: None,
            ..m.clone()
        };
        input["monarch"] = serde_json::json!(m);
    }
    if let Some(size) = &world.spec.shared_memory_size {
        input["sharedMemorySize"] = serde_json::json!(size);
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, input.to_string().as_bytes());
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The pod hash when Kueue placed the hosts: the template hash and the
/// placement (an admission with other flavors makes other pods; one with
/// no node labels or tolerations keeps the template hash).
pub fn placed_hash(template_hash: &str, placement: Option<&Placement>) -> String {
    match placement.filter(|p| !p.is_empty()) {
        None => template_hash.to_string(),
        Some(p) => {
            let input = serde_json::json!({"template": template_hash, "placement": p});
            let digest = ring::digest::digest(&ring::digest::SHA256, input.to_string().as_bytes());
            digest.as_ref()[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        }
    }
}

/// The pod template of the World's Kueue pod set: host pod 0 without its
/// identity (name, owner, rank label, hostname), so Kueue counts exactly
/// the resources every host pod requests, the install container included.
pub fn pod_set_template(
    world: &World,
    agent_image: &str,
    hash: &str,
) -> Result<PodTemplateSpec, OperatorError> {
    let pod = pod(world, 0, agent_image, hash, None)?;
    let mut labels = pod.metadata.labels.unwrap_or_default();
    labels.remove(LABEL_RANK);
    labels.remove(hostmesh_crds::monarch::LABEL_POD_INDEX);
    // Host 0's topology group is not every host's (topology invariant 4
    // asks Kueue through the pod set's topology request instead).
    labels.retain(|k, _| !k.starts_with("hostmesh.dev/group-"));
    let mut spec = pod.spec.unwrap_or_default();
    spec.hostname = None;
    spec.affinity = world
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.affinity.clone());
    Ok(PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            annotations: pod.metadata.annotations,
            ..Default::default()
        }),
        spec: Some(spec),
    })
}

/// Kueue invariant 4: the admitted flavors' node labels (winning over the
/// template's on the same key) and tolerations, admission checks' labels and
/// annotations (never over the operator's own), and Kueue's pod-set label.
fn apply_placement(meta: &mut ObjectMeta, spec: &mut PodSpec, placement: &Placement) {
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in &placement.labels {
        labels.entry(k.clone()).or_insert_with(|| v.clone());
    }
    labels.insert(LABEL_POD_SET.to_string(), POD_SET.to_string());
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in &placement.annotations {
        annotations.entry(k.clone()).or_insert_with(|| v.clone());
    }
    if !placement.node_selector.is_empty() {
        spec.node_selector
            .get_or_insert_with(BTreeMap::new)
            .extend(placement.node_selector.clone());
    }
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for t in &placement.tolerations {
        if !tolerations.contains(t) {
            tolerations.push(t.clone());
        }
    }
    if tolerations.is_empty() {
        spec.tolerations = None;
    }
    // Kueue invariant 7.
    if let Some(wl) = &placement.topology_workload {
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .insert(LABEL_TAS.to_string(), "true".to_string());
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ANNOTATION_WORKLOAD.to_string(), wl.clone());
        let gates = spec.scheduling_gates.get_or_insert_with(Vec::new);
        if !gates.iter().any(|g| g.name == TOPOLOGY_GATE) {
            gates.push(PodSchedulingGate {
                name: TOPOLOGY_GATE.to_string(),
            });
        }
    }
}

/// Index of the host container in the template: the one named `host`, else
/// the first.
pub fn host_container_index(containers: &[Container]) -> usize {
    containers
        .iter()
        .position(|c| c.name == "host")
        .unwrap_or(0)
}

/// `spec.sharedMemorySize`: a memory `emptyDir` of `size` at `/dev/shm`
/// in the host container (`hostmesh_crds::shm`).
fn shared_memory(size: &str, host: &mut Container, volumes: &mut Vec<Volume>) {
    use hostmesh_crds::shm::{MOUNT_PATH, VOLUME};
    volumes.retain(|v| v.name != VOLUME);
    volumes.push(Volume {
        name: VOLUME.to_string(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".to_string()),
            size_limit: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                size.to_string(),
            )),
        }),
        ..Default::default()
    });
    host.volume_mounts
        .get_or_insert_with(Vec::new)
        .push(VolumeMount {
            name: VOLUME.to_string(),
            mount_path: MOUNT_PATH.to_string(),
            ..Default::default()
        });
}

fn volumes_of(v: &mut Option<Vec<Volume>>) -> &mut Vec<Volume> {
    v.get_or_insert_with(Vec::new)
}

/// A plain environment variable of a host container.
pub(super) fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.into()),
        value_from: None,
    }
}

/// Host pod `rank` of `world` (invariants 1-3), placed where Kueue admitted
/// it when `placement` is given (kueue invariant 4).
pub fn pod(
    world: &World,
    rank: Rank,
    agent_image: &str,
    hash: &str,
    placement: Option<&Placement>,
) -> Result<Pod, OperatorError> {
    let world_name = world.name_any();
    let name = pod_name(&world_name, rank);
    let template = &world.spec.template;
    let mut meta = owned_meta(world, name.clone())?;
    let mut labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.extend(meta.labels.take().unwrap_or_default());
    labels.insert(LABEL_RANK.to_string(), rank.to_string());
    meta.labels = Some(labels);
    let mut annotations = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    annotations.insert(ANNOTATION_TEMPLATE_HASH.to_string(), hash.to_string());
    meta.annotations = Some(annotations);

    let mut spec: PodSpec = template
        .spec
        .clone()
        .ok_or(OperatorError::MissingField("spec.template.spec"))?;
    if spec.containers.is_empty() {
        return Err(OperatorError::MissingField("spec.template.spec.containers"));
    }
    spec.hostname = Some(name);
    spec.subdomain = Some(world_name.clone());
    // The operator decides replacement; a kubelet restart would hide failures.
    spec.restart_policy = Some("Never".to_string());

    let has_agent = world.spec.agent.image_has_agent;
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    let mut mounts = Vec::new();
    let agent_cmd = if has_agent {
        "hostmesh".to_string()
    } else {
        volumes.push(Volume {
            name: BIN_VOLUME.to_string(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: BIN_VOLUME.to_string(),
            mount_path: BIN_DIR.to_string(),
            read_only: Some(true),
            ..Default::default()
        });
        let install = Container {
            name: "hostmesh-install".to_string(),
            image: Some(agent_image.to_string()),
            command: Some(vec![
                "hostmesh".to_string(),
                "install-agent".to_string(),
                "--to".to_string(),
                BIN_PATH.to_string(),
            ]),
            volume_mounts: Some(vec![VolumeMount {
                name: BIN_VOLUME.to_string(),
                mount_path: BIN_DIR.to_string(),
                ..Default::default()
            }]),
            security_context: Some(install_security_context()),
            // Why a copy failed reaches the pod's status, and the World's.
            termination_message_policy: Some(FALLBACK_TO_LOGS.to_string()),
            ..Default::default()
        };
        spec.init_containers
            .get_or_insert_with(Vec::new)
            .insert(0, install);
        BIN_PATH.to_string()
    };

    let idx = host_container_index(&spec.containers);
    let host = &mut spec.containers[idx];
    host.command = Some(vec![agent_cmd, "agent".to_string()]);
    host.args = None;
    host.termination_message_policy
        .get_or_insert_with(|| FALLBACK_TO_LOGS.to_string());
    host.volume_mounts
        .get_or_insert_with(Vec::new)
        .extend(mounts);
    let port = world.spec.port;
    let envs = host.env.get_or_insert_with(Vec::new);
    envs.retain(|e| !e.name.starts_with(contract::env::PREFIX));
    envs.extend([
        env(contract::env::WORLD, world_name.clone()),
        env(
            contract::env::NAMESPACE,
            world.namespace().unwrap_or_default(),
        ),
        env(contract::env::HOST_RANK, rank.to_string()),
        EnvVar {
            name: contract::env::POD_IP.to_string(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.podIP".to_string(),
                    api_version: None,
                }),
                ..Default::default()
            }),
        },
        env(contract::env::PORT, port.to_string()),
        env(contract::env::HEALTH_PORT, HEALTH_PORT.to_string()),
        // The World secret as a variable, not a mounted file: the agent
        // takes it out of its environment and is not dumpable, so its
        // procs (same container, same user) cannot read it, which they
        // could a file (agent `keys.rs`).
        EnvVar {
            name: contract::env::SECRET.to_string(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret_name(&world_name),
                    key: contract::SECRET_KEY.to_string(),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
        },
    ]);
    // Only when set: other Worlds' pods stay as they were.
    if let Some(beat) = &world.spec.agent.heartbeat_interval {
        envs.push(env(contract::env::HEARTBEAT_INTERVAL, beat.clone()));
    }
    let ports = host.ports.get_or_insert_with(Vec::new);
    ports.retain(|p| {
        p.container_port != i32::from(port) && p.container_port != i32::from(HEALTH_PORT)
    });
    ports.push(ContainerPort {
        name: Some("hostmesh".to_string()),
        container_port: i32::from(port),
        protocol: Some("TCP".to_string()),
        ..Default::default()
    });
    ports.push(ContainerPort {
        name: Some("hostmesh-health".to_string()),
        container_port: i32::from(HEALTH_PORT),
        protocol: Some("TCP".to_string()),
        ..Default::default()
    });
    host.readiness_probe = Some(Probe {
        http_get: Some(HTTPGetAction {
            path: Some(contract::READYZ.to_string()),
            port: IntOrString::Int(i32::from(HEALTH_PORT)),
            ..Default::default()
        }),
        // Every second (the smallest period): a new host counts as ready
        // at most a second after its agent serves.
        period_seconds: Some(1),
        failure_threshold: Some(3),
        ..Default::default()
    });
    if let Some(size) = &world.spec.shared_memory_size {
        shared_memory(size, host, volumes_of(&mut spec.volumes));
    }
    if let Some(m) = &world.spec.monarch {
        super::monarch::configure_host(m, rank, host);
        super::monarch::tls_volume(m, &world_name, rank, volumes_of(&mut spec.volumes));
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .extend(super::monarch::labels(m, &world_name, rank));
    }
    let (groups, affinity) = super::topology::placement(world, rank);
    if let Some(a) = affinity {
        meta.labels.get_or_insert_with(BTreeMap::new).extend(groups);
        super::topology::merge_affinity(&mut spec.affinity, a);
    }
    if let Some(p) = placement {
        apply_placement(&mut meta, &mut spec, p);
    }
    Ok(Pod {
        metadata: meta,
        spec: Some(spec),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn mk_world(yaml: &str) -> World {
        let mut w: World = serde_saphyr::from_str(yaml).unwrap();
        w.metadata.namespace = Some("ns".into());
        w.metadata.uid = Some("uid-1".into());
        w
    }

    const WORLD: &str = r#"
apiVersion: hostmesh.dev/v1alpha1
kind: World
metadata: {name: trainer}
spec:
  shape: [{name: replica, size: 2}, {name: host, size: 2}]
  template:
    metadata: {labels: {team: ml, hostmesh.dev/rank: spoof}, annotations: {note: keep}}
    spec:
      containers:
      - {name: sidecar, image: proxy}
      - {name: host, image: trainer:1.4, command: [sleep], env: [{name: A, value: b}]}
"#;

    #[test]
    fn the_api_default_port_is_the_agent_contract_s() {
        assert_eq!(hostmesh_crds::world::DEFAULT_PORT, contract::AGENT_PORT);
        assert_ne!(contract::AGENT_PORT, HEALTH_PORT);
    }

    /// `spec.sharedMemorySize`: a memory emptyDir of that size at /dev/shm
    /// in the host container only, and a change of it rolls the pods.
    #[test]
    fn shared_memory_is_a_memory_empty_dir_at_dev_shm() {
        let mut w = mk_world(WORLD);
        let before = template_hash(&w, "agent:1");
        w.spec.shared_memory_size = Some("16Gi".into());
        assert_ne!(template_hash(&w, "agent:1"), before);
        let spec = pod(&w, 0, "agent:1", "h", None).unwrap().spec.unwrap();
        let vol = spec
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == hostmesh_crds::shm::VOLUME)
            .unwrap();
        let dir = vol.empty_dir.unwrap();
        assert_eq!(dir.medium.as_deref(), Some("Memory"));
        assert_eq!(dir.size_limit.unwrap().0, "16Gi");
        let mounts_shm = |c: &Container| {
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path == "/dev/shm" && m.name == hostmesh_crds::shm::VOLUME)
        };
        assert!(mounts_shm(&spec.containers[1]), "the host container");
        assert!(!mounts_shm(&spec.containers[0]), "not the sidecar");
    }

    /// `spec.agent.heartbeatInterval` reaches the agent as
    /// `HOSTMESH_HEARTBEAT_INTERVAL`, only when set: a World without it
    /// keeps its pods and their hash.
    #[test]
    fn a_heartbeat_interval_reaches_the_agent_only_when_set() {
        let mut w = mk_world(WORLD);
        let before = template_hash(&w, "agent:1");
        let beat = |w: &World| {
            let spec = pod(w, 0, "agent:1", "h", None).unwrap().spec.unwrap();
            spec.containers[1]
                .env
                .iter()
                .flatten()
                .find(|e| e.name == contract::env::HEARTBEAT_INTERVAL)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(beat(&w), None);
        w.spec.agent.heartbeat_interval = Some("5s".into());
        assert_eq!(beat(&w).as_deref(), Some("5s"));
        assert_ne!(
            template_hash(&w, "agent:1"),
            before,
            "a change rolls the pods"
        );
        w.spec.agent.heartbeat_interval = None;
        assert_eq!(template_hash(&w, "agent:1"), before);
    }

    /// Kueue invariant 4: the flavors' labels join (and win over) the
    /// template's node selector, their tolerations are added once, and the
    /// placement changes the pod hash only when it places anything.
    #[test]
    fn an_admission_places_the_pods_and_changes_their_hash() {
        let w = mk_world(WORLD);
        let placement = Placement {
            node_selector: BTreeMap::from([("pool".to_string(), "a100".to_string())]),
            tolerations: vec![k8s_openapi::api::core::v1::Toleration {
                key: Some("nvidia.com/gpu".into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let p = pod(&w, 1, "agent:1", "h", Some(&placement)).unwrap();
        let spec = p.spec.unwrap();
        assert_eq!(spec.node_selector.unwrap()["pool"], "a100");
        assert_eq!(spec.tolerations.unwrap(), placement.tolerations);
        assert_eq!(p.metadata.labels.unwrap()[LABEL_POD_SET], POD_SET);
        assert_eq!(placed_hash("h", None), "h");
        assert_eq!(placed_hash("h", Some(&Placement::default())), "h");
        assert_ne!(placed_hash("h", Some(&placement)), "h");
        let t = pod_set_template(&w, "agent:1", "h").unwrap();
        assert!(!t.metadata.unwrap().labels.unwrap().contains_key(LABEL_RANK));
        assert!(t.spec.unwrap().hostname.is_none());
        assert!(
            pod(&w, 1, "agent:1", "h", Some(&placement))
                .unwrap()
                .spec
                .unwrap()
                .scheduling_gates
                .is_none(),
            "no topology assignment, no gate"
        );
    }

    #[test]
    fn a_topology_assignment_hands_the_pods_to_kueues_ungater() {
        let w = mk_world(WORLD);
        let placement = Placement {
            topology_workload: Some("world-w-1".to_string()),
            ..Default::default()
        };
        let p = pod(&w, 1, "agent:1", "h", Some(&placement)).unwrap();
        assert_eq!(p.metadata.labels.unwrap()[LABEL_TAS], "true");
        assert_eq!(
            p.metadata.annotations.unwrap()[ANNOTATION_WORKLOAD],
            "world-w-1"
        );
        let gates = p.spec.unwrap().scheduling_gates.unwrap();
        assert_eq!(gates.len(), 1);
        assert_eq!(gates[0].name, TOPOLOGY_GATE);
        assert_ne!(placed_hash("h", Some(&placement)), "h");
    }

    /// monarch invariants 1, 2: attach mode's labels and env on a Monarch
    /// World's pods, the worker settings for the agent, and a hash that
    /// moves with `spec.monarch`.
    #[test]
    fn a_monarch_world_labels_its_pods_for_attach_mode() {
        let plain = mk_world(WORLD);
        let w =
            mk_world(&WORLD.replace("  template:", "  monarch: {meshName: trainer}\n  template:"));
        assert_ne!(template_hash(&plain, "a"), template_hash(&w, "a"));
        let p = pod(&w, 2, "agent:1", "h", None).unwrap();
        let labels = p.metadata.labels.unwrap();
        assert_eq!(labels["app.kubernetes.io/name"], "monarch-worker");
        assert_eq!(labels["monarch.pytorch.org/mesh-name"], "trainer");
        assert_eq!(labels["apps.kubernetes.io/pod-index"], "2");
        let spec = p.spec.unwrap();
        let host = &spec.containers[host_container_index(&spec.containers)];
        let env: BTreeMap<_, _> = host
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.as_str(), e.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(env["MONARCH_PORT"], "26600");
        assert_eq!(env["MONARCH_SERVICE_PROC_RANK"], "2");
        assert!(!env.contains_key("MONARCH_SERVICE_PROC_IDS"));
        assert_eq!(env[contract::env::MONARCH_PORT], "26600");
        assert!(env[contract::env::MONARCH_COMMAND].contains("run_worker_loop_forever"));
        let ports = host.ports.as_ref().unwrap();
        assert!(
            ports
                .iter()
                .any(|p| p.name.as_deref() == Some("monarch") && p.container_port == 26600)
        );
        assert!(
            !pod(&plain, 2, "agent:1", "h", None)
                .unwrap()
                .metadata
                .labels
                .unwrap()
                .contains_key("apps.kubernetes.io/pod-index")
        );
    }

    #[test]
    fn pod_has_contract_names_labels_and_owner() {
        let w = mk_world(WORLD);
        let p = pod(&w, 3, "agent:1", "abc", None).unwrap();
        assert_eq!(p.metadata.name.as_deref(), Some("trainer-host-3"));
        let labels = p.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["team"], "ml");
        assert_eq!(labels[LABEL_RANK], "3");
        assert_eq!(labels[LABEL_WORLD], "trainer");
        assert_eq!(labels[LABEL_MANAGED_BY], "hostmesh");
        let ann = p.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann["note"], "keep");
        assert_eq!(ann[ANNOTATION_TEMPLATE_HASH], "abc");
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("World", Some(true))
        );
        let spec = p.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("trainer-host-3"));
        assert_eq!(spec.subdomain.as_deref(), Some("trainer"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    }

    #[test]
    fn agent_is_injected_into_host_container() {
        let w = mk_world(WORLD);
        let spec = pod(&w, 0, "agent:1", "h", None).unwrap().spec.unwrap();
        let init = &spec.init_containers.as_ref().unwrap()[0];
        assert_eq!(init.name, "hostmesh-install");
        assert_eq!(init.image.as_deref(), Some("agent:1"));
        assert_eq!(
            init.command.as_ref().unwrap()[1..],
            ["install-agent", "--to", "/hostmesh/bin/hostmesh"]
        );
        // Restricted Pod Security Standard, field by field.
        let sc = init.security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_ne!(sc.run_as_user, Some(0));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
        assert!(sc.capabilities.as_ref().unwrap().add.is_none());
        assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        assert_eq!(
            spec.containers[0].command.as_deref(),
            None,
            "sidecar untouched"
        );
        let host = &spec.containers[1];
        assert_eq!(
            host.command.as_ref().unwrap(),
            &["/hostmesh/bin/hostmesh", "agent"]
        );
        let env: BTreeMap<_, _> = host
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| (e.name.as_str(), e))
            .collect();
        assert_eq!(env["A"].value.as_deref(), Some("b"));
        assert_eq!(env["HOSTMESH_WORLD"].value.as_deref(), Some("trainer"));
        assert_eq!(env["HOSTMESH_HOST_RANK"].value.as_deref(), Some("0"));
        assert_eq!(env["HOSTMESH_PORT"].value.as_deref(), Some("26602"));
        // The secret comes as a variable from the World's Secret, never a
        // file the procs could read.
        let secret = env["HOSTMESH_SECRET"].value_from.as_ref().unwrap();
        let key = secret.secret_key_ref.as_ref().unwrap();
        assert_eq!(
            (key.name.as_str(), key.key.as_str()),
            ("trainer-agent", "token")
        );
        assert_eq!(env["HOSTMESH_SECRET"].value, None);
        assert!(!env.contains_key("HOSTMESH_SECRET_FILE"));
        let ip = env["HOSTMESH_POD_IP"].value_from.as_ref().unwrap();
        assert_eq!(ip.field_ref.as_ref().unwrap().field_path, "status.podIP");
        let probe = host
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap();
        assert_eq!(
            (probe.path.as_deref(), &probe.port),
            (Some("/readyz"), &IntOrString::Int(26601))
        );
        let mounts: Vec<_> = host
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(mounts, [BIN_DIR]);
        assert!(
            !spec.volumes.iter().flatten().any(|v| v.secret.is_some()),
            "no Secret volume: {:?}",
            spec.volumes
        );
    }

    #[test]
    fn image_with_agent_gets_no_init_container() {
        let mut w = mk_world(WORLD);
        w.spec.agent.image_has_agent = true;
        let spec = pod(&w, 0, "agent:1", "h", None).unwrap().spec.unwrap();
        assert!(spec.init_containers.is_none());
        assert_eq!(
            spec.containers[1].command.as_ref().unwrap(),
            &["hostmesh", "agent"]
        );
    }

    #[test]
    fn template_hash_tracks_template_and_image_only() {
        let w = mk_world(WORLD);
        let h = template_hash(&w, "agent:1");
        assert_eq!(h, template_hash(&w, "agent:1"));
        assert_ne!(h, template_hash(&w, "agent:2"));
        let mut w2 = w.clone();
        w2.spec.template.spec.as_mut().unwrap().containers[1].image = Some("trainer:1.5".into());
        assert_ne!(h, template_hash(&w2, "agent:1"));
        let mut w3 = w.clone();
        w3.spec.failure_policy.max_restarts = 9;
        w3.metadata.labels = Some(BTreeMap::from([("x".into(), "y".into())]));
        assert_eq!(h, template_hash(&w3, "agent:1"));
        // Who may dial the Monarch port shapes the NetworkPolicy only.
        let mut m = w.clone();
        m.spec.monarch = Some(Default::default());
        let hm = template_hash(&m, "agent:1");
        assert_ne!(h, hm);
        m.spec.monarch.as_mut().unwrap().client_selector = Some(Default::default());
        assert_eq!(hm, template_hash(&m, "agent:1"));
    }

    #[test]
    fn service_and_secret() {
        let w = mk_world(WORLD);
        let s = service(&w).unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("trainer"));
        assert_eq!(s.spec.as_ref().unwrap().cluster_ip.as_deref(), Some("None"));
        let sec = secret(&w, [7; 32]).unwrap();
        assert_eq!(sec.metadata.name.as_deref(), Some("trainer-agent"));
        let token = sec.data.unwrap()["token"].0.clone();
        assert_eq!(token, b"07".repeat(32));
        // Whatever the random bytes, the agent's key is the token itself.
        let edges = secret(&w, [0x0c; 32]).unwrap().data.unwrap()["token"]
            .0
            .clone();
        assert_eq!(hostmesh_agent::secret_key(&edges), &edges[..]);
        let mut no_uid = w.clone();
        no_uid.metadata.uid = None;
        assert!(service(&no_uid).is_err());
    }
}
