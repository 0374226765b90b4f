//! e2e: the chart and the image through a job's life, as a user installs
//! them: `helm install` with the chart's default values (every namespace;
//! on a cluster's own nodes only the `image` values point at the image
//! loaded there), a World of 2 hosts and a ProcMesh of 2 procs per host, a
//! proc SIGKILLed and seen in status, the operator pod deleted and then a
//! `helm upgrade` with the ProcMesh untouched (same processes, no restart
//! counted, Ready throughout), the World deleted, `helm uninstall` leaving
//! nothing of the release and no Lease held, and a reinstall that leads at
//! once.
//!
//! The install is cluster-wide, so on a real cluster it runs only when the
//! cluster is the test's alone (`HOSTMESH_E2E_EXCLUSIVE=1`, the second run
//! of `.ci/e2e-realk8s.sh`); the embedded cluster always is. The figures it
//! measures (install to a leading operator, kill to status, uninstall to
//! nothing left, reinstall to a leading operator) are recorded
//! ([`hostmesh_e2e::record`]), not asserted.

use std::time::{Duration, Instant};

use hostmesh_e2e::chart::{self, SELECTOR};
use hostmesh_e2e::{Env, WAIT, always_for, condition_true, record, signal, world_yaml};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams};

/// The chart's default `leaderElection.leaseName`.
const LEASE: &str = "hostmesh-operator";

/// The chart's default values, but for the image a cluster's nodes have.
fn default_values(env: &Env) -> serde_json::Value {
    match chart::image_values(env) {
        Some(image) => serde_json::json!({"image": image}),
        None => serde_json::json!({}),
    }
}

/// Names of the release's operator pods that are not being deleted.
async fn live_operator_pods(env: &Env) -> anyhow::Result<Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    Ok(pods
        .list(&ListParams::default().labels(SELECTOR))
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect())
}

/// The holder of the leader Lease, if one holds it.
async fn lease_holder(env: &Env) -> anyhow::Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.namespace);
    Ok(leases
        .get_opt(LEASE)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// Waits until a live operator pod other than `not` holds the Lease, and
/// returns its name.
async fn new_leader(env: &Env, not: Option<&str>) -> anyhow::Result<String> {
    let start = Instant::now();
    loop {
        if let Some(holder) = lease_holder(env).await?
            && Some(holder.as_str()) != not
            && live_operator_pods(env).await?.contains(&holder)
        {
            return Ok(holder);
        }
        anyhow::ensure!(
            start.elapsed() < WAIT,
            "no operator pod other than {not:?} leads: Lease holder {:?}, pods {:?}",
            lease_holder(env).await?,
            live_operator_pods(env).await?
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What is left of the release: a line per kind with objects of it, and
/// the Lease while held.
async fn release_left(env: &Env) -> anyhow::Result<Vec<String>> {
    let lp = ListParams::default().labels(SELECTOR);
    let ns = &env.namespace;
    let c = &env.client;
    let mut left = Vec::new();
    let counts = [
        (
            "Deployment",
            Api::<Deployment>::namespaced(c.clone(), ns)
                .list(&lp)
                .await?
                .items
                .len(),
        ),
        (
            "Pod",
            Api::<Pod>::namespaced(c.clone(), ns)
                .list(&lp)
                .await?
                .items
                .len(),
        ),
        (
            "ServiceAccount",
            Api::<ServiceAccount>::namespaced(c.clone(), ns)
                .list(&lp)
                .await?
                .items
                .len(),
        ),
        (
            "Service",
            Api::<Service>::namespaced(c.clone(), ns)
                .list(&lp)
                .await?
                .items
                .len(),
        ),
        (
            "Role",
            Api::<Role>::namespaced(c.clone(), ns)
                .list(&lp)
                .await?
                .items
                .len(),
        ),
        (
            "RoleBinding",
            Api::<RoleBinding>::namespaced(c.clone(), ns)
                .list(&lp)
                .await?
                .items
                .len(),
        ),
        (
            "ClusterRole",
            Api::<ClusterRole>::all(c.clone())
                .list(&lp)
                .await?
                .items
                .len(),
        ),
        (
            "ClusterRoleBinding",
            Api::<ClusterRoleBinding>::all(c.clone())
                .list(&lp)
                .await?
                .items
                .len(),
        ),
    ];
    for (kind, n) in counts {
        if n > 0 {
            left.push(format!("{n} {kind}"));
        }
    }
    if let Some(holder) = lease_holder(env).await? {
        left.push(format!("Lease {LEASE} held by {holder}"));
    }
    Ok(left)
}

/// Waits until nothing of the release is left.
async fn until_nothing_left(env: &Env) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let left = release_left(env).await?;
        if left.is_empty() {
            return Ok(());
        }
        anyhow::ensure!(
            start.elapsed() < WAIT,
            "left of the release after uninstall: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exclusive_chart_defaults_run_a_job_through_faults_an_upgrade_and_a_reinstall()
-> anyhow::Result<()> {
    let env = Env::start_without_operator("chart-life").await?;
    if env.real_cluster && std::env::var_os("HOSTMESH_E2E_EXCLUSIVE").is_none() {
        #[allow(clippy::print_stderr)]
        {
            eprintln!(
                "skipped: a cluster-wide install needs the cluster to itself (HOSTMESH_E2E_EXCLUSIVE=1)"
            );
        }
        return Ok(());
    }
    let values = default_values(&env);
    let start = Instant::now();
    chart::install(&env, &values)?;
    let leader = new_leader(&env, None).await?;
    record(
        &env,
        "chart_install_to_leading_s",
        start.elapsed().as_secs_f64(),
        "s",
    );

    // A job: a World and a ProcMesh that restarts a failed rank in place.
    env.apply(&world_yaml("job", &[("host", 2)], "")).await?;
    env.apply(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {name: train}\nspec:\n  world: job\n  perHost: [{name: gpu, size: 2}]\n  command: [sleep, '600']\n  restartPolicy: {policy: OnFailure, maxRestarts: 3}\n",
    )
    .await?;
    env.wait_for("ProcMesh", "train", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    let pids = env.proc_pids("job", "train");
    anyhow::ensure!(pids.len() == 4, "4 procs run: {pids:?}");

    // A proc SIGKILLed: status names it, and the rank is back.
    let start = Instant::now();
    signal(pids[0], "KILL")?;
    let status = env
        .wait_for("ProcMesh", "train", "the kill in status", |s| {
            s["firstFailure"]["signal"].as_i64() == Some(9)
        })
        .await?;
    record(
        &env,
        "chart_proc_kill_to_status_s",
        start.elapsed().as_secs_f64(),
        "s",
    );
    let killed_rank = status["firstFailure"]["rank"].clone();
    let status = env
        .wait_for("ProcMesh", "train", "restarted and Ready", |s| {
            s["restarts"] == 1 && condition_true(s, "Ready") && s["running"] == 4
        })
        .await?;
    assert_eq!(status["firstFailure"]["rank"], killed_rank, "{status:#}");
    let mut pids = env.proc_pids("job", "train");
    pids.sort_unstable();
    anyhow::ensure!(pids.len() == 4, "4 procs run again: {pids:?}");

    // From here on, the job is untouched: the same processes, no restart
    // counted, Ready throughout.
    let untouched = async |what: &str, period: Duration| {
        always_for(what, period, async || {
            let mut now = env.proc_pids("job", "train");
            now.sort_unstable();
            let pm = env
                .hostmesh_api("ProcMesh")
                .get("train")
                .await?
                .data
                .get("status")
                .cloned()
                .unwrap_or_default();
            Ok(if now != pids {
                Some(format!("procs {pids:?} became {now:?}"))
            } else if pm["restarts"] != 1 || !condition_true(&pm, "Ready") {
                Some(format!("the ProcMesh changed: {pm:#}"))
            } else {
                None
            })
        })
        .await
    };

    // The operator pod deleted: a new one leads, the job carries on.
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    pods.delete(&leader, &DeleteParams::default()).await?;
    let leader = new_leader(&env, Some(&leader)).await?;
    untouched("after the operator pod's deletion", Duration::from_secs(5)).await?;

    // An upgrade that rolls the operator: the same.
    let mut upgraded = values.clone();
    upgraded["logLevel"] = serde_json::json!("debug");
    chart::upgrade(&env, &upgraded)?;
    new_leader(&env, Some(&leader)).await?;
    untouched("after helm upgrade", Duration::from_secs(5)).await?;

    // The World deleted by the operator that leads now: procs and pods go.
    env.delete("World", "job").await?;
    let worlds = env.hostmesh_api("World");
    let start = Instant::now();
    while worlds.get_opt("job").await?.is_some() || !env.proc_pids("job", "train").is_empty() {
        anyhow::ensure!(start.elapsed() < WAIT, "World job not deleted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Uninstall leaves nothing of the release, no Lease held included.
    let start = Instant::now();
    chart::uninstall(&env)?;
    until_nothing_left(&env).await?;
    record(
        &env,
        "chart_uninstall_to_nothing_left_s",
        start.elapsed().as_secs_f64(),
        "s",
    );

    // A reinstall right away leads without waiting out a stale Lease.
    let start = Instant::now();
    let start_wall = std::time::SystemTime::now();
    chart::install(&env, &values)?;
    let leader = new_leader(&env, None).await?;
    record(
        &env,
        "chart_reinstall_to_leading_s",
        start.elapsed().as_secs_f64(),
        "s",
    );
    // The election itself: from the operator container's start (which
    // the kubelet reports to the second, so this reads up to 1 s long) to
    // the Lease's acquireTime.
    let started = pods
        .get(&leader)
        .await?
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|cs| cs.into_iter().next())
        .and_then(|c| c.state?.running?.started_at);
    let acquired = Api::<Lease>::namespaced(env.client.clone(), &env.namespace)
        .get(LEASE)
        .await?
        .spec
        .and_then(|s| s.acquire_time);
    if let Some(acquired) = &acquired {
        // `helm install` to the Lease taken, without Helm's wait for the
        // Deployment's rollout (the figure above includes it); the node's
        // clock and this process's are the same machine's.
        let taken = std::time::SystemTime::from(acquired.0);
        if let Ok(d) = taken.duration_since(start_wall) {
            record(
                &env,
                "chart_reinstall_to_lease_taken_s",
                d.as_secs_f64(),
                "s",
            );
        }
    }
    if let (Some(started), Some(acquired)) = (started, acquired) {
        let secs = acquired.0.duration_since(started.0).as_secs_f64();
        record(&env, "chart_reinstall_start_to_leading_s", secs, "s");
    }
    env.apply(&world_yaml("again", &[("host", 1)], "")).await?;
    env.wait_for("World", "again", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    env.delete("World", "again").await?;
    let start = Instant::now();
    while worlds.get_opt("again").await?.is_some() {
        anyhow::ensure!(start.elapsed() < WAIT, "World again not deleted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    chart::uninstall(&env)?;
    until_nothing_left(&env).await
}
