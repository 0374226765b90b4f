//! The `MonarchMesh` resource (`monarch.pytorch.org/v1alpha1`), served by
//! hostmesh when asked (`--serve-monarch-mesh`) in place of the Monarch
//! operator (meta-pytorch/monarch-kubernetes): the spec and status fields
//! that project defines, so Monarch's `KubernetesJob.add_mesh(...,
//! image_spec=...)` provisioning works unchanged, plus hostmesh's health
//! (phase, host runs, first failure, the World's conditions) in status.
//!
//! Invariants:
//! 1. The spec is monarch-kubernetes' v0.2.0 spec: `replicas` (>= 1),
//!    `port` (default 26600), `podTemplate`; the status keeps its
//!    `replicas`, `readyReplicas` and `Ready` condition meanings. Every
//!    other status field is an addition a Monarch client ignores.
//! 2. The CRD carries monarch-kubernetes' CEL rule on the name and a CEL
//!    rule on the port; [`validate`] checks the same (and more) for API
//!    servers that do not evaluate CEL, with messages naming the field.
//! 3. [`crd_yaml`] is separate from [`crate::crd_yaml`]: hostmesh's own CRD
//!    set never includes this kind.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt as _};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::field::FieldError;
use crate::monarch::{AGENT_HEALTH_PORT, DEFAULT_MONARCH_PORT, mesh_name_problem};
use crate::world::{HostFailure, HostStatus, MAX_HOSTS, WorldPhase};
use hostmesh_mesh::Run;

/// The API group of `MonarchMesh` (Monarch's, not hostmesh's).
pub const GROUP: &str = "monarch.pytorch.org";
/// The API version of `MonarchMesh`.
pub const VERSION: &str = "v1alpha1";
/// The resource's plural, as Monarch's client addresses it.
pub const PLURAL: &str = "monarchmeshes";
/// The CRD's name.
pub const CRD_NAME: &str = "monarchmeshes.monarch.pytorch.org";
/// Suffix of the headless Service monarch-kubernetes creates per mesh
/// (`<name>-svc`, selecting the mesh's workers).
pub const SERVICE_SUFFIX: &str = "-svc";
/// Name of that Service's port.
pub const SERVICE_PORT_NAME: &str = "monarch";

/// Desired state of a MonarchMesh: Monarch workers on `replicas` pods.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "monarch.pytorch.org",
    version = "v1alpha1",
    kind = "MonarchMesh",
    plural = "monarchmeshes",
    namespaced,
    status = "MonarchMeshStatus",
    doc = "Monarch workers on replicas pods (Monarch's KubernetesJob provisioning mode), run by hostmesh as a World with spec.monarch.",
    printcolumn(
        name = "READY",
        type_ = "string",
        json_path = ".status.ready",
        description = "ready/desired workers"
    ),
    printcolumn(name = "PHASE", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "RESTARTS", type_ = "integer", json_path = ".status.restarts"),
    printcolumn(
        name = "FAILURE",
        type_ = "string",
        json_path = ".status.firstFailure.reason",
        description = "the first worker failure since the mesh was last Ready"
    ),
    printcolumn(
        name = "AGE",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MonarchMeshSpec {
    /// Number of Monarch worker pods (hosts of the World).
    #[schemars(range(min = 1, max = MAX_HOSTS))]
    pub replicas: i32,
    /// Port Monarch workers listen on (`MONARCH_PORT`). Must differ from
    /// the hostmesh agent's ports (26601, 26602).
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Pod template of the workers. The first container is the worker: its
    /// command and args become the worker command the hostmesh agent runs
    /// and supervises; its env (MONARCH_SERVICE_PROC_IDS, ...) is kept.
    #[schemars(schema_with = "crate::preserve_unknown_object")]
    pub pod_template: PodTemplateSpec,
}

fn default_port() -> i32 {
    i32::from(DEFAULT_MONARCH_PORT)
}

/// Observed state of a MonarchMesh: monarch-kubernetes' fields, then the
/// World's health.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MonarchMeshStatus {
    /// Worker pods the mesh asks for (the World's desired hosts).
    #[serde(default)]
    pub replicas: i32,
    /// Worker pods that are Ready (pod Ready, worker listening, agent
    /// heartbeating).
    #[serde(default)]
    pub ready_replicas: i32,
    /// `Ready` (all replicas ready; reasons `AllReady`, `Waiting`,
    /// `InvalidSpec`, `WorldConflict`), then the World's other conditions
    /// (Progressing, Degraded, Failed, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// `ready/desired` for display, e.g. `2/2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    /// The World's phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<WorldPhase>,
    /// The World that runs the workers (same name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world: Option<String>,
    /// Per-rank host state as runs of equal state (the World's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<Run<HostStatus>>,
    /// Host restarts so far (the World's).
    #[serde(default)]
    pub restarts: u32,
    /// The first worker failure since the mesh was last Ready: rank, pod,
    /// exit code or signal, stderr tail (the World's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<HostFailure>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The CEL rule monarch-kubernetes puts on the name (Monarch's own rule).
const NAME_RULE: &str =
    "self.metadata.name.matches('^[a-z][a-z0-9]*$') && self.metadata.name.size() <= 63";
const NAME_MESSAGE: &str = "MonarchMesh name must start with a lowercase letter and be lowercase alphanumeric with less than 64 characters";

/// The MonarchMesh CRD with its CEL rules (invariant 2).
pub fn crd() -> CustomResourceDefinition {
    let mut crd = MonarchMesh::crd();
    for v in &mut crd.spec.versions {
        let Some(schema) = v
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        schema.x_kubernetes_validations = Some(vec![rule(NAME_RULE, NAME_MESSAGE)]);
        if let Some(port) = schema
            .properties
            .as_mut()
            .and_then(|p| p.get_mut("spec"))
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("port"))
        {
            port.x_kubernetes_validations = Some(vec![rule(
                &format!(
                    "self != {AGENT_HEALTH_PORT} && self != {}",
                    crate::world::DEFAULT_PORT
                ),
                &format!(
                    "spec.port is a hostmesh agent port ({AGENT_HEALTH_PORT} or {}); use another, e.g. Monarch's default {DEFAULT_MONARCH_PORT}",
                    crate::world::DEFAULT_PORT
                ),
            )]);
        }
    }
    crd
}

fn rule(
    rule: &str,
    message: &str,
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ValidationRule {
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ValidationRule {
        rule: rule.to_string(),
        message: Some(message.to_string()),
        ..Default::default()
    }
}

/// The MonarchMesh CRD as YAML (`hostmesh crds --monarch-mesh`, the chart's
/// `monarch.serveMonarchMesh` template); invariant 3.
pub fn crd_yaml() -> Result<String, crate::CrdError> {
    let doc = serde_saphyr::to_string(&crd()).map_err(|e| crate::CrdError::Yaml(e.to_string()))?;
    let mut out = format!("---\n{doc}");
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

/// Checks a MonarchMesh named `name` whose World's agent listens on
/// `agent_port` (invariant 2); each error names the field and the fix.
pub fn validate(name: &str, spec: &MonarchMeshSpec, agent_port: u16) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(problem) = mesh_name_problem(name) {
        errs.push(FieldError::new(
            "metadata.name",
            format!(
                "{name:?} {problem}; Monarch refuses it as a mesh name. Use lowercase letters and digits starting with a letter, e.g. \"trainer\""
            ),
        ));
    }
    if spec.replicas < 1 || i64::from(spec.replicas) > i64::try_from(MAX_HOSTS).unwrap_or(i64::MAX)
    {
        errs.push(FieldError::new(
            "spec.replicas",
            format!(
                "{} is out of range; a MonarchMesh needs 1 to {MAX_HOSTS} worker pods",
                spec.replicas
            ),
        ));
    }
    let port = spec.port;
    if !(1..=65535).contains(&port) {
        errs.push(FieldError::new(
            "spec.port",
            format!("{port} is not a port; use 1-65535, e.g. {DEFAULT_MONARCH_PORT}"),
        ));
    } else if port == i32::from(agent_port) || port == i32::from(AGENT_HEALTH_PORT) {
        let whose = if port == i32::from(agent_port) {
            "the hostmesh agent's port"
        } else {
            "the hostmesh agent's health port"
        };
        errs.push(FieldError::new(
            "spec.port",
            format!(
                "{port} is {whose}; give the Monarch workers another port, e.g. {DEFAULT_MONARCH_PORT} (Monarch's default)"
            ),
        ));
    }
    let containers = spec
        .pod_template
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    if containers.is_empty() {
        errs.push(FieldError::new(
            "spec.podTemplate.spec.containers",
            "is empty; give the worker container (image, and a command that starts run_worker_loop_forever)",
        ));
    }
    // The World's agent goes into the container named `host`, else the
    // first; the worker command comes from the first, so they must agree.
    if let Some(i) = containers.iter().skip(1).position(|c| c.name == "host") {
        errs.push(FieldError::new(
            format!("spec.podTemplate.spec.containers[{}].name", i + 1),
            "\"host\" is reserved for the worker container, which is the first; rename this container",
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> MonarchMeshSpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    const OK: &str = "replicas: 2\npodTemplate: {spec: {containers: [{name: worker, image: monarch, command: [python, -c, x]}]}}\n";

    #[test]
    fn monarch_clients_spec_parses_with_the_default_port() {
        let s = spec(OK);
        assert_eq!(s.port, 26600);
        assert!(validate("trainer", &s, 26602).is_empty());
    }

    #[test]
    fn bad_input_names_the_field_and_fix() {
        let zero = spec(&OK.replace("replicas: 2", "replicas: 0"));
        let e = validate("trainer", &zero, 26602);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].field, "spec.replicas");
        assert!(e[0].message.contains("1 to"), "{}", e[0].message);

        for (port, why) in [
            (26602, "agent's port"),
            (26601, "health port"),
            (0, "not a port"),
        ] {
            let mut s = spec(OK);
            s.port = port;
            let e = validate("trainer", &s, 26602);
            assert_eq!(e.len(), 1, "{port}");
            assert_eq!(e[0].field, "spec.port");
            assert!(e[0].message.contains(why), "{}", e[0].message);
            assert!(e[0].message.contains("26600"), "{}", e[0].message);
        }

        let e = validate("my-mesh", &spec(OK), 26602);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].field, "metadata.name");
        assert!(e[0].message.contains("\"my-mesh\""), "{}", e[0].message);

        let none = spec("replicas: 1\npodTemplate: {spec: {containers: []}}\n");
        assert_eq!(
            validate("m", &none, 26602)[0].field,
            "spec.podTemplate.spec.containers"
        );
        let host = spec(
            "replicas: 1\npodTemplate: {spec: {containers: [{name: worker}, {name: host}]}}\n",
        );
        assert_eq!(
            validate("m", &host, 26602)[0].field,
            "spec.podTemplate.spec.containers[1].name"
        );
    }

    #[test]
    fn crd_matches_monarch_kubernetes_shape() {
        let text = crd_yaml().unwrap();
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
        assert_eq!(docs.len(), 1);
        let d = &docs[0];
        assert_eq!(d["metadata"]["name"], CRD_NAME);
        assert_eq!(d["spec"]["group"], GROUP);
        assert_eq!(d["spec"]["names"]["plural"], PLURAL);
        assert_eq!(d["spec"]["scope"], "Namespaced");
        let v = &d["spec"]["versions"][0];
        assert_eq!(v["name"], VERSION);
        assert!(v["subresources"]["status"].is_object());
        let root = &v["schema"]["openAPIV3Schema"];
        assert_eq!(root["x-kubernetes-validations"][0]["rule"], NAME_RULE);
        let spec = &root["properties"]["spec"];
        let req: Vec<&str> = spec["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap())
            .collect();
        assert!(req.contains(&"replicas") && req.contains(&"podTemplate"));
        assert_eq!(
            spec["properties"]["replicas"]["minimum"].as_f64(),
            Some(1.0)
        );
        assert_eq!(spec["properties"]["port"]["default"], 26600);
        assert!(
            spec["properties"]["port"]["x-kubernetes-validations"][0]["rule"]
                .as_str()
                .unwrap()
                .contains("26601")
        );
        let status = &root["properties"]["status"]["properties"];
        for f in [
            "replicas",
            "readyReplicas",
            "conditions",
            "firstFailure",
            "phase",
        ] {
            assert!(status[f].is_object(), "status.{f}");
        }
        let cols: Vec<&str> = v["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(cols, ["READY", "PHASE", "RESTARTS", "FAILURE", "AGE"]);
    }
}
