//! Stalls through the real ProcMesh controller with simulated agents
//! (controllers::procmesh::stall invariants 1-3): under `Gang` a stalled
//! rank restarts every rank, the stall is the first failure, and the
//! stacks ConfigMap is written, owned by the ProcMesh, with a line for
//! every rank even when an agent cannot capture stacks.

use hostmesh_crds::ProcMesh;
use hostmesh_crds::World;
use hostmesh_operator::hub::protocol::{ProcPhase, Stall};
use hostmesh_operator::hub::sim::SimRequest;
use hostmesh_operator::hub::{HostKey, HostReport, WorldKey};
use hostmesh_testkit::eventually_async;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::ListParams;

mod support;

use support::{Cluster, NS, running_world};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_under_gang_restarts_every_rank_and_keeps_a_stacks_configmap() {
    let c = Cluster::start().await;
    running_world(&c).await;
    c.apply_yaml(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {name: pm, namespace: ctl}\n\
         spec: {world: w, perHost: [{name: gpu, size: 2}], command: [sleep, '300'], stallTimeout: 2s, \
         restartPolicy: {policy: Gang, maxRestarts: 2}}\n",
    )
    .await;
    let meshes = c.api::<ProcMesh>();
    let pm = eventually_async("ProcMesh Running", || async {
        let pm = meshes.get("pm").await.ok()?;
        let s = pm.status.as_ref()?;
        let stalled = s.conditions.iter().find(|c| c.type_ == "Stalled")?;
        (s.running == 4 && stalled.status == "False").then_some(pm)
    })
    .await;
    let world = c.api::<World>().get("w").await.unwrap();
    let id = hostmesh_operator::controllers::procmesh::desired::mesh_id(&pm, &world);
    let host1 = HostKey {
        world: WorldKey {
            namespace: NS.into(),
            name: "w".into(),
        },
        rank: 1,
    };
    // Host 1's agent reports rank 3 stalled (still Ready).
    let Some(HostReport::ProcState {
        host,
        pod_uid,
        mut state,
    }) = c.sim.set_status(
        &host1,
        &format!("{id}.3"),
        ProcPhase::Ready { pid: 1, addr: None },
    )
    else {
        panic!("rank 3 runs on host 1");
    };
    state.stall = Some(Stall {
        last_progress_ms: 1_000,
        after_ms: 2_000,
        cpu_ms: Some(0),
    });
    c.ctx
        .hub
        .push_sender()
        .send(HostReport::ProcState {
            host,
            pod_uid,
            state,
        })
        .await
        .unwrap();

    let s = eventually_async("a gang restart for the stall", || async {
        let s = meshes.get("pm").await.ok()?.status?;
        (s.restarts == 1).then_some(s)
    })
    .await;
    let ff = s.first_failure.expect("the stall is the first failure");
    assert_eq!(ff.rank, 3);
    assert_eq!(ff.state, hostmesh_crds::procmesh::ProcState::Stalled);
    assert!(
        ff.reason.starts_with("rank 3 Stalled: no progress for 2s"),
        "{}",
        ff.reason
    );
    // Every rank was stopped for the gang restart, not only the stalled one.
    let stops = |rank: hostmesh_crds::Rank| {
        let host = HostKey {
            rank: rank / 2,
            ..host1.clone()
        };
        c.sim
            .requests_of(&host)
            .into_iter()
            .filter(|r| *r == SimRequest::Stop(format!("{id}.{rank}")))
            .count()
    };
    eventually_async("every rank stopped", || async {
        (0..4).all(|r| stops(r) >= 1).then_some(())
    })
    .await;

    // The stacks ConfigMap: owned by the ProcMesh, a line for every rank
    // (these simulated agents cannot capture stacks, which it says).
    let cm = eventually_async("the stacks ConfigMap", || async {
        c.api::<ConfigMap>().get_opt("pm-stacks").await.ok()?
    })
    .await;
    let owner = &cm.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("ProcMesh", "pm")
    );
    let data = cm.data.unwrap();
    for r in 0..4 {
        let text = &data[&format!("rank-{r}")];
        assert!(text.contains("cannot capture stacks"), "rank {r}: {text}");
    }
    assert!(
        data["summary"].contains("stall of ranks 3"),
        "{}",
        data["summary"]
    );
    // The Event is published after the ConfigMap is written: wait for it.
    eventually_async("a Stalled Event", || async {
        let events = c.api::<Event>().list(&ListParams::default()).await.ok()?;
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Stalled"))
            .then_some(())
    })
    .await;
    c.shutdown().await;
}
