//! `root_cause_correct_ratio`: the causal scenario of issue #15, `runs`
//! times, with real agents (two `hostmesh agent` processes on loopback; the
//! suite plays the kubelet for their pods) and the real controllers in
//! process. In each run a fresh ProcMesh of 8 ranks starts, rank 5 is
//! SIGKILLed, the others exit 1 about 50 ms after it is gone, and rank 5's
//! report is held back 500 ms on its way to the hub by
//! `hostmesh_operator::hub::holdback::HoldBack` around the real connector
//! (as in `cli/tests/causal_agents.rs`). A run is
//! correct when `firstFailure` is rank 5 and every other failed rank is
//! collateral with `causedBy` 5. Baseline: null (the target is 1.0).

use hostmesh_crds::Rank;
use std::sync::Arc;
use std::time::Duration;

use hostmesh_crds::ProcMesh;
use hostmesh_crds::procmesh::{ProcMeshStatus, ProcState};
use hostmesh_e2e::inproc::WorldAgents;
use hostmesh_operator::hub::default_connector;
use hostmesh_operator::hub::holdback::HoldBack;
use kube::api::{Api, DeleteParams};

use super::cluster::{BOUND, NS, Operator};
use crate::report::{emit, failure};

const ROOT: Rank = 5;
const HELD: Duration = Duration::from_millis(500);
/// How long after rank 5 is gone the others exit.
const CASCADE: Duration = Duration::from_millis(50);

/// Runs the scenario `runs` times and emits the ratio of correct runs.
pub(crate) async fn run(bin: &std::path::Path, runs: usize) -> anyhow::Result<()> {
    let op = Operator::start(Arc::new(HoldBack {
        inner: default_connector(),
        rank: ROOT,
        delay: HELD,
    }))
    .await;
    let outcome = scenario(&op, bin, runs).await;
    op.stop().await;
    let correct = outcome?;
    emit(
        "root_cause_correct_ratio",
        correct as f64 / runs.max(1) as f64,
        "ratio",
        None,
    );
    Ok(())
}

async fn scenario(op: &Operator, bin: &std::path::Path, runs: usize) -> anyhow::Result<usize> {
    op.apply(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {name: w, namespace: diag}\n\
         spec:\n  shape: [{name: host, size: 2}]\n  healthTimeout: 30s\n  template:\n    spec:\n      containers: [{name: host, image: busybox}]\n",
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let agents = WorldAgents {
        client: &op.client,
        namespace: NS,
        world: "w",
        hosts: 2,
        bin,
        quiet: true,
        bound: BOUND,
    }
    .start(dir.path())
    .await?;
    let mut correct = 0;
    for i in 0..runs {
        match one_run(op, dir.path(), i).await {
            Ok(true) => correct += 1,
            Ok(false) => {}
            Err(e) => failure("root_cause", i, &format!("{e:#}")),
        }
    }
    drop(agents);
    Ok(correct)
}

/// One run on a fresh ProcMesh `pm-<i>`; whether the root cause was right.
async fn one_run(op: &Operator, base: &std::path::Path, i: usize) -> anyhow::Result<bool> {
    let dir = base.join(format!("run-{i}"));
    std::fs::create_dir_all(&dir)?;
    let d = dir.display();
    let name = format!("pm-{i}");
    let script = format!(
        "if [ \"$RANK\" = {ROOT} ]; then echo $$ > {d}/root.pid; exec sleep 300; fi; \
         while [ ! -e {d}/go ]; do sleep 0.02; done; echo \"rank $RANK: connection reset by peer\" >&2; exit 1"
    );
    op.apply(&format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: {name}, namespace: diag}}\n\
         spec:\n  world: w\n  perHost: [{{name: gpu, size: 4}}]\n  command: [sh, -c, {script:?}]\n  restartPolicy: {{policy: Never}}\n"
    ))
    .await?;
    let meshes: Api<ProcMesh> = Api::namespaced(op.client.clone(), NS);
    op.until("8 procs running", || async {
        let s = meshes.get(&name).await.ok()?.status?;
        (s.running == 8).then_some(())
    })
    .await?;
    let pid_file = dir.join("root.pid");
    let pid: i32 = op
        .until("rank 5's pid", || async {
            std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
        })
        .await?;
    // SAFETY: kill(2) with a pid the run's own proc wrote; no memory involved.
    anyhow::ensure!(
        unsafe { libc::kill(pid, libc::SIGKILL) } == 0,
        "kill rank 5"
    );
    op.until("rank 5 gone", || async {
        hostmesh_testkit::process::gone(pid as u32).then_some(())
    })
    .await?;
    tokio::time::sleep(CASCADE).await;
    std::fs::write(dir.join("go"), b"")?;
    // Settled: rank 5's (held) report is in and no rank runs or stops.
    let s = op
        .until("the failures settled", || async {
            let s = meshes.get(&name).await.ok()?.status?;
            s.first_failure.as_ref()?;
            let settled = s.ranks.iter().all(|r| {
                !matches!(
                    r.value.state,
                    ProcState::Running
                        | ProcState::Starting
                        | ProcState::Stopping
                        | ProcState::Pending
                )
            });
            settled.then_some(s)
        })
        .await?;
    let right = judge(&s);
    if !right {
        failure(
            "root_cause",
            i,
            &format!(
                "firstFailure {:?}, failed {}, collateral {}",
                s.first_failure.as_ref().map(|f| f.rank),
                s.failed,
                s.collateral
            ),
        );
    }
    meshes.delete(&name, &DeleteParams::default()).await?;
    op.until("the ProcMesh gone", || async {
        meshes.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await?;
    Ok(right)
}

/// Rank 5 is the first failure and every other failed rank is its
/// collateral.
fn judge(s: &ProcMeshStatus) -> bool {
    let Some(ff) = s.first_failure.as_ref() else {
        return false;
    };
    ff.rank == ROOT
        && s.collateral + 1 == s.failed
        && (0..8).filter(|r| *r != ROOT).all(|rank| {
            hostmesh_crds::runs::get(&s.ranks, rank)
                .is_some_and(|r| r.state != ProcState::Failed || r.caused_by == Some(ROOT))
        })
}
