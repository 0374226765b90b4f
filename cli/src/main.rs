//! The `hostmesh` binary: one executable for the operator, the host agent,
//! the cluster in a box and the user-facing commands. Each subcommand's
//! arguments are owned by the crate that implements it (docs/architecture.md).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

/// `hostmesh --version`: the crate version and the git revision it was
/// built from (`unknown` without git; see build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("HOSTMESH_GIT_REVISION"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "hostmesh",
    version = VERSION,
    about = "Monarch-style host meshes on Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the host agent of one World host (docs/agent.md).
    Agent(Box<hostmesh_agent::AgentArgs>),
    /// Run the example runtime-aware proc (`Echo` actors), from a
    /// ProcMesh with `runtimeAware: true`.
    EchoProc,
    /// Put the agent binary at PATH: the agent-only build (`hostmesh-agent`)
    /// beside this executable, else this executable (the host pods' init
    /// container uses it).
    InstallAgent {
        /// Where to put the agent binary.
        #[arg(long)]
        to: PathBuf,
    },
    /// Run the World and ProcMesh controllers and the supervision hub.
    Operator(Box<hostmesh_operator::ops::OperatorCommand>),
    /// Run a World and ProcMesh manifest on an embedded cluster (API server,
    /// process kubelet and operator in this process) until Ctrl-C.
    Up(hostmesh_cli::up::UpArgs),
    /// Print the CRDs (World, ProcMesh) as multi-document YAML.
    Crds {
        /// Print Monarch's MonarchMesh CRD instead (what
        /// `hostmesh operator --serve-monarch-mesh` serves).
        #[arg(long)]
        monarch_mesh: bool,
    },
    /// Show a World or ProcMesh: phase, ready hosts, per-rank state, first
    /// failure, conditions (`hostmesh status world/NAME`).
    Status(hostmesh_cli::status::StatusArgs),
    /// Print the stacks of every rank a stall captured
    /// (`hostmesh stacks procmesh/NAME [--rank R]`).
    Stacks(hostmesh_cli::stacks::StacksArgs),
    /// Serve the embedded Kubernetes API server until Ctrl-C.
    Apiserver(hostmesh_devcluster::apiserver::ApiServerArgs),
    /// Run the process kubelet: a Node that runs its pods as local processes.
    Kubelet(hostmesh_devcluster::kubelet::KubeletArgs),
    /// Run the Deployment and ReplicaSet controllers (cluster in a box only).
    ControllerManager(hostmesh_devcluster::controllers::ControllerManagerArgs),
    /// `hostmesh up`'s clean-up after it is killed (started by `up`).
    #[command(name = "up-reaper", hide = true)]
    UpReaper {
        /// `up`'s data directory.
        data_dir: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if cli.command.long_running() {
        hostmesh_agent::malloc::tune();
    }
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line with the whole cause chain; no backtrace for users.
            #[allow(clippy::print_stderr)]
            {
                eprintln!("error: {e:#}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

impl Command {
    /// Whether this subcommand serves until it is stopped (its allocator is
    /// tuned: `hostmesh_agent::malloc`).
    fn long_running(&self) -> bool {
        matches!(
            self,
            Command::Agent(_)
                | Command::Operator(_)
                | Command::Up(_)
                | Command::Apiserver(_)
                | Command::Kubelet(_)
                | Command::ControllerManager(_)
        )
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::InstallAgent { to } => install_agent(&to),
        Command::Crds { monarch_mesh } => print_crds(monarch_mesh),
        Command::Up(args) => run_up(args),
        Command::UpReaper { data_dir } => Ok(hostmesh_cli::reaper::run(&data_dir)?),
        Command::Operator(cmd) => Ok(hostmesh_operator::ops::run_blocking(*cmd)?),
        Command::Agent(args) => Ok(hostmesh_agent::run_blocking(*args)?),
        Command::EchoProc => Ok(hostmesh_agent::echo::run_blocking()?),
        Command::Status(args) => Ok(hostmesh_cli::status::run_blocking(&args)?),
        Command::Stacks(args) => Ok(hostmesh_cli::stacks::run_blocking(&args)?),
        Command::Apiserver(args) => run_apiserver(args),
        Command::ControllerManager(args) => run_controller_manager(args),
        Command::Kubelet(args) => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                        format!("info,{}", hostmesh_devcluster::dns::QUIET_QUERY_LOGS).into()
                    }),
                )
                .with_writer(std::io::stderr)
                .try_init();
            let runtime =
                tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            runtime
                .block_on(hostmesh_devcluster::kubelet::run(args))
                .context("process kubelet failed")
        }
    }
}

/// `hostmesh controller-manager`: logs to stderr until SIGINT/SIGTERM.
fn run_controller_manager(
    args: hostmesh_devcluster::controllers::ControllerManagerArgs,
) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    rt.block_on(hostmesh_devcluster::controllers::run(args))
        .context("controller-manager failed")
}

/// `hostmesh up`: logs go to a file in the data directory so the terminal
/// shows only the live view. The data directory is private (0700); `up`
/// removes its state when it exits (keeping the log when it failed), and
/// its reaper does when `up` is killed (`hostmesh_cli::reaper`).
fn run_up(args: hostmesh_cli::up::UpArgs) -> anyhow::Result<()> {
    use hostmesh_cli::reaper;
    use std::os::unix::fs::OpenOptionsExt as _;
    hostmesh_devcluster::private_dir::ensure(&args.data_dir)?;
    let log_path = args.data_dir.join(reaper::LOG_FILE);
    let log = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&log_path)
        .with_context(|| format!("cannot create {}", log_path.display()))?;
    let me = std::env::current_exe().context("cannot find the running hostmesh executable")?;
    let mut guard = reaper::Reaper::start(&me, &args.data_dir)
        .context("cannot start the clean-up process of hostmesh up")?;
    let _ = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(log))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(format!(
                    "info,{}",
                    hostmesh_devcluster::dns::QUIET_QUERY_LOGS
                ))
            }),
        )
        .try_init();
    let data_dir = args.data_dir.clone();
    let outcome = tokio::runtime::Runtime::new()
        .context("cannot start the async runtime")
        .and_then(|rt| {
            let noted = hostmesh_cli::up::run_noting(args, |env| {
                if let Some(bridge) = env.pod_bridge() {
                    guard.note_bridge(&bridge);
                }
            });
            Ok(rt.block_on(noted)?)
        });
    // Everything stopped: the tokens, pod directories and kubeconfig go;
    // the log stays when there is a failure to read about.
    if let Err(e) = reaper::remove_state(&data_dir, outcome.is_err()) {
        tracing::warn!(error = %e, "cannot remove the state of hostmesh up");
    }
    guard.disarm();
    if outcome.is_err() {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("the log of this run: {}", log_path.display());
        }
    }
    outcome
}

/// Prints both CRDs (or the MonarchMesh CRD) to stdout.
fn print_crds(monarch_mesh: bool) -> anyhow::Result<()> {
    use std::io::Write as _;
    let yaml = if monarch_mesh {
        hostmesh_crds::monarchmesh::crd_yaml()?
    } else {
        hostmesh_crds::crd_yaml()?
    };
    std::io::stdout().lock().write_all(yaml.as_bytes())?;
    Ok(())
}

/// Serves the embedded API server until Ctrl-C or SIGTERM (what a
/// process manager or the kubelet sends, as to kube-apiserver), then shuts
/// it down gracefully (persisting state when a data directory is given).
fn run_apiserver(args: hostmesh_devcluster::apiserver::ApiServerArgs) -> anyhow::Result<()> {
    use hostmesh_devcluster::apiserver::ApiServer;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    rt.block_on(async move {
        let server = ApiServer::start(args.into()).await?;
        tracing::info!(
            url = server.url(),
            kubeconfig = %server.kubeconfig_path().map(|p| p.display().to_string()).unwrap_or_default(),
            "API server ready; export KUBECONFIG to use it"
        );
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("cannot wait for SIGTERM")?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("cannot wait for Ctrl-C")?,
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        }
        server.shutdown().await;
        Ok(())
    })
}

/// `install-agent --to PATH`: the agent-only build beside this executable
/// (else this executable) at PATH (`hostmesh_agent::install`).
fn install_agent(to: &std::path::Path) -> anyhow::Result<()> {
    let me = std::env::current_exe().context("cannot find the running hostmesh executable")?;
    Ok(hostmesh_agent::install::install(&me, to)?)
}
