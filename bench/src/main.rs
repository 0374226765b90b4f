//! hostmesh benchmark suites. Run as
//! `cargo run --release -p hostmesh-bench -- <suite>` (`chaos` also takes
//! `--runs N` and `--scenarios a,b`; `diagnosis` takes `--runs N`, the
//! causal-scenario runs, default 20; `scale` takes `--hosts`,
//! `--procs-per-host`, `--nodes`, `--simulate`); each suite prints one JSON object per
//! line (`bench`, `value`, `unit`, `baseline`, `ratio`).

mod agent;
mod apiserver;
mod client;
mod diagnosis;
mod e2e;
mod image;
mod kubelet;
mod kueue;
mod monarch;
mod operator;
mod runtime;
mod scale;
mod streams;

use clap::Parser;
use hostmesh_bench::{chaos, report};

#[derive(Parser)]
#[command(name = "hostmesh-bench")]
struct Cli {
    /// Suite to run: runtime, client, agent, operator, apiserver, e2e, image, streams, kubelet, kueue, monarch, chaos, diagnosis, scale.
    suite: String,
    /// chaos: runs of each scenario (default 3); diagnosis: runs of the
    /// causal scenario (default 20).
    #[arg(long)]
    runs: Option<usize>,
    /// chaos: the scenarios to run (comma-separated; all by default).
    #[arg(long, value_delimiter = ',')]
    scenarios: Vec<String>,
    /// scale: the World's size, procs per host, kubelets, simulation.
    #[command(flatten)]
    scale: scale::ScaleArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Logs of the components a suite runs in process go to stderr (stdout
    // carries the JSON lines); `RUST_LOG` overrides the level.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    match cli.suite.as_str() {
        "agent" => agent::run(),
        "apiserver" => apiserver::run(),
        "operator" => operator::run(),
        "e2e" => e2e::run(),
        "image" => image::run(),
        "kueue" => kueue::run(),
        "monarch" => monarch::run(),
        "kubelet" => kubelet::run(),
        "runtime" => runtime::run(),
        "client" => client::run(),
        "streams" => streams::run(),
        "scale" => scale::run(&cli.scale),
        "diagnosis" => diagnosis::run(cli.runs.unwrap_or(20)),
        "chaos" => {
            let scenarios = cli
                .scenarios
                .iter()
                .map(|s| chaos::Scenario::parse(s))
                .collect::<anyhow::Result<Vec<_>>>()?;
            chaos::run(cli.runs.unwrap_or(3), &scenarios)
        }
        other => anyhow::bail!(
            "unknown suite {other:?}: choose one of runtime, client, agent, operator, apiserver, e2e, image, streams, kubelet, kueue, monarch, chaos, diagnosis, scale"
        ),
    }
}
