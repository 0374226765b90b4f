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
use hostmesh_e2e::monarch::Monarch;
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
    ready_world_of(env, Monarch::Release, python).await
}

async fn ready_world_of(env: &Env, which: Monarch, python: &Path) -> anyhow::Result<()> {
    env.apply(&monarch::world_of(which, MESH, HOSTS, python, ""))
        .await?;
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
    outside_attach(Monarch::Release, "monarch-out").await
}

/// The same with the next Monarch (`TORCHMONARCH_NEXT`, its client and its
/// workers), whose client attaches only to workers that declare their
/// service identity (`MONARCH_POD_UID`, docs/monarch.md).
#[tokio::test(flavor = "multi_thread")]
async fn a_next_monarch_client_outside_attaches_through_port_forward() -> anyhow::Result<()> {
    outside_attach(Monarch::Next, "monarch-next-out").await
}

async fn outside_attach(which: Monarch, test: &str) -> anyhow::Result<()> {
    let python = tokio::task::spawn_blocking(move || which.python()).await?;
    let env = Env::start(test).await?;
    ready_world_of(&env, which, &python).await?;
    // Monarch 0.8's client refuses a worker pod that declares no service
    // identity; every host pod declares MONARCH_POD_UID (its own uid).
    let declared = env.kubectl(&[
        "get",
        "pod",
        "-n",
        &env.namespace,
        &format!("{MESH}-host-0"),
        "-o",
        "jsonpath={.spec.containers[0].env[?(@.name==\"MONARCH_POD_UID\")].valueFrom.fieldRef.fieldPath}",
    ])?;
    assert_eq!(
        declared, "metadata.uid",
        "MONARCH_POD_UID from the downward API"
    );
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

fn tls_client_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("monarch_tls_client.py")
}

/// `spec.monarch.transport: Tls` with Monarch 0.7 (docs/monarch.md, "TLS"):
/// the workers serve mutual TLS with a certificate per host from the
/// World's own CA; a client holding the World's client Secret spawns and
/// calls actors on both hosts; one whose certificate comes from another CA
/// is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_tls_monarch_world_serves_clients_of_its_ca_and_refuses_others() -> anyhow::Result<()> {
    tls_attach(Monarch::Release, "monarch-tls").await
}

/// The same with Monarch 0.8, whose workers also carry the service
/// identity derived from their pod's uid.
#[tokio::test(flavor = "multi_thread")]
async fn a_next_monarch_client_calls_tls_workers_and_another_ca_is_refused() -> anyhow::Result<()> {
    tls_attach(Monarch::Next, "monarch-next-tls").await
}

async fn tls_attach(which: Monarch, test: &str) -> anyhow::Result<()> {
    use hostmesh_e2e::monarch::{ClientExtras, client_pod_with};
    use hostmesh_operator::controllers::world::monarch_tls;
    use k8s_openapi::api::core::v1::{Pod, Secret};
    use kube::api::{Api, PostParams};

    let python = tokio::task::spawn_blocking(move || which.python()).await?;
    let env = Env::start(test).await?;
    // A client reaches the second worker through the first, which dials it
    // by its FQDN: that needs cluster DNS, which the embedded cluster
    // serves and `../shared/realk8s` lacks (no CoreDNS). There the World
    // has one host (docs/testing.md).
    let hosts = if env.placement == hostmesh_e2e::Placement::Embedded {
        HOSTS
    } else {
        1
    };
    let world = monarch::world_of(which, MESH, hosts, &python, "")
        .replace("monarch: {}", "monarch: {transport: Tls}");
    anyhow::ensure!(world.contains("transport: Tls"), "{world}");
    env.apply(&world).await?;
    let status = env
        .wait_for("World", MESH, "Ready", |s| condition_true(s, "Ready"))
        .await?;
    let client_secret = format!("{MESH}-monarch-client");
    assert_eq!(status["monarch"]["clientSecret"], client_secret.as_str());

    // The Secrets: the CA stays with the operator; hosts and clients get
    // their own certificate and the CA's certificate.
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.namespace);
    let ca = secrets.get(&monarch_tls::ca_name(MESH)).await?;
    let ca_crt = ca.data.unwrap_or_default()["ca.crt"].clone();
    let client = secrets.get(&client_secret).await?;
    assert_eq!(client.type_.as_deref(), Some("kubernetes.io/tls"));
    let data = client.data.unwrap_or_default();
    assert!(data.contains_key("tls.crt") && data.contains_key("tls.key"));
    assert_eq!(data["ca.crt"], ca_crt, "the client trusts the World's CA");
    assert!(!data.contains_key("ca.key"));
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let (mut workers, mut uids, mut aliases) = (Vec::new(), Vec::new(), Vec::new());
    for rank in 0..hosts as usize {
        let pod = pods.get(&format!("{MESH}-host-{rank}")).await?;
        let mounted: Vec<String> = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|v| v.secret.as_ref()?.secret_name.clone())
            .collect();
        assert_eq!(
            mounted,
            [monarch_tls::host_name(MESH, rank)],
            "host {rank} mounts its own certificate and nothing else"
        );
        let host = secrets.get(&monarch_tls::host_name(MESH, rank)).await?;
        assert_eq!(host.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(host.data.unwrap_or_default()["ca.crt"], ca_crt);
        let ip = pod
            .status
            .and_then(|s| s.pod_ip)
            .context("a Ready host pod has an IP")?;
        let fqdn = monarch_tls::host_dns_names(MESH, &env.namespace, rank)[0].clone();
        workers.push(format!("tls://{fqdn}:26600"));
        uids.push(pod.metadata.uid.unwrap_or_default());
        aliases.push((ip, vec![fqdn]));
    }

    // A client certificate of another CA, beside this World's own CA
    // certificate (public to anyone who can read a host's files): the
    // client trusts the workers, so it is the workers that must refuse it.
    let (foreign, _) =
        monarch_tls::Ca::generate(&env.namespace, "elsewhere", monarch_tls::VALIDITY)?;
    let monarch_tls::Leaf { crt, key, .. } = foreign.issue(monarch_tls::CLIENT_NAME, &[])?;
    let world_ca = String::from_utf8(ca_crt.0.clone())?;
    let rogue: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "rogue-tls"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": crt, "tls.key": key, "ca.crt": world_ca},
    }))?;
    secrets.create(&PostParams::default(), &rogue).await?;

    let args = [workers.join(","), uids.join(",")];
    let image = match which {
        Monarch::Release => "monarch-client",
        Monarch::Next => "monarch-next",
    };
    for (name, secret) in [
        ("tls-client", client_secret.as_str()),
        ("rogue-client", "rogue-tls"),
    ] {
        let extras = ClientExtras {
            image: Some(image),
            tls_secret: Some(secret.to_string()),
            host_aliases: aliases.clone(),
        };
        env.kubectl_apply(
            name,
            &client_pod_with(&env, name, &python, &tls_client_script(), &args, &extras)?,
        )?;
    }
    let ended = |pod: &str| matches!(env.pod_phase(pod).as_str(), "Succeeded" | "Failed");
    eventually("both clients to end", || {
        ended("tls-client") && ended("rogue-client")
    })
    .await
    .with_context(|| {
        format!(
            "client:\n{}\nrogue:\n{}",
            tail(&env.pod_logs("tls-client"), 40),
            tail(&env.pod_logs("rogue-client"), 40)
        )
    })?;
    let out = env.pod_logs("tls-client");
    assert_eq!(env.pod_phase("tls-client"), "Succeeded", "{out}");
    let ok = out
        .lines()
        .find(|l| l.starts_with("TLS OK"))
        .with_context(|| format!("no TLS OK line:\n{out}"))?;
    for (_, names) in &aliases {
        assert!(ok.contains(&names[0]), "every host answered: {ok}");
    }
    let rogue_out = env.pod_logs("rogue-client");
    assert_eq!(env.pod_phase("rogue-client"), "Failed", "{rogue_out}");
    // Monarch reports a refused handshake only as its attach timing out.
    assert!(rogue_out.contains("TLS FAILED"), "{rogue_out}");
    assert!(!rogue_out.contains("TLS OK"), "{rogue_out}");
    Ok(())
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
