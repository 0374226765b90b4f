//! `hostmesh operator` as a process against the embedded API server: JSON
//! logs on stderr (one object per line), the HTTP endpoint, the Lease taken,
//! and on SIGTERM a clean exit that releases the Lease.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};

use hostmesh_testkit::{PATIENCE, eventually_ok, poll};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

#[tokio::test(flavor = "multi_thread")]
async fn operator_process_logs_json_leads_and_releases_the_lease_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    let server = hostmesh_testkit::cluster::server_with_crds(&kubeconfig).await;
    let client = server.client().expect("client");

    let mut child = Command::new(env!("CARGO_BIN_EXE_hostmesh"))
        .args([
            "operator",
            "--log-format",
            "json",
            "--log-level",
            "info",
            "--http-addr",
            "127.0.0.1:0",
            "--leader-elect",
            "--leader-elect-namespace",
            "default",
            "--leader-elect-identity",
            "proc-a",
            "--watch-namespaces",
            "default",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hostmesh operator");
    let pid = child.id();

    // Every stderr line is a JSON object; the endpoint's address is logged.
    let stderr = child.stderr.take().expect("stderr");
    let (addr_tx, addr_rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut bad = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<serde_json::Value>(&line) {
                Ok(v) => {
                    if let Some(addr) = v["fields"]["addr"].as_str()
                        && v["fields"]["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("/metrics"))
                    {
                        let _ = addr_tx.send(addr.to_owned());
                    }
                }
                Err(_) => bad.push(line),
            }
        }
        bad
    });
    let addr = tokio::task::spawn_blocking(move || addr_rx.recv_timeout(PATIENCE))
        .await
        .expect("join")
        .expect("the operator logs its HTTP address");

    eventually_ok(
        "the operator to lead",
        async || match hostmesh_testkit::http::get(&addr, "/readyz").await {
            Some((200, body)) if body.contains("[+]leader-election leader") => Ok(()),
            other => Err(other),
        },
    )
    .await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let holder = |l: Lease| l.spec.and_then(|s| s.holder_identity);
    assert_eq!(
        holder(leases.get("hostmesh-operator").await.expect("lease")).as_deref(),
        Some("proc-a")
    );

    // SIGTERM, to this child only (by PID).
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let exit = poll(PATIENCE, async || {
        child.try_wait().expect("try_wait").ok_or(())
    })
    .await;
    let exit = exit.unwrap_or_else(|()| {
        let _ = child.kill();
        panic!("operator did not exit after SIGTERM");
    });
    assert!(exit.success(), "clean exit after SIGTERM: {exit}");
    assert_eq!(
        holder(leases.get("hostmesh-operator").await.expect("lease")),
        None,
        "the Lease is released on shutdown"
    );
    let bad = reader.join().expect("reader");
    assert!(bad.is_empty(), "non-JSON log lines: {bad:?}");
    server.shutdown().await;
}
