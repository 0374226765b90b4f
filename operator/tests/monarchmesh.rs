//! The MonarchMesh controller against the embedded API server, with
//! simulated agents: a MonarchMesh as Monarch 0.7.0's `KubernetesJob`
//! creates it becomes an owned World with `spec.monarch`, its status
//! follows the World to Ready and carries its first failure, a client's
//! patch reaches the World, bad
//! input is refused or reported naming the field, a foreign World is left
//! alone, and deleting the mesh deletes its World.

mod support;

use hostmesh_crds::World;
use hostmesh_crds::monarchmesh::MonarchMesh;
use hostmesh_testkit::eventually_async;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{Cluster, NS, cond};

/// The body Monarch's `KubernetesJob._create` posts for
/// `add_mesh(name, replicas, image_spec=ImageSpec("monarch:test"))`.
fn monarch_body(name: &str, replicas: i64, port: i64) -> serde_json::Value {
    json!({
        "apiVersion": "monarch.pytorch.org/v1alpha1",
        "kind": "MonarchMesh",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "port": port,
            "podTemplate": {"spec": {"containers": [{
                "name": "worker",
                "image": "monarch:test",
                "command": ["python", "-u", "-c", "import monarch"],
                "env": [
                    {"name": "MONARCH_PORT", "value": port.to_string()},
                    {"name": "MONARCH_SERVICE_PROC_RANK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}},
                    {"name": "MONARCH_SERVICE_PROC_IDS", "value": "[]"},
                ],
            }]}},
        },
    })
}

async fn create(c: &Cluster, body: serde_json::Value) -> Result<MonarchMesh, kube::Error> {
    let mesh: MonarchMesh = serde_json::from_value(body).unwrap();
    c.api::<MonarchMesh>()
        .create(&PostParams::default(), &mesh)
        .await
}

async fn ready_reason(c: &Cluster, name: &str) -> Option<(String, String, String)> {
    let s = c.api::<MonarchMesh>().get(name).await.ok()?.status?;
    let r = s.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((r.status.clone(), r.reason.clone(), r.message.clone()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_monarch_mesh_runs_as_an_owned_world_and_goes_with_it() {
    let c = Cluster::start_serving_monarch_mesh().await;
    create(&c, monarch_body("trainer", 2, 26600)).await.unwrap();

    let worlds = c.api::<World>();
    let w = eventually_async("the MonarchMesh's World", || async {
        worlds.get("trainer").await.ok()
    })
    .await;
    assert_eq!(w.spec.hosts, Some(2));
    let m = w.spec.monarch.clone().expect("spec.monarch");
    assert_eq!(m.mesh_name.as_deref(), Some("trainer"));
    assert_eq!(m.port, Some(26600));
    assert_eq!(m.command, ["python", "-u", "-c", "import monarch"]);
    let owner = &w.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("MonarchMesh", Some(true))
    );
    let services = c.api::<Service>();
    let svc = eventually_async("the <name>-svc Service", || async {
        services.get("trainer-svc").await.ok()
    })
    .await;
    assert_eq!(
        svc.spec.unwrap().selector.unwrap()["monarch.pytorch.org/mesh-name"],
        "trainer"
    );

    // The World's hosts come up; the mesh reports Ready as monarch-kubernetes does.
    let pods = c.api::<Pod>();
    eventually_async("two host pods", || async {
        let l = pods
            .list(&ListParams::default().labels("hostmesh.dev/world=trainer"))
            .await
            .ok()?;
        (l.items.len() == 2).then_some(())
    })
    .await;
    c.pod_ready("trainer-host-0", "127.0.9.1").await;
    c.pod_ready("trainer-host-1", "127.0.9.2").await;
    let meshes = c.api::<MonarchMesh>();
    let s = eventually_async("MonarchMesh Ready", || async {
        let s = meshes.get("trainer").await.ok()?.status?;
        (cond(&s.conditions, "Ready")?.0 == "True").then_some(s)
    })
    .await;
    assert_eq!((s.replicas, s.ready_replicas), (2, 2));
    assert_eq!(s.ready.as_deref(), Some("2/2"));
    assert_eq!(s.phase, Some(hostmesh_crds::world::WorldPhase::Running));
    assert_eq!(s.world.as_deref(), Some("trainer"));
    assert!(!s.hosts.is_empty());

    // A worker host fails: the mesh's status carries the World's health.
    let failed = json!({"status": {
        "phase": "Failed",
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [{
            "name": "worker", "ready": false, "restartCount": 0, "image": "monarch:test", "imageID": "",
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
        }],
    }});
    pods.patch_status(
        "trainer-host-1",
        &PatchParams::default(),
        &Patch::Merge(&failed),
    )
    .await
    .unwrap();
    let s = eventually_async("the failure in MonarchMesh status", || async {
        let s = meshes.get("trainer").await.ok()?.status?;
        s.first_failure.is_some().then_some(s)
    })
    .await;
    let ff = s.first_failure.as_ref().unwrap();
    assert_eq!((ff.rank, ff.pod.as_str()), (1, "trainer-host-1"), "{ff:?}");
    assert_eq!(
        cond(&s.conditions, "Ready").map(|c| c.0),
        Some("False".into())
    );

    // Monarch's client patches an existing mesh (merge patch on 409).
    meshes
        .patch(
            "trainer",
            &PatchParams::default(),
            &Patch::Merge(monarch_body("trainer", 3, 26600)),
        )
        .await
        .unwrap();
    eventually_async("the patch reaches the World", || async {
        (worlds.get("trainer").await.ok()?.spec.hosts == Some(3)).then_some(())
    })
    .await;
    let (status, reason, message) = eventually_async("Ready False for 3 replicas", || async {
        ready_reason(&c, "trainer")
            .await
            .filter(|r| r.2.contains("/3"))
    })
    .await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "Waiting"),
        "{message}"
    );

    // job.kill() deletes the mesh: the World goes with it.
    meshes
        .delete("trainer", &DeleteParams::default())
        .await
        .unwrap();
    eventually_async("the World deleted with its MonarchMesh", || async {
        worlds
            .get_opt("trainer")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_monarch_meshes_name_the_field_and_foreign_worlds_are_left_alone() {
    let c = Cluster::start_serving_monarch_mesh().await;

    // Schema admission: replicas 0.
    let err = create(&c, monarch_body("zero", 0, 26600))
        .await
        .expect_err("replicas 0 is refused");
    assert!(err.to_string().contains("spec.replicas"), "{err}");

    // The agent's ports, and a name Monarch refuses: a status condition
    // (the embedded API server does not evaluate the CRD's CEL rules).
    for (name, port, field) in [
        ("healthport", 26601, "spec.port"),
        (
            "agentport",
            i64::from(hostmesh_crds::world::DEFAULT_PORT),
            "spec.port",
        ),
        ("my-mesh", 26600, "metadata.name"),
    ] {
        create(&c, monarch_body(name, 1, port)).await.unwrap();
        let (status, reason, message) =
            eventually_async("InvalidSpec", || async { ready_reason(&c, name).await }).await;
        assert_eq!((status.as_str(), reason.as_str()), ("False", "InvalidSpec"));
        assert!(message.starts_with(field), "{name}: {message}");
        assert!(
            c.api::<World>().get_opt(name).await.unwrap().is_none(),
            "{name}: no World for an invalid mesh"
        );
    }

    // A World of the same name that is not the mesh's.
    c.apply_yaml(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {name: taken, namespace: ctl}\n\
         spec:\n  hosts: 1\n  template: {spec: {containers: [{name: host, image: busybox}]}}\n",
    )
    .await;
    create(&c, monarch_body("taken", 2, 26600)).await.unwrap();
    let (_, reason, message) = eventually_async("WorldConflict", || async {
        ready_reason(&c, "taken").await
    })
    .await;
    assert_eq!(reason, "WorldConflict", "{message}");
    let w = c.api::<World>().get("taken").await.unwrap();
    assert_eq!(w.spec.hosts, Some(1), "the foreign World is untouched");
    assert!(w.spec.monarch.is_none());
    c.shutdown().await;
}
