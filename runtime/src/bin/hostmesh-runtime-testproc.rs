//! A test proc server in its own process: registers the test actor, listens,
//! prints `READY <proc id>`, and exits when stdin closes.
//!
//! Usage: `hostmesh-runtime-testproc --name N --listen tcp:127.0.0.1:0
//! [--secret S] [--max-frame BYTES] [--actors N] [--refuse LABEL]`

use std::io::Read as _;
use std::io::Write as _;

use clap::Parser;
use hostmesh_runtime::testing::{ServerConfig, start_server};

#[derive(Parser)]
struct Args {
    /// Proc name.
    #[arg(long, default_value = "testproc")]
    name: String,
    /// Listen address.
    #[arg(long, default_value = "tcp:127.0.0.1:0")]
    listen: String,
    /// Shared secret.
    #[arg(long)]
    secret: Option<String>,
    /// Largest frame accepted, in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    max_frame: usize,
    /// Test actors to spawn at start (t0, t1, ...).
    #[arg(long, default_value_t = 1)]
    actors: usize,
    /// A label this process's test actors refuse to spawn with (one
    /// failing rank of a mesh).
    #[arg(long)]
    refuse: Option<String>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if let Some(label) = args.refuse {
        hostmesh_runtime::testing::refuse_label_in_this_process(label);
    }
    let config = ServerConfig {
        name: args.name,
        listen: args.listen.parse()?,
        secret: args.secret.map(String::into_bytes),
        issue_from_secret: false,
        max_frame_len: args.max_frame,
        actors: args.actors,
    };
    let proc = start_server(&config).await?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "READY {}", proc.id())?;
        out.flush()?;
    }
    // Serve until the parent closes our stdin.
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        std::io::stdin().read_to_end(&mut sink)
    })
    .await;
    proc.shutdown();
    Ok(())
}
