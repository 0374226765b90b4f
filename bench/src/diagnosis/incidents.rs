//! `incident_<action>_<phase>_s`: the phases of a ProcMesh incident
//! (`status.incidents`) when a host of a 16-host World fails, for World
//! `failurePolicy` ReplaceHost and RecreateGang. The controllers are the
//! real ones in process on the embedded API server; the agents are
//! simulated (in memory, `hub::sim`, as the `operator` suite's), and the
//! suite plays the kubelet (a pod is made Ready within about 100 ms of
//! being created), so the figures are the operator's own share of a
//! recovery, not a container runtime's. The failure is host 3's pod
//! evicted (status `Failed`); the ProcMesh (one proc per host, `OnFailure`)
//! loses rank 3 (or, with RecreateGang, every rank). Phases: `detect`
//! (failure to report), `decide` (report to action), `pods` (action to
//! hosts Ready), `procs` (hosts Ready to procs running), `total`. The
//! World's `backoff` is 0 s. Baseline: null.

use hostmesh_crds::Rank;
use std::sync::Arc;
use std::time::Duration;

use hostmesh_crds::ProcMesh;
use hostmesh_crds::incident::Incident;
use hostmesh_operator::hub::sim::{SimConnector, connector};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, Patch, PatchParams};

use super::cluster::{NS, Operator};
use crate::report::emit;

const HOSTS: Rank = 16;

/// Runs the two recoveries, each on a cluster of its own.
pub(crate) async fn run() -> anyhow::Result<()> {
    for (action, bench) in [
        ("ReplaceHost", "incident_replace_host"),
        ("RecreateGang", "incident_recreate_gang"),
    ] {
        let sim = Arc::new(SimConnector::with_heartbeat(Duration::from_millis(200)));
        let op = Operator::start(connector(&sim)).await;
        let kubelet = op.play_kubelet();
        let outcome = recovery(&op, action).await;
        let _ = kubelet.send(());
        op.stop().await;
        let inc = outcome?;
        for (phase, secs) in phases(&inc) {
            emit(&format!("{bench}_{phase}_s"), secs, "s", None);
        }
    }
    Ok(())
}

fn secs(a: &MicroTime, b: &MicroTime) -> f64 {
    (b.0.as_millisecond() - a.0.as_millisecond()) as f64 / 1000.0
}

/// The phase durations of a closed incident.
fn phases(i: &Incident) -> Vec<(&'static str, f64)> {
    let mut out = vec![("detect", secs(&i.failed_at, &i.detected_at))];
    if let Some(d) = &i.decided_at {
        out.push(("decide", secs(&i.detected_at, d)));
        if let Some(p) = &i.pods_ready_at {
            out.push(("pods", secs(d, p)));
        }
    }
    if let (Some(p), Some(r)) = (&i.pods_ready_at, &i.procs_running_at) {
        out.push(("procs", secs(p, r)));
    }
    if let Some(r) = &i.procs_running_at {
        out.push(("total", secs(&i.failed_at, r)));
    }
    out
}

/// World `w` of [`HOSTS`] hosts with this failure action and ProcMesh
/// `pm` running; host 3 evicted; the incident once closed.
async fn recovery(op: &Operator, action: &str) -> anyhow::Result<Incident> {
    op.apply(&format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {{name: w, namespace: diag}}\n\
         spec:\n  shape: [{{name: host, size: {HOSTS}}}]\n  healthTimeout: 30s\n  failurePolicy: {{action: {action}, maxRestarts: 3, backoff: 0s}}\n  template:\n    spec:\n      containers: [{{name: host, image: busybox}}]\n"
    ))
    .await?;
    op.apply(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {name: pm, namespace: diag}\n\
         spec:\n  world: w\n  perHost: [{name: gpu, size: 1}]\n  command: [sleep, '600']\n  restartPolicy: {policy: OnFailure, maxRestarts: 3, backoff: 0s}\n",
    )
    .await?;
    let meshes: Api<ProcMesh> = Api::namespaced(op.client.clone(), NS);
    op.until("every proc running", || async {
        let s = meshes.get("pm").await.ok()?.status?;
        (s.running == HOSTS).then_some(())
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(op.client.clone(), NS);
    let evicted =
        serde_json::json!({"status": {"phase": "Failed", "reason": "Evicted", "conditions": []}});
    pods.patch_status("w-host-3", &PatchParams::default(), &Patch::Merge(&evicted))
        .await?;
    op.until("the incident closed with procs running", || async {
        let s = meshes.get("pm").await.ok()?.status?;
        let inc = s.incidents.last()?;
        (inc.procs_running_at.is_some() && s.running == HOSTS).then(|| inc.clone())
    })
    .await
}
