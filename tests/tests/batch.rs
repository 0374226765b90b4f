//! e2e: batch lifecycle (docs/api.md, "A World that finishes"): a World
//! with `finishWhen: ProcMeshesFinished` finishes with its ProcMeshes,
//! frees its hosts, tells Kueue and is deleted by its TTL; deadlines,
//! success policies, `dependsOn`, failure scope by dimension, failure rules
//! and the spec-change policy, each on real agents.

use std::path::Path;
use std::time::{Duration, Instant};

use hostmesh_e2e::{Env, condition_true, world_yaml};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

fn mesh_yaml(name: &str, world: &str, per_host: u32, command: &str, extra: &str) -> String {
    format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: {name}}}\nspec:\n  world: {world}\n  perHost: [{{name: gpu, size: {per_host}}}]\n  command: [sh, -c, {command:?}]\n{extra}"
    )
}

/// The host pods of World `world` that exist (terminating ones too).
async fn host_pods(env: &Env, world: &str) -> anyhow::Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let lp = ListParams::default().labels(&format!("hostmesh.dev/world={world}"));
    Ok(pods.list(&lp).await?.items)
}

/// Polls until `f` holds, failing after [`hostmesh_e2e::WAIT`] with `what`.
async fn until<F, Fut>(what: &str, mut f: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let start = Instant::now();
    while start.elapsed() < hostmesh_e2e::WAIT {
        if f().await? {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("{what}: not true after {:?}", hostmesh_e2e::WAIT)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_finished_world_completes_frees_its_hosts_and_its_ttl_deletes_it() -> anyhow::Result<()> {
    let env = Env::start("batch-finish").await?;
    env.apply(&world_yaml(
        "w",
        &[("host", 2)],
        "  finishWhen: ProcMeshesFinished\n  ttlSecondsAfterFinished: 5\n",
    ))
    .await?;
    env.apply(&mesh_yaml("pm", "w", 2, "sleep 2; exit 0", ""))
        .await?;
    let status = env
        .wait_for("World", "w", "Complete", |s| condition_true(s, "Complete"))
        .await?;
    assert_eq!(status["phase"], "Succeeded", "{status:#}");
    assert!(!status["finishedAt"].is_null(), "{status:#}");
    let finished = Instant::now();
    let pm = env
        .wait_for("ProcMesh", "pm", "Succeeded", |s| s["phase"] == "Succeeded")
        .await?;
    assert_eq!(
        (pm["succeeded"].as_u64(), pm["failed"].as_u64()),
        (Some(4), Some(0)),
        "{pm:#}"
    );
    until("the host pods gone", || async {
        Ok(host_pods(&env, "w").await?.is_empty())
    })
    .await?;
    hostmesh_e2e::record(
        &env,
        "batch_pods_gone_after_finish_s",
        finished.elapsed().as_secs_f64(),
        "s",
    );
    let worlds = env.hostmesh_api("World");
    let meshes = env.hostmesh_api("ProcMesh");
    until("the World and its ProcMesh deleted by the TTL", || async {
        Ok(worlds.get_opt("w").await?.is_none() && meshes.get_opt("pm").await?.is_none())
    })
    .await?;
    hostmesh_e2e::record(
        &env,
        "batch_world_deleted_after_finish_s",
        finished.elapsed().as_secs_f64(),
        "s",
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_world_whose_proc_mesh_failed_fails_and_frees_its_hosts() -> anyhow::Result<()> {
    let env = Env::start("batch-fail").await?;
    env.apply(&world_yaml(
        "w",
        &[("host", 2)],
        "  finishWhen: ProcMeshesFinished\n",
    ))
    .await?;
    env.apply(&mesh_yaml(
        "pm",
        "w",
        1,
        "if [ \"$RANK\" = 1 ]; then echo boom >&2; exit 3; fi; sleep 300",
        "",
    ))
    .await?;
    let status = env
        .wait_for("World", "w", "Failed", |s| s["phase"] == "Failed")
        .await?;
    let failed = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Failed"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(failed["reason"], "ProcMeshesFailed", "{status:#}");
    assert!(
        failed["message"]
            .as_str()
            .unwrap_or_default()
            .contains("ProcMesh pm failed"),
        "{status:#}"
    );
    until("the host pods gone", || async {
        Ok(host_pods(&env, "w").await?.is_empty())
    })
    .await?;
    Ok(())
}

fn kueue(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", kind),
        plural,
    )
}

fn cond(t: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": t, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// With Kueue (played as `kueue.rs` plays it), a World that succeeds marks
/// its Workload `Finished` (reason `Succeeded`), so the quota goes back.
#[tokio::test(flavor = "multi_thread")]
async fn a_queued_world_that_succeeds_finishes_its_workload() -> anyhow::Result<()> {
    let env = Env::start("batch-kueue").await?;
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../operator/tests/data/kueue");
    hostmesh_testkit::cluster::install_crd_dir(&env.client, &data).await;
    let flavor = format!("e2e-{}", env.namespace);
    let flavors: Api<DynamicObject> = Api::all_with(
        env.client.clone(),
        &kueue("ResourceFlavor", "resourceflavors"),
    );
    flavors
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                "metadata": {"name": flavor},
                "spec": {"nodeLabels": {"kubernetes.io/hostname": env.node}},
            }))?,
        )
        .await?;
    env.apply(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata:\n  name: w\n  labels: {kueue.x-k8s.io/queue-name: team-a}\nspec:\n  hosts: 2\n  finishWhen: ProcMeshesFinished\n  template:\n    spec:\n      containers:\n      - name: host\n        image: busybox\n",
    )
    .await?;
    env.apply(&mesh_yaml("pm", "w", 1, "exit 0", "")).await?;
    let wls: Api<DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        &env.namespace,
        &kueue("Workload", "workloads"),
    );
    let name = hostmesh_testkit::eventually_async("the World's Workload", || async {
        let w = wls
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .next()?;
        w.metadata.name
    })
    .await;
    let status = json!({"status": {
        "admission": {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "hosts", "flavors": {"cpu": flavor}, "count": 2}]},
        "conditions": [
            cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cq"),
            cond("Admitted", "True", "Admitted", "The workload is admitted"),
        ],
    }});
    wls.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    env.wait_for("World", "w", "Complete", |s| condition_true(s, "Complete"))
        .await?;
    until("the Workload Finished with reason Succeeded", || async {
        let wl = wls.get(&name).await?;
        Ok(wl.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "Finished" && c["status"] == "True" && c["reason"] == "Succeeded"
            }))
    })
    .await?;
    until("the host pods gone", || async {
        Ok(host_pods(&env, "w").await?.is_empty())
    })
    .await?;
    env.delete("World", "w").await?;
    flavors.delete(&flavor, &Default::default()).await?;
    Ok(())
}

/// The message of condition `t` in a status object.
fn condition(status: &Value, t: &str) -> (String, String) {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == t)
        .map(|c| {
            (
                c["reason"].as_str().unwrap_or_default().to_owned(),
                c["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .unwrap_or_default()
}

/// A World whose hosts never get Ready (an init container that waits
/// forever, on any node) fails at its ready deadline, naming the hosts.
#[tokio::test(flavor = "multi_thread")]
async fn a_world_not_ready_by_its_ready_deadline_fails_naming_its_hosts() -> anyhow::Result<()> {
    let env = Env::start("batch-ready-deadline").await?;
    let yaml = world_yaml("w", &[("host", 2)], "  readyDeadlineSeconds: 5\n").replace(
        "      containers:\n",
        "      initContainers:\n      - {name: wait, image: busybox, command: [sleep, '3600']}\n      containers:\n",
    );
    env.apply(&yaml).await?;
    let status = env
        .wait_for("World", "w", "Failed", |s| s["phase"] == "Failed")
        .await?;
    let (reason, message) = condition(&status, "Failed");
    assert_eq!(reason, "ReadyDeadlineExceeded", "{status:#}");
    assert!(
        message.contains("0/2 hosts ready")
            && message.contains("host 0")
            && message.contains("host 1"),
        "{message}"
    );
    until("the host pods gone", || async {
        Ok(host_pods(&env, "w").await?.is_empty())
    })
    .await?;
    Ok(())
}

/// A command that records its own graceful stop: on TERM it writes
/// `<dir>/<mesh>-<RANK>.term` and exits.
fn stops_gracefully(dir: &Path, mesh: &str) -> String {
    format!(
        "trap 'echo term > {d}/{mesh}-$RANK.term; exit 0' TERM; while true; do sleep 0.2; done",
        d = dir.display()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_world_past_its_active_deadline_fails_and_stops_its_procs_gracefully()
-> anyhow::Result<()> {
    let env = Env::start("batch-world-deadline").await?;
    let dir = env.shared_dir()?;
    env.apply(&world_yaml(
        "w",
        &[("host", 2)],
        "  activeDeadlineSeconds: 10\n",
    ))
    .await?;
    env.apply(&mesh_yaml("pm", "w", 1, &stops_gracefully(&dir, "pm"), ""))
        .await?;
    env.wait_for("ProcMesh", "pm", "Running", |s| s["phase"] == "Running")
        .await?;
    let status = env
        .wait_for("World", "w", "Failed", |s| s["phase"] == "Failed")
        .await?;
    assert_eq!(
        condition(&status, "Failed").0,
        "DeadlineExceeded",
        "{status:#}"
    );
    let pm = env
        .wait_for("ProcMesh", "pm", "Failed with its World", |s| {
            s["phase"] == "Failed"
        })
        .await?;
    assert_eq!(condition(&pm, "Failed").0, "WorldFinished", "{pm:#}");
    for rank in 0..2 {
        let f = dir.join(format!("pm-{rank}.term"));
        hostmesh_e2e::eventually(&format!("rank {rank} stopped with TERM"), || f.exists()).await?;
    }
    until("the host pods gone", || async {
        Ok(host_pods(&env, "w").await?.is_empty())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_proc_mesh_past_its_active_deadline_fails_and_stops_its_procs_gracefully()
-> anyhow::Result<()> {
    let env = Env::start("batch-mesh-deadline").await?;
    let dir = env.shared_dir()?;
    env.apply(&world_yaml("w", &[("host", 2)], "")).await?;
    env.apply(&mesh_yaml(
        "pm",
        "w",
        1,
        &stops_gracefully(&dir, "pm"),
        "  activeDeadlineSeconds: 6\n",
    ))
    .await?;
    let pm = env
        .wait_for("ProcMesh", "pm", "Failed", |s| s["phase"] == "Failed")
        .await?;
    assert_eq!(condition(&pm, "Failed").0, "DeadlineExceeded", "{pm:#}");
    for rank in 0..2 {
        let f = dir.join(format!("pm-{rank}.term"));
        hostmesh_e2e::eventually(&format!("rank {rank} stopped with TERM"), || f.exists()).await?;
    }
    let pm = env
        .wait_for("ProcMesh", "pm", "no rank counted failed", |s| {
            s["running"] == 0
        })
        .await?;
    assert_eq!(pm["restarts"], 0, "{pm:#}");
    // The World goes on (finishWhen: Never).
    let w = env
        .wait_for("World", "w", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    assert_eq!(w["phase"], "Running", "{w:#}");
    Ok(())
}

/// `successPolicy: RankZero`: rank 0 exits 0 while the others sleep; the
/// ProcMesh is `Succeeded`, the others are stopped and are not failures.
#[tokio::test(flavor = "multi_thread")]
async fn rank_zero_success_stops_the_other_ranks_without_failures() -> anyhow::Result<()> {
    let env = Env::start("batch-success").await?;
    let dir = env.shared_dir()?;
    env.apply(&world_yaml("w", &[("host", 2)], "")).await?;
    let cmd = format!(
        "if [ \"$RANK\" = 0 ]; then sleep 3; exit 0; fi; {}",
        stops_gracefully(&dir, "pm")
    );
    env.apply(&mesh_yaml(
        "pm",
        "w",
        2,
        &cmd,
        "  successPolicy: {policy: RankZero}\n  restartPolicy: {policy: OnFailure, maxRestarts: 3}\n",
    ))
    .await?;
    let pm = env
        .wait_for(
            "ProcMesh",
            "pm",
            "Succeeded, the other ranks stopped",
            |s| {
                s["phase"] == "Succeeded"
                    && s["ranks"].as_array().is_some_and(|r| {
                        r.iter()
                            .all(|run| run["state"] == "Succeeded" || run["state"] == "Stopped")
                    })
            },
        )
        .await?;
    assert_eq!(
        (
            pm["succeeded"].as_u64(),
            pm["failed"].as_u64(),
            pm["restarts"].as_u64()
        ),
        (Some(1), Some(0), Some(0)),
        "{pm:#}"
    );
    assert!(pm["firstFailure"].is_null(), "{pm:#}");
    assert_eq!(condition(&pm, "Ready").0, "Succeeded", "{pm:#}");
    for rank in 1..4 {
        let f = dir.join(format!("pm-{rank}.term"));
        hostmesh_e2e::eventually(&format!("rank {rank} stopped with TERM"), || f.exists()).await?;
    }
    assert!(env.proc_pids("w", "pm").is_empty(), "no proc left running");
    Ok(())
}

/// `dependsOn`: `train` spawns nothing while `fetch` runs (its `Waiting`
/// condition names `fetch`), then starts once `fetch` succeeded; a
/// dependency that fails fails its dependent.
#[tokio::test(flavor = "multi_thread")]
async fn depends_on_waits_for_its_dependency_and_fails_with_it() -> anyhow::Result<()> {
    let env = Env::start("batch-depends").await?;
    let dir = env.shared_dir()?;
    env.apply(&world_yaml("w", &[("host", 2)], "")).await?;
    let go = dir.join("go");
    // `fetch` runs until the test lets it finish.
    let fetch = format!(
        "while [ ! -e {go} ]; do sleep 0.2; done; exit 0",
        go = go.display()
    );
    env.apply(&mesh_yaml("fetch", "w", 1, &fetch, "")).await?;
    let started = dir.join("train-started");
    let train = format!("touch {}; sleep 300", started.display());
    env.apply(&mesh_yaml(
        "train",
        "w",
        1,
        &train,
        "  dependsOn: [{name: fetch, condition: Succeeded}]\n",
    ))
    .await?;
    env.wait_for("ProcMesh", "fetch", "Running", |s| s["phase"] == "Running")
        .await?;
    let s = env
        .wait_for("ProcMesh", "train", "Waiting", |s| {
            condition_true(s, "Waiting")
        })
        .await?;
    assert_eq!(s["phase"], "Pending", "{s:#}");
    assert!(
        condition(&s, "Waiting").1.contains("ProcMesh fetch"),
        "{s:#}"
    );
    assert!(!started.exists(), "train spawned before fetch succeeded");
    std::fs::write(&go, "")?;
    env.wait_for("ProcMesh", "fetch", "Succeeded", |s| {
        s["phase"] == "Succeeded"
    })
    .await?;
    let s = env
        .wait_for("ProcMesh", "train", "Running", |s| {
            condition_true(s, "Ready")
        })
        .await?;
    assert_eq!(condition(&s, "Waiting").0, "DependenciesMet", "{s:#}");
    hostmesh_e2e::eventually("train's ranks started", || started.exists()).await?;

    // A dependency that fails fails the ProcMesh waiting on it.
    env.apply(&mesh_yaml("prep", "w", 1, "exit 4", "")).await?;
    env.apply(&mesh_yaml(
        "eval",
        "w",
        1,
        "sleep 300",
        "  dependsOn: [{name: prep}]\n",
    ))
    .await?;
    let s = env
        .wait_for("ProcMesh", "eval", "Failed", |s| s["phase"] == "Failed")
        .await?;
    let (reason, message) = condition(&s, "Failed");
    assert_eq!(reason, "DependencyFailed", "{s:#}");
    assert!(message.contains("ProcMesh prep failed"), "{message}");
    Ok(())
}

async fn pod_uid(env: &Env, name: &str) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    Ok(pods.get(name).await?.metadata.uid.unwrap_or_default())
}

/// `failurePolicy.scope: replica` on a `[replica: 2, host: 2]` World: a
/// killed agent on host (1, 0) recreates exactly the two hosts of replica
/// 1; replica 0's pods keep their UIDs and its procs their PIDs.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_host_recreates_only_its_replica() -> anyhow::Result<()> {
    let env = Env::start("batch-scope").await?;
    env.apply(&world_yaml(
        "w",
        &[("replica", 2), ("host", 2)],
        "  healthTimeout: 3s\n  evictionTimeout: 1s\n  failurePolicy: {action: ReplaceHost, scope: replica, maxRestarts: 3, backoff: 1s}\n",
    ))
    .await?;
    env.apply(&mesh_yaml(
        "pm",
        "w",
        1,
        "exec sleep 300",
        "  restartPolicy: {policy: OnFailure, maxRestarts: 3}\n",
    ))
    .await?;
    env.wait_for("ProcMesh", "pm", "Running", |s| s["running"] == 4)
        .await?;
    let uids = [
        pod_uid(&env, "w-host-0").await?,
        pod_uid(&env, "w-host-1").await?,
        pod_uid(&env, "w-host-2").await?,
        pod_uid(&env, "w-host-3").await?,
    ];
    // The procs of this test's ProcMesh (its agents' children) with `RANK`.
    let rank_pids = |rank: &str| {
        env.proc_pids("w", "pm")
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .unwrap_or_default()
                    .split(|b| *b == 0)
                    .any(|kv| kv == format!("RANK={rank}").as_bytes())
            })
            .collect::<Vec<i32>>()
    };
    let replica0 = [rank_pids("0"), rank_pids("1")];
    assert!(replica0.iter().all(|p| !p.is_empty()), "{replica0:?}");
    let agents = env.agent_pids("w", 2);
    assert_eq!(agents.len(), 1, "{agents:?}");
    hostmesh_e2e::signal(agents[0], "KILL")?;
    let s = env
        .wait_for("World", "w", "restarted once and Ready again", |s| {
            s["restarts"].as_u64().unwrap_or(0) >= 1 && condition_true(s, "Ready")
        })
        .await?;
    assert_eq!(s["restarts"], 1, "one restart for the slice: {s:#}");
    assert_eq!(pod_uid(&env, "w-host-0").await?, uids[0], "replica 0 kept");
    assert_eq!(pod_uid(&env, "w-host-1").await?, uids[1], "replica 0 kept");
    assert_ne!(
        pod_uid(&env, "w-host-2").await?,
        uids[2],
        "replica 1 recreated"
    );
    assert_ne!(
        pod_uid(&env, "w-host-3").await?,
        uids[3],
        "replica 1 recreated"
    );
    env.wait_for("ProcMesh", "pm", "Running again", |s| {
        s["running"] == 4 && s["restarts"].as_u64().unwrap_or(0) >= 1
    })
    .await?;
    assert_eq!(
        [rank_pids("0"), rank_pids("1")],
        replica0,
        "replica 0's procs kept their PIDs"
    );
    Ok(())
}

/// Failure rules: a deleted host pod under `RestartWithoutCounting` rules
/// (the World's on `Deleted`, the ProcMesh's on `HostLost`) is replaced
/// and its ranks restarted with both restart counts unchanged, though
/// both allow no counted restart at all; the rules that fired are named
/// in status.
#[tokio::test(flavor = "multi_thread")]
async fn restart_without_counting_rules_replace_a_deleted_host_for_free() -> anyhow::Result<()> {
    let env = Env::start("batch-rules").await?;
    env.apply(&world_yaml(
        "w",
        &[("host", 2)],
        "  failurePolicy:\n    maxRestarts: 0\n    rules: [{name: infra, action: RestartWithoutCounting, reasons: [Deleted, NodeLost, Preempted]}]\n",
    ))
    .await?;
    env.apply(&mesh_yaml(
        "pm",
        "w",
        1,
        "exec sleep 300",
        "  restartPolicy:\n    policy: OnFailure\n    maxRestarts: 0\n    rules: [{name: lost-host, action: RestartWithoutCounting, reasons: [HostLost]}]\n",
    ))
    .await?;
    env.wait_for("ProcMesh", "pm", "Running", |s| s["running"] == 2)
        .await?;
    let before = pod_uid(&env, "w-host-1").await?;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    pods.delete("w-host-1", &Default::default()).await?;
    let w = env
        .wait_for("World", "w", "the rule fired", |s| {
            !s["ruleFired"].is_null()
        })
        .await?;
    assert_eq!(w["ruleFired"]["name"], "infra", "{w:#}");
    assert_eq!(w["ruleFired"]["rank"], 1, "{w:#}");
    let w = env
        .wait_for("World", "w", "Ready with a new host 1", |s| {
            condition_true(s, "Ready")
        })
        .await?;
    assert_ne!(
        pod_uid(&env, "w-host-1").await?,
        before,
        "host 1 was replaced"
    );
    assert_eq!(w["restarts"], 0, "{w:#}");
    let pm = env
        .wait_for("ProcMesh", "pm", "Running again", |s| {
            s["running"] == 2 && !s["ruleFired"].is_null()
        })
        .await?;
    assert_eq!(pm["ruleFired"]["name"], "lost-host", "{pm:#}");
    assert_eq!(
        (pm["restarts"].as_u64(), pm["phase"].as_str()),
        (Some(0), Some("Running")),
        "{pm:#}"
    );
    Ok(())
}

/// A rule over the stderr tail: a rank that prints a CUDA error fails the
/// ProcMesh at once (`Fail`) though its policy would restart it, and the
/// failure and the Event name the rule.
#[tokio::test(flavor = "multi_thread")]
async fn a_stderr_rule_fails_the_mesh_and_is_named() -> anyhow::Result<()> {
    let env = Env::start("batch-stderr-rule").await?;
    env.apply(&world_yaml("w", &[("host", 1)], "")).await?;
    env.apply(&mesh_yaml(
        "pm",
        "w",
        2,
        "if [ \"$RANK\" = 1 ]; then echo 'RuntimeError: CUDA error: an illegal memory access was encountered' >&2; exit 1; fi; exec sleep 300",
        "  restartPolicy:\n    policy: OnFailure\n    maxRestarts: 5\n    rules: [{name: cuda, action: Fail, stderrPattern: 'CUDA error: an illegal memory access'}]\n",
    ))
    .await?;
    let pm = env
        .wait_for("ProcMesh", "pm", "Failed", |s| s["phase"] == "Failed")
        .await?;
    assert_eq!(pm["restarts"], 0, "{pm:#}");
    assert_eq!(pm["ruleFired"]["name"], "cuda", "{pm:#}");
    assert_eq!(pm["ruleFired"]["action"], "Fail", "{pm:#}");
    let (_, message) = condition(&pm, "Failed");
    assert!(message.contains("(rule cuda: Fail)"), "{message}");
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(env.client.clone(), &env.namespace);
    until("an Event names the rule", || async {
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|e| {
                e.message
                    .as_deref()
                    .unwrap_or_default()
                    .contains("rule cuda")
            }))
    })
    .await?;
    Ok(())
}

/// `updatePolicy`: with `OnNextRestart` a template change leaves the
/// running hosts as they are (`staleHosts` counts them) until one is
/// recreated anyway (a killed agent), which takes the new template; with
/// `RollingUpdate` (`maxUnavailable: 1`) the rest are recreated one at a
/// time until none is stale and the World is Ready.
#[tokio::test(flavor = "multi_thread")]
async fn update_policies_apply_a_template_change_on_restart_or_rolling() -> anyhow::Result<()> {
    let env = Env::start("batch-update").await?;
    env.apply(&world_yaml(
        "w",
        &[("host", 3)],
        "  healthTimeout: 3s\n  evictionTimeout: 1s\n  failurePolicy: {maxRestarts: 3, backoff: 1s}\n  updatePolicy: {type: OnNextRestart}\n",
    ))
    .await?;
    env.wait_for("World", "w", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    let uids = [
        pod_uid(&env, "w-host-0").await?,
        pod_uid(&env, "w-host-1").await?,
        pod_uid(&env, "w-host-2").await?,
    ];
    let worlds = env.hostmesh_api("World");
    let relabel =
        |team: &str| json!({"spec": {"template": {"metadata": {"labels": {"team": team}}}}});
    worlds
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(relabel("e2e-2")),
        )
        .await?;
    let s = env
        .wait_for("World", "w", "3 stale hosts", |s| s["staleHosts"] == 3)
        .await?;
    assert!(
        condition_true(&s, "Ready"),
        "stale hosts keep running: {s:#}"
    );
    for (r, uid) in uids.iter().enumerate() {
        assert_eq!(
            &pod_uid(&env, &format!("w-host-{r}")).await?,
            uid,
            "host {r} kept"
        );
    }
    // A host recreated for a failure takes the new template.
    let agents = env.agent_pids("w", 1);
    assert_eq!(agents.len(), 1, "{agents:?}");
    hostmesh_e2e::signal(agents[0], "KILL")?;
    env.wait_for("World", "w", "host 1 replaced, 2 stale", |s| {
        s["staleHosts"] == 2 && condition_true(s, "Ready")
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let team = |p: &Pod| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("team").cloned())
            .unwrap_or_default()
    };
    let host1 = pods.get("w-host-1").await?;
    assert_ne!(host1.metadata.uid.as_deref(), Some(uids[1].as_str()));
    assert_eq!(team(&host1), "e2e-2", "the new template");
    assert_eq!(pod_uid(&env, "w-host-0").await?, uids[0], "host 0 kept");
    // RollingUpdate: the two stale hosts are recreated, one at a time.
    worlds
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"updatePolicy": {"type": "RollingUpdate", "maxUnavailable": 1}}}),
            ),
        )
        .await?;
    let most_down = std::cell::Cell::new(0usize);
    until(
        "every host on the new template and the World Ready",
        || async {
            let now = host_pods(&env, "w").await?;
            let down = (0..3)
                .filter(|r| {
                    !now.iter().any(|p| {
                        p.metadata.name.as_deref() == Some(&format!("w-host-{r}"))
                            && p.metadata.deletion_timestamp.is_none()
                            && p.status
                                .as_ref()
                                .and_then(|s| s.conditions.as_ref())
                                .is_some_and(|c| {
                                    c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                                })
                    })
                })
                .count();
            most_down.set(most_down.get().max(down));
            let w = worlds.get("w").await?;
            let status = w.data.get("status").cloned().unwrap_or_default();
            Ok(now.len() == 3
                && now.iter().all(|p| team(p) == "e2e-2")
                && status["staleHosts"].is_null()
                && condition_true(&status, "Ready"))
        },
    )
    .await?;
    let most_down = most_down.get();
    assert!(
        most_down <= 1,
        "maxUnavailable 1, but {most_down} hosts were down at once"
    );
    assert_ne!(pod_uid(&env, "w-host-0").await?, uids[0], "host 0 rolled");
    assert_ne!(pod_uid(&env, "w-host-2").await?, uids[2], "host 2 rolled");
    Ok(())
}

/// `restartPolicy.scope: host` on a ProcMesh of extent `[host: 2, gpu: 2]`:
/// rank 2 (host 1, gpu 0) failing once restarts the two ranks of host 1,
/// counted as one restart; host 0's ranks keep their PIDs.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_rank_restarts_only_the_ranks_of_its_host() -> anyhow::Result<()> {
    let env = Env::start("batch-rank-scope").await?;
    let dir = env.shared_dir()?;
    env.apply(&world_yaml("w", &[("host", 2)], "")).await?;
    let go = dir.join("go");
    let failed_once = dir.join("failed-once");
    // Rank 2 fails once, when the test says so; every other run sleeps.
    let command = format!(
        "if [ \"$RANK\" = 2 ] && [ ! -e {once} ]; then while [ ! -e {go} ]; do sleep 0.2; done; touch {once}; exit 1; fi; exec sleep 300",
        once = failed_once.display(),
        go = go.display()
    );
    env.apply(&mesh_yaml(
        "pm",
        "w",
        2,
        &command,
        "  restartPolicy: {policy: OnFailure, scope: host, maxRestarts: 3, backoff: 1s}\n",
    ))
    .await?;
    env.wait_for("ProcMesh", "pm", "Running", |s| s["running"] == 4)
        .await?;
    let rank_pids = |rank: &str| {
        env.proc_pids("w", "pm")
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .unwrap_or_default()
                    .split(|b| *b == 0)
                    .any(|kv| kv == format!("RANK={rank}").as_bytes())
            })
            .collect::<Vec<i32>>()
    };
    let host0 = [rank_pids("0"), rank_pids("1")];
    let rank3 = rank_pids("3");
    assert!(
        host0.iter().all(|p| !p.is_empty()) && !rank3.is_empty(),
        "{host0:?} {rank3:?}"
    );
    std::fs::write(&go, "")?;
    let s = env
        .wait_for("ProcMesh", "pm", "restarted and Running again", |s| {
            s["restarts"].as_u64().unwrap_or(0) >= 1 && s["running"] == 4
        })
        .await?;
    assert_eq!(s["restarts"], 1, "one restart for the host's ranks: {s:#}");
    assert!(failed_once.exists());
    hostmesh_e2e::eventually("rank 3 restarted with rank 2", || {
        let now = rank_pids("3");
        !now.is_empty() && now != rank3
    })
    .await?;
    assert_eq!(
        [rank_pids("0"), rank_pids("1")],
        host0,
        "host 0's ranks kept their PIDs"
    );
    Ok(())
}
