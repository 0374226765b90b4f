//! `hostmesh-agent`: the agent-only build that goes into every host pod
//! (docs/architecture.md, "Host pods"): only `agent`, `install-agent` and
//! `echo-proc` (the example runtime-aware proc),
//! with the same arguments as the full `hostmesh` binary's, so the host
//! container's `/hostmesh/bin/hostmesh agent` runs either build. It links
//! the agent crate alone (no operator, API server or kubelet), which keeps
//! the copy in every host pod small.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "hostmesh-agent",
    version,
    about = "The hostmesh host agent (the agent-only build of hostmesh)"
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
    /// Put this binary at PATH (the host pods' init container).
    InstallAgent {
        /// Where to put the agent binary.
        #[arg(long)]
        to: PathBuf,
    },
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Agent(args) => Ok(hostmesh_agent::run_blocking(*args)?),
        Command::EchoProc => Ok(hostmesh_agent::echo::run_blocking()?),
        Command::InstallAgent { to } => {
            let me = std::env::current_exe()?;
            Ok(hostmesh_agent::install::install(&me, &to)?)
        }
    }
}

fn main() -> std::process::ExitCode {
    hostmesh_agent::malloc::tune();
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line with the cause chain, as `hostmesh` prints it.
            let mut msg = e.to_string();
            let mut source = e.source();
            while let Some(s) = source {
                msg.push_str(": ");
                msg.push_str(&s.to_string());
                source = s.source();
            }
            #[allow(clippy::print_stderr)]
            {
                eprintln!("error: {msg}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
