//! Causal root cause with real agents: the real World and ProcMesh
//! controllers against the embedded API server, two `hostmesh agent`
//! processes on loopback (the test plays the kubelet), and real procs.
//! Rank 5 is SIGKILLed, then the other ranks exit 1 in its wake (those the
//! operator has not stopped by then: `restartPolicy: Never` stops the rest
//! at the first failure report), and the root's report is held back 500 ms
//! on its way to the hub (a delaying connector around the real one): status
//! still names rank 5 as the first failure, with the others collateral.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hostmesh_crds::ProcMesh;
use hostmesh_crds::procmesh::ProcState;
use hostmesh_e2e::inproc::{Controllers, WorldAgents, operator_args};
use hostmesh_operator::hub::default_connector;
use hostmesh_operator::hub::holdback::HoldBack;
use hostmesh_testkit::{PATIENCE, eventually_async};
use kube::api::{Api, Patch, PatchParams};

const NS: &str = "causal";
const ROOT: hostmesh_crds::Rank = 5;
const HELD: Duration = Duration::from_millis(500);

async fn apply(client: &kube::Client, yaml: &str) {
    let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
    let name = v["metadata"]["name"].as_str().unwrap().to_string();
    let pp = PatchParams::apply("test").force();
    let ar = match v["kind"].as_str().unwrap() {
        "World" => kube::api::ApiResource::erase::<hostmesh_crds::World>(&()),
        _ => kube::api::ApiResource::erase::<ProcMesh>(&()),
    };
    Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), NS, &ar)
        .patch(&name, &pp, &Patch::Apply(&v))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_rank_is_the_root_and_the_ranks_that_followed_are_collateral() {
    let (server, client) = hostmesh_testkit::cluster::crd_server_with_namespace(NS).await;
    let controllers = Controllers::start(
        client.clone(),
        operator_args(NS, "test"),
        Arc::new(HoldBack {
            inner: default_connector(),
            rank: ROOT,
            delay: HELD,
        }),
    );

    // The World, its Secret, then the agents with that Secret and its pods
    // Ready at the agents' addresses.
    apply(
        &client,
        "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {name: w, namespace: causal}\n\
         spec:\n  shape: [{name: host, size: 2}]\n  healthTimeout: 30s\n  template:\n    spec:\n      containers: [{name: host, image: busybox}]\n",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let agents = WorldAgents {
        client: &client,
        namespace: NS,
        world: "w",
        hosts: 2,
        bin: Path::new(env!("CARGO_BIN_EXE_hostmesh")),
        quiet: false,
        bound: PATIENCE,
    }
    .start(dir.path())
    .await
    .expect("the World's agents start and their pods are Ready");

    // Rank 5 prints its exception first, then noise that pushes it out of
    // the tail; the others wait for `go` and then exit 1.
    let d = dir.path().display();
    let script = format!(
        "if [ \"$RANK\" = {ROOT} ]; then echo 'Traceback: the real root cause' >&2; \
         for i in $(seq 1 40); do echo \"noise $i\" >&2; done; echo $$ > {d}/root.pid; exec sleep 300; fi; \
         while [ ! -e {d}/go ]; do sleep 0.02; done; echo \"rank $RANK: connection reset by peer\" >&2; exit 1"
    );
    apply(
        &client,
        &format!(
            "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: pm, namespace: causal}}\n\
             spec:\n  world: w\n  perHost: [{{name: gpu, size: 4}}]\n  command: [sh, -c, {script:?}]\n  restartPolicy: {{policy: Never}}\n"
        ),
    )
    .await;
    let meshes: Api<ProcMesh> = Api::namespaced(client.clone(), NS);
    eventually_async("8 procs running", async || {
        let s = meshes.get("pm").await.ok()?.status?;
        (s.running == 8).then_some(())
    })
    .await;
    let pid_file = dir.path().join("root.pid");
    let pid: i32 = eventually_async("rank 5's pid", async || {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    })
    .await;

    // SIGKILL rank 5; once it is gone, the others fail in its wake.
    // SAFETY: kill(2) with a pid this test's proc wrote; no memory involved.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    eventually_async("rank 5 gone", async || {
        hostmesh_testkit::process::gone(pid as u32).then_some(())
    })
    .await;
    std::fs::write(dir.path().join("go"), b"").unwrap();

    let s = eventually_async(
        "rank 5 named as the root, the rest collateral",
        async || {
            let s = meshes.get("pm").await.ok()?.status?;
            let ff = s.first_failure.as_ref()?;
            let settled = s.ranks.iter().all(|r| r.value.state != ProcState::Stopping);
            (ff.rank == ROOT && s.failed >= 2 && s.collateral == s.failed - 1 && settled)
                .then_some(s)
        },
    )
    .await;
    let ff = s.first_failure.as_ref().unwrap();
    assert_eq!((ff.host, ff.signal), (1, Some(9)), "{ff:?}");
    assert!(
        ff.stderr_head
            .as_deref()
            .unwrap_or_default()
            .contains("Traceback: the real root cause"),
        "the head keeps the exception the tail lost: {ff:?}"
    );
    assert!(
        ff.stderr_tail
            .as_deref()
            .unwrap_or_default()
            .contains("noise 40"),
        "{ff:?}"
    );
    // Every rank that exited 1 is collateral of rank 5; the rest were
    // stopped by the operator (not failures).
    for rank in (0..8).filter(|r| *r != ROOT) {
        let r = hostmesh_crds::runs::get(&s.ranks, rank).unwrap();
        match r.state {
            ProcState::Failed => {
                assert_eq!(
                    (r.caused_by, r.exit_code),
                    (Some(ROOT), Some(1)),
                    "rank {rank}: {r:?}"
                );
            }
            ProcState::Stopped => assert_eq!(r.caused_by, None),
            other => panic!("rank {rank} is {other:?}: {r:?}"),
        }
    }
    assert_eq!(
        hostmesh_crds::runs::get(&s.ranks, ROOT).unwrap().caused_by,
        None
    );
    let incident = s.incidents.last().expect("an incident");
    assert_eq!(
        (incident.rank, incident.collateral),
        (ROOT, s.collateral),
        "{incident:?}"
    );
    assert_eq!(incident.failed_at.0, ff.time.0);
    assert!(
        incident.detected_at.0 >= incident.failed_at.0,
        "{incident:?}"
    );
    assert_eq!(
        incident.action,
        Some(hostmesh_crds::incident::IncidentAction::GaveUp)
    );

    // The collateral reports came first (the root's was held back), and
    // the root replaced the first-reported failure.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), NS);
    eventually_async(
        "an Event naming rank 5 as the root reported later",
        async || {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    let m = e.message.as_deref().unwrap_or_default();
                    m.starts_with("rank 5 ") && m.contains("its report came later")
                })
                .then_some(())
        },
    )
    .await;

    controllers.stop().await;
    drop(agents);
    server.shutdown().await;
}
