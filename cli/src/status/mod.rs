//! `hostmesh status world/NAME` and `hostmesh status procmesh/NAME`: one
//! readable screen about a World or a ProcMesh (`monarchmesh/NAME`: the
//! World that runs a MonarchMesh), read from the API server:
//! phase, readiness, per-rank state as runs, the first failure with its
//! stderr tail, and conditions.
//!
//! Invariants:
//! 1. Formatting is pure ([`format_world`], [`format_procmesh`] take the
//!    objects and the current time) so it is unit-tested from YAML and reused
//!    by live views (`hostmesh up`).
//! 2. The output is bounded whatever the mesh size: at most
//!    [`MAX_RUNS_SHOWN`] runs are listed, then a count of the rest.
//! 3. Text from the API (reasons, messages, stderr) is printed with control
//!    characters replaced, so a proc's stderr cannot drive the terminal.

mod format;

use hostmesh_crds::{ProcMesh, World};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;

pub use format::{format_procmesh, format_world};

/// Most runs listed before the rest is summarised (invariant 2).
pub const MAX_RUNS_SHOWN: usize = 40;

/// Errors of `hostmesh status`.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The `KIND/NAME` argument did not parse.
    #[error(
        "cannot read {0:?}: give KIND/NAME where KIND is `world`, `procmesh` or `monarchmesh`, e.g. `world/trainer`"
    )]
    Target(String),
    /// No kubeconfig or in-cluster configuration.
    #[error("cannot reach the cluster: {0}; set KUBECONFIG or use --kubeconfig")]
    Config(String),
    /// The object does not exist.
    #[error(
        "{kind} {name:?} not found in namespace {namespace:?}; list them with `kubectl get {plural} -n {namespace}`"
    )]
    NotFound {
        /// `World` or `ProcMesh`.
        kind: &'static str,
        /// Its plural for kubectl.
        plural: &'static str,
        /// The name asked for.
        name: String,
        /// The namespace searched.
        namespace: String,
    },
    /// Any other API error.
    #[error("cannot read {kind} {name:?}: {source}")]
    Api {
        /// `World` or `ProcMesh`.
        kind: &'static str,
        /// The name asked for.
        name: String,
        /// The cause.
        source: kube::Error,
    },
}

/// Arguments of `hostmesh status`.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// What to show: `world/NAME` or `procmesh/NAME` (also `worlds/`, `pm/`,
    /// `procmeshes/`).
    pub target: String,
    /// Namespace (defaults to the kubeconfig context's namespace).
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// Kubeconfig file (defaults to KUBECONFIG, then ~/.kube/config, then
    /// in-cluster configuration).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
}

/// What `hostmesh status` was asked to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A World by name.
    World(String),
    /// A ProcMesh by name.
    ProcMesh(String),
    /// A MonarchMesh by name (shown as its World).
    MonarchMesh(String),
}

/// Parses `KIND/NAME`.
pub fn parse_target(s: &str) -> Result<Target, StatusError> {
    let (kind, name) = s
        .split_once('/')
        .ok_or_else(|| StatusError::Target(s.to_owned()))?;
    if name.is_empty() || name.contains('/') {
        return Err(StatusError::Target(s.to_owned()));
    }
    match kind.to_ascii_lowercase().as_str() {
        "world" | "worlds" | "world.hostmesh.dev" | "worlds.hostmesh.dev" => {
            Ok(Target::World(name.to_owned()))
        }
        "procmesh" | "procmeshes" | "pm" | "procmesh.hostmesh.dev" | "procmeshes.hostmesh.dev" => {
            Ok(Target::ProcMesh(name.to_owned()))
        }
        "monarchmesh" | "monarchmeshes" | "monarchmeshes.monarch.pytorch.org" => {
            Ok(Target::MonarchMesh(name.to_owned()))
        }
        _ => Err(StatusError::Target(s.to_owned())),
    }
}

/// Reads the object and returns its formatted view.
pub async fn run(args: &StatusArgs) -> Result<String, StatusError> {
    let target = parse_target(&args.target)?;
    let client = client(args).await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let now = Timestamp::now();
    match target {
        Target::World(name) => {
            let api: Api<World> = Api::namespaced(client.clone(), &namespace);
            let world = get(&api, &name, "World", "worlds", &namespace).await?;
            let pms: Api<ProcMesh> = Api::namespaced(client, &namespace);
            // The ProcMesh list is a convenience: a missing permission must
            // not hide the World's own status.
            let meshes = match pms.list(&ListParams::default()).await {
                Ok(list) => list
                    .items
                    .into_iter()
                    .filter(|pm| pm.spec.world == name)
                    .collect(),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot list ProcMeshes");
                    Vec::new()
                }
            };
            Ok(format_world(&world, &meshes, now))
        }
        Target::ProcMesh(name) => {
            let api: Api<ProcMesh> = Api::namespaced(client, &namespace);
            let pm = get(&api, &name, "ProcMesh", "procmeshes", &namespace).await?;
            Ok(format_procmesh(&pm, now))
        }
        Target::MonarchMesh(name) => {
            use hostmesh_crds::monarchmesh::MonarchMesh;
            let api: Api<MonarchMesh> = Api::namespaced(client.clone(), &namespace);
            let mesh = get(&api, &name, "MonarchMesh", "monarchmeshes", &namespace).await?;
            let ready = mesh
                .status
                .as_ref()
                .and_then(|s| hostmesh_crds::conditions::get(&s.conditions, "Ready"))
                .map(|c| format!("Ready {} ({}): {}", c.status, c.reason, c.message))
                .unwrap_or_else(|| "no status yet".to_owned());
            let worlds: Api<World> = Api::namespaced(client, &namespace);
            let world = get(&worlds, &name, "World", "worlds", &namespace).await?;
            Ok(format!(
                "MonarchMesh {}: {}\n{}",
                format::clean(&name),
                format::clean(&ready),
                format_world(&world, &[], now)
            ))
        }
    }
}

/// `hostmesh status`: logs warnings to stderr, prints the view to stdout.
pub fn run_blocking(args: &StatusArgs) -> Result<(), StatusError> {
    use std::io::Write as _;
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StatusError::Config(format!("cannot start the tokio runtime: {e}")))?;
    let text = rt.block_on(run(args))?;
    // A closed stdout (piped into `head`) is not an error worth reporting.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(())
}

async fn client(args: &StatusArgs) -> Result<kube::Client, StatusError> {
    kube_client(args.kubeconfig.as_deref()).await
}

/// A client from `kubeconfig`, else the inferred configuration (KUBECONFIG,
/// ~/.kube/config, in-cluster).
pub(crate) async fn kube_client(
    kubeconfig: Option<&std::path::Path>,
) -> Result<kube::Client, StatusError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| StatusError::Config(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| StatusError::Config(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| StatusError::Config(e.to_string()))?,
    };
    hostmesh_net::kube_client(config).map_err(|e| StatusError::Config(e.to_string()))
}

async fn get<K>(
    api: &Api<K>,
    name: &str,
    kind: &'static str,
    plural: &'static str,
    namespace: &str,
) -> Result<K, StatusError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.get_opt(name).await {
        Ok(Some(obj)) => Ok(obj),
        Ok(None) => Err(StatusError::NotFound {
            kind,
            plural,
            name: name.to_owned(),
            namespace: namespace.to_owned(),
        }),
        Err(source) => Err(StatusError::Api {
            kind,
            name: name.to_owned(),
            source,
        }),
    }
}
