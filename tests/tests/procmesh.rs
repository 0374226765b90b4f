//! e2e: a ProcMesh becomes Running with the environment contract in every
//! proc; a failing proc is reported with its root cause and restarted per
//! policy.

use std::collections::BTreeMap;

use hostmesh_e2e::{Env, condition_true, world_yaml};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};

fn mesh_yaml(name: &str, world: &str, per_host: u32, command: &str, extra: &str) -> String {
    format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: {name}}}\nspec:\n  world: {world}\n  perHost: [{{name: gpu, size: {per_host}}}]\n  command: [sh, -c, {command:?}]\n{extra}"
    )
}

fn read_env(path: &std::path::Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn procmesh_of_eight_procs_runs_with_the_environment_contract() -> anyhow::Result<()> {
    let env = Env::start("procmesh-env").await?;
    let out = env.shared_dir()?;
    env.apply(&world_yaml("w", &[("replica", 2), ("host", 2)], ""))
        .await?;
    let cmd = format!(
        "env > {dir}/rank-$RANK.tmp && mv {dir}/rank-$RANK.tmp {dir}/rank-$RANK.env && exec sleep 300",
        dir = out.display()
    );
    env.apply(&mesh_yaml("pm", "w", 2, &cmd, "")).await?;
    let status = env
        .wait_for("ProcMesh", "pm", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    assert_eq!(status["running"], 8, "{status:#}");
    assert_eq!(status["phase"], "Running", "{status:#}");
    assert_eq!(status["extent"], "replica=2,host=2,gpu=2", "{status:#}");

    // The World's host 0 address is MASTER_ADDR for everyone.
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(env.client.clone(), &env.namespace);
    let host0_ip = pods
        .get("w-host-0")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .expect("host 0 has an IP");
    for rank in 0..8u32 {
        let path = out.join(format!("rank-{rank}.env"));
        hostmesh_e2e::eventually(&format!("rank {rank} wrote its env"), || path.exists()).await?;
        let e = read_env(&path);
        let host = rank / 2;
        assert_eq!(e["RANK"], rank.to_string());
        assert_eq!(e["WORLD_SIZE"], "8");
        assert_eq!(e["LOCAL_RANK"], (rank % 2).to_string());
        assert_eq!(e["LOCAL_WORLD_SIZE"], "2");
        assert_eq!(e["GROUP_RANK"], host.to_string());
        assert_eq!(e["MASTER_ADDR"], host0_ip);
        assert_eq!(e["HOSTMESH_COORD_REPLICA"], (host / 2).to_string());
        assert_eq!(e["HOSTMESH_COORD_HOST"], (host % 2).to_string());
        assert_eq!(e["HOSTMESH_COORD_GPU"], (rank % 2).to_string());
        assert_eq!(e["HOSTMESH_PROC_MESH"], "pm");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_rank_is_the_first_failure_with_code_and_stderr() -> anyhow::Result<()> {
    let env = Env::start("procmesh-fail").await?;
    env.apply(&world_yaml("w", &[("host", 2)], "")).await?;
    // Rank 3 fails; the others keep running.
    let cmd = "if [ \"$RANK\" = 3 ]; then echo 'boom: out of memory on device' >&2; exit 3; fi; exec sleep 300";
    env.apply(&mesh_yaml(
        "pm",
        "w",
        2,
        cmd,
        "  restartPolicy: {policy: Never}\n",
    ))
    .await?;
    let status = env
        .wait_for("ProcMesh", "pm", "a first failure", |s| {
            !s["firstFailure"].is_null()
        })
        .await?;
    let ff = &status["firstFailure"];
    assert_eq!(ff["rank"], 3, "{status:#}");
    assert_eq!(ff["host"], 1, "{status:#}");
    assert_eq!(ff["exitCode"], 3, "{status:#}");
    assert!(
        ff["stderrTail"]
            .as_str()
            .unwrap_or_default()
            .contains("boom"),
        "{status:#}"
    );
    let status = env
        .wait_for(
            "ProcMesh",
            "pm",
            "Failed with its other ranks stopped",
            |s| {
                // A rank whose stop is under way says `Stopping` until its
                // process has exited.
                let settled = s["ranks"]
                    .as_array()
                    .is_some_and(|r| r.iter().all(|run| run["state"] != "Stopping"));
                s["phase"] == "Failed" && s["failed"] == 1 && s["running"] == 0 && settled
            },
        )
        .await?;
    assert!(condition_true(&status, "Failed"), "{status:#}");
    // With restartPolicy Never the mesh fails and its other ranks are
    // stopped; the runs say so compactly: ranks 0-2 one run, rank 3 (with its
    // exit code and stderr) another.
    let ranks = status["ranks"].as_array().cloned().unwrap_or_default();
    assert_eq!(ranks.len(), 2, "runs are compact: {status:#}");
    assert_eq!(ranks[1]["start"], 3, "{status:#}");
    assert_eq!(ranks[1]["exitCode"], 3, "{status:#}");
    // An Event names the rank.
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.namespace);
    let start = std::time::Instant::now();
    loop {
        let list = events.list(&ListParams::default()).await?;
        if list
            .items
            .iter()
            .any(|e| e.message.as_deref().unwrap_or_default().contains("rank 3"))
        {
            break;
        }
        anyhow::ensure!(
            start.elapsed() < hostmesh_e2e::WAIT,
            "no Event mentions rank 3"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn on_failure_restarts_the_rank_in_place_and_counts_it() -> anyhow::Result<()> {
    let env = Env::start("procmesh-restart").await?;
    let marks = env.shared_dir()?;
    env.apply(&world_yaml("w", &[("host", 1)], "")).await?;
    env.wait_for("World", "w", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(env.client.clone(), &env.namespace);
    let uid_before = pods.get("w-host-0").await?.metadata.uid;
    anyhow::ensure!(uid_before.is_some(), "host pod w-host-0 has no UID");
    // Rank 1 fails the first time only.
    let cmd = format!(
        "if [ \"$RANK\" = 1 ] && [ ! -e {m}/once ]; then touch {m}/once; echo first-try >&2; exit 3; fi; exec sleep 300",
        m = marks.display()
    );
    env.apply(&mesh_yaml(
        "pm",
        "w",
        2,
        &cmd,
        "  restartPolicy: {policy: OnFailure, maxRestarts: 2}\n",
    ))
    .await?;
    let status = env
        .wait_for("ProcMesh", "pm", "restarted and Ready", |s| {
            s["restarts"].as_u64().unwrap_or(0) >= 1 && condition_true(s, "Ready")
        })
        .await?;
    assert_eq!(status["running"], 2, "{status:#}");
    // The root cause stays recorded after the recovery.
    assert_eq!(status["firstFailure"]["rank"], 1, "{status:#}");
    // In place: the rank was restarted by its agent in the same host pod,
    // not by replacing the pod.
    assert_eq!(
        pods.get("w-host-0").await?.metadata.uid,
        uid_before,
        "the host pod was replaced; an in-place restart keeps it"
    );
    Ok(())
}

/// Least privilege on a host: a proc of a restricted World (non-root, no
/// capabilities) that reads its environment, every process's environment
/// it can open (the agent's included), its mounts and the places the
/// World secret once lived finds no trace of the World's secret, which
/// only the operator and the agents hold.
#[tokio::test(flavor = "multi_thread")]
async fn a_proc_finds_no_world_secret_in_its_environment_or_files() -> anyhow::Result<()> {
    let env = Env::start("procmesh-secret").await?;
    let out = env.shared_dir()?;
    let restricted = "        securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}\n      \
                      securityContext: {runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, seccompProfile: {type: RuntimeDefault}}\n";
    env.apply(&world_yaml("w", &[("host", 1)], restricted))
        .await?;
    // Each section names what it read; `tr` failing to open a file is
    // "unreadable".
    let cmd = format!(
        "f={dir}/rank-$RANK; {{ echo '== self'; id; env; \
         for p in /proc/[0-9]*; do echo \"== $p $(cat $p/comm 2>/dev/null)\"; \
         if tr '\\0' '\\n' < $p/environ; then echo '-- environ read'; else echo '-- environ unreadable'; fi; done; \
         echo '== mounts'; cat /proc/self/mounts; \
         echo '== files'; ls -laR /var/run/hostmesh /hostmesh; }} > $f.tmp 2>&1; \
         mv $f.tmp $f.dump; exec sleep 300",
        dir = out.display()
    );
    env.apply(&mesh_yaml("pm", "w", 2, &cmd, "")).await?;
    env.wait_for("ProcMesh", "pm", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(env.client.clone(), &env.namespace);
    let token = secrets
        .get("w-agent")
        .await?
        .data
        .and_then(|d| d.get("token").cloned())
        .map(|b| String::from_utf8_lossy(&b.0).trim().to_owned())
        .expect("the World's agent Secret has a token");
    anyhow::ensure!(token.len() >= 16, "a real token");
    for rank in 0..2u32 {
        let path = out.join(format!("rank-{rank}.dump"));
        hostmesh_e2e::eventually(&format!("rank {rank} wrote its dump"), || path.exists()).await?;
        let dump = std::fs::read_to_string(&path)?;
        assert!(
            dump.contains("HOSTMESH_PROC_NAME="),
            "a real dump of the proc's environment:\n{dump}"
        );
        assert!(
            !dump.contains(&token),
            "rank {rank} found the World secret:\n{dump}"
        );
        assert!(!dump.contains("HOSTMESH_SECRET"), "rank {rank}:\n{dump}");
        assert!(
            !dump.contains("HOSTMESH_RUNTIME_KEY") && !dump.contains("HOSTMESH_PROC_CREDENTIAL"),
            "a plain proc gets no runtime key or credential either:\n{dump}"
        );
        let mounts = dump
            .split("\n== mounts\n")
            .nth(1)
            .and_then(|m| m.split("\n== files").next())
            .unwrap_or_default();
        assert!(!mounts.is_empty(), "a real dump of the mounts:\n{dump}");
        assert!(
            !mounts.contains("hostmesh/secret"),
            "no Secret is mounted into the host container:\n{mounts}"
        );
        // The agent (`/hostmesh/bin/hostmesh agent`, comm `hostmesh`) is
        // there and its environment, where the secret came in, is closed
        // to the proc.
        let sections: Vec<&str> = dump.split("\n== ").collect();
        let agents: Vec<&&str> = sections
            .iter()
            .filter(|s| s.lines().next().is_some_and(|l| l.ends_with(" hostmesh")))
            .collect();
        assert!(
            !agents.is_empty(),
            "the proc sees its agent's process:\n{dump}"
        );
        for a in agents {
            assert!(
                a.contains("-- environ unreadable"),
                "an agent's environment was readable:\n{a}"
            );
        }
    }
    Ok(())
}

/// The runtime-aware ProcMesh `pm` the client tests drive: the agent
/// binary's example proc (every host pod has it), 2 per host of World `w`,
/// with `restart` as its restartPolicy.
fn echo_mesh(restart: &str) -> String {
    format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: pm}}\nspec:\n  world: w\n  perHost: [{{name: gpu, size: 2}}]\n  command: [/hostmesh/bin/hostmesh, echo-proc]\n  runtimeAware: true\n  restartPolicy: {restart}\n"
    )
}

/// SIGKILLs rank 3's proc of ProcMesh `pm` on World `w`.
fn kill_rank_3(env: &Env) -> anyhow::Result<()> {
    let procs = env.proc_pids("w", "pm");
    let victim = hostmesh_e2e::find_pids(|e| {
        e.get("RANK").map(String::as_str) == Some("3")
            && e.get("HOSTMESH_PROC_MESH").map(String::as_str) == Some("pm")
    })
    .into_iter()
    .find(|p| procs.contains(p))
    .expect("rank 3's proc");
    hostmesh_e2e::signal(victim, "KILL")
}

/// The replies of an actor mesh call, in rank order.
fn answers(v: hostmesh_mesh::ValueMesh<String>) -> Vec<String> {
    v.iter().map(|(_, s)| s.clone()).collect()
}

/// The client tests' options: the e2e wait for Ready, a 10 s keepalive.
fn client_options() -> hostmesh_client::ClientOptions {
    hostmesh_client::ClientOptions {
        ready_timeout: hostmesh_e2e::WAIT,
        keepalive: std::time::Duration::from_secs(10),
        ..Default::default()
    }
}

/// Issue 29: a client holding only what the operator publishes for
/// clients (ConfigMap `<procmesh>-runtime`, Secret `<world>-runtime`)
/// drives actors on a runtime-aware ProcMesh's procs: an `Echo` on every
/// rank answers from its rank, a slice answers alone, a failing actor
/// reaches the client and `status.actorFailures`, and a killed rank's proc
/// end reaches the client with its signal. The procs are the example proc
/// the agent binary carries (`hostmesh echo-proc`).
#[tokio::test(flavor = "multi_thread")]
async fn a_client_drives_actors_on_a_runtime_aware_procmesh() -> anyhow::Result<()> {
    use hostmesh_agent::echo::{Echo, Fail};
    use hostmesh_client::{MeshClient, MeshEvent};
    use std::time::Duration;

    let env = Env::start("procmesh-client").await?;
    env.apply(&world_yaml("w", &[("host", 2)], "")).await?;
    // The example proc is in the agent binary every host pod has.
    env.apply(&echo_mesh("{policy: Never}")).await?;
    let client =
        MeshClient::connect(env.client.clone(), &env.namespace, "pm", client_options()).await?;
    let timeout = Duration::from_secs(20);
    let mesh = client.spawn::<Echo>("echo", &()).await?;
    let replies = mesh
        .call_all(client.proc(), &"hi".to_string(), timeout)
        .await?;
    let got: Vec<String> = replies.iter().map(|(_, v)| v.clone()).collect();
    assert_eq!(got, ["0:hi", "1:hi", "2:hi", "3:hi"], "each rank answers");
    let host1 = mesh.range("host", 1..2)?;
    let got: Vec<String> = host1
        .call_all(client.proc(), &"there".to_string(), timeout)
        .await?
        .iter()
        .map(|(_, v)| v.clone())
        .collect();
    assert_eq!(got, ["2:there", "3:there"], "the slice of host 1 only");

    // A failing actor: the client hears it, and status records it.
    let one = mesh.get(1).expect("rank 1's actor");
    one.send(client.proc(), &Fail("out of widgets".into()))
        .await?;
    let start = std::time::Instant::now();
    loop {
        match client.next_event(Duration::from_secs(1)).await {
            Some(MeshEvent::ActorFailed { actor, reason }) => {
                assert_eq!(&actor, one.id(), "{reason}");
                assert!(reason.contains("out of widgets"), "{reason}");
                break;
            }
            other => anyhow::ensure!(
                start.elapsed() < hostmesh_e2e::WAIT,
                "no ActorFailed event; last: {other:?}"
            ),
        }
    }
    env.wait_for("ProcMesh", "pm", "the actor failure in status", |s| {
        s["actorFailures"]
            .as_array()
            .is_some_and(|a| a.iter().any(|f| f["rank"] == 1))
    })
    .await?;

    // A killed proc: the client hears which rank and how.
    kill_rank_3(&env)?;
    let start = std::time::Instant::now();
    loop {
        match client.next_event(Duration::from_secs(1)).await {
            // Under `Never` the other ranks are stopped too: events of
            // their own.
            Some(MeshEvent::ProcEnded {
                rank: 3,
                signal,
                state,
                ..
            }) => {
                assert_eq!(signal, Some(9), "{state:?}");
                break;
            }
            other => anyhow::ensure!(
                start.elapsed() < hostmesh_e2e::WAIT,
                "no ProcEnded event for rank 3; last: {other:?}"
            ),
        }
    }
    Ok(())
}

/// Issue 29: under `OnFailure` a killed rank's proc is restarted and
/// rejoins the client's actor mesh: the client hears the end (rank, signal)
/// and then the rejoin, the rest of the mesh answers meanwhile, `respawn`
/// puts the actor on the new proc and every rank answers again; a second
/// kill of the same rank is a second event. The client holds only the RBAC
/// docs/api.md names.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_rank_rejoins_the_clients_actor_mesh() -> anyhow::Result<()> {
    use hostmesh_agent::echo::Echo;
    use hostmesh_client::{MeshClient, MeshEvent};
    use std::time::Duration;

    let env = Env::start("procmesh-rejoin").await?;
    env.apply(&world_yaml("w", &[("host", 2)], "")).await?;
    env.apply(&echo_mesh(
        "{policy: OnFailure, maxRestarts: 5, backoff: 0s}",
    ))
    .await?;
    // The client runs as a service account with only what docs/api.md
    // says a client needs, by name.
    env.apply(&format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: mesh-user}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: mesh-user}}\nrules:\n- {{apiGroups: [hostmesh.dev], resources: [procmeshes], resourceNames: [pm], verbs: [get, list, watch]}}\n- {{apiGroups: [''], resources: [configmaps], resourceNames: [pm-runtime], verbs: [get, list, watch]}}\n- {{apiGroups: [''], resources: [secrets], resourceNames: [w-runtime], verbs: [get]}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: mesh-user}}\nsubjects: [{{kind: ServiceAccount, name: mesh-user, namespace: {ns}}}]\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: mesh-user}}\n",
        ns = env.namespace
    ))
    .await?;
    let token =
        hostmesh_e2e::service_account_token(&env.client, &env.namespace, "mesh-user").await?;
    let as_user = hostmesh_e2e::client_with_token(&env.kubeconfig, &token).await?;
    let client = MeshClient::connect(as_user, &env.namespace, "pm", client_options()).await?;
    let timeout = Duration::from_secs(20);
    let mut mesh = client.spawn::<Echo>("echo", &()).await?;
    let hi = "hi".to_string();
    assert_eq!(
        answers(mesh.call_all(client.proc(), &hi, timeout).await?),
        ["0:hi", "1:hi", "2:hi", "3:hi"]
    );
    let next = async |what: &str, want: &dyn Fn(&MeshEvent) -> bool| -> anyhow::Result<MeshEvent> {
        let start = std::time::Instant::now();
        let mut seen = Vec::new();
        while start.elapsed() < hostmesh_e2e::WAIT {
            if let Some(ev) = client.next_event(Duration::from_secs(1)).await {
                if want(&ev) {
                    return Ok(ev);
                }
                seen.push(ev);
            }
        }
        anyhow::bail!("no {what}; saw {seen:?}")
    };
    for round in 1..=2u32 {
        kill_rank_3(&env)?;
        let ended = next(&format!("rank 3's end #{round}"), &|e| {
            matches!(e, MeshEvent::ProcEnded { rank: 3, .. })
        })
        .await?;
        match &ended {
            // Killed, or already Starting again when the client read it:
            // the signal is the agent's either way.
            MeshEvent::ProcEnded {
                signal,
                reason,
                down,
                ..
            } => {
                assert!(
                    *signal == Some(9)
                        || reason.as_deref().is_some_and(|r| r.contains("restarted")),
                    "{ended:?}"
                );
                assert_eq!(down, &[3], "the rest of the mesh is usable: {ended:?}");
            }
            other => unreachable!("{other:?}"),
        }
        // Host 0's ranks answer while rank 3 is away.
        let host0 = mesh.range("host", 0..1)?;
        assert_eq!(
            answers(host0.call_all(client.proc(), &hi, timeout).await?),
            ["0:hi", "1:hi"]
        );
        let back = next(&format!("rank 3's rejoin #{round}"), &|e| {
            matches!(e, MeshEvent::ProcRejoined { rank: 3, .. })
        })
        .await?;
        assert_eq!(
            back,
            MeshEvent::ProcRejoined {
                rank: 3,
                incarnation: round
            }
        );
        let before = mesh.ids().to_vec();
        mesh = client.respawn(&mesh, "echo", &()).await?;
        assert_ne!(
            mesh.ids()[3],
            before[3],
            "rank 3's actor is on its new proc"
        );
        assert_eq!(mesh.ids()[..3], before[..3], "the others are kept");
        assert_eq!(
            answers(mesh.call_all(client.proc(), &hi, timeout).await?),
            ["0:hi", "1:hi", "2:hi", "3:hi"],
            "round {round}: every rank answers again"
        );
    }
    let pm = env
        .wait_for("ProcMesh", "pm", "two restarts", |s| s["restarts"] == 2)
        .await?;
    assert_eq!(pm["running"], 4, "{pm:#}");
    Ok(())
}

/// Issue 29: the actor-mesh example (`examples/actors`) against its own
/// manifest: a reply from every rank, the slice `host=0`, and the end of
/// the last rank's proc (exit 3, asked through its actor) as an event.
#[tokio::test(flavor = "multi_thread")]
async fn the_actor_mesh_example_runs_against_its_manifest() -> anyhow::Result<()> {
    let env = Env::start("actors-example").await?;
    let manifest = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/actors/echo.yaml"
    ))?;
    env.apply(&manifest).await?;
    let mut said = Vec::new();
    let seen =
        hostmesh_actors_example::run(env.client.clone(), &env.namespace, "echo", |l| said.push(l))
            .await;
    let seen = seen.map_err(|e| anyhow::anyhow!("{e:#}; it said: {said:#?}"))?;
    assert_eq!(seen.replies, ["0:hello", "1:hello", "2:hello", "3:hello"]);
    assert_eq!(seen.slice, ["0:slice", "1:slice"]);
    match seen.ended {
        (3, hostmesh_client::MeshEvent::ProcEnded { exit_code, .. }) => {
            assert_eq!(exit_code, Some(3))
        }
        other => panic!("not rank 3's end: {other:?}"),
    }
    Ok(())
}

/// Issue 28: a new token written into `<world>-agent` is rotated to in
/// place, and costs a running job nothing. No host pod is replaced, the
/// client's actor mesh keeps answering over the links it has, a rank
/// restarted after the rotation (a proc of the new issuer) rejoins the
/// mesh of the client that read the old runtime key, and a client that
/// reads the rotated `<world>-runtime` (its new key and lineage) drives
/// the procs issued before the rotation and after it. Once the ProcMesh
/// from before the rotation is gone, the lineage is dropped.
#[tokio::test(flavor = "multi_thread")]
async fn rotating_the_world_token_in_place_costs_a_running_job_nothing() -> anyhow::Result<()> {
    use hostmesh_agent::echo::Echo;
    use hostmesh_client::{MeshClient, MeshEvent};
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{Pod, Secret};
    use kube::api::{Patch, PatchParams};
    use std::time::Duration;

    let env = Env::start("procmesh-rotate").await?;
    env.apply(&world_yaml("w", &[("host", 2)], "")).await?;
    env.apply(&echo_mesh(
        "{policy: OnFailure, maxRestarts: 5, backoff: 0s}",
    ))
    .await?;
    let old_client =
        MeshClient::connect(env.client.clone(), &env.namespace, "pm", client_options()).await?;
    let timeout = Duration::from_secs(20);
    let mut mesh = old_client.spawn::<Echo>("echo", &()).await?;
    let hi = "hi".to_string();
    let all = ["0:hi", "1:hi", "2:hi", "3:hi"];
    assert_eq!(
        answers(mesh.call_all(old_client.proc(), &hi, timeout).await?),
        all
    );
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let uids = async || -> anyhow::Result<Vec<String>> {
        let l = pods
            .list(&ListParams::default().labels("hostmesh.dev/world=w"))
            .await?;
        let mut u: Vec<String> = l
            .items
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        u.sort();
        Ok(u)
    };
    let hosts_before = uids().await?;
    assert_eq!(hosts_before.len(), 2);

    // Rotate: a new token in the Secret, and a touch of the World so the
    // operator reads it now rather than at its next periodic pass.
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.namespace);
    let token: String = (0..32)
        .map(|i| format!("{:02x}", (i as u8).wrapping_mul(37) ^ 0x5a))
        .collect();
    let patch = Secret {
        data: Some([("token".to_string(), ByteString(token.clone().into_bytes()))].into()),
        ..Default::default()
    };
    secrets
        .patch("w-agent", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    env.apply(&world_yaml("w", &[("host", 2)], "").replace(
        "metadata:\n  name: w\n",
        "metadata:\n  name: w\n  annotations: {e2e/rotated: \"1\"}\n",
    ))
    .await?;
    let data = |s: &Secret, k: &str| {
        s.data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    let start = std::time::Instant::now();
    loop {
        let copy = secrets.get_opt("w-agent-recovery").await?;
        let done = copy.as_ref().is_some_and(|c| {
            data(c, "token").as_deref() == Some(token.as_str()) && data(c, "previous").is_none()
        });
        if done {
            break;
        }
        anyhow::ensure!(
            start.elapsed() < hostmesh_e2e::WAIT,
            "the rotation did not finish; the copy holds keys {:?}\n--- operator log (tail) ---\n{}",
            copy.and_then(|c| c.data)
                .map(|d| d.keys().cloned().collect::<Vec<_>>()),
            hostmesh_e2e::tail(&env.log("operator"), 40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let runtime = secrets.get("w-runtime").await?;
    let lineage = data(&runtime, "lineage").expect("the rotated runtime Secret's lineage");
    assert!(!lineage.is_empty());
    assert_eq!(uids().await?, hosts_before, "no host pod was replaced");
    let w = env
        .wait_for("World", "w", "Running", |s| s["phase"] == "Running")
        .await?;
    assert_eq!(w["restarts"], 0, "{w:#}");

    // The established links keep answering.
    assert_eq!(
        answers(mesh.call_all(old_client.proc(), &hi, timeout).await?),
        all
    );
    // Rank 3 restarted after the rotation holds a credential of the new
    // issuer: the old client's mesh takes it back.
    kill_rank_3(&env)?;
    let start = std::time::Instant::now();
    loop {
        if let Some(MeshEvent::ProcRejoined { rank: 3, .. }) =
            old_client.next_event(Duration::from_secs(1)).await
        {
            break;
        }
        anyhow::ensure!(
            start.elapsed() < hostmesh_e2e::WAIT,
            "rank 3 did not rejoin"
        );
    }
    mesh = old_client.respawn(&mesh, "echo", &()).await?;
    assert_eq!(
        answers(mesh.call_all(old_client.proc(), &hi, timeout).await?),
        all
    );
    // A client of the rotated runtime Secret drives both kinds of procs.
    let new_client =
        MeshClient::connect(env.client.clone(), &env.namespace, "pm", client_options()).await?;
    let fresh = new_client.spawn::<Echo>("echo-2", &()).await?;
    assert_eq!(
        answers(fresh.call_all(new_client.proc(), &hi, timeout).await?),
        all
    );
    assert_eq!(uids().await?, hosts_before, "no host pod was replaced");
    let pm = env
        .wait_for("ProcMesh", "pm", "one restart", |s| s["restarts"] == 1)
        .await?;
    assert_eq!(pm["running"], 4, "{pm:#}");

    // The ProcMesh from before the rotation goes: the lineage is dropped.
    env.delete("ProcMesh", "pm").await?;
    env.apply(&world_yaml("w", &[("host", 2)], "").replace(
        "metadata:\n  name: w\n",
        "metadata:\n  name: w\n  annotations: {e2e/rotated: \"2\"}\n",
    ))
    .await?;
    let start = std::time::Instant::now();
    while data(&secrets.get("w-runtime").await?, "lineage").is_some() {
        anyhow::ensure!(
            start.elapsed() < hostmesh_e2e::WAIT,
            "the lineage was not dropped"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
