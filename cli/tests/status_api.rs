//! `hostmesh status` reading real objects from the embedded API server: the
//! CRDs are installed from `hostmesh crds`, a World and a ProcMesh (and a
//! MonarchMesh) get a status through the status subresource, and the
//! command's view shows it.

use hostmesh_cli::manifest;
use hostmesh_cli::status::{StatusArgs, run};
use hostmesh_crds::{ProcMesh, World};
use hostmesh_testkit::eventually_ok;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

const OBJECTS: &str = r#"
apiVersion: hostmesh.dev/v1alpha1
kind: World
metadata: {name: trainer, namespace: default}
spec:
  shape: [{name: replica, size: 2}, {name: host, size: 2}]
  template: {spec: {containers: [{name: host, image: trainer:1}]}}
---
apiVersion: hostmesh.dev/v1alpha1
kind: ProcMesh
metadata: {name: train, namespace: default}
spec:
  world: trainer
  perHost: [{name: gpu, size: 2}]
  command: [python, train.py]
"#;

#[tokio::test]
async fn status_reads_world_and_procmesh_from_the_api_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    let server = hostmesh_testkit::cluster::server_with_crds(&kubeconfig).await;
    let client = server.client().expect("client");
    let objects = manifest::parse("objects", OBJECTS).expect("parse");
    // The CRDs may take a moment to be served: retry within a bound.
    eventually_ok("the objects applied", async || {
        manifest::apply_all(&client, &objects, "default", "test").await
    })
    .await;

    let worlds: Api<World> = Api::namespaced(client.clone(), "default");
    let status = serde_json::json!({"status": {
        "phase": "Running", "ready": "4/4", "readyHosts": 4, "desiredHosts": 4,
        "hosts": [{"start": 0, "count": 4, "state": "Ready"}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "AllHostsReady",
            "message": "4/4 hosts ready", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    }});
    worlds
        .patch_status("trainer", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("world status");
    let pms: Api<ProcMesh> = Api::namespaced(client.clone(), "default");
    let mut pm = pms.get("train").await.expect("procmesh");
    pm.status = Some(
        serde_json::from_value(serde_json::json!({
            "phase": "Failed", "extent": "replica=2,host=2,gpu=2",
            "running": 7, "failed": 1,
            "ranks": [{"start": 0, "count": 3, "state": "Running"},
                      {"start": 3, "count": 1, "state": "Failed", "exitCode": 3},
                      {"start": 4, "count": 4, "state": "Running"}],
            "firstFailure": {"rank": 3, "host": 1, "time": "2026-01-01T00:00:00Z",
                "state": "Failed", "reason": "exited with code 3", "exitCode": 3,
                "stderrTail": "boom\n"}
        }))
        .expect("status"),
    );
    pms.replace_status("train", &PostParams::default(), &pm)
        .await
        .expect("procmesh status");

    let args = |target: &str, ns: Option<&str>| StatusArgs {
        target: target.into(),
        namespace: ns.map(Into::into),
        kubeconfig: Some(kubeconfig.clone()),
    };
    let text = run(&args("world/trainer", None)).await.expect("world view");
    assert!(
        text.starts_with("World default/trainer: Running\n"),
        "{text}"
    );
    assert!(text.contains("  ready      4/4 hosts\n"), "{text}");
    assert!(text.contains("AllHostsReady"), "{text}");
    assert!(text.contains("train  Failed  7"), "{text}");

    let text = run(&args("pm/train", Some("default")))
        .await
        .expect("procmesh view");
    assert!(
        text.contains("First failure: rank 3 on host 1 (trainer-host-1)"),
        "{text}"
    );
    assert!(text.contains("    | boom\n"), "{text}");
    assert!(text.contains("3      Failed (exit 3)"), "{text}");

    let err = run(&args("world/nope", Some("default")))
        .await
        .expect_err("missing world")
        .to_string();
    assert!(
        err.contains("World \"nope\" not found in namespace \"default\""),
        "{err}"
    );
    assert!(err.contains("kubectl get worlds -n default"), "{err}");

    // A MonarchMesh is shown as its Ready condition and its World.
    hostmesh_testkit::cluster::install_monarch_mesh_crd(&client).await;
    let meshes: Api<hostmesh_crds::monarchmesh::MonarchMesh> =
        Api::namespaced(client.clone(), "default");
    let mut mesh: hostmesh_crds::monarchmesh::MonarchMesh =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "monarch.pytorch.org/v1alpha1", "kind": "MonarchMesh",
            "metadata": {"name": "trainer", "namespace": "default"},
            "spec": {"replicas": 4, "podTemplate": {"spec": {"containers": [{"name": "worker"}]}}},
        }))
        .expect("mesh");
    mesh = meshes
        .create(&PostParams::default(), &mesh)
        .await
        .expect("create mesh");
    mesh.status = Some(
        serde_json::from_value(serde_json::json!({
            "replicas": 4, "readyReplicas": 4, "world": "trainer",
            "conditions": [{"type": "Ready", "status": "True", "reason": "AllReady",
                "message": "4/4 Monarch workers ready", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        }))
        .expect("mesh status"),
    );
    meshes
        .replace_status("trainer", &PostParams::default(), &mesh)
        .await
        .expect("mesh status");
    let text = run(&args("monarchmesh/trainer", Some("default")))
        .await
        .expect("monarchmesh view");
    assert!(
        text.starts_with(
            "MonarchMesh trainer: Ready True (AllReady): 4/4 Monarch workers ready\nWorld default/trainer: Running\n"
        ),
        "{text}"
    );
    server.shutdown().await;
}
