//! What a MonarchMesh asks for, as plain data (no client): the World that
//! runs its workers and the `<name>-svc` headless Service monarch-kubernetes
//! also creates.
//!
//! Invariants:
//! 1. The World has the MonarchMesh's name and namespace and a controller
//!    owner reference to it, so deleting the MonarchMesh deletes the World.
//! 2. The World is built as a server-side apply body holding only the
//!    fields this controller owns (`hosts`, `template`, `monarch`); the
//!    API server defaults the rest, and a field another manager set (a
//!    user's `failurePolicy`, say) is left alone.
//! 3. The first container of `podTemplate` is the worker: its command and
//!    args become `spec.monarch.command` and are removed from the
//!    template (the agent takes the container's command); its env, image,
//!    resources and volumes stay.
//! 4. Monarch's selector labels (`app.kubernetes.io/name=monarch-worker`,
//!    `monarch.pytorch.org/mesh-name=<name>`) win over the template's own on
//!    the pod template, as in monarch-kubernetes.
//! 5. The World's `monarch.clientSelector` is `{}`: a MonarchMesh names no
//!    clients, and Monarch's own operator writes no NetworkPolicy, so with
//!    the operator's NetworkPolicies on, every pod of the namespace may
//!    still dial the workers' Monarch port (the agent's ports stay closed
//!    to them).

use std::collections::BTreeMap;

use hostmesh_crds::field::FieldError;
use hostmesh_crds::monarch::{APP_NAME_WORKER, LABEL_APP_NAME, LABEL_MESH_NAME};
use hostmesh_crds::monarchmesh::{MonarchMesh, SERVICE_PORT_NAME, SERVICE_SUFFIX};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource as _, ResourceExt as _};
use serde_json::json;

use crate::OperatorError;

/// Label on the World and Service: the MonarchMesh they belong to.
pub const LABEL_MONARCH_MESH: &str = "hostmesh.dev/monarch-mesh";
/// Annotations never copied from the MonarchMesh to its World.
const SKIPPED_ANNOTATIONS: &[&str] = &["kubectl.kubernetes.io/last-applied-configuration"];

/// Monarch's selector labels for mesh `name` (invariant 4).
pub fn selector(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_APP_NAME.to_string(), APP_NAME_WORKER.to_string()),
        (LABEL_MESH_NAME.to_string(), name.to_string()),
    ])
}

/// The worker command line of `mesh`: the first container's command and
/// args (invariant 3). Empty when the container gives neither (the World
/// then runs Monarch's own worker bootstrap). Args without a command are
/// refused: the agent cannot see the image's entrypoint.
pub fn worker_command(mesh: &MonarchMesh) -> Result<Vec<String>, FieldError> {
    let Some(c) = mesh
        .spec
        .pod_template
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
    else {
        return Ok(Vec::new());
    };
    let command = c.command.clone().unwrap_or_default();
    let args = c.args.clone().unwrap_or_default();
    if command.is_empty() && !args.is_empty() {
        return Err(FieldError::new(
            "spec.podTemplate.spec.containers[0].command",
            "is empty while args is set; hostmesh runs the worker through its agent and cannot \
             see the image's entrypoint, so give the whole command line in command",
        ));
    }
    Ok(command.into_iter().chain(args).collect())
}

fn owner_meta(mesh: &MonarchMesh, name: String) -> Result<ObjectMeta, OperatorError> {
    let owner = mesh
        .controller_owner_ref(&())
        .ok_or(OperatorError::MissingField("MonarchMesh metadata.uid"))?;
    let mut labels = mesh.labels().clone();
    labels.insert(LABEL_MONARCH_MESH.to_string(), mesh.name_any());
    labels.insert(
        "app.kubernetes.io/managed-by".to_string(),
        "hostmesh".to_string(),
    );
    Ok(ObjectMeta {
        name: Some(name),
        namespace: mesh.namespace(),
        owner_references: Some(vec![owner]),
        labels: Some(labels),
        ..Default::default()
    })
}

/// The World of `mesh` as a server-side apply body (invariants 1-4), with
/// `command` its [`worker_command`].
pub fn world(mesh: &MonarchMesh, command: &[String]) -> Result<serde_json::Value, OperatorError> {
    let name = mesh.name_any();
    let mut meta = owner_meta(mesh, name.clone())?;
    let annotations: BTreeMap<String, String> = mesh
        .annotations()
        .iter()
        .filter(|(k, _)| !SKIPPED_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !annotations.is_empty() {
        meta.annotations = Some(annotations);
    }
    let mut template = mesh.spec.pod_template.clone();
    let tmeta = template.metadata.get_or_insert_with(Default::default);
    tmeta
        .labels
        .get_or_insert_with(BTreeMap::new)
        .extend(selector(&name));
    if let Some(c) = template
        .spec
        .as_mut()
        .and_then(|s| s.containers.first_mut())
    {
        c.command = None;
        c.args = None;
    }
    // Invariant 5.
    let mut monarch = json!({"meshName": name, "port": mesh.spec.port, "clientSelector": {}});
    if !command.is_empty() {
        monarch["command"] = json!(command);
    }
    Ok(json!({
        "apiVersion": "hostmesh.dev/v1alpha1",
        "kind": "World",
        "metadata": meta,
        "spec": {
            "hosts": mesh.spec.replicas,
            "template": template,
            "monarch": monarch,
        },
    }))
}

/// The headless Service `<name>-svc` selecting the mesh's workers, as
/// monarch-kubernetes makes it (the workers' own DNS names come from the
/// World's Service).
pub fn service(mesh: &MonarchMesh) -> Result<Service, OperatorError> {
    let name = mesh.name_any();
    let mut meta = owner_meta(mesh, format!("{name}{SERVICE_SUFFIX}"))?;
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .extend(selector(&name));
    Ok(Service {
        metadata: meta,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            selector: Some(selector(&name)),
            ports: Some(vec![ServicePort {
                name: Some(SERVICE_PORT_NAME.to_string()),
                port: mesh.spec.port,
                target_port: Some(IntOrString::Int(mesh.spec.port)),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use hostmesh_crds::World;

    /// A MonarchMesh as Monarch 0.7.0's `_build_worker_pod_template` makes
    /// it (ImageSpec with resources), with a uid as the API server gives.
    pub(crate) fn mk_mesh(name: &str) -> MonarchMesh {
        let mut m: MonarchMesh = serde_json::from_value(json!({
            "apiVersion": "monarch.pytorch.org/v1alpha1",
            "kind": "MonarchMesh",
            "metadata": {"name": name, "namespace": "ns", "uid": "u-1", "generation": 3,
                          "labels": {"team": "a"},
                          "annotations": {"note": "x", "kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": {
                "replicas": 2,
                "port": 26600,
                "podTemplate": {"spec": {"containers": [{
                    "name": "worker",
                    "image": "ghcr.io/meta-pytorch/monarch:latest",
                    "command": ["python", "-u", "-c", "print('bootstrap')"],
                    "env": [
                        {"name": "MONARCH_PORT", "value": "26600"},
                        {"name": "MONARCH_SERVICE_PROC_RANK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}},
                        {"name": "MONARCH_SERVICE_PROC_IDS", "value": "[\"a\",\"b\"]"},
                    ],
                    "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}},
                }]}},
            },
        }))
        .unwrap();
        m.metadata.uid = Some("u-1".into());
        m
    }

    #[test]
    fn world_runs_the_first_containers_command_as_the_worker() {
        let m = mk_mesh("trainer");
        let body = world(&m, &worker_command(&m).unwrap()).unwrap();
        let w: World = serde_json::from_value(body.clone()).unwrap();
        assert_eq!(w.metadata.name.as_deref(), Some("trainer"));
        assert_eq!(w.metadata.namespace.as_deref(), Some("ns"));
        let owner = &w.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("MonarchMesh", "u-1", Some(true))
        );
        assert_eq!(w.labels()["team"], "a");
        assert_eq!(w.labels()[LABEL_MONARCH_MESH], "trainer");
        assert_eq!(w.annotations().len(), 1, "{:?}", w.annotations());
        assert_eq!(w.spec.hosts, Some(2));
        let m = w.spec.monarch.as_ref().unwrap();
        assert_eq!(m.mesh_name.as_deref(), Some("trainer"));
        assert_eq!(m.port, Some(26600));
        assert_eq!(m.command, ["python", "-u", "-c", "print('bootstrap')"]);
        let pod = w.spec.template.spec.as_ref().unwrap();
        let c = &pod.containers[0];
        assert!(c.command.is_none() && c.args.is_none());
        let env: Vec<&str> = c
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(
            env,
            [
                "MONARCH_PORT",
                "MONARCH_SERVICE_PROC_RANK",
                "MONARCH_SERVICE_PROC_IDS"
            ]
        );
        assert!(c.resources.is_some());
        let labels = w
            .spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        assert_eq!(labels[LABEL_APP_NAME], "monarch-worker");
        assert_eq!(labels[LABEL_MESH_NAME], "trainer");
        // Invariant 2: only the owned fields are in the apply body.
        let keys: Vec<&String> = body["spec"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["hosts", "monarch", "template"]);
        // Invariant 5: every pod of the namespace is a possible client.
        let clients = w.spec.monarch.as_ref().unwrap().client_selector.as_ref();
        assert_eq!(clients, Some(&Default::default()));
    }

    #[test]
    fn args_join_the_command_and_bare_args_are_refused() {
        let mut m = mk_mesh("trainer");
        let c = &mut m.spec.pod_template.spec.as_mut().unwrap().containers[0];
        c.command = Some(vec!["python".into()]);
        c.args = Some(vec!["-m".into(), "worker".into()]);
        assert_eq!(worker_command(&m).unwrap(), ["python", "-m", "worker"]);
        let c = &mut m.spec.pod_template.spec.as_mut().unwrap().containers[0];
        c.command = None;
        let e = worker_command(&m).unwrap_err();
        assert_eq!(e.field, "spec.podTemplate.spec.containers[0].command");
        let c = &mut m.spec.pod_template.spec.as_mut().unwrap().containers[0];
        c.args = None;
        let w: World = serde_json::from_value(world(&m, &[]).unwrap()).unwrap();
        assert!(
            w.spec.monarch.unwrap().command.is_empty(),
            "Monarch's default"
        );
    }

    #[test]
    fn service_is_monarch_kubernetes_headless_svc() {
        let s = service(&mk_mesh("trainer")).unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("trainer-svc"));
        let spec = s.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.selector.unwrap(), selector("trainer"));
        let p = &spec.ports.unwrap()[0];
        assert_eq!((p.name.as_deref(), p.port), (Some("monarch"), 26600));
        let mut no_uid = mk_mesh("trainer");
        no_uid.metadata.uid = None;
        assert!(service(&no_uid).is_err() && world(&no_uid, &[]).is_err());
    }
}
