//! e2e: an unmodified Monarch client (PyPI `torchmonarch`, `KubernetesJob`
//! defaults, `tests/monarch_client.py`) attaches to the workers a World with
//! `spec.monarch` runs, from a pod inside the cluster and from this machine
//! outside it; it spawns procs on every host, an actor on every proc, calls
//! them all and one slice. Then a worker is SIGKILLed: the World's
//! `status.firstFailure` names rank, pod and SIGKILL (pushed by the agent,
//! not read from pod status), and the client gets an error, not a hang.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context as _;
use hostmesh_e2e::{
    Env, condition_true, eventually, monarch, pid_in_pod, signal, tail, world_yaml,
};

/// The World, and the Monarch mesh name the client asks for (its default).
const MESH: &str = "trainer";
const HOSTS: u32 = 2;
/// The rank whose worker is killed.
const VICTIM: u64 = 1;

fn client_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("monarch_client.py")
}

/// The venv's python (made on first use, off the async runtime's threads).
async fn monarch_python() -> anyhow::Result<PathBuf> {
    Ok(tokio::task::spawn_blocking(hostmesh_testkit::monarch::python).await?)
}

async fn ready_world(env: &Env, python: &Path) -> anyhow::Result<()> {
    env.apply(&monarch::world(MESH, HOSTS, python, "")).await?;
    env.wait_for("World", MESH, "Ready", |s| condition_true(s, "Ready"))
        .await?;
    // Attach mode finds the workers by Monarch's default selector.
    let pods = env.kubectl(&[
        "get",
        "pods",
        "-n",
        &env.namespace,
        "-l",
        &format!("app.kubernetes.io/name=monarch-worker,monarch.pytorch.org/mesh-name={MESH}"),
        "-o",
        "jsonpath={range .items[*]}{.metadata.labels.apps\\.kubernetes\\.io/pod-index} {end}",
    ])?;
    let mut ranks: Vec<&str> = pods.split_whitespace().collect();
    ranks.sort_unstable();
    assert_eq!(ranks, ["0", "1"], "pods by Monarch's selector");
    Ok(())
}

/// Kills host `VICTIM`'s worker and waits for `status.firstFailure` to name
/// it.
async fn kill_worker_and_see_it_in_status(env: &Env) -> anyhow::Result<()> {
    let pid = env.monarch_worker_pid(MESH, VICTIM as u32)?;
    // The agent names the worker by its PID in the pod.
    let pod_pid = pid_in_pod(pid);
    signal(pid, "KILL")?;
    let status = env
        .wait_for(
            "World",
            MESH,
            "firstFailure naming the killed worker",
            |s| {
                let f = &s["firstFailure"];
                f["rank"].as_u64() == Some(VICTIM) && f["signal"].as_i64() == Some(9)
            },
        )
        .await?;
    let f = &status["firstFailure"];
    assert_eq!(f["pod"], format!("{MESH}-host-{VICTIM}"), "{f:#}");
    let reason = f["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("SIGKILL") && reason.contains(&format!("pid {pod_pid}")),
        "{f:#}"
    );
    assert!(
        f["command"]
            .as_str()
            .unwrap_or_default()
            .contains("run_worker_loop_forever"),
        "{f:#}"
    );
    Ok(())
}

/// What the client's first round must have printed: every actor (2 hosts x
/// 2 procs) answered, and the slice.
fn check_first_round(out: &str) {
    let all = out
        .lines()
        .find_map(|l| l.strip_prefix("ALL "))
        .unwrap_or_default();
    assert_eq!(all.split_whitespace().count(), 4, "{out}");
    for h in 0..HOSTS {
        assert!(all.contains(&format!("{MESH}-host-{h}:")), "{out}");
    }
    assert!(
        out.lines()
            .any(|l| l.starts_with(&format!("SLICE {MESH}-host-{}:", HOSTS - 1))),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_monarch_client_in_a_pod_attaches_and_sees_a_killed_worker() -> anyhow::Result<()> {
    let python = monarch_python().await?;
    let env = Env::start("monarch-in").await?;
    ready_world(&env, &python).await?;
    env.kubectl_apply(
        "monarch-client",
        &monarch::client_pod(
            &env,
            "monarch-client",
            &python,
            &client_script(),
            &[env.namespace.clone(), MESH.into(), HOSTS.to_string()],
        )?,
    )?;
    let logs = || env.pod_logs("monarch-client");
    let phase = || env.pod_phase("monarch-client");
    eventually("the client's first round", || {
        logs().contains("ROUND1 OK") || phase() == "Failed"
    })
    .await
    .with_context(|| format!("client log:\n{}", tail(&logs(), 40)))?;
    let out = logs();
    assert!(out.contains("ROUND1 OK"), "client failed:\n{out}");
    check_first_round(&out);

    kill_worker_and_see_it_in_status(&env).await?;
    eventually("the client to end", || {
        matches!(phase().as_str(), "Succeeded" | "Failed")
    })
    .await
    .with_context(|| format!("client log:\n{}", tail(&logs(), 40)))?;
    let out = logs();
    assert_eq!(phase(), "Succeeded", "the client saw no error:\n{out}");
    assert!(out.contains("CALL FAILED"), "{out}");
    Ok(())
}

/// Runs the client on this machine with the kubeconfig (Monarch's own
/// port-forward), output into `dir`; `once`: stop after the first round.
fn outside_client(
    env: &Env,
    python: &Path,
    dir: &Path,
    once: bool,
) -> anyhow::Result<std::process::Child> {
    Command::new(python)
        .arg("-u")
        .arg(client_script())
        .args([env.namespace.as_str(), MESH, &HOSTS.to_string()])
        .arg(&env.kubeconfig)
        .env("KUBECONFIG", &env.kubeconfig)
        .env("CLIENT_ONCE", if once { "1" } else { "0" })
        // The user's shell, not the client: this machine's hostname
        // resolves only to loopback, which Monarch refuses for its
        // hostname transport; an explicit client address is Monarch's own
        // remedy (docs/monarch.md). Pods never dial it: everything flows
        // over the port-forward to rank 0 (duplex attach).
        .env("HYPERACTOR_MESH_DEFAULT_TRANSPORT", "tcp://127.0.0.1:0")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("client.log"))?)
        .stderr(std::fs::File::create(dir.join("client.err"))?)
        .spawn()
        .context("starting the Monarch client")
}

/// Outside the cluster: attach, call, see the kill as an error; then, once
/// the failure policy has replaced the host, a new client attaches to the
/// new worker (docs/monarch.md, "Restarts and a running client").
#[tokio::test(flavor = "multi_thread")]
async fn a_monarch_client_outside_attaches_through_port_forward() -> anyhow::Result<()> {
    let python = monarch_python().await?;
    let env = Env::start("monarch-out").await?;
    ready_world(&env, &python).await?;
    let dir = tempfile::tempdir()?;
    let out = || std::fs::read_to_string(dir.path().join("client.log")).unwrap_or_default();
    let err = || std::fs::read_to_string(dir.path().join("client.err")).unwrap_or_default();
    let mut client = outside_client(&env, &python, dir.path(), false)?;
    let result = async {
        eventually("the client's first round", || {
            out().contains("ROUND1 OK") || client.try_wait().is_ok_and(|s| s.is_some())
        })
        .await?;
        anyhow::ensure!(out().contains("ROUND1 OK"), "client ended early");
        check_first_round(&out());
        kill_worker_and_see_it_in_status(&env).await?;
        eventually("the client to end", || {
            client.try_wait().is_ok_and(|s| s.is_some())
        })
        .await?;
        anyhow::ensure!(out().contains("CALL FAILED"), "the client saw no error");

        env.wait_for("World", MESH, "host replaced and Ready again", |s| {
            s["restarts"].as_u64().unwrap_or(0) >= 1 && condition_true(s, "Ready")
        })
        .await?;
        client = outside_client(&env, &python, dir.path(), true)?;
        eventually("the new client to end", || {
            client.try_wait().is_ok_and(|s| s.is_some())
        })
        .await?;
        anyhow::ensure!(
            client.wait()?.success() && out().contains("ROUND1 OK"),
            "a new client did not attach to the replaced host"
        );
        check_first_round(&out());
        Ok(())
    }
    .await;
    let _ = client.kill();
    let _ = client.wait();
    result.with_context(|| {
        format!(
            "client stdout:\n{}\nclient stderr:\n{}",
            tail(&out(), 40),
            tail(&err(), 80)
        )
    })
}

/// A worker that never listens (here: a command that only sleeps) leaves
/// its pod not Ready, and the World says which rank waits and why.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_that_never_listens_is_named_in_status() -> anyhow::Result<()> {
    let env = Env::start("monarch-idle").await?;
    env.apply(&world_yaml(
        "idle",
        &[("host", 1)],
        "  monarch: {command: [sleep, \"3600\"]}\n",
    ))
    .await?;
    let status = env
        .wait_for("World", "idle", "host 0 waiting for its worker", |s| {
            s["hosts"].as_array().into_iter().flatten().any(|r| {
                r["reason"].as_str().is_some_and(|why| {
                    why.starts_with("monarch worker (pid ")
                        && why.contains("not listening on :26600 for ")
                })
            })
        })
        .await?;
    assert!(!condition_true(&status, "Ready"), "{status:#}");
    let ready = env.kubectl(&[
        "get",
        "pod",
        "-n",
        &env.namespace,
        "idle-host-0",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
    ])?;
    assert_eq!(
        ready, "False",
        "the pod is not Ready while its worker does not listen"
    );
    Ok(())
}

/// A mesh name Monarch would refuse (here the World's own name, which has a
/// `-`) and a worker port that is the agent's are flagged in status, naming
/// the field and the fix; no host pod is made.
#[tokio::test(flavor = "multi_thread")]
async fn bad_monarch_specs_are_flagged_naming_the_field() -> anyhow::Result<()> {
    let env = Env::start("monarch-invalid").await?;
    for (name, spec, field) in [
        ("my-world", "  monarch: {}\n", "spec.monarch.meshName"),
        ("clash", "  monarch: {port: 26602}\n", "spec.monarch.port"),
    ] {
        env.apply(&world_yaml(name, &[("host", 1)], spec)).await?;
        let status = env
            .wait_for("World", name, "a condition naming the field", |s| {
                s.to_string().contains(field)
            })
            .await?;
        assert!(!condition_true(&status, "Ready"), "{status:#}");
        assert!(status.to_string().contains("e.g."), "the fix: {status:#}");
    }
    let pods = env.kubectl(&["get", "pods", "-n", &env.namespace, "-o", "name"])?;
    assert_eq!(pods.trim(), "", "no host pods for invalid Worlds");
    Ok(())
}
