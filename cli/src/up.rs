//! `hostmesh up`: the cluster in a box. Starts the embedded API server, the
//! process kubelet and the operator in this process, installs the CRDs,
//! applies a manifest, shows a live view of every applied World and ProcMesh
//! until they are Ready, and tears everything down on Ctrl-C (or at once with
//! `--exit-when-ready`).
//!
//! Invariants:
//! 1. Teardown always runs, on success, failure, timeout and Ctrl-C: the
//!    kubelet stops every process it started before `up` returns.
//! 2. `--exit-when-ready` exits 0 only when every applied World and ProcMesh
//!    has condition Ready=True; a Failed condition or the timeout is an error
//!    that names the object and the reason.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject};

use crate::manifest::{self, Applied};
use hostmesh_devcluster::kubelet::PodNetwork;

/// Arguments of `hostmesh up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Manifest to apply (Worlds, ProcMeshes and anything else).
    #[arg(default_value = "examples/quickstart.yaml")]
    pub manifest: PathBuf,
    /// Directory for the kubeconfig, certificates, pod data and logs.
    #[arg(long, default_value = ".hostmesh")]
    pub data_dir: PathBuf,
    /// Namespace for objects that do not name one.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// Apply, wait until every World, ProcMesh and MonarchMesh is Ready,
    /// tear down, exit.
    #[arg(long)]
    pub exit_when_ready: bool,
    /// How long `--exit-when-ready` waits before giving up.
    #[arg(long, default_value = "5m", value_parser = parse_timeout)]
    pub timeout: Duration,
    /// Pod networking: `sandbox` (each pod in its own network namespace; needs root) or `host` (the machine's, on loopback addresses).
    #[arg(long, value_enum, default_value_t = PodNetwork::Sandbox)]
    pub pod_network: PodNetwork,
    /// Also serve Monarch's MonarchMesh (its CRD, and the operator's
    /// `--serve-monarch-mesh`), so Monarch's KubernetesJob provisioning
    /// works against this cluster (docs/monarch.md).
    #[arg(long)]
    pub serve_monarch_mesh: bool,
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    hostmesh_crds::duration::parse("--timeout", text).map_err(|e| e.to_string())
}

/// What `up` reports when it cannot finish.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    /// The manifest could not be read.
    #[error("cannot read manifest {path}")]
    ReadManifest {
        /// The path given.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The manifest did not parse or apply.
    #[error(transparent)]
    Manifest(#[from] manifest::ManifestError),
    /// A component of the cluster in a box failed to start.
    #[error("cannot start {component}: {reason}")]
    Start {
        /// Which component.
        component: &'static str,
        /// Why.
        reason: String,
    },
    /// An applied object failed.
    #[error("{kind} {namespace}/{name} failed: {reason}")]
    Failed {
        /// Object kind.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The Failed condition's message.
        reason: String,
    },
    /// Not everything was Ready in time.
    #[error("not Ready after {timeout:?}: {pending}")]
    Timeout {
        /// The timeout.
        timeout: Duration,
        /// The objects still not Ready, with their phases.
        pending: String,
    },
    /// The API server answered with an error while watching progress.
    #[error("watching progress: {0}")]
    Kube(#[from] kube::Error),
    /// An applied object was deleted (with kubectl) before it was Ready.
    #[error(
        "{kind} {namespace}/{name} was deleted before it was Ready; apply it again, or run without --exit-when-ready"
    )]
    Deleted {
        /// Object kind.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

/// Readiness of one applied World or ProcMesh, read from its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// `World` or `ProcMesh`.
    pub kind: String,
    /// `namespace/name`.
    pub key: String,
    /// `status.phase`, or `-` before the first status write.
    pub phase: String,
    /// The Ready condition is True.
    pub ready: bool,
    /// The Failed condition's message when it is True.
    pub failed: Option<String>,
    /// A short summary of the counters in status (ready hosts, running procs).
    pub detail: String,
}

/// Reads an object's progress from its status (pure).
pub fn progress_of(kind: &str, obj: &DynamicObject) -> Progress {
    let status = obj.data.get("status");
    let get = |p: &str| status.and_then(|s| s.pointer(p));
    let cond = |t: &str| {
        get("/conditions")
            .and_then(|c| c.as_array())
            .and_then(|cs| cs.iter().find(|c| c["type"] == t))
            .filter(|c| c["status"] == "True")
            .map(|c| c["message"].as_str().unwrap_or_default().to_owned())
    };
    let num = |p: &str| get(p).and_then(|v| v.as_u64());
    let detail = match kind {
        "World" => match (num("/readyHosts"), num("/desiredHosts")) {
            (Some(r), Some(d)) => format!("hosts {r}/{d}"),
            _ => String::new(),
        },
        "MonarchMesh" => match (num("/readyReplicas"), num("/replicas")) {
            (Some(r), Some(d)) => format!("workers {r}/{d}"),
            _ => String::new(),
        },
        _ => match (num("/running"), num("/failed")) {
            (Some(r), Some(f)) => format!("running {r} failed {f}"),
            _ => String::new(),
        },
    };
    Progress {
        kind: kind.to_owned(),
        key: format!(
            "{}/{}",
            obj.metadata.namespace.as_deref().unwrap_or("-"),
            obj.metadata.name.as_deref().unwrap_or("-")
        ),
        phase: get("/phase")
            .and_then(|p| p.as_str())
            .unwrap_or("-")
            .to_owned(),
        ready: cond("Ready").is_some(),
        failed: cond("Failed"),
        detail,
    }
}

/// Runs `hostmesh up` to completion.
pub async fn run(args: UpArgs) -> Result<(), UpError> {
    run_noting(args, |_| {}).await
}

/// Like [`run`]; `started` sees the cluster once it is up (`hostmesh up`
/// tells its reaper the pod bridge).
pub async fn run_noting(
    args: UpArgs,
    started: impl FnOnce(&crate::devenv::DevEnv),
) -> Result<(), UpError> {
    let yaml = std::fs::read_to_string(&args.manifest).map_err(|source| UpError::ReadManifest {
        path: args.manifest.clone(),
        source,
    })?;
    let objects = manifest::parse(&args.manifest.display().to_string(), &yaml)?;
    std::fs::create_dir_all(&args.data_dir).map_err(|e| UpError::Start {
        component: "data directory",
        reason: format!("{}: {e}", args.data_dir.display()),
    })?;
    let me = std::env::current_exe().map_err(|e| UpError::Start {
        component: "cluster in a box",
        reason: format!("cannot find the running hostmesh executable: {e}"),
    })?;
    let cluster = crate::devenv::DevEnv::start_with(
        &args.data_dir,
        me,
        args.pod_network,
        args.serve_monarch_mesh,
    )
    .await
    .map_err(|e| UpError::Start {
        component: "cluster in a box",
        reason: e.to_string(),
    })?;
    started(&cluster);
    if let Some(range) = cluster.pod_range() {
        say(&format!("pod range: {range}"));
    }
    say(&format!(
        "cluster in a box is up. In another shell:\n  export KUBECONFIG={}\n  kubectl get worlds,procmeshes,pods",
        cluster.kubeconfig().display()
    ));
    let outcome = apply_and_watch(&cluster, &objects, &args).await;
    say("tearing down ...");
    cluster.shutdown().await;
    say("done.");
    outcome
}

async fn apply_and_watch(
    cluster: &crate::devenv::DevEnv,
    objects: &[DynamicObject],
    args: &UpArgs,
) -> Result<(), UpError> {
    let client = cluster.client();
    let applied = manifest::apply_all(&client, objects, &args.namespace, "hostmesh-up").await?;
    for a in &applied {
        say(&format!(
            "applied {} {}",
            a.resource.kind,
            a.namespace
                .as_deref()
                .map(|ns| format!("{ns}/{}", a.name))
                .unwrap_or_else(|| a.name.clone())
        ));
    }
    let watched: Vec<&Applied> = applied
        .iter()
        .filter(|a| {
            a.resource.group == hostmesh_crds::GROUP
                || a.resource.group == hostmesh_crds::monarchmesh::GROUP
        })
        .collect();
    let deadline = Instant::now() + args.timeout;
    let mut shown: BTreeMap<String, Progress> = BTreeMap::new();
    let mut announced_ready = false;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    // What was printed last: a line is printed again only when it changed.
    let mut last_error: Option<String> = None;
    let mut last_get_error: Option<String> = None;
    loop {
        let mut all = Vec::with_capacity(watched.len());
        for a in &watched {
            let namespace = a.namespace.as_deref().unwrap_or(&args.namespace);
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), namespace, &a.resource);
            match api.get_opt(&a.name).await {
                Ok(Some(obj)) => all.push(progress_of(&a.resource.kind, &obj)),
                // Deleted by someone (kubectl delete): report it, keep serving.
                Ok(None) => {
                    if args.exit_when_ready {
                        return Err(UpError::Deleted {
                            kind: a.resource.kind.clone(),
                            namespace: namespace.to_owned(),
                            name: a.name.clone(),
                        });
                    }
                    all.push(deleted(&a.resource.kind, namespace, &a.name));
                }
                // A passing API error: say it once, look again.
                Err(e) => {
                    let line = format!(
                        "warning: reading {} {namespace}/{}: {e}",
                        a.resource.kind, a.name
                    );
                    if last_get_error.as_ref() != Some(&line) {
                        say(&line);
                        last_get_error = Some(line);
                    }
                    if args.exit_when_ready && Instant::now() >= deadline {
                        return Err(e.into());
                    }
                }
            }
        }
        for p in &all {
            if shown.get(&p.key) != Some(p) {
                say(&render(p));
                shown.insert(p.key.clone(), p.clone());
            }
        }
        if let Some(p) = all.iter().find(|p| p.failed.is_some()) {
            let (namespace, name) = p.key.split_once('/').unwrap_or(("-", &p.key));
            let err = UpError::Failed {
                kind: p.kind.clone(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                reason: p.failed.clone().unwrap_or_default(),
            };
            if args.exit_when_ready {
                return Err(err);
            }
            let line = format!("error: {err}");
            if last_error.as_ref() != Some(&line) {
                say(&line);
                last_error = Some(line);
            }
        }
        let live: Vec<&Progress> = all.iter().filter(|p| p.phase != DELETED).collect();
        let ready = all.len() == watched.len() && !live.is_empty() && live.iter().all(|p| p.ready);
        if ready && !announced_ready {
            announced_ready = true;
            if args.exit_when_ready {
                say("everything is Ready.");
                return Ok(());
            }
            say("everything is Ready. Press Ctrl-C to tear down.");
        }
        if args.exit_when_ready && Instant::now() >= deadline {
            let pending = all
                .iter()
                .filter(|p| !p.ready)
                .map(|p| format!("{} {} ({})", p.kind, p.key, p.phase))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(UpError::Timeout {
                timeout: args.timeout,
                pending,
            });
        }
        tokio::select! {
            _ = &mut ctrl_c => return Ok(()),
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

/// The phase shown for an applied object someone deleted.
const DELETED: &str = "Deleted";

/// The progress line of an applied object that no longer exists.
fn deleted(kind: &str, namespace: &str, name: &str) -> Progress {
    Progress {
        kind: kind.to_owned(),
        key: format!("{namespace}/{name}"),
        phase: DELETED.to_owned(),
        ready: false,
        failed: None,
        detail: "deleted; still serving (Ctrl-C to tear down)".to_owned(),
    }
}

fn render(p: &Progress) -> String {
    let mark = if p.failed.is_some() {
        "FAILED"
    } else if p.ready {
        "ready"
    } else {
        "..."
    };
    let mut line = format!(
        "{:<8} {:<32} {:<12} {:<24} {}",
        p.kind, p.key, p.phase, p.detail, mark
    );
    if let Some(reason) = &p.failed {
        line.push_str(&format!(": {reason}"));
    }
    line
}

/// `up` talks to a person: plain lines on stdout.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(status: serde_json::Value) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "hostmesh.dev/v1alpha1", "kind": "World",
            "metadata": {"name": "w", "namespace": "ns"},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn progress_reads_phase_conditions_and_counts() {
        let p = progress_of(
            "World",
            &obj(serde_json::json!({
                "phase": "Running", "readyHosts": 4, "desiredHosts": 4,
                "conditions": [{"type": "Ready", "status": "True", "message": ""}],
            })),
        );
        assert_eq!(p.key, "ns/w");
        assert_eq!(p.phase, "Running");
        assert!(p.ready);
        assert_eq!(p.failed, None);
        assert_eq!(p.detail, "hosts 4/4");
    }

    #[test]
    fn a_failed_condition_carries_its_message_and_is_not_ready() {
        let p = progress_of(
            "ProcMesh",
            &obj(serde_json::json!({
                "phase": "Failed", "running": 7, "failed": 1,
                "conditions": [
                    {"type": "Ready", "status": "False", "message": ""},
                    {"type": "Failed", "status": "True", "message": "rank 3 exited with code 3"},
                ],
            })),
        );
        assert!(!p.ready);
        assert_eq!(p.failed.as_deref(), Some("rank 3 exited with code 3"));
        assert!(render(&p).contains("FAILED: rank 3 exited with code 3"));
    }

    #[test]
    fn no_status_yet_is_pending_not_an_error() {
        let mut o = obj(serde_json::Value::Null);
        o.data = serde_json::json!({});
        let p = progress_of("World", &o);
        assert_eq!(p.phase, "-");
        assert!(!p.ready && p.failed.is_none());
    }
}
