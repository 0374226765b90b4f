//! Suite `chaos`: faults injected into running Worlds on the embedded
//! cluster (issue 17), through the e2e harness (`hostmesh-e2e`: separate
//! `hostmesh` API server, kubelet, controller-manager and operator
//! processes; `HOSTMESH_BIN` overrides which binary).
//!
//! Every run of every scenario starts a fresh cluster with World `w` (2
//! hosts) and ProcMesh `pm` (2 procs per host), injects one fault and
//! checks the final state and the status trail. Per scenario it prints
//! (JSON lines, [`crate::report`]):
//! - `<scenario>_failures`: runs whose final state or status was wrong (or
//!   that could not be set up), with `baseline` the number of runs; each
//!   failure's reason goes to stderr;
//! - `<scenario>_detect_s_p50` / `_p99`: fault to the status showing it;
//! - `<scenario>_recover_s_p50` / `_p99`: fault to Ready again, where the
//!   scenario has a recovery;
//! - scenario extras (`unauth_flood_peak_rss_mib`, `up_kill_files_left`, ...).
//!
//! Invariants: runs are sequential and each is bounded by [`RUN_BOUND`]; a
//! run's processes go with its cluster when the run ends (the harness's
//! `Env` drop), and a frozen agent is thawed first.

mod blips;
mod churn;
mod faults;
mod fixture;
mod flood;
mod restart;
mod up;

use std::time::Duration;

use faults::{HostFault, OperatorFault};

use crate::report::{emit, failure};

/// The longest one run may take, setup and teardown included.
pub const RUN_BOUND: Duration = Duration::from_secs(300);

/// A chaos scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// SIGKILL a proc under `OnFailure`.
    ProcKill,
    /// SIGKILL an agent.
    AgentKill,
    /// SIGSTOP an agent past `evictionTimeout`.
    AgentStop,
    /// Delete a host pod.
    PodDelete,
    /// kill -9 the operator mid-spawn.
    OperatorKillSpawn,
    /// kill -9 the operator past `spawnTimeout` after the spawn.
    OperatorKillLate,
    /// Delete the agent Secret, then restart the operator.
    SecretDelete,
    /// 20,000 unauthenticated connections against one agent.
    UnauthFlood,
    /// kill -9 `hostmesh up`.
    UpKill,
    /// Stop the API server (SIGTERM or SIGKILL, 5 s or 20 s) under a
    /// running World and start it again on the same data.
    ApiRestart,
    /// Workers create and delete Worlds with ProcMeshes; nothing is left,
    /// and the API server gives its memory back.
    Churn,
    /// Cut one host's pod off the network for 6 s (`healthTimeout` 2 s,
    /// `evictionTimeout` 30 s): nothing restarted, counted or replaced.
    PartitionShort,
    /// SIGSTOP the operator for 10 s (`healthTimeout` 2 s): it blames no
    /// agent for its own pause.
    OperatorFreeze,
    /// Cut one host's pod off the network and freeze its node's kubelet:
    /// the pod is force-deleted once its agent must have fenced, and the
    /// rank runs again on a new pod, counted once.
    PartitionNodeHung,
}

impl Scenario {
    /// Every scenario, in the order the suite runs them.
    pub const ALL: [Scenario; 14] = [
        Scenario::ProcKill,
        Scenario::AgentKill,
        Scenario::AgentStop,
        Scenario::PodDelete,
        Scenario::OperatorKillSpawn,
        Scenario::OperatorKillLate,
        Scenario::SecretDelete,
        Scenario::UnauthFlood,
        Scenario::UpKill,
        Scenario::ApiRestart,
        Scenario::Churn,
        Scenario::PartitionShort,
        Scenario::OperatorFreeze,
        Scenario::PartitionNodeHung,
    ];

    /// The scenario's name, the prefix of its result lines.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::ProcKill => "proc_kill",
            Scenario::AgentKill => "agent_kill",
            Scenario::AgentStop => "agent_stop",
            Scenario::PodDelete => "pod_delete",
            Scenario::OperatorKillSpawn => "operator_kill_spawn",
            Scenario::OperatorKillLate => "operator_kill_late",
            Scenario::SecretDelete => "secret_delete",
            Scenario::UnauthFlood => "unauth_flood",
            Scenario::UpKill => "up_kill",
            Scenario::ApiRestart => "api_restart",
            Scenario::Churn => "churn",
            Scenario::PartitionShort => "partition_short",
            Scenario::OperatorFreeze => "operator_freeze",
            Scenario::PartitionNodeHung => "partition_node_hung",
        }
    }

    /// Parses a scenario name, naming the choices when it is unknown.
    pub fn parse(name: &str) -> anyhow::Result<Scenario> {
        Scenario::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| {
                let all: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
                anyhow::anyhow!(
                    "--scenarios: unknown scenario {name:?}; choose from {}",
                    all.join(", ")
                )
            })
    }
}

/// What one passing run measured (seconds from the fault).
#[derive(Clone, Debug, Default)]
pub struct Timing {
    /// Fault to the status showing it.
    pub detect: Option<f64>,
    /// Fault to Ready again.
    pub recover: Option<f64>,
    /// Scenario figures reported as their maximum over the runs: (name
    /// suffix, value, unit).
    pub extra: Vec<(&'static str, f64, &'static str)>,
    /// Scenario timings reported as p50 and p99 over the runs: (name
    /// suffix, seconds, unit).
    pub figures: Vec<(&'static str, f64, &'static str)>,
    /// Why the run failed although it measured (its figures still count).
    pub failure: Option<String>,
}

impl Timing {
    fn measured(detect: f64, recover: f64) -> Timing {
        Timing {
            detect: Some(detect),
            recover: Some(recover),
            ..Timing::default()
        }
    }
}

/// The runs of one scenario.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Which scenario.
    pub scenario: Scenario,
    /// How many runs.
    pub runs: usize,
    /// Why each failed run failed, with its run number.
    pub failures: Vec<(usize, String)>,
    /// What the runs that got as far as measuring measured.
    pub timings: Vec<Timing>,
}

/// Runs `scenario` `runs` times, one after the other; a failure's reason is
/// printed to stderr as it happens.
pub async fn run_scenario(scenario: Scenario, runs: usize) -> Outcome {
    let mut out = Outcome {
        scenario,
        runs,
        failures: Vec::new(),
        timings: Vec::new(),
    };
    for run in 0..runs {
        let name = format!("chaos-{}-{run}", scenario.name());
        let result = tokio::time::timeout(RUN_BOUND, run_once(scenario, &name, run)).await;
        match result {
            Ok(Ok(t)) => {
                if let Some(reason) = &t.failure {
                    failure(scenario.name(), run, reason);
                    out.failures.push((run, reason.clone()));
                } else {
                    forget_logs(&name);
                    // A series cut short still leaves its runs on record.
                    crate::report::progress(&format!(
                        "{} run {run} ok: detect {:?} s, recover {:?} s, {:?}",
                        scenario.name(),
                        t.detect,
                        t.recover,
                        t.figures
                    ));
                }
                out.timings.push(t);
            }
            Ok(Err(e)) => {
                let reason = format!("{e:#}");
                failure(scenario.name(), run, &reason);
                out.failures.push((run, reason));
            }
            Err(_) => {
                let reason = format!("not finished in {RUN_BOUND:?}");
                failure(scenario.name(), run, &reason);
                out.failures.push((run, reason));
            }
        }
    }
    out
}

/// Removes a passing run's logs that the Env kept
/// ([`hostmesh_e2e::KEEP_LOGS_ENV`]): only failed runs' stay.
fn forget_logs(run: &str) {
    if let Some(root) = std::env::var_os(hostmesh_e2e::KEEP_LOGS_ENV) {
        let dir = std::path::PathBuf::from(root).join(hostmesh_e2e::namespace_for(run));
        let _ = std::fs::remove_dir_all(dir);
    }
}

async fn run_once(scenario: Scenario, name: &str, index: usize) -> anyhow::Result<Timing> {
    match scenario {
        Scenario::ProcKill => faults::proc_kill(name).await,
        Scenario::AgentKill => faults::host_lost(name, HostFault::Kill).await,
        Scenario::AgentStop => faults::host_lost(name, HostFault::Stop).await,
        Scenario::PodDelete => faults::host_lost(name, HostFault::DeletePod).await,
        Scenario::OperatorKillSpawn => faults::operator_kill(name, OperatorFault::MidSpawn).await,
        Scenario::OperatorKillLate => faults::operator_kill(name, OperatorFault::Late).await,
        Scenario::SecretDelete => faults::secret_delete(name).await,
        Scenario::UnauthFlood => flood::unauth_flood(name).await,
        Scenario::UpKill => up::up_kill(name).await,
        Scenario::ApiRestart => restart::api_restart(name, index).await,
        Scenario::Churn => churn::churn(name).await,
        Scenario::PartitionShort => blips::partition_short(name).await,
        Scenario::OperatorFreeze => blips::operator_freeze(name).await,
        Scenario::PartitionNodeHung => blips::partition_node_hung(name).await,
    }
}

/// Prints an outcome's result lines.
pub fn emit_outcome(o: &Outcome) {
    let name = o.scenario.name();
    emit(
        &format!("{name}_failures"),
        o.failures.len() as f64,
        "runs",
        Some(o.runs as f64),
    );
    let series =
        |f: fn(&Timing) -> Option<f64>| -> Vec<f64> { o.timings.iter().filter_map(f).collect() };
    for (what, values) in [
        ("detect", series(|t| t.detect)),
        ("recover", series(|t| t.recover)),
    ] {
        if let (Some(p50), Some(p99)) = (percentile(&values, 50), percentile(&values, 99)) {
            emit(&format!("{name}_{what}_s_p50"), p50, "s", None);
            emit(&format!("{name}_{what}_s_p99"), p99, "s", None);
        }
    }
    // Figures: p50 and p99 of each, named by their suffix (`_s` included).
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for t in &o.timings {
        for &(k, _, unit) in &t.figures {
            if !keys.iter().any(|(e, _)| *e == k) {
                keys.push((k, unit));
            }
        }
    }
    for (k, unit) in keys {
        let values: Vec<f64> = o
            .timings
            .iter()
            .flat_map(|t| t.figures.iter().filter(|f| f.0 == k).map(|f| f.1))
            .collect();
        if let (Some(p50), Some(p99)) = (percentile(&values, 50), percentile(&values, 99)) {
            emit(&format!("{name}_{k}_p50"), p50, unit, None);
            emit(&format!("{name}_{k}_p99"), p99, unit, None);
        }
    }
    // Extras: the worst (largest) value over the runs.
    let mut extras: Vec<(&str, f64, &str)> = Vec::new();
    for t in &o.timings {
        for &(k, v, unit) in &t.extra {
            match extras.iter_mut().find(|(e, _, _)| *e == k) {
                Some(e) => e.1 = e.1.max(v),
                None => extras.push((k, v, unit)),
            }
        }
    }
    for (k, v, unit) in extras {
        emit(&format!("{name}_{k}_max"), v, unit, None);
    }
}

/// The nearest-rank `p`th percentile (`None` for no values).
pub fn percentile(values: &[f64], p: usize) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = (p * v.len()).div_ceil(100).max(1);
    v.get(rank - 1).copied()
}

/// The suite's entry point: `scenarios` (all when empty) `runs` times each.
pub fn run(runs: usize, scenarios: &[Scenario]) -> anyhow::Result<()> {
    anyhow::ensure!(runs >= 1, "--runs: {runs} runs; give at least 1");
    let scenarios: &[Scenario] = if scenarios.is_empty() {
        &Scenario::ALL
    } else {
        scenarios
    };
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        for &s in scenarios {
            let outcome = tokio::select! {
                o = run_scenario(s, runs) => o,
                () = hostmesh_operator::shutdown_signal() => anyhow::bail!("interrupted"),
            };
            emit_outcome(&outcome);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        assert_eq!(percentile(&[], 50), None);
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50), Some(2.0));
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 99), Some(3.0));
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&hundred, 99), Some(99.0));
        assert_eq!(percentile(&hundred, 50), Some(50.0));
    }

    #[test]
    fn scenario_names_round_trip_and_unknown_ones_name_the_choices() {
        for s in Scenario::ALL {
            assert_eq!(Scenario::parse(s.name()).unwrap(), s);
        }
        let e = Scenario::parse("nope").unwrap_err().to_string();
        assert!(e.contains("--scenarios") && e.contains("proc_kill"), "{e}");
    }
}
