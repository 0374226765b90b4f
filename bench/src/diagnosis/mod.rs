//! Suite `diagnosis` (issue #15): how fast and how right the operator's
//! diagnosis is.
//!
//! - `stall_detection_s` ([`stall`]): a rank's last output to `Stalled=True`
//!   with real agents; baseline: the `stallTimeout`.
//! - `root_cause_correct_ratio` ([`causal`]): runs of the causal scenario
//!   (rank 5 SIGKILLed, the others exit 1 50 ms later, rank 5's report held
//!   back 500 ms) in which `firstFailure` is rank 5 and the rest are
//!   collateral; real agents.
//! - `incident_{replace_host,recreate_gang}_<phase>_s` ([`incidents`]): the
//!   phases of a recovery at 16 hosts; simulated agents.
//!
//! Needs the `hostmesh` binary beside the bench's (`cargo build --release
//! --bin hostmesh`).

mod causal;
mod cluster;
mod incidents;
mod stall;

use anyhow::Context as _;

/// The median of `v` (NaN when empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs the suite; `runs` is the number of causal-scenario runs.
pub(crate) fn run(runs: usize) -> anyhow::Result<()> {
    let hostmesh = std::env::current_exe()?.with_file_name("hostmesh");
    anyhow::ensure!(
        hostmesh.exists(),
        "{} is missing: build it with `cargo build --release --bin hostmesh`",
        hostmesh.display()
    );
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let suite = async {
            incidents::run().await.context("incident phases")?;
            causal::run(&hostmesh, runs).await.context("root cause")?;
            stall::run().await.context("stall detection")
        };
        // Ctrl-C or SIGTERM drops the suite's futures, and with them the
        // agent processes and clusters they started.
        tokio::select! {
            r = suite => r,
            () = hostmesh_operator::shutdown_signal() => Err(anyhow::anyhow!("interrupted")),
        }
    })
}
