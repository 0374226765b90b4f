//! The real World and ProcMesh controllers against the embedded API server
//! (in process, HTTPS on loopback), with simulated agents behind the hub:
//! the test plays the kubelet by writing pod status, the agents by pushing
//! proc states.

use std::collections::BTreeMap;
use std::time::Duration;

use hostmesh_crds::{ProcMesh, World};
use hostmesh_operator::hub::protocol::ProcPhase;
use hostmesh_operator::hub::sim::{SimConnector, SimRequest};
use hostmesh_operator::hub::{HostKey, WorldKey};
use hostmesh_testkit::eventually_async;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};

mod support;

use support::{Cluster, NS, WORLD, cond, running_world, running_world_from};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn world_gets_pods_service_secret_and_becomes_running_with_agents() {
    let c = Cluster::start().await;
    c.apply_yaml(WORLD).await;
    let pods = c.api::<Pod>();
    let list = eventually_async("two host pods", || async {
        let l = pods
            .list(&ListParams::default().labels("hostmesh.dev/world=w"))
            .await
            .ok()?;
        (l.items.len() == 2).then_some(l)
    })
    .await;
    for p in &list.items {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("team").map(String::as_str), Some("t"));
        assert!(labels.contains_key("hostmesh.dev/rank"));
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "World");
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(
            spec.init_containers.as_ref().unwrap()[0].image.as_deref(),
            Some("agent:test")
        );
    }
    let svc = c.api::<Service>().get("w").await.unwrap();
    assert_eq!(svc.spec.unwrap().cluster_ip.as_deref(), Some("None"));
    let secret = c.api::<Secret>().get("w-agent").await.unwrap();
    // 32 random bytes as hex: text with no whitespace the agent would trim.
    let token = secret.data.unwrap()["token"].0.clone();
    assert_eq!(token.len(), 64);
    assert!(token.iter().all(u8::is_ascii_hexdigit), "{token:?}");

    let worlds = c.api::<World>();
    let s = eventually_async("status Creating 0/2", || async {
        let s = worlds.get("w").await.ok()?.status?;
        (s.ready.as_deref() == Some("0/2")).then_some(s)
    })
    .await;
    assert_eq!(s.phase, Some(hostmesh_crds::world::WorldPhase::Creating));
    assert_eq!(cond(&s.conditions, "Ready").unwrap().0, "False");

    // Pods become Ready; the agents answer (simulated): Running.
    c.pod_ready("w-host-0", "127.0.9.1").await;
    c.pod_ready("w-host-1", "127.0.9.2").await;
    let s = eventually_async("World Running", || async {
        let s = worlds.get("w").await.ok()?.status?;
        (s.phase == Some(hostmesh_crds::world::WorldPhase::Running)).then_some(s)
    })
    .await;
    assert_eq!(s.ready.as_deref(), Some("2/2"));
    assert_eq!(cond(&s.conditions, "Ready").unwrap().0, "True");
    // Every agent got the address book.
    let host0 = HostKey {
        world: WorldKey {
            namespace: NS.into(),
            name: "w".into(),
        },
        rank: 0,
    };
    eventually_async("the address book sent to host 0", || async {
        c.sim
            .requests_of(&host0)
            .iter()
            .any(|r| matches!(r, SimRequest::Book(_)))
            .then_some(())
    })
    .await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn procmesh_runs_fails_with_root_cause_and_deletion_stops_procs() {
    let c = Cluster::start().await;
    running_world(&c).await;
    c.apply_yaml(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {name: pm, namespace: ctl}\n\
         spec: {world: w, perHost: [{name: gpu, size: 2}], command: [sleep, '300']}\n",
    )
    .await;
    let meshes = c.api::<ProcMesh>();
    let s = eventually_async("ProcMesh Running", || async {
        let s = meshes.get("pm").await.ok()?.status?;
        (s.running == 4).then_some(s)
    })
    .await;
    assert_eq!(s.extent.as_deref(), Some("host=2,gpu=2"));
    assert_eq!(cond(&s.conditions, "Ready").unwrap().0, "True");

    // Rank 3 (host 1) exits 3 with a message on stderr.
    let pm = meshes.get("pm").await.unwrap();
    let world = c.api::<World>().get("w").await.unwrap();
    let id = hostmesh_operator::controllers::procmesh::desired::mesh_id(&pm, &world);
    let host1 = HostKey {
        world: WorldKey {
            namespace: NS.into(),
            name: "w".into(),
        },
        rank: 1,
    };
    let name = format!("{id}.3");
    let failed = ProcPhase::Stopped {
        exit_code: 3,
        stderr_tail: vec!["boom: out of memory".into()],
    };
    let push = c
        .sim
        .set_status(&host1, &name, failed)
        .expect("proc exists on host 1");
    c.ctx.hub.push_sender().send(push).await.unwrap();
    let s = eventually_async("first failure", || async {
        let s = meshes.get("pm").await.ok()?.status?;
        s.first_failure.is_some().then_some(s)
    })
    .await;
    let ff = s.first_failure.unwrap();
    assert_eq!((ff.rank, ff.host, ff.exit_code), (3, 1, Some(3)));
    assert!(ff.stderr_tail.unwrap().contains("boom"));
    assert_eq!(
        s.phase,
        Some(hostmesh_crds::procmesh::ProcMeshPhase::Failed)
    );

    // Deleting the World deletes the ProcMesh first, which stops its procs.
    c.api::<World>()
        .delete("w", &DeleteParams::default())
        .await
        .unwrap();
    eventually_async("World and ProcMesh gone", || async {
        let w = c.api::<World>().get_opt("w").await.ok()?;
        let m = meshes.get_opt("pm").await.ok()?;
        (w.is_none() && m.is_none()).then_some(())
    })
    .await;
    let stops = c
        .sim
        .requests_of(&host1)
        .into_iter()
        .filter(|r| matches!(r, SimRequest::Stop(_)))
        .count();
    assert!(stops >= 1, "procs on host 1 were stopped");
    c.shutdown().await;
}

/// A runtime-aware ProcMesh: its procs are asked to check in, and an actor
/// failure its agent reports reaches `status.actorFailures` and an Event,
/// while the rank keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_failure_in_a_runtime_aware_proc_reaches_status() {
    let c = Cluster::start().await;
    running_world(&c).await;
    c.apply_yaml(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {name: pm, namespace: ctl}\n\
         spec: {world: w, perHost: [{name: gpu, size: 2}], command: [hostmesh-echo-proc], runtimeAware: true, spawnTimeout: 45s}\n",
    )
    .await;
    let meshes = c.api::<ProcMesh>();
    eventually_async("ProcMesh Running", || async {
        let s = meshes.get("pm").await.ok()?.status?;
        (s.running == 4).then_some(())
    })
    .await;
    let host1 = HostKey {
        world: WorldKey {
            namespace: NS.into(),
            name: "w".into(),
        },
        rank: 1,
    };
    // The procs' runtime addresses are published for clients, beside the
    // name of the Secret holding the runtime key.
    let cms = c.api::<k8s_openapi::api::core::v1::ConfigMap>();
    let cm = eventually_async("the runtime addresses ConfigMap", || async {
        let cm = cms.get_opt("pm-runtime").await.ok()??;
        let lines = cm.data.as_ref()?.get("addresses")?.lines().count();
        (lines == 4).then_some(cm)
    })
    .await;
    let data = cm.data.clone().unwrap();
    let ranks: Vec<&str> = data["addresses"]
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(r, _)| r))
        .collect();
    assert_eq!(ranks, ["0", "1", "2", "3"]);
    assert!(
        data["addresses"].lines().all(|l| l.contains(" tcp:")),
        "{data:?}"
    );
    assert_eq!(data["credentials"], "w-runtime");
    assert_eq!(data["extent"], "host=2,gpu=2");
    assert_eq!(
        cm.metadata.owner_references.as_ref().unwrap()[0].kind,
        "ProcMesh"
    );
    let spec = c
        .sim
        .requests_of(&host1)
        .into_iter()
        .find_map(|r| match r {
            SimRequest::Create(req) => Some(req.spec),
            _ => None,
        })
        .unwrap();
    assert!(
        spec.runtime_aware,
        "the agent is told to wait for a check-in"
    );
    assert_eq!(spec.spawn_timeout_ms, Some(45_000));

    let pm = meshes.get("pm").await.unwrap();
    let world = c.api::<World>().get("w").await.unwrap();
    let id = hostmesh_operator::controllers::procmesh::desired::mesh_id(&pm, &world);
    let push = c
        .sim
        .fail_actor(
            &host1,
            &format!("{id}.3"),
            "tcp:10.0.0.2:4000/pm.3/trainer[0]",
            "handler failed: CUDA error",
        )
        .expect("proc exists on host 1");
    c.ctx.hub.push_sender().send(push).await.unwrap();
    let s = eventually_async("the actor failure in status", || async {
        let s = meshes.get("pm").await.ok()?.status?;
        (!s.actor_failures.is_empty()).then_some(s)
    })
    .await;
    let f = &s.actor_failures[0];
    assert_eq!((f.rank, f.host, f.count), (3, 1, 1));
    assert!(f.actor.ends_with("trainer[0]"), "{f:?}");
    assert!(f.reason.contains("CUDA error"), "{f:?}");
    assert_eq!(s.running, 4, "an actor failure does not fail its rank");
    assert_eq!(
        s.phase,
        Some(hostmesh_crds::procmesh::ProcMeshPhase::Running)
    );
    let events = c.api::<k8s_openapi::api::core::v1::Event>();
    eventually_async("an ActorFailed Event", || async {
        let l = events.list(&Default::default()).await.ok()?;
        l.items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("ActorFailed")
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.contains("trainer[0]"))
            })
            .map(|_| ())
    })
    .await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_host_is_replaced_and_counted() {
    let c = Cluster::start().await;
    running_world(&c).await;
    let pods = c.api::<Pod>();
    let old = pods.get("w-host-1").await.unwrap().metadata.uid;
    let evicted =
        serde_json::json!({"status": {"phase": "Failed", "reason": "Evicted", "conditions": []}});
    pods.patch_status("w-host-1", &PatchParams::default(), &Patch::Merge(&evicted))
        .await
        .unwrap();
    let worlds = c.api::<World>();
    let s = eventually_async("restart counted", || async {
        let s = worlds.get("w").await.ok()?.status?;
        (s.restarts == 1).then_some(s)
    })
    .await;
    let degraded = cond(&s.conditions, "Degraded");
    assert!(degraded.is_some());
    eventually_async("host 1 recreated", || async {
        let p = pods.get_opt("w-host-1").await.ok()??;
        (p.metadata.uid != old).then_some(())
    })
    .await;
    c.pod_ready("w-host-1", "127.0.9.3").await;
    eventually_async("Running again", || async {
        let s = worlds.get("w").await.ok()?.status?;
        (s.phase == Some(hostmesh_crds::world::WorldPhase::Running)).then_some(())
    })
    .await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_procmesh_names_the_field() {
    let c = Cluster::start().await;
    c.apply_yaml(WORLD).await;
    c.apply_yaml(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {name: clash, namespace: ctl}\n\
         spec: {world: w, perHost: [{name: host, size: 2}], command: [sleep, '1']}\n",
    )
    .await;
    c.apply_yaml(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {name: orphan, namespace: ctl}\n\
         spec: {world: nowhere, command: [sleep, '1']}\n",
    )
    .await;
    let meshes = c.api::<ProcMesh>();
    let msgs: BTreeMap<&str, String> = {
        let mut out = BTreeMap::new();
        for name in ["clash", "orphan"] {
            let m = eventually_async("Failed condition", || async {
                let s = meshes.get(name).await.ok()?.status?;
                cond(&s.conditions, "Failed")
                    .filter(|(st, _)| st == "True")
                    .map(|(_, m)| m)
            })
            .await;
            out.insert(name, m);
        }
        out
    };
    assert!(
        msgs["clash"].contains("spec.perHost[0].name"),
        "{}",
        msgs["clash"]
    );
    assert!(
        msgs["orphan"].contains("spec.world") && msgs["orphan"].contains("nowhere"),
        "{}",
        msgs["orphan"]
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_agent_expires_degrades_the_world_and_its_host_is_replaced() {
    let c = Cluster::start_with(SimConnector::with_heartbeat(Duration::from_millis(200))).await;
    running_world_from(
        &c,
        &format!(
            "{WORLD}  healthTimeout: 1s\n  evictionTimeout: 1s\n  failurePolicy: {{action: ReplaceHost, maxRestarts: 2, backoff: 1s}}\n"
        ),
    )
    .await;
    let pods = c.api::<Pod>();
    let worlds = c.api::<World>();
    let old = pods.get("w-host-1").await.unwrap().metadata.uid.unwrap();
    let untouched = pods.get("w-host-0").await.unwrap().metadata.uid;
    c.sim.kill(&old);
    let s = eventually_async("host 1 Expired", || async {
        let s = worlds.get("w").await.ok()?.status?;
        let expired = hostmesh_crds::runs::get(&s.hosts, 1)
            .is_some_and(|h| h.state == hostmesh_crds::world::HostState::Expired);
        expired.then_some(s)
    })
    .await;
    assert_eq!(s.phase, Some(hostmesh_crds::world::WorldPhase::Degraded));
    assert!(s.degraded_since.is_some());
    eventually_async("host 1 replaced", || async {
        let p = pods.get_opt("w-host-1").await.ok()??;
        (p.metadata.uid.as_deref() != Some(old.as_str())).then_some(())
    })
    .await;
    c.pod_ready("w-host-1", "127.0.9.3").await;
    let s = eventually_async("Running again", || async {
        let s = worlds.get("w").await.ok()?.status?;
        (s.phase == Some(hostmesh_crds::world::WorldPhase::Running)).then_some(s)
    })
    .await;
    assert_eq!(s.restarts, 1);
    assert!(s.degraded_since.is_none());
    assert_eq!(
        pods.get("w-host-0").await.unwrap().metadata.uid,
        untouched,
        "host 0 left alone"
    );
    c.shutdown().await;
}

fn creates(c: &Cluster) -> usize {
    (0..2)
        .map(|r| {
            let host = HostKey {
                world: WorldKey {
                    namespace: NS.into(),
                    name: "w".into(),
                },
                rank: r,
            };
            c.sim
                .requests_of(&host)
                .into_iter()
                .filter(|q| matches!(q, SimRequest::Create(_)))
                .count()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_rebuilds_from_agents_without_duplicates() {
    let mut c = Cluster::start_with(SimConnector::with_heartbeat(Duration::from_millis(200))).await;
    running_world(&c).await;
    c.apply_yaml(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {name: pm, namespace: ctl}\n\
         spec: {world: w, perHost: [{name: gpu, size: 2}], command: [sleep, '300']}\n",
    )
    .await;
    let meshes = c.api::<ProcMesh>();
    eventually_async("ProcMesh Running", || async {
        let s = meshes.get("pm").await.ok()?.status?;
        (s.running == 4).then_some(())
    })
    .await;
    assert_eq!(creates(&c), 4, "one request per proc");
    c.restart_operator().await;
    // The new operator reconnects, reads the agents' snapshots and keeps
    // everything as it is.
    let worlds = c.api::<World>();
    eventually_async("agents reconnected", || async {
        let host = HostKey {
            world: WorldKey {
                namespace: NS.into(),
                name: "w".into(),
            },
            rank: 1,
        };
        let uid = c.api::<Pod>().get("w-host-1").await.ok()?.metadata.uid?;
        (c.ctx.hub.liveness(&host.world, 1, &uid) == hostmesh_operator::hub::Liveness::Alive)
            .then_some(())
    })
    .await;
    // Several reconciles later, still Running, still 4 creates in all.
    for _ in 0..3 {
        let pm = meshes.get("pm").await.unwrap();
        c.api::<ProcMesh>()
            .patch("pm", &PatchParams::default(), &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"poke": pm.metadata.resource_version}}})))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let s = meshes.get("pm").await.unwrap().status.unwrap();
    assert_eq!(s.running, 4, "{s:?}");
    assert_eq!(
        worlds.get("w").await.unwrap().status.unwrap().phase,
        Some(hostmesh_crds::world::WorldPhase::Running)
    );
    // Requests may be repeated (CreateOrUpdate is idempotent), but the agents
    // still hold exactly the original procs, never restarted.
    let held: Vec<(String, u32)> = c
        .sim
        .procs
        .lock()
        .unwrap()
        .values()
        .flat_map(|h| h.values().map(|p| (p.name.clone(), p.restarts)))
        .collect();
    assert_eq!(held.len(), 4, "{held:?}");
    assert!(held.iter().all(|(_, restarts)| *restarts == 0), "{held:?}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_critical_procmesh_fails_its_world() {
    let c = Cluster::start().await;
    running_world(&c).await;
    c.apply_yaml(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {name: boss, namespace: ctl}\n\
         spec: {world: w, command: [sleep, '300'], critical: true}\n",
    )
    .await;
    let meshes = c.api::<ProcMesh>();
    let pm = eventually_async("ProcMesh Running", || async {
        let pm = meshes.get("boss").await.ok()?;
        (pm.status.as_ref()?.running == 2).then_some(pm)
    })
    .await;
    let world = c.api::<World>().get("w").await.unwrap();
    let id = hostmesh_operator::controllers::procmesh::desired::mesh_id(&pm, &world);
    let host0 = HostKey {
        world: WorldKey {
            namespace: NS.into(),
            name: "w".into(),
        },
        rank: 0,
    };
    let killed = ProcPhase::Killed {
        signal: 9,
        core_dumped: false,
        stderr_tail: vec![],
    };
    let push = c
        .sim
        .set_status(&host0, &format!("{id}.0"), killed)
        .unwrap();
    c.ctx.hub.push_sender().send(push).await.unwrap();
    let worlds = c.api::<World>();
    let s = eventually_async("World Failed", || async {
        let s = worlds.get("w").await.ok()?.status?;
        (s.phase == Some(hostmesh_crds::world::WorldPhase::Failed)).then_some(s)
    })
    .await;
    let failed = s.conditions.iter().find(|c| c.type_ == "Failed").unwrap();
    assert_eq!(failed.reason, "CriticalProcMeshFailed");
    assert!(
        failed.message.contains("boss") && failed.message.contains("SIGKILL (9)"),
        "{}",
        failed.message
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_change_replaces_the_procs() {
    let c = Cluster::start().await;
    running_world(&c).await;
    let yaml = "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {name: pm, namespace: ctl}\n\
         spec: {world: w, perHost: [{name: gpu, size: 2}], command: [sleep, 'ARG']}\n";
    c.apply_yaml(&yaml.replace("ARG", "300")).await;
    let meshes = c.api::<ProcMesh>();
    eventually_async("ProcMesh Running", || async {
        let s = meshes.get("pm").await.ok()?.status?;
        (s.running == 4).then_some(())
    })
    .await;
    let world = c.api::<World>().get("w").await.unwrap();
    let old_id = hostmesh_operator::controllers::procmesh::desired::mesh_id(
        &meshes.get("pm").await.unwrap(),
        &world,
    );
    c.apply_yaml(&yaml.replace("ARG", "600")).await;
    let new_id = eventually_async("new procs Running", || async {
        let pm = meshes.get("pm").await.ok()?;
        let id = hostmesh_operator::controllers::procmesh::desired::mesh_id(&pm, &world);
        let s = pm.status?;
        (id != old_id && s.running == 4 && s.observed_generation == pm.metadata.generation)
            .then_some(id)
    })
    .await;
    // The agents now hold the old procs stopped and the new ones running.
    let procs = c.sim.procs.lock().unwrap().clone();
    let mut old_live = 0;
    let mut new_live = 0;
    for h in procs.values() {
        for p in h.values() {
            let live = !p.status.is_terminal();
            if p.name.starts_with(&format!("{old_id}.")) && live {
                old_live += 1;
            }
            if p.name.starts_with(&format!("{new_id}.")) && live {
                new_live += 1;
            }
        }
    }
    assert_eq!((old_live, new_live), (0, 4));
    c.shutdown().await;
}

/// Touches the World so the controller reconciles it now (a deleted Secret
/// is otherwise noticed at the next periodic reconcile; the operator does
/// not watch Secrets, see `world/secret.rs`).
async fn nudge(c: &Cluster, n: u32) {
    let patch = serde_json::json!({"metadata": {"annotations": {"test/nudge": n.to_string()}}});
    c.api::<World>()
        .patch("w", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Waits for an Event with `reason`.
async fn event_seen(events: &Api<k8s_openapi::api::events::v1::Event>, reason: &str) {
    eventually_async(&format!("a {reason} Event"), || async {
        let l = events.list(&ListParams::default()).await.ok()?;
        l.items
            .iter()
            .any(|e| e.reason.as_deref() == Some(reason))
            .then_some(())
    })
    .await;
}

fn token_of(s: &Secret) -> Vec<u8> {
    s.data.as_ref().unwrap()["token"].0.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_agent_secret_comes_back_with_the_token_the_agents_hold() {
    let mut c = Cluster::start().await;
    running_world(&c).await;
    let secrets = c.api::<Secret>();
    let token = token_of(&secrets.get("w-agent").await.unwrap());
    let copy = eventually_async("the recovery copy", || async {
        secrets.get_opt("w-agent-recovery").await.ok()?
    })
    .await;
    assert_eq!(token_of(&copy), token);
    // The runtime credential for clients of the procs' actors: the
    // runtime key of that token, never the token.
    let runtime_of = |t: &[u8]| {
        hostmesh_agent::keys::to_hex(
            hostmesh_agent::keys::runtime_key(hostmesh_agent::secret_key(t)).bytes(),
        )
    };
    let runtime = eventually_async("the runtime Secret", || async {
        secrets.get_opt("w-runtime").await.ok()?
    })
    .await;
    let held = |s: &Secret| String::from_utf8(s.data.as_ref().unwrap()["key"].0.clone()).unwrap();
    assert_eq!(held(&runtime), runtime_of(&token));
    assert!(!held(&runtime).contains(std::str::from_utf8(&token).unwrap().trim()));

    // Deleted while this operator runs: restored from what it dials with.
    secrets
        .delete("w-agent", &DeleteParams::default())
        .await
        .unwrap();
    nudge(&c, 1).await;
    let back = eventually_async("the Secret restored", || async {
        secrets.get_opt("w-agent").await.ok()?
    })
    .await;
    assert_eq!(token_of(&back), token, "the agents' token, not a new one");
    let events: Api<k8s_openapi::api::events::v1::Event> = c.api();
    event_seen(&events, "AgentSecretRestored").await;

    // Deleted again while no operator runs: the next one restores it from
    // the copy.
    c.stop_operator().await;
    secrets
        .delete("w-agent", &DeleteParams::default())
        .await
        .unwrap();
    c.start_operator();
    nudge(&c, 2).await;
    let back = eventually_async("the Secret restored from the copy", || async {
        secrets.get_opt("w-agent").await.ok()?
    })
    .await;
    assert_eq!(token_of(&back), token);
    let worlds = c.api::<World>();
    eventually_async("World Running again", || async {
        let s = worlds.get("w").await.ok()?.status?;
        (s.phase == Some(hostmesh_crds::world::WorldPhase::Running)).then_some(())
    })
    .await;

    // Both gone and no operator holds the token: a new one, and the hosts
    // are replaced on purpose, with an Event that says why. The operator is
    // stopped first: a running one would restore both from its memory.
    c.stop_operator().await;
    for name in ["w-agent", "w-agent-recovery"] {
        secrets
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    c.start_operator();
    nudge(&c, 3).await;
    let fresh = eventually_async("a new Secret", || async {
        secrets.get_opt("w-agent").await.ok()?
    })
    .await;
    assert_ne!(token_of(&fresh), token);
    event_seen(&events, "CredentialsReplaced").await;
    // The runtime Secret held the old token's key: rewritten in place.
    event_seen(&events, "RuntimeSecretRewritten").await;
    let want = runtime_of(&token_of(&fresh));
    eventually_async("the runtime Secret of the new token", || async {
        let s = secrets.get_opt("w-runtime").await.ok()??;
        (held(&s) == want).then_some(())
    })
    .await;
    let hash = hostmesh_operator::controllers::world::desired::secret_hash(&token_of(&fresh));
    let pods = c.api::<Pod>();
    eventually_async(
        "both hosts replaced with pods mounting the new token",
        || async {
            let l = pods
                .list(&ListParams::default().labels("hostmesh.dev/world=w"))
                .await
                .ok()?;
            let fresh: Vec<_> = l
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| {
                    p.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get("hostmesh.dev/secret-hash"))
                        == Some(&hash)
                })
                .collect();
            (fresh.len() == 2).then_some(())
        },
    )
    .await;
    let s = worlds.get("w").await.unwrap().status.unwrap();
    assert_eq!(s.restarts, 0, "a deliberate replacement is not a restart");
    c.shutdown().await;
}

/// `world/secret.rs` invariants 5 and 6, against agents that admit only
/// the token they hold (the simulated agents model the real one's
/// `Rekey`): a new token in `<world>-agent` is handed to the running
/// agents without replacing a pod. While one agent does not answer, the
/// rotation stays open (the copy keeps the previous token, which the
/// operator still dials with); an operator restarted meanwhile reads the
/// copy and finishes it. Then the previous token is dropped, the runtime
/// Secret holds the new key, and, no ProcMesh being older than the
/// rotation, the lineage is dropped too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_agent_token_is_rotated_to_in_place_across_an_operator_restart() {
    let mut c = Cluster::start().await;
    running_world(&c).await;
    let secrets = c.api::<Secret>();
    let old = token_of(&secrets.get("w-agent").await.unwrap());
    let host = |rank| HostKey {
        world: WorldKey {
            namespace: NS.into(),
            name: "w".into(),
        },
        rank,
    };
    let sim = c.sim.clone();
    let held_key = |rank| sim.keys.lock().unwrap().get(&host(rank)).cloned();
    for r in 0..2 {
        c.sim.keys.lock().unwrap().insert(host(r), old.clone());
    }
    let pods = c.api::<Pod>();
    let uids = async || {
        let l = pods
            .list(&ListParams::default().labels("hostmesh.dev/world=w"))
            .await
            .unwrap();
        let mut u: Vec<String> = l
            .items
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        u.sort();
        u
    };
    let before = uids().await;
    // Host 1's agent does not answer calls: it cannot take the token yet.
    c.sim.hung.lock().unwrap().push(host(1));
    let new = b"a-rotated-token-0123456789abcdef0123456789abcdef".to_vec();
    let patch = Secret {
        data: Some([("token".to_string(), k8s_openapi::ByteString(new.clone()))].into()),
        ..Default::default()
    };
    secrets
        .patch("w-agent", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    nudge(&c, 1).await;
    let events: Api<k8s_openapi::api::events::v1::Event> = c.api();
    event_seen(&events, "SecretRotating").await;
    let data = |s: &Secret, k: &str| s.data.as_ref().unwrap().get(k).map(|b| b.0.clone());
    eventually_async("host 0's agent took the new token", || async {
        (held_key(0) == Some(new.clone())).then_some(())
    })
    .await;
    let copy = secrets.get("w-agent-recovery").await.unwrap();
    assert_eq!(token_of(&copy), new);
    assert_eq!(data(&copy, "previous"), Some(old.clone()), "still rotating");
    assert_eq!(held_key(1), Some(old.clone()));
    assert_eq!(uids().await, before, "no host pod is replaced");

    // A restarted operator reads the rotation from the copy, dials host
    // 1 with the previous token and hands it the new one.
    c.stop_operator().await;
    c.sim.hung.lock().unwrap().clear();
    c.start_operator();
    nudge(&c, 2).await;
    event_seen(&events, "SecretRotated").await;
    assert_eq!(held_key(1), Some(new.clone()));
    let copy = secrets.get("w-agent-recovery").await.unwrap();
    assert_eq!(
        data(&copy, "previous"),
        None,
        "the previous token opens nothing"
    );
    assert!(
        c.sim
            .requests_of(&host(1))
            .iter()
            .any(|r| matches!(r, SimRequest::Rekey(l) if !l.is_empty())),
        "host 1 got the lineage"
    );
    // No ProcMesh from before the rotation: the lineage goes at once.
    event_seen(&events, "IssuerLineageDropped").await;
    let want = hostmesh_agent::keys::to_hex(hostmesh_agent::keys::runtime_key(&new).bytes());
    eventually_async(
        "the runtime Secret of the new token, without lineage",
        || async {
            let s = secrets.get_opt("w-runtime").await.ok()??;
            (data(&s, "key") == Some(want.clone().into_bytes()) && data(&s, "lineage").is_none())
                .then_some(())
        },
    )
    .await;
    eventually_async(
        "every agent handed the token without the lineage",
        || async {
            let empty = |r| {
                sim.requests_of(&host(r))
                    .iter()
                    .rev()
                    .find_map(|q| match q {
                        SimRequest::Rekey(l) => Some(l.is_empty()),
                        _ => None,
                    })
                    .unwrap_or(false)
            };
            (empty(0) && empty(1)).then_some(())
        },
    )
    .await;
    let worlds = c.api::<World>();
    let s = worlds.get("w").await.unwrap().status.unwrap();
    assert_eq!(s.phase, Some(hostmesh_crds::world::WorldPhase::Running));
    assert_eq!(s.restarts, 0);
    assert_eq!(uids().await, before, "no host pod is replaced");
    let replaced = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .any(|e| e.reason.as_deref() == Some("CredentialsReplaced"));
    assert!(!replaced, "a rotation replaces no host");
    c.shutdown().await;
}

/// Monarch TLS (`world::monarch_tls`): the CA, the clients' Secret and a
/// certificate Secret per host (made before its pod, which mounts it) are
/// there, and `status.monarch` names the clients' Secret. Renewal and
/// rotation, in place: a host certificate due for renewal is issued anew
/// (the other host's is not), a CA certificate due for renewal is signed
/// anew with its key and every Secret gets it, and a deleted CA comes back
/// as a new CA whose certificates every Secret gets.
#[tokio::test]
async fn a_tls_monarch_world_gets_its_ca_and_certificates_renewed_and_rotated_in_place() {
    let mut c = Cluster::start().await;
    c.apply_yaml(&WORLD.replace(
        "spec:\n  shape:",
        "spec:\n  monarch: {transport: Tls}\n  shape:",
    ))
    .await;
    let secrets = c.api::<Secret>();
    let pods = c.api::<Pod>();
    let ca_of = |s: &Secret| s.data.as_ref().unwrap()["ca.crt"].0.clone();
    let ca = eventually_async("the CA", || async {
        secrets.get_opt("w-monarch-ca").await.ok()?
    })
    .await;
    assert!(ca.data.as_ref().unwrap().contains_key("ca.key"));
    for rank in 0..2 {
        let pod = eventually_async("a host pod", || async {
            pods.get_opt(&format!("w-host-{rank}")).await.ok()?
        })
        .await;
        let mounted: Vec<String> = pod
            .spec
            .unwrap()
            .volumes
            .unwrap_or_default()
            .into_iter()
            .filter_map(|v| v.secret?.secret_name)
            .collect();
        assert_eq!(mounted, [format!("w-host-{rank}-tls")]);
        let host = secrets.get(&format!("w-host-{rank}-tls")).await.unwrap();
        assert_eq!(host.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(ca_of(&host), ca_of(&ca));
        assert!(!host.data.as_ref().unwrap().contains_key("ca.key"));
    }
    let client = secrets.get("w-monarch-client").await.unwrap();
    assert_eq!(ca_of(&client), ca_of(&ca));
    let worlds = c.api::<World>();
    eventually_async("status.monarch.clientSecret", || async {
        let s = worlds.get("w").await.ok()?.status?;
        (s.monarch?.client_secret == "w-monarch-client").then_some(())
    })
    .await;

    let crt_of = |s: &Secret| s.data.as_ref().unwrap()["tls.crt"].0.clone();
    let host = |rank: u32| {
        let secrets = secrets.clone();
        async move { secrets.get(&format!("w-host-{rank}-tls")).await.unwrap() }
    };
    let all_on = |pem: Vec<u8>| {
        let secrets = secrets.clone();
        async move {
            for name in ["w-host-0-tls", "w-host-1-tls", "w-monarch-client"] {
                let s = secrets.get_opt(name).await.ok()??;
                if ca_of(&s) != pem {
                    return None;
                }
            }
            Some(())
        }
    };
    let events = c.api::<k8s_openapi::api::events::v1::Event>();

    // Host 1's certificate is due when an operator starts (it records
    // what it wrote, and reads a Secret once after it starts): issued anew
    // in place, host 0's kept.
    c.stop_operator().await;
    let (h0, h1) = (host(0).await, host(1).await);
    let soon = (std::time::SystemTime::now() + Duration::from_secs(60))
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let patch = serde_json::json!({"metadata": {"annotations": {
        hostmesh_operator::controllers::world::monarch_tls::NOT_AFTER_ANNOTATION: soon.to_string()
    }}});
    secrets
        .patch(
            "w-host-1-tls",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    c.start_operator();
    nudge(&c, 1).await;
    eventually_async("host 1's certificate issued anew", || async {
        (crt_of(&host(1).await) != crt_of(&h1)).then_some(())
    })
    .await;
    assert_eq!(crt_of(&host(0).await), crt_of(&h0), "not due: kept");
    assert_eq!(ca_of(&host(1).await), ca_of(&ca), "the same CA");
    event_seen(&events, "TlsRenewed").await;

    // The CA certificate is due (one of a day, where the operator issues
    // for a year): signed anew with the same key, and every Secret gets it.
    let key = String::from_utf8(ca.data.as_ref().unwrap()["ca.key"].0.clone()).unwrap();
    let short = hostmesh_operator::controllers::world::monarch_tls::Ca::from_key(
        NS,
        "w",
        &key,
        Duration::from_secs(86_400),
    )
    .unwrap();
    let mut due = secrets.get("w-monarch-ca").await.unwrap();
    due.data.as_mut().unwrap().insert(
        "ca.crt".into(),
        k8s_openapi::ByteString(short.pem.clone().into_bytes()),
    );
    secrets
        .replace("w-monarch-ca", &Default::default(), &due)
        .await
        .unwrap();
    nudge(&c, 2).await;
    let renewed = eventually_async("the CA renewed", || async {
        let s = secrets.get_opt("w-monarch-ca").await.ok()??;
        let pem = ca_of(&s);
        (pem != short.pem.as_bytes() && pem != ca_of(&ca)).then_some(s)
    })
    .await;
    assert_eq!(
        renewed.data.as_ref().unwrap()["ca.key"].0,
        key.as_bytes(),
        "the same key"
    );
    eventually_async("every Secret on the renewed CA", || all_on(ca_of(&renewed))).await;

    // Rotation: a deleted CA is a new CA, and every Secret is issued by it.
    secrets
        .delete("w-monarch-ca", &DeleteParams::default())
        .await
        .unwrap();
    nudge(&c, 3).await;
    let again = eventually_async("a new CA", || async {
        secrets.get_opt("w-monarch-ca").await.ok()?
    })
    .await;
    assert_ne!(ca_of(&again), ca_of(&renewed), "a new CA");
    assert_ne!(
        again.data.as_ref().unwrap()["ca.key"].0,
        key.as_bytes(),
        "a new key"
    );
    eventually_async("every Secret on the new CA", || all_on(ca_of(&again))).await;
    c.shutdown().await;
}
