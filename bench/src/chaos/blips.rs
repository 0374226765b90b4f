//! The chaos scenarios of the control plane's own faults (issue 30): a
//! network partition of one host shorter than `evictionTimeout`
//! (`partition_short`) and the operator frozen for several
//! `healthTimeout`s (`operator_freeze`), which must cost a running job
//! nothing, and a hung node (`partition_node_hung`), which must cost it one
//! counted restart of that host's ranks and nothing more.
//!
//! The first two end with the same checks: both ProcMesh and World Ready
//! again, no restart of either and no `firstFailure` on the ProcMesh, the
//! same host pods and the same procs (pid per rank) as before the fault.
//! The World may record the partitioned host's expiry as its
//! `firstFailure` (it did expire); after the operator's own pause it
//! records nothing.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use hostmesh_e2e::{Env, Thaw, host_state, signal};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use super::Timing;
use super::fixture::{self, Trail, check, count, mesh_up, until, world_up};

/// World spec lines: a silent host is Expired after 2 s and evicted only
/// after 30 s, far longer than the partition.
const WORLD_SLOW_EVICTION: &str = "  healthTimeout: 2s\n  evictionTimeout: 30s\n  failurePolicy: {action: ReplaceHost, maxRestarts: 3, backoff: 1s}\n";

/// How long host 1 is cut off: three `healthTimeout`s, a fifth of
/// `evictionTimeout`.
const PARTITION: Duration = Duration::from_secs(6);

/// How long the operator is frozen: five `healthTimeout`s.
const FREEZE: Duration = Duration::from_secs(10);

/// Cuts host 1's pod off the network (its veth down) for [`PARTITION`],
/// then restores it. Detect: the fault to the World showing host 1 not
/// Ready; recover: the fault to both Ready again.
pub(crate) async fn partition_short(run: &str) -> anyhow::Result<Timing> {
    let env = fixture::ready_world(run, WORLD_SLOW_EVICTION).await?;
    let before = fixture::ready_mesh(&env).await?;
    let uids = pod_uids(&env).await?;
    let mut trail = Trail::default();
    let t0 = Instant::now();
    env.set_pod_link("w-host-1", false).await?;
    let cut = async {
        let seen = until(
            &env,
            &mut trail,
            "World",
            "w",
            "host 1 not Ready",
            t0,
            |s| host_state(s, 1) != "Ready",
        )
        .await;
        let left = PARTITION.saturating_sub(t0.elapsed());
        tokio::time::sleep(left).await;
        seen
    }
    .await;
    // Restored whatever happened: a run never leaves a pod cut off.
    let restored = env.set_pod_link("w-host-1", true).await;
    let (_, detect) = cut?;
    restored?;
    let recover = nothing_lost(&env, &mut trail, t0, &before, &uids).await?;
    Ok(Timing::measured(detect, recover))
}

/// SIGSTOPs the operator for [`FREEZE`], then SIGCONTs it: it must tell its
/// own pause from silent agents. Recover: the thaw to both seen Ready.
pub(crate) async fn operator_freeze(run: &str) -> anyhow::Result<Timing> {
    let env = fixture::ready_world(run, WORLD_SLOW_EVICTION).await?;
    let before = fixture::ready_mesh(&env).await?;
    let uids = pod_uids(&env).await?;
    let operators = env.operator_pids();
    anyhow::ensure!(operators.len() == 1, "one operator: {operators:?}");
    let mut trail = Trail::default();
    signal(operators[0], "STOP")?;
    tokio::time::sleep(FREEZE).await;
    signal(operators[0], "CONT")?;
    let t0 = Instant::now();
    let recover = nothing_lost(&env, &mut trail, t0, &before, &uids).await?;
    let w = fixture::status(&env, "World", "w").await?;
    check(
        w["firstFailure"].is_null(),
        format!("World firstFailure {}", w["firstFailure"]),
        &trail,
    )?;
    let events = fixture::event_reasons(&env).await?;
    check(
        !events.iter().any(|e| e == "HostExpired"),
        format!("a host expired for the operator's own pause: {events:?}"),
        &trail,
    )?;
    Ok(Timing {
        recover: Some(recover),
        ..Timing::default()
    })
}

/// World spec lines for the hung node: expired after 2 s, evicted after 3 s.
const WORLD_FAST_EVICTION: &str = "  healthTimeout: 2s\n  evictionTimeout: 3s\n  failurePolicy: {action: ReplaceHost, maxRestarts: 3, backoff: 1s}\n";

/// The longest wait for the hung node's pod to be force-deleted: the fence
/// timeout (60 s at least) and a reconcile after it.
const FORCE_DELETE_BOUND: Duration = Duration::from_secs(240);

/// Cuts host 1's pod off the network and SIGSTOPs the kubelet (a hung
/// node: the pod goes `Terminating` and no kubelet confirms it). Detect:
/// the fault to the old pod object gone (force-deleted once its agent must
/// have fenced itself); its procs must be gone by then, with a
/// `HostPodForceDeleted` Event. Then the kubelet is thawed. Recover: the
/// fault to both Ready again, the ProcMesh with exactly one restart.
pub(crate) async fn partition_node_hung(run: &str) -> anyhow::Result<Timing> {
    let env = fixture::ready_world(run, WORLD_FAST_EVICTION).await?;
    let before = fixture::ready_mesh(&env).await?;
    let kubelet = env
        .kubelet_pid()
        .context("the suite's own process kubelet (not a real cluster's node)")?;
    let old_uid = fixture::pod_uid(&env, "w-host-1").await?;
    // Host 1's procs: ranks 2 and 3 (2 per host).
    let old_procs: Vec<i32> = before
        .iter()
        .filter(|(rank, _)| **rank >= 2)
        .map(|(_, pid)| *pid)
        .collect();
    let mut trail = Trail::default();
    let t0 = Instant::now();
    env.set_pod_link("w-host-1", false).await?;
    signal(kubelet, "STOP")?;
    let thaw = Thaw(kubelet);
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let gone = hostmesh_testkit::wait::poll(FORCE_DELETE_BOUND, async || {
        match pods.get_opt("w-host-1").await {
            Ok(Some(p)) if p.metadata.uid.as_deref() == Some(old_uid.as_str()) => Err(()),
            Ok(_) => Ok(t0.elapsed().as_secs_f64()),
            Err(_) => Err(()),
        }
    })
    .await;
    let outlived: Vec<i32> = old_procs
        .iter()
        .copied()
        .filter(|p| !hostmesh_testkit::process::gone(u32::try_from(*p).unwrap_or(0)))
        .collect();
    drop(thaw);
    let detect = gone.map_err(|()| {
        anyhow::anyhow!("w-host-1 was not force-deleted in {FORCE_DELETE_BOUND:?}")
    })?;
    check(
        outlived.is_empty(),
        format!("the old pod's procs {outlived:?} outlived its force-deletion"),
        &trail,
    )?;
    let events = fixture::event_reasons(&env).await?;
    check(
        events.iter().any(|e| e == "HostPodForceDeleted"),
        format!("no HostPodForceDeleted Event: {events:?}"),
        &trail,
    )?;
    // The link of the new pod is up (a new veth); the old one went with it.
    let (_, world_back) = until(
        &env,
        &mut trail,
        "World",
        "w",
        "Running again",
        t0,
        world_up,
    )
    .await?;
    let (pm, mesh_back) = until(
        &env,
        &mut trail,
        "ProcMesh",
        "pm",
        "Ready again, one restart",
        t0,
        |s| mesh_up(s) && count(s, "restarts") >= 1,
    )
    .await?;
    check(
        count(&pm, "restarts") == 1,
        format!(
            "ProcMesh restarts {} (one hung host is one restart)",
            pm["restarts"]
        ),
        &trail,
    )?;
    Ok(Timing::measured(detect, world_back.max(mesh_back)))
}

async fn pod_uids(env: &Env) -> anyhow::Result<[String; 2]> {
    Ok([
        fixture::pod_uid(env, "w-host-0").await?,
        fixture::pod_uid(env, "w-host-1").await?,
    ])
}

/// Both Ready again with nothing counted, failed or replaced; returns the
/// seconds from `t0` to both Ready.
async fn nothing_lost(
    env: &Env,
    trail: &mut Trail,
    t0: Instant,
    before: &std::collections::BTreeMap<u64, i32>,
    uids: &[String; 2],
) -> anyhow::Result<f64> {
    let (w, world_back) = until(env, trail, "World", "w", "Running again", t0, world_up).await?;
    let (pm, mesh_back) = until(env, trail, "ProcMesh", "pm", "Ready again", t0, mesh_up).await?;
    check(
        count(&w, "restarts") == 0,
        format!("World restarts {}", w["restarts"]),
        trail,
    )?;
    check(
        count(&pm, "restarts") == 0 && pm["firstFailure"].is_null(),
        format!(
            "ProcMesh restarts {}, firstFailure {}",
            pm["restarts"], pm["firstFailure"]
        ),
        trail,
    )?;
    check(
        !trail.saw_phase("World", "Failed") && !trail.saw_phase("ProcMesh", "Failed"),
        "Failed on the way",
        trail,
    )?;
    for (i, uid) in uids.iter().enumerate() {
        check(
            fixture::pod_uid(env, &format!("w-host-{i}")).await? == *uid,
            format!("host {i}'s pod was replaced"),
            trail,
        )?;
    }
    let after = fixture::procs_by_rank(env).await?;
    check(
        &after == before,
        format!("procs restarted: {before:?} -> {after:?}"),
        trail,
    )?;
    Ok(world_back.max(mesh_back))
}
