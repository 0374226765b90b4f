//! One chaos run's cluster and the status polls the scenarios measure with.
//!
//! A run gets a fresh e2e [`Env`] (separate API server, kubelet,
//! controller-manager and operator processes), World `w` of 2 hosts and
//! ProcMesh `pm` of 2 procs per host (`OnFailure`, `spawnTimeout` 3 s).
//!
//! Invariants:
//! 1. Every wait is bounded by [`BOUND`] and fails with what it waited for
//!    and the last status seen.
//! 2. Every status a poll reads goes into the run's [`Trail`], so a scenario
//!    can check the phases and host states the objects went through, not
//!    only where they ended.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hostmesh_e2e::{Env, condition_true, host_state, world_yaml};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

/// How long any single wait of a scenario may take.
pub(crate) const BOUND: Duration = Duration::from_secs(90);

/// The spawn timeout of `pm`: short, so "long after the spawn" is seconds.
pub(crate) const SPAWN_TIMEOUT: Duration = Duration::from_secs(3);

/// Procs of `pm`: 2 hosts x 2 per host.
pub(crate) const PROCS: usize = 4;

/// World spec lines: replace a failed host, first restart at once.
pub(crate) const WORLD: &str =
    "  failurePolicy: {action: ReplaceHost, maxRestarts: 3, backoff: 1s}\n";

/// World spec lines with fast expiry: a silent host is Expired after 2 s
/// and evicted 3 s later.
pub(crate) const WORLD_FAST_EXPIRY: &str = "  healthTimeout: 2s\n  evictionTimeout: 3s\n  failurePolicy: {action: ReplaceHost, maxRestarts: 3, backoff: 1s}\n";

/// The ProcMesh manifest (`pm` on World `w`).
pub(crate) fn mesh_yaml() -> String {
    format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: pm}}\nspec:\n  world: w\n  perHost: [{{name: gpu, size: 2}}]\n  command: [sleep, '600']\n  spawnTimeout: {}s\n  restartPolicy: {{policy: OnFailure, maxRestarts: 3, backoff: 1s}}\n",
        SPAWN_TIMEOUT.as_secs()
    )
}

/// The World manifest (`w`, 2 hosts) with these spec lines.
pub(crate) fn world(spec: &str) -> String {
    world_yaml("w", &[("host", 2)], spec)
}

/// A fresh cluster named after `run` with World `w` Ready.
pub(crate) async fn ready_world(run: &str, spec: &str) -> anyhow::Result<Env> {
    let env = Env::start(run).await?;
    env.apply(&world(spec)).await?;
    env.wait_for("World", "w", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    Ok(env)
}

/// Applies `pm`, waits until it is Ready with every proc running, and
/// returns the procs' pids by rank.
pub(crate) async fn ready_mesh(env: &Env) -> anyhow::Result<BTreeMap<u64, i32>> {
    env.apply(&mesh_yaml()).await?;
    env.wait_for("ProcMesh", "pm", "Ready", |s| {
        condition_true(s, "Ready") && s["running"] == PROCS
    })
    .await?;
    procs_by_rank(env).await
}

/// The procs of `pm` by `RANK`, once there is exactly one live process per
/// rank (the agents report a proc as running when they have spawned it; a
/// second live process of a rank is an error at once).
pub(crate) async fn procs_by_rank(env: &Env) -> anyhow::Result<BTreeMap<u64, i32>> {
    let mut last = String::new();
    let got = hostmesh_testkit::wait::poll(BOUND, async || {
        let mut by_rank: BTreeMap<u64, Vec<i32>> = BTreeMap::new();
        for pid in env.proc_pids("w", "pm") {
            if let Some(rank) = proc_env(pid, "RANK").and_then(|r| r.parse().ok()) {
                by_rank.entry(rank).or_default().push(pid);
            }
        }
        if let Some((rank, pids)) = by_rank.iter().find(|(_, p)| p.len() > 1) {
            return Ok(Err(format!("rank {rank} runs twice: pids {pids:?}")));
        }
        last = format!("{by_rank:?}");
        if by_rank.len() == PROCS {
            Ok(Ok(by_rank.into_iter().map(|(r, p)| (r, p[0])).collect()))
        } else {
            Err(())
        }
    })
    .await;
    match got {
        Ok(Ok(m)) => Ok(m),
        Ok(Err(dup)) => bail!("{dup}"),
        Err(()) => bail!("not one live proc per rank of {PROCS} after {BOUND:?}: {last}"),
    }
}

/// The value of `key` in a process's environment.
pub(crate) fn proc_env(pid: i32, key: &str) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{key}=");
    raw.split(|b| *b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&prefix).map(str::to_owned)
    })
}

/// The phases and host states the objects of a run went through, in order
/// (consecutive repeats folded).
#[derive(Debug, Default)]
pub(crate) struct Trail {
    seen: Vec<String>,
}

impl Trail {
    /// Records what `status` of `kind` shows.
    pub(crate) fn record(&mut self, kind: &str, status: &serde_json::Value) {
        let phase = status["phase"].as_str().unwrap_or("-");
        let mut entry = format!("{kind} {phase}");
        if kind == "World" {
            let hosts: Vec<String> = (0..2).map(|h| host_state(status, h)).collect();
            entry.push_str(&format!(" [{}]", hosts.join(",")));
        }
        if self.seen.last() != Some(&entry) {
            self.seen.push(entry);
        }
    }

    /// Whether `kind` was ever seen in `phase`.
    pub(crate) fn saw_phase(&self, kind: &str, phase: &str) -> bool {
        let want = format!("{kind} {phase}");
        self.seen
            .iter()
            .any(|e| e == &want || e.starts_with(&format!("{want} ")))
    }
}

impl std::fmt::Display for Trail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.seen.join(" -> "))
    }
}

/// Polls `kind/name` until `pred` holds, recording every status in `trail`;
/// returns that status and the seconds since `since` (the fault).
pub(crate) async fn until(
    env: &Env,
    trail: &mut Trail,
    kind: &str,
    name: &str,
    what: &str,
    since: Instant,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> anyhow::Result<(serde_json::Value, f64)> {
    let api = env.hostmesh_api(kind);
    let mut last = serde_json::Value::Null;
    let got = hostmesh_testkit::wait::poll(BOUND, async || {
        let Ok(Some(o)) = api.get_opt(name).await else {
            return Err(());
        };
        last = o.data.get("status").cloned().unwrap_or_default();
        trail.record(kind, &last);
        if pred(&last) {
            Ok((last.clone(), since.elapsed().as_secs_f64()))
        } else {
            Err(())
        }
    })
    .await;
    got.map_err(|()| {
        anyhow::anyhow!("{kind} {name}: {what} not reached in {BOUND:?}; last status: {last}")
    })
}

/// The current status of `kind/name`.
pub(crate) async fn status(env: &Env, kind: &str, name: &str) -> anyhow::Result<serde_json::Value> {
    let o = env
        .hostmesh_api(kind)
        .get(name)
        .await
        .with_context(|| format!("reading {kind} {name}"))?;
    Ok(o.data.get("status").cloned().unwrap_or_default())
}

/// The World is Running and Ready with both hosts Ready.
pub(crate) fn world_up(s: &serde_json::Value) -> bool {
    s["phase"] == "Running"
        && condition_true(s, "Ready")
        && host_state(s, 0) == "Ready"
        && host_state(s, 1) == "Ready"
}

/// The ProcMesh is Running and Ready with every proc running.
pub(crate) fn mesh_up(s: &serde_json::Value) -> bool {
    s["phase"] == "Running" && condition_true(s, "Ready") && s["running"] == PROCS
}

/// A status counter (`restarts`, `attempt`), 0 when absent.
pub(crate) fn count(s: &serde_json::Value, field: &str) -> u64 {
    s[field].as_u64().unwrap_or(0)
}

/// The uid of pod `name` in the run's namespace.
pub(crate) async fn pod_uid(env: &Env, name: &str) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    Ok(pods.get(name).await?.metadata.uid.unwrap_or_default())
}

/// The reasons of the Events in the run's namespace (events.k8s.io/v1, as
/// the operator records them).
pub(crate) async fn event_reasons(env: &Env) -> anyhow::Result<Vec<String>> {
    let api: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(env.client.clone(), &env.namespace);
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect())
}

/// Fails unless `cond`, with `msg` and the trail so far.
pub(crate) fn check(cond: bool, msg: impl std::fmt::Display, trail: &Trail) -> anyhow::Result<()> {
    if !cond {
        bail!("{msg}; trail: {trail}");
    }
    Ok(())
}
