//! Suite `scale`: a World of `--hosts` hosts and a ProcMesh of
//! `--procs-per-host` procs on each, with every component a separate
//! process as on a cluster ([`cluster`]): `hostmesh apiserver`,
//! `hostmesh controller-manager`, `--nodes` process kubelets with host
//! networking, one `hostmesh operator`, real agents and real procs.
//! With `--simulate`, the kubelets and agents are simulated ([`sim`],
//! [`sim_agent`]: the real agent protocol over TCP, one loopback address
//! per host), in this process and, beyond 4,000 hosts, in child processes
//! ([`shards`]), so the operator's and the API server's own cost can be
//! measured at 10,000 hosts; its figures are named `scale_sim_*`. A World
//! of more than 2,000 hosts is sized as docs/operations.md says (a slower
//! `spec.agent.heartbeatInterval`).
//!
//! Figures (JSON lines, DESIGN.md "Benchmarks"):
//! - `scale_world_ready_s`: apply to the World's Ready condition. Baseline:
//!   the same host pods created bare (no operator) until all are Ready, in
//!   the same run, after the World is gone.
//! - `scale_procmesh_ready_s`: apply to Ready, on the Ready World.
//! - `scale_proc_kill_to_status_s`: the p99 over `KILLS` proc SIGKILLs
//!   (each on another host, each after the ProcMesh recovered) of the time
//!   until the kill shows in `status.incidents`; the p50 as
//!   `scale_proc_kill_to_status_p50_s`.
//! - `scale_agent_kill_not_ready_s`, `scale_agent_kill_recovered_s`: an
//!   agent SIGKILLed until the World is not Ready, and until it is Ready
//!   again with every host ready and the victim's host replaced (a new
//!   pod).
//! - `scale_agents_fenced`: agents the operator saw fenced while it ran
//!   (must be 0).
//! - `scale_operator_rss_bytes`, `scale_operator_rss_per_host_bytes`
//!   (baseline the target, 64 KiB); `scale_apiserver_rss_bytes`,
//!   `scale_apiserver_rss_per_host_bytes` (baseline 256 KiB);
//!   `scale_kubelet_rss_bytes` (all kubelets), `scale_kubelet_rss_per_pod_bytes`
//!   (baseline 1 MiB). Taken once the ProcMesh has run in steady state for
//!   [`STEADY`]. Per host is the growth beyond the idle figures, taken
//!   earlier in the run with a World of one host and its ProcMesh running,
//!   divided by the hosts beyond that one: what each further host costs,
//!   not the code and connections a first World pages in (the RSS before
//!   any World is printed too: a cold operator is about 4 MB smaller).
//! - `scale_operator_api_requests`: requests per second the operator sends
//!   to the API server over [`STEADY`] of steady state;
//!   `scale_operator_cpu_cores` the CPU it used meanwhile (user + system
//!   seconds per second).
//! - `scale_status_bytes_max`: the largest `status` (World or ProcMesh),
//!   JSON bytes.
//! - `scale_sim_book_entries_per_agent_per_host` (simulated only): address
//!   book entries the agents received while the World came up, per agent
//!   and per host of the World: about 1 when each change costs one entry
//!   per agent; whole books to every agent on every change cost about a
//!   third of the hosts or more.

mod cluster;
mod flow;
mod shards;
mod sim;
mod sim_agent;

use std::path::PathBuf;
use std::time::Duration;

/// The suite's arguments.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ScaleArgs {
    /// Hosts of the World.
    #[arg(long, default_value_t = 256)]
    pub(crate) hosts: usize,
    /// Procs of the ProcMesh on each host.
    #[arg(long, default_value_t = 4)]
    pub(crate) procs_per_host: usize,
    /// Process kubelets (default: one per 100 hosts).
    #[arg(long)]
    pub(crate) nodes: Option<usize>,
    /// Simulated kubelets and agents (the real agent protocol over TCP)
    /// instead of real ones.
    #[arg(long)]
    pub(crate) simulate: bool,
    /// Processes the simulated kubelets and agents run in (default: one
    /// per 4,000 hosts; each holds two file descriptors per agent).
    #[arg(long)]
    pub(crate) shards: Option<usize>,
    /// Longest wait for the World (and later the ProcMesh) to be Ready.
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub(crate) ready_timeout: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    hostmesh_agent::parse_duration("--ready-timeout", s).map_err(|e| e.to_string())
}

/// Proc kills measured.
pub(crate) const KILLS: usize = 5;
/// Steady state before memory and request rates are taken.
pub(crate) const STEADY: Duration = Duration::from_secs(10);

/// Runs the suite.
pub(crate) fn run(args: &ScaleArgs) -> anyhow::Result<()> {
    if let Ok(spec) = std::env::var(shards::SHARD_ENV) {
        return shards::serve(&spec);
    }
    anyhow::ensure!(args.hosts >= 2, "--hosts must be at least 2");
    anyhow::ensure!(
        args.procs_per_host >= 1,
        "--procs-per-host must be at least 1"
    );
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let bin = std::env::current_exe()?.with_file_name("hostmesh");
        anyhow::ensure!(
            bin.exists(),
            "{} is missing: build it with `cargo build --release --bin hostmesh`",
            bin.display()
        );
        let dir: PathBuf =
            std::env::temp_dir().join(format!("hostmesh-scale-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        crate::report::progress(&format!("scale: working in {}", dir.display()));
        let outcome = tokio::select! {
            r = flow::run(args, bin, dir.clone()) => r,
            () = hostmesh_operator::shutdown_signal() => Err(anyhow::anyhow!("interrupted")),
        };
        if outcome.is_ok() {
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            crate::report::progress(&format!("scale: logs kept in {}", dir.display()));
        }
        outcome
    })
}

/// The Secrets a pod takes data from: its secret volumes and its
/// containers' `secretKeyRef` variables (a host pod's World secret comes
/// as `HOSTMESH_SECRET`), each name once, in order.
pub(crate) fn referenced_secrets(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let volumes = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.secret.as_ref()?.secret_name.clone());
    let vars = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.env.iter().flatten())
        .filter_map(|e| Some(e.value_from.as_ref()?.secret_key_ref.as_ref()?.name.clone()));
    let mut out: Vec<String> = Vec::new();
    for n in volumes.chain(vars) {
        if !out.contains(&n) {
            out.push(n);
        }
    }
    out
}

/// The Secrets `pods` take data from ([`referenced_secrets`]), read from
/// namespace `ns` as fresh objects (no owner, no server fields): what the
/// same pods need again when a benchmark creates them bare.
pub(crate) async fn fresh_secrets(
    client: &kube::Client,
    ns: &str,
    pods: &[k8s_openapi::api::core::v1::Pod],
) -> anyhow::Result<Vec<k8s_openapi::api::core::v1::Secret>> {
    let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), ns);
    let names: std::collections::BTreeSet<String> =
        pods.iter().flat_map(referenced_secrets).collect();
    let mut out = Vec::new();
    for n in names {
        let s = api.get(&n).await?;
        let mut fresh = k8s_openapi::api::core::v1::Secret::default();
        fresh.metadata.name = Some(n);
        fresh.data = s.data;
        fresh.type_ = s.type_;
        out.push(fresh);
    }
    Ok(out)
}
