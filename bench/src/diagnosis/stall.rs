//! `stall_detection_s`: from a rank's last output to `Stalled=True` in
//! ProcMesh status, on the e2e cluster (separate API server, kubelet and
//! operator processes; real agents and procs). One World of one host; per
//! repetition a fresh ProcMesh of 2 ranks with `stallTimeout` [`TIMEOUT`]
//! and `onStall: Report`: rank 1 prints every 0.2 s, rank 0 notes the wall
//! clock, prints once and hangs. Status is polled every 50 ms. Baseline:
//! the `stallTimeout` itself (the ratio is how close detection gets to it).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::bail;
use hostmesh_e2e::{Env, condition_true, world_yaml};

use super::median;
use crate::report::emit;

/// The ProcMeshes' `stallTimeout`.
const TIMEOUT: Duration = Duration::from_secs(2);
/// Repetitions; the median is reported.
const REPS: usize = 3;
/// Longest wait for one condition.
const BOUND: Duration = Duration::from_secs(120);

pub(crate) async fn run() -> anyhow::Result<()> {
    let env = Env::start("bench-stall").await?;
    env.apply(&world_yaml("w", &[("host", 1)], "")).await?;
    env.wait_for("World", "w", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    let dir = tempfile::tempdir()?;
    let mut samples = Vec::new();
    for i in 0..REPS {
        samples.push(once(&env, dir.path(), i).await?);
    }
    emit(
        "stall_detection_s",
        median(samples),
        "s",
        Some(TIMEOUT.as_secs_f64()),
    );
    Ok(())
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One repetition on ProcMesh `stall-<i>`: seconds from rank 0's last
/// output to `Stalled=True`.
async fn once(env: &Env, dir: &std::path::Path, i: usize) -> anyhow::Result<f64> {
    let mark = dir.join(format!("last-{i}"));
    let name = format!("stall-{i}");
    // `date +%s.%N` before the line: the stall clock starts at the line, a
    // few ms after the mark.
    let cmd = format!(
        "if [ \"$RANK\" = 0 ]; then date +%s.%N > {m}.tmp; mv {m}.tmp {m}; echo last line; exec sleep 600; fi; while :; do echo tick; sleep 0.2; done",
        m = mark.display()
    );
    env.apply(&format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: {name}}}\nspec:\n  world: w\n  perHost: [{{name: gpu, size: 2}}]\n  command: [sh, -c, {cmd:?}]\n  stallTimeout: {}s\n  restartPolicy: {{policy: Never, onStall: Report}}\n",
        TIMEOUT.as_secs()
    ))
    .await?;
    let api = env.hostmesh_api("ProcMesh");
    let start = Instant::now();
    let stalled_at = loop {
        if start.elapsed() > BOUND {
            bail!("ProcMesh {name}: no Stalled=True in {BOUND:?}");
        }
        if let Some(o) = api.get_opt(&name).await?
            && condition_true(&o.data["status"], "Stalled")
        {
            break now_s();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let last: f64 = std::fs::read_to_string(&mark)?.trim().parse()?;
    env.delete("ProcMesh", &name).await?;
    let start = Instant::now();
    while api.get_opt(&name).await?.is_some() {
        if start.elapsed() > BOUND {
            bail!("ProcMesh {name} not gone in {BOUND:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(stalled_at - last)
}
