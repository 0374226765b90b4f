//! Root cause across an operator restart, with the real controllers against
//! the embedded API server and simulated agents: a proc that died while no
//! operator ran is recorded with the time its agent saw it die, not the
//! time the new operator noticed, and the incident timeline starts there.

use std::time::Duration;

use hostmesh_crds::{ProcMesh, World};
use hostmesh_operator::hub::protocol::ProcPhase;
use hostmesh_operator::hub::sim::SimConnector;
use hostmesh_operator::hub::{HostKey, WorldKey};
use hostmesh_testkit::eventually_async;
use k8s_openapi::jiff::Timestamp;

mod support;

use support::{Cluster, NS, running_world};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_failure_time_survives_an_operator_restart_as_the_agents_time() {
    let mut c = Cluster::start_with(SimConnector::with_heartbeat(Duration::from_millis(200))).await;
    running_world(&c).await;
    c.apply_yaml(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {name: pm, namespace: ctl}\n\
         spec: {world: w, perHost: [{name: gpu, size: 2}], command: [sleep, '300']}\n",
    )
    .await;
    let meshes = c.api::<ProcMesh>();
    eventually_async("ProcMesh Running", || async {
        let s = meshes.get("pm").await.ok()?.status?;
        (s.running == 4).then_some(())
    })
    .await;
    let pm = meshes.get("pm").await.unwrap();
    let world = c.api::<World>().get("w").await.unwrap();
    let id = hostmesh_operator::controllers::procmesh::desired::mesh_id(&pm, &world);
    let host1 = HostKey {
        world: WorldKey {
            namespace: NS.into(),
            name: "w".into(),
        },
        rank: 1,
    };
    // Rank 2 died a minute ago, on its agent's clock, and nobody heard: the
    // push is dropped (the operator was down).
    let died = Timestamp::now().as_millisecond() - 60_000;
    c.sim
        .set_status_at(
            &host1,
            &format!("{id}.2"),
            ProcPhase::Killed {
                signal: 9,
                core_dumped: false,
                stderr_tail: vec!["killed".into()],
            },
            died as u64,
        )
        .expect("rank 2 runs on host 1");
    c.restart_operator().await;
    let s = eventually_async("the new operator records the failure", || async {
        let s = meshes.get("pm").await.ok()?.status?;
        s.first_failure.is_some().then_some(s)
    })
    .await;
    let ff = s.first_failure.unwrap();
    assert_eq!((ff.rank, ff.signal), (2, Some(9)));
    let off = ff.time.0.as_millisecond() - died;
    // The simulated agents share the hub's clock: the estimate is off by
    // the in-memory delay only, far less than the minute since.
    assert!(
        (0..1_000).contains(&off),
        "firstFailure.time is {off} ms after the death"
    );
    let incident = s.incidents.last().expect("an incident");
    assert_eq!(incident.rank, 2);
    assert_eq!(incident.failed_at.0, ff.time.0);
    assert!(
        incident.detected_at.0.as_millisecond() - died >= 59_000,
        "detected when the new operator heard: {incident:?}"
    );
    // restartPolicy Never gave up: detection and decision are observed
    // once, in the operator's metrics.
    for phase in ["detect", "decide"] {
        let line = format!("hostmesh_recovery_seconds_count{{phase=\"{phase}\"}} 1\n");
        eventually_async(&format!("{phase} observed once"), async || {
            c.ctx.metrics.encode().contains(&line).then_some(())
        })
        .await;
    }
    c.shutdown().await;
}
