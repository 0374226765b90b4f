//! The chaos scenarios that hit one component of a running World: a proc,
//! an agent (killed or frozen), a host pod, the operator (mid-spawn and long
//! after) and the agent Secret.
//!
//! Each runs on a fresh [`fixture`] cluster, injects its one fault, and
//! fails with the reason when the final state, the counters or the status
//! trail are not what `docs/api.md` promises. Every wait is bounded; the
//! only processes signalled are the run's own (found through its
//! namespace's agents).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hostmesh_e2e::{Env, always_for, condition_true, host_state, signal};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams};

use super::Timing;
use super::fixture::{
    self, BOUND, PROCS, SPAWN_TIMEOUT, Trail, WORLD, WORLD_FAST_EXPIRY, check, count, mesh_up,
    until, world_up,
};

/// SIGKILL one proc under `OnFailure`: one restart, `firstFailure` names
/// the rank and SIGKILL, Ready again with a new pid; nothing else moved.
pub(crate) async fn proc_kill(run: &str) -> anyhow::Result<Timing> {
    let env = fixture::ready_world(run, WORLD).await?;
    let before = fixture::ready_mesh(&env).await?;
    let (&rank, &victim) = before.iter().next().context("no proc")?;
    let mut trail = Trail::default();
    let t0 = Instant::now();
    signal(victim, "KILL")?;
    let (_, detect) = until(
        &env,
        &mut trail,
        "ProcMesh",
        "pm",
        "firstFailure",
        t0,
        |s| !s["firstFailure"].is_null(),
    )
    .await?;
    let (s, recover) = until(&env, &mut trail, "ProcMesh", "pm", "Ready again", t0, |s| {
        count(s, "restarts") >= 1 && mesh_up(s)
    })
    .await?;
    check(
        count(&s, "restarts") == 1,
        format!("restarts {}, want 1", s["restarts"]),
        &trail,
    )?;
    let ff = &s["firstFailure"];
    check(
        ff["rank"] == rank && ff["signal"] == 9 && ff["state"] == "Killed",
        format!("firstFailure {ff}, want rank {rank}, signal 9, Killed"),
        &trail,
    )?;
    check(
        ff["reason"].as_str().is_some_and(|r| r.contains("SIGKILL")),
        format!("firstFailure.reason {} does not name SIGKILL", ff["reason"]),
        &trail,
    )?;
    let after = fixture::procs_by_rank(&env).await?;
    check(
        after[&rank] != victim,
        format!("rank {rank} still has pid {victim}"),
        &trail,
    )?;
    for (r, p) in &before {
        check(
            *r == rank || after[r] == *p,
            format!("rank {r} was restarted too: {p} -> {}", after[r]),
            &trail,
        )?;
    }
    let w = fixture::status(&env, "World", "w").await?;
    check(
        world_up(&w) && count(&w, "restarts") == 0,
        format!("World moved: {w}"),
        &trail,
    )?;
    let events = fixture::event_reasons(&env).await?;
    check(
        events.iter().any(|e| e == "ProcFailed"),
        format!("no ProcFailed Event: {events:?}"),
        &trail,
    )?;
    Ok(Timing::measured(detect, recover))
}

/// How host 1 is lost.
#[derive(Clone, Copy, Debug)]
pub(crate) enum HostFault {
    /// SIGKILL its agent.
    Kill,
    /// SIGSTOP its agent past `evictionTimeout`.
    Stop,
    /// Delete its pod.
    DeletePod,
}

/// Loses host 1 and checks that it is replaced (host 0 untouched), the
/// World is Running again and the ProcMesh Ready with one restart (one
/// incident, however many ranks it cost).
pub(crate) async fn host_lost(run: &str, fault: HostFault) -> anyhow::Result<Timing> {
    let spec = match fault {
        HostFault::Stop => WORLD_FAST_EXPIRY,
        HostFault::Kill | HostFault::DeletePod => WORLD,
    };
    let env = fixture::ready_world(run, spec).await?;
    let before = fixture::ready_mesh(&env).await?;
    let uids = [
        fixture::pod_uid(&env, "w-host-0").await?,
        fixture::pod_uid(&env, "w-host-1").await?,
    ];
    let agents = env.agent_pids("w", 1);
    anyhow::ensure!(agents.len() == 1, "one agent for host 1: {agents:?}");
    let agent = agents[0];
    let mut trail = Trail::default();
    let t0 = Instant::now();
    let _thaw = match fault {
        HostFault::Kill => {
            signal(agent, "KILL")?;
            None
        }
        HostFault::Stop => {
            signal(agent, "STOP")?;
            Some(Thaw::new(&env, agent))
        }
        HostFault::DeletePod => {
            let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
            pods.delete("w-host-1", &DeleteParams::default()).await?;
            None
        }
    };
    let (_, detect) = match fault {
        HostFault::Stop => {
            until(&env, &mut trail, "World", "w", "host 1 Expired", t0, |s| {
                host_state(s, 1) == "Expired"
            })
            .await?
        }
        HostFault::Kill | HostFault::DeletePod => {
            until(&env, &mut trail, "World", "w", "host 1 lost", t0, |s| {
                host_state(s, 1) != "Ready" || count(s, "restarts") >= 1 || !world_up(s)
            })
            .await?
        }
    };
    // A deleted pod is recreated without a restart of the World (nothing
    // failed); a dead or expired host is a restart.
    let world_restarts = match fault {
        HostFault::DeletePod => 0,
        HostFault::Kill | HostFault::Stop => 1,
    };
    let (pm, mesh_back) = until(&env, &mut trail, "ProcMesh", "pm", "Ready again", t0, |s| {
        count(s, "restarts") >= 1 && mesh_up(s)
    })
    .await?;
    let (w, world_back) = until(&env, &mut trail, "World", "w", "Running again", t0, |s| {
        count(s, "restarts") >= world_restarts && world_up(s)
    })
    .await?;
    check(
        count(&w, "restarts") == world_restarts,
        format!("World restarts {}, want {world_restarts}", w["restarts"]),
        &trail,
    )?;
    check(
        count(&pm, "restarts") == 1,
        format!(
            "ProcMesh restarts {}, want 1 (one incident)",
            pm["restarts"]
        ),
        &trail,
    )?;
    check(
        pm["firstFailure"]["host"] == 1,
        format!("firstFailure {} does not name host 1", pm["firstFailure"]),
        &trail,
    )?;
    check(
        trail.saw_phase("World", "Degraded"),
        "the World never showed Degraded while it lost a host",
        &trail,
    )?;
    check(
        !trail.saw_phase("World", "Failed") && !trail.saw_phase("ProcMesh", "Failed"),
        "Failed on the way",
        &trail,
    )?;
    check(
        fixture::pod_uid(&env, "w-host-0").await? == uids[0],
        "host 0's pod was replaced too",
        &trail,
    )?;
    check(
        fixture::pod_uid(&env, "w-host-1").await? != uids[1],
        "host 1's pod was not replaced",
        &trail,
    )?;
    // One live proc per rank: no rank runs twice (a frozen agent's procs
    // alongside the replacement's) and host 0's procs were left alone.
    let after = fixture::procs_by_rank(&env).await?;
    for (r, p) in &before {
        let on_host_0 = *r < (PROCS as u64) / 2;
        check(
            !on_host_0 || after[r] == *p,
            format!("host 0's rank {r} was restarted: {p} -> {}", after[r]),
            &trail,
        )?;
    }
    let now = env.agent_pids("w", 1);
    check(
        now.len() == 1 && now[0] != agent,
        format!("host 1's agents after replacement: {now:?} (old {agent})"),
        &trail,
    )?;
    if matches!(fault, HostFault::Stop) {
        let events = fixture::event_reasons(&env).await?;
        check(
            events.iter().any(|e| e == "HostExpired"),
            format!("no HostExpired Event: {events:?}"),
            &trail,
        )?;
    }
    Ok(Timing::measured(detect, world_back.max(mesh_back)))
}

/// SIGCONTs a frozen agent when dropped, if it still exists: a run never
/// leaves a stopped process behind, whatever its outcome.
struct Thaw {
    pid: i32,
    namespace: String,
}

impl Thaw {
    fn new(env: &Env, pid: i32) -> Thaw {
        Thaw {
            pid,
            namespace: env.namespace.clone(),
        }
    }
}

impl Drop for Thaw {
    fn drop(&mut self) {
        // Only the same process: an agent of this run's namespace.
        if fixture::proc_env(self.pid, "HOSTMESH_NAMESPACE").as_deref() == Some(&self.namespace) {
            let _ = signal(self.pid, "CONT");
        }
    }
}

/// When the operator is killed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OperatorFault {
    /// As soon as the first proc of `pm` exists.
    MidSpawn,
    /// Twice `spawnTimeout` after `pm` is Ready.
    Late,
}

/// kill -9 the operator and start a new one: `pm` ends Running with one
/// proc per rank (the same ones when killed late), no restart and no
/// failure; the new operator then restarts a killed proc (it is in charge,
/// not merely absent).
pub(crate) async fn operator_kill(run: &str, when: OperatorFault) -> anyhow::Result<Timing> {
    let mut env = fixture::ready_world(run, WORLD).await?;
    let mut trail = Trail::default();
    let before = match when {
        OperatorFault::MidSpawn => {
            env.apply(&fixture::mesh_yaml()).await?;
            hostmesh_testkit::wait::poll(BOUND, async || {
                (!env.proc_pids("w", "pm").is_empty())
                    .then_some(())
                    .ok_or(())
            })
            .await
            .map_err(|()| anyhow::anyhow!("no proc of pm started in {BOUND:?}"))?;
            None
        }
        OperatorFault::Late => {
            let pids = fixture::ready_mesh(&env).await?;
            // The fault needs the time to pass: past spawnTimeout.
            tokio::time::sleep(SPAWN_TIMEOUT * 2).await;
            Some(pids)
        }
    };
    let t0 = Instant::now();
    env.kill_operator();
    env.start_operator()?;
    let (_, recover) = until(&env, &mut trail, "ProcMesh", "pm", "Ready", t0, mesh_up).await?;
    let api = env.hostmesh_api("ProcMesh");
    always_for(
        "pm stays Running with no restart and no failure after the takeover",
        Duration::from_secs(8),
        async || {
            let s = api.get("pm").await?.data["status"].clone();
            let bad = !mesh_up(&s) || count(&s, "restarts") != 0 || !s["firstFailure"].is_null();
            Ok(bad.then(|| s.to_string()))
        },
    )
    .await?;
    let w = fixture::status(&env, "World", "w").await?;
    check(
        world_up(&w) && count(&w, "restarts") == 0,
        format!("the World moved: {w}"),
        &trail,
    )?;
    let after = fixture::procs_by_rank(&env).await?;
    if let Some(before) = before {
        check(
            after == before,
            format!("procs changed: {before:?} -> {after:?}"),
            &trail,
        )?;
    }
    new_operator_acts(&env, &mut trail, &after).await?;
    Ok(match when {
        OperatorFault::MidSpawn => Timing {
            recover: Some(recover),
            ..Timing::default()
        },
        OperatorFault::Late => Timing::default(),
    })
}

/// The running operator is in charge: a proc SIGKILLed now is restarted
/// (one restart, Ready again).
async fn new_operator_acts(
    env: &Env,
    trail: &mut Trail,
    procs: &BTreeMap<u64, i32>,
) -> anyhow::Result<()> {
    let (_, &pid) = procs.iter().next().context("no proc")?;
    signal(pid, "KILL")?;
    let t = Instant::now();
    let (s, _) = until(
        env,
        trail,
        "ProcMesh",
        "pm",
        "the killed proc restarted",
        t,
        |s| count(s, "restarts") >= 1 && mesh_up(s),
    )
    .await?;
    check(
        count(&s, "restarts") == 1,
        format!("restarts {} after one kill, want 1", s["restarts"]),
        trail,
    )
}

/// Delete the agent Secret, then kill -9 and restart the operator: the
/// Secret comes back with the same token (Event `AgentSecretRestored`), the
/// World stays Running with its hosts (expiry is 2 s, so an operator that
/// could not authenticate would show), no pod is replaced, and the new
/// operator still drives the agents.
pub(crate) async fn secret_delete(run: &str) -> anyhow::Result<Timing> {
    let mut env = fixture::ready_world(run, WORLD_FAST_EXPIRY).await?;
    let procs = fixture::ready_mesh(&env).await?;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.namespace);
    let token = token_of(&secrets.get("w-agent").await?);
    anyhow::ensure!(!token.is_empty(), "w-agent has no token");
    let uids = [
        fixture::pod_uid(&env, "w-host-0").await?,
        fixture::pod_uid(&env, "w-host-1").await?,
    ];
    let mut trail = Trail::default();
    let t0 = Instant::now();
    secrets.delete("w-agent", &DeleteParams::default()).await?;
    env.kill_operator();
    env.start_operator()?;
    // Reconcile now rather than at the steady requeue.
    let nudge = serde_json::json!({"metadata": {"annotations": {"chaos.hostmesh.dev/nudge": "1"}}});
    env.hostmesh_api("World")
        .patch("w", &PatchParams::default(), &Patch::Merge(&nudge))
        .await?;
    let restored = hostmesh_testkit::wait::poll(BOUND, async || {
        let events = fixture::event_reasons(&env).await.map_err(|_| ())?;
        events
            .iter()
            .any(|e| e == "AgentSecretRestored")
            .then_some(())
            .ok_or(())
    })
    .await;
    check(restored.is_ok(), "no AgentSecretRestored Event", &trail)?;
    let detect = t0.elapsed().as_secs_f64();
    let back = hostmesh_testkit::wait::poll(BOUND, async || {
        secrets.get_opt("w-agent").await.ok().flatten().ok_or(())
    })
    .await
    .map_err(|()| anyhow::anyhow!("w-agent not recreated in {BOUND:?}"))?;
    let recover = t0.elapsed().as_secs_f64();
    check(
        token_of(&back) == token,
        "w-agent came back with another token",
        &trail,
    )?;
    // Watched for a while (past healthTimeout and evictionTimeout); the
    // first status off Running is kept, and the run goes on to say whether
    // the World came back and whether hosts were replaced.
    let api = env.hostmesh_api("World");
    let mut first_off: Option<(f64, serde_json::Value)> = None;
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(8) {
        let s = api.get("w").await?.data["status"].clone();
        trail.record("World", &s);
        if first_off.is_none() && (!world_up(&s) || count(&s, "restarts") != 0) {
            first_off = Some((t0.elapsed().as_secs_f64(), s));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut replaced = Vec::new();
    for (rank, uid) in uids.iter().enumerate() {
        if &fixture::pod_uid(&env, &format!("w-host-{rank}")).await? != uid {
            replaced.push(rank);
        }
    }
    if let Some((at, s)) = first_off {
        let now = fixture::status(&env, "World", "w").await?;
        check(
            false,
            format!(
                "the World left Running {at:.2} s after the fault: {}; {}; 8 s later it is {} ({}), restarts {}, hosts replaced {replaced:?}",
                s["conditions"], s["hosts"], now["phase"], now["ready"], now["restarts"]
            ),
            &trail,
        )?;
    }
    check(
        replaced.is_empty(),
        format!("hosts {replaced:?} were replaced"),
        &trail,
    )?;
    let pm = fixture::status(&env, "ProcMesh", "pm").await?;
    check(
        mesh_up(&pm) && count(&pm, "restarts") == 0 && condition_true(&pm, "Ready"),
        format!("ProcMesh moved: {pm}"),
        &trail,
    )?;
    check(
        fixture::procs_by_rank(&env).await? == procs,
        "procs changed",
        &trail,
    )?;
    new_operator_acts(&env, &mut trail, &procs).await?;
    Ok(Timing::measured(detect, recover))
}

fn token_of(s: &Secret) -> Vec<u8> {
    s.data
        .as_ref()
        .and_then(|d| d.get("token"))
        .map(|t| t.0.clone())
        .unwrap_or_default()
}
