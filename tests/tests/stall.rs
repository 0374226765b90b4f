//! e2e: stall detection with real agents and procs. Of 8 ranks printing
//! every half second, a hung one makes `Stalled=True` naming it while the
//! busy ranks stay unflagged, the stacks of every rank land in ConfigMap
//! `<pm>-stacks` and print with `hostmesh stacks`, the stall ends when
//! output resumes, and `OnFailure` restarts a stalled rank.

use std::process::Command;

use hostmesh_e2e::{Env, condition_true, hostmesh_bin, world_yaml};
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{Api, ListParams};

fn mesh_yaml(name: &str, world: &str, per_host: u32, command: &str, extra: &str) -> String {
    format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: {name}}}\nspec:\n  world: {world}\n  perHost: [{{name: gpu, size: {per_host}}}]\n  command: [sh, -c, {command:?}]\n  stallTimeout: 2s\n{extra}"
    )
}

/// `hostmesh <args> -n <ns> --kubeconfig <kc>`: its stdout, or an error
/// with its stderr.
fn hostmesh(env: &Env, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(hostmesh_bin())
        .args(args)
        .arg("-n")
        .arg(&env.namespace)
        .arg("--kubeconfig")
        .arg(&env.kubeconfig)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "hostmesh {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn condition_message(status: &serde_json::Value, kind: &str) -> String {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_owned()
}

async fn stacks_configmap(env: &Env, name: &str) -> anyhow::Result<ConfigMap> {
    let api: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    let start = std::time::Instant::now();
    loop {
        if let Some(cm) = api.get_opt(name).await? {
            return Ok(cm);
        }
        anyhow::ensure!(
            start.elapsed() < hostmesh_e2e::WAIT,
            "no ConfigMap {name}\n{}",
            hostmesh_e2e::tail(&env.log("operator"), 40)
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

async fn has_event(env: &Env, reason: &str) -> anyhow::Result<bool> {
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.namespace);
    let list = events.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .any(|e| e.reason.as_deref() == Some(reason)))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_rank_is_stalled_with_stacks_of_every_rank() -> anyhow::Result<()> {
    let env = Env::start("stall-hang").await?;
    env.apply(&world_yaml("w", &[("host", 2)], "")).await?;
    // Of 8 ranks, rank 5 prints once and hangs in a sleep until the test kills that
    // sleep; the others print a line every half second, for longer than
    // stallTimeout.
    let cmd = "if [ \"$RANK\" = 5 ]; then echo start; sleep 600; fi; while :; do echo tick; sleep 0.5; done";
    env.apply(&mesh_yaml(
        "pm",
        "w",
        4,
        cmd,
        &format!(
            "  env: [{{name: STALL_TEST, value: {}}}]\n  restartPolicy: {{policy: Never, onStall: Report}}\n",
            env.namespace
        ),
    ))
    .await?;
    let status = env
        .wait_for("ProcMesh", "pm", "Stalled", |s| {
            condition_true(s, "Stalled")
        })
        .await?;
    let msg = condition_message(&status, "Stalled");
    assert!(
        msg.starts_with("ranks 5 stalled; rank 5: no progress for"),
        "only the hung rank, as runs: {msg}"
    );
    assert!(
        msg.contains("blocked"),
        "a sleeping rank uses no CPU: {msg}"
    );
    assert_eq!(
        status["phase"], "Running",
        "onStall Report keeps it running: {status:#}"
    );

    // Stacks of every rank, the hung one's showing its sleeping child.
    let cm = stacks_configmap(&env, "pm-stacks").await?;
    let data = cm.data.unwrap_or_default();
    for r in 0..8 {
        assert!(
            data.contains_key(&format!("rank-{r}")),
            "rank {r}: {data:#?}"
        );
    }
    assert!(data["rank-5"].contains("(sleep)"), "{}", data["rank-5"]);
    assert!(
        data["summary"].contains("stall of ranks 5"),
        "{}",
        data["summary"]
    );

    // Through the CLI, as a user with only API access would read them.
    let all = hostmesh(&env, &["stacks", "procmesh/pm"])?;
    assert!(
        all.contains("rank 0 (") && all.contains("rank 7 ("),
        "{all}"
    );
    let five = hostmesh(&env, &["stacks", "procmesh/pm", "--rank", "5"])?;
    assert!(
        five.starts_with("rank 5 (") && !five.contains("rank 6 ("),
        "{five}"
    );
    let view = hostmesh(&env, &["status", "procmesh/pm"])?;
    assert!(view.contains("Stalled: ranks 5 stalled"), "{view}");
    assert!(has_event(&env, "Stalled").await?, "a Stalled Event");

    // Output resumes (its sleep ends): the stall ends.
    let ns = env.namespace.clone();
    let hung = hostmesh_e2e::find_pids(|e| {
        e.get("STALL_TEST") == Some(&ns) && e.get("RANK").map(String::as_str) == Some("5")
    })
    .into_iter()
    .filter(|p| {
        std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep\x00600"))
    })
    .collect::<Vec<_>>();
    anyhow::ensure!(hung.len() == 1, "rank 5's sleep: {hung:?}");
    hostmesh_e2e::signal(hung[0], "TERM")?;
    let status = env
        .wait_for("ProcMesh", "pm", "the stall over", |s| {
            s["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Stalled" && c["status"] == "False")
            })
        })
        .await?;
    assert_eq!(status["running"], 8, "{status:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn on_failure_restarts_a_stalled_rank_after_taking_its_stacks() -> anyhow::Result<()> {
    let env = Env::start("stall-restart").await?;
    let marks = env.shared_dir()?;
    env.apply(&world_yaml("w", &[("host", 1)], "")).await?;
    // Rank 1 hangs the first time only; afterwards it prints like rank 0.
    let cmd = format!(
        "if [ \"$RANK\" = 1 ] && [ ! -e {m}/once ]; then touch {m}/once; echo start; sleep 600; fi; while :; do echo tick; sleep 0.5; done",
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
    assert_eq!(status["firstFailure"]["rank"], 1, "{status:#}");
    assert_eq!(status["firstFailure"]["state"], "Stalled", "{status:#}");
    assert_eq!(status["running"], 2, "{status:#}");
    // The stacks were taken before the restart: the hung sleep is in them.
    let cm = stacks_configmap(&env, "pm-stacks").await?;
    let data = cm.data.unwrap_or_default();
    assert!(
        data.get("rank-1").is_some_and(|t| t.contains("(sleep)")),
        "{data:#?}"
    );
    assert!(has_event(&env, "Stalled").await?, "a Stalled Event");
    Ok(())
}
