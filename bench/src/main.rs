//! hostmesh benchmark suites. Run as
//! `cargo run --release -p hostmesh-bench -- <suite>`; each suite prints one
//! JSON object per line (`bench`, `value`, `unit`, `baseline`, `ratio`).

mod agent;
mod apiserver;
mod e2e;
mod image;
mod kubelet;
mod operator;
mod report;
mod runtime;
mod streams;

use clap::Parser;

#[derive(Parser)]
#[command(name = "hostmesh-bench")]
struct Cli {
    /// Suite to run: runtime, agent, operator, apiserver, e2e, image, streams, kubelet.
    suite: String,
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
        "kubelet" => kubelet::run(),
        "runtime" => runtime::run(),
        "streams" => streams::run(),
        other => anyhow::bail!(
            "unknown suite {other:?}: choose one of runtime, agent, operator, apiserver, e2e, image, streams, kubelet"
        ),
    }
}
