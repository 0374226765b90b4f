//! e2e: a World becomes Running with an agent in every host pod, is usable
//! with `kubectl wait`, and leaves nothing behind when deleted.

use hostmesh_e2e::{Env, condition_true, eventually, world_yaml};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

#[tokio::test(flavor = "multi_thread")]
async fn world_of_four_hosts_becomes_running_with_an_agent_per_pod() -> anyhow::Result<()> {
    let env = Env::start("world-running").await?;
    env.apply(&world_yaml("w4", &[("replica", 2), ("host", 2)], ""))
        .await?;
    let status = env
        .wait_for("World", "w4", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    assert_eq!(status["phase"], "Running", "{status:#}");
    assert_eq!(status["readyHosts"], 4, "{status:#}");
    assert_eq!(status["ready"], "4/4", "{status:#}");

    // One pod per rank, named and labelled by rank, user labels kept.
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let list = pods
        .list(&ListParams::default().labels("hostmesh.dev/world=w4"))
        .await?;
    let mut names: Vec<String> = list
        .items
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, ["w4-host-0", "w4-host-1", "w4-host-2", "w4-host-3"]);
    for p in &list.items {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("team").map(String::as_str),
            Some("e2e"),
            "user label lost"
        );
    }
    // Every host runs a real agent process.
    for rank in 0..4 {
        assert_eq!(env.agent_pids("w4", rank).len(), 1, "agent of host {rank}");
    }
    // kubectl wait understands the condition.
    env.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "world/w4",
        "-n",
        &env.namespace,
        "--timeout=60s",
    ])?;
    // The README's `kubectl port-forward` to the agent's health port: it
    // connects to localhost inside the pod, where the agent listens too.
    let mut pf = std::process::Command::new("kubectl")
        .env("KUBECONFIG", &env.kubeconfig)
        .args([
            "port-forward",
            "-n",
            &env.namespace,
            "pod/w4-host-0",
            ":26601",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut line = String::new();
    // Kept open until kubectl is killed: it writes more lines.
    let mut out = std::io::BufReader::new(pf.stdout.take().expect("piped"));
    std::io::BufRead::read_line(&mut out, &mut line)?;
    // "Forwarding from 127.0.0.1:<port> -> 26601"
    let local = line
        .split_whitespace()
        .nth(2)
        .unwrap_or_default()
        .to_string();
    let ready = hostmesh_testkit::http::get(local.as_str(), "/readyz").await;
    let _ = pf.kill();
    let _ = pf.wait();
    drop(out);
    assert_eq!(
        ready.map(|(code, _)| code),
        Some(200),
        "port-forward to the health port ({line})"
    );
    // And kubectl get shows the printer columns.
    let table = env.kubectl(&["get", "worlds", "-n", &env.namespace])?;
    assert!(
        table.contains("READY") && table.contains("4/4") && table.contains("Running"),
        "{table}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_world_stops_everything_and_leaves_no_object() -> anyhow::Result<()> {
    let env = Env::start("world-delete").await?;
    // Each proc records that it was asked to stop (SIGTERM) before exiting.
    let marks = env.shared_dir()?;
    env.apply(&world_yaml("wd", &[("host", 2)], "")).await?;
    let cmd = format!(
        "trap 'touch {m}/term-$RANK; exit 0' TERM; sleep 300 & wait",
        m = marks.display()
    );
    env.apply(&format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: sleepers}}\nspec:\n  world: wd\n  perHost: [{{name: gpu, size: 2}}]\n  command: [sh, -c, {cmd:?}]\n"
    ))
    .await?;
    env.wait_for("ProcMesh", "sleepers", "Ready", |s| {
        condition_true(s, "Ready")
    })
    .await?;
    assert_eq!(env.proc_pids("wd", "sleepers").len(), 4);
    env.delete("World", "wd").await?;
    eventually("every proc and agent gone", || {
        env.proc_pids("wd", "sleepers").is_empty()
            && (0..2).all(|r| env.agent_pids("wd", r).is_empty())
    })
    .await?;
    for rank in 0..4 {
        assert!(
            marks.join(format!("term-{rank}")).exists(),
            "rank {rank} was not stopped gracefully (no SIGTERM seen)"
        );
    }
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let api = env.hostmesh_api("ProcMesh");
    let worlds = env.hostmesh_api("World");
    let start = std::time::Instant::now();
    loop {
        let left_pods = pods.list(&ListParams::default()).await?.items.len();
        let left_meshes = api.list(&ListParams::default()).await?.items.len();
        let left_worlds = worlds.list(&ListParams::default()).await?.items.len();
        if left_pods + left_meshes + left_worlds == 0 {
            break;
        }
        anyhow::ensure!(
            start.elapsed() < hostmesh_e2e::WAIT,
            "objects left: {left_pods} pods, {left_meshes} procmeshes, {left_worlds} worlds"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_specs_are_rejected_or_flagged_naming_the_field() -> anyhow::Result<()> {
    let env = Env::start("invalid").await?;
    // Schema: a dimension size of 0 is rejected at admission, naming the field.
    let err = env
        .apply(&world_yaml("bad", &[("host", 0)], ""))
        .await
        .expect_err("size 0 must be rejected");
    let msg = format!("{err:#}");
    assert!(msg.contains("size"), "{msg}");
    // Controller-side: a perHost dimension that is also a World dimension.
    env.apply(&world_yaml("wv", &[("host", 1)], "")).await?;
    env.apply(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {name: clash}\nspec:\n  world: wv\n  perHost: [{name: host, size: 2}]\n  command: [sleep, '1']\n",
    )
    .await?;
    let status = env
        .wait_for("ProcMesh", "clash", "a condition naming perHost", |s| {
            s.to_string().contains("perHost")
        })
        .await?;
    assert!(!condition_true(&status, "Ready"), "{status:#}");
    // A ProcMesh whose World does not exist says so.
    env.apply(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {name: orphan}\nspec:\n  world: nowhere\n  command: [sleep, '1']\n",
    )
    .await?;
    env.wait_for("ProcMesh", "orphan", "a condition naming the World", |s| {
        s.to_string().contains("nowhere")
    })
    .await?;
    Ok(())
}

/// A World whose agent Secret already exists (made by someone else, with a
/// token a shell would write: whitespace around it) still becomes Ready: the
/// operator and the agents derive the same key from it.
#[tokio::test(flavor = "multi_thread")]
async fn a_preexisting_agent_secret_with_whitespace_around_its_token_works() -> anyhow::Result<()> {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::PostParams;

    let env = Env::start("world-secret").await?;
    let mut secret = Secret::default();
    secret.metadata.name = Some("ws-agent".into());
    secret.data = Some(
        [(
            "token".to_string(),
            ByteString(b"\x0c 0123456789abcdef0123456789abcdef\n".to_vec()),
        )]
        .into(),
    );
    Api::<Secret>::namespaced(env.client.clone(), &env.namespace)
        .create(&PostParams::default(), &secret)
        .await?;
    env.apply(&world_yaml("ws", &[("host", 2)], "")).await?;
    env.wait_for("World", "ws", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    Ok(())
}

/// A World whose template meets the `restricted` Pod Security Standard
/// (non-root uid 65532, seccomp RuntimeDefault, no capabilities, no
/// privilege escalation) becomes Ready in a namespace that enforces it: the
/// operator's additions (the `hostmesh-install` init container, the agent
/// Secret and binary volumes) are admissible, and the agent, not root,
/// can read its Secret.
#[tokio::test(flavor = "multi_thread")]
async fn a_restricted_world_is_admitted_and_ready_where_restricted_is_enforced()
-> anyhow::Result<()> {
    let env = Env::start("world-restricted").await?;
    env.label_namespace(&[
        ("pod-security.kubernetes.io/enforce", "restricted"),
        ("pod-security.kubernetes.io/enforce-version", "latest"),
    ])
    .await?;
    let restricted = "        securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}\n      \
                      securityContext: {runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, seccompProfile: {type: RuntimeDefault}}\n";
    env.apply(&world_yaml("wr", &[("host", 2)], restricted))
        .await?;
    let status = env
        .wait_for("World", "wr", "Ready", |s| condition_true(s, "Ready"))
        .await?;
    assert_eq!(status["readyHosts"], 2, "{status:#}");
    // The enforcement is real: a plain pod is refused in the namespace.
    let plain: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }))?;
    let refused = Api::<Pod>::namespaced(env.client.clone(), &env.namespace)
        .create(&kube::api::PostParams::default(), &plain)
        .await;
    match refused {
        Err(kube::Error::Api(s)) => assert!(
            s.code == 403
                && s.message
                    .contains("violates PodSecurity \"restricted:latest\""),
            "{s:?}"
        ),
        other => anyhow::bail!("a plain pod was not refused: {other:?}"),
    }
    Ok(())
}

/// A World whose host pods admission refuses (PodSecurity `restricted` in
/// its namespace, a template that does not meet it) says so in status and
/// in a Warning Event, with the API server's own message.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_host_pod_is_a_replica_failure_condition_and_an_event() -> anyhow::Result<()> {
    let env = Env::start("world-refused").await?;
    env.label_namespace(&[("pod-security.kubernetes.io/enforce", "restricted")])
        .await?;
    env.apply(&world_yaml("wp", &[("host", 2)], "")).await?;
    let status = env
        .wait_for("World", "wp", "ReplicaFailure", |s| {
            condition_true(s, "ReplicaFailure")
        })
        .await?;
    let cond = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "ReplicaFailure"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(cond["reason"], "FailedCreate", "{status:#}");
    let msg = cond["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("wp-host-") && msg.contains("violates PodSecurity"),
        "{msg}"
    );
    let events = env.kubectl(&[
        "get",
        "events",
        "-n",
        &env.namespace,
        "--field-selector",
        "involvedObject.name=wp",
        "-o",
        "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
    ])?;
    assert!(
        events.contains("FailedCreate: host pod wp-host-"),
        "a Warning Event carries the refusal: {events}"
    );
    Ok(())
}
