//! Two `hostmesh operator` replicas with leader election against the
//! embedded API server, observed from outside through their real HTTP
//! endpoints: one leads and runs the controllers, the other is a ready
//! standby; on graceful shutdown the leader releases the Lease and the
//! standby takes over (ops.rs invariants 1-2).

use std::sync::Arc;

use clap::Parser;
use hostmesh_crds::World;
use hostmesh_operator::client_metrics;
use hostmesh_operator::metrics::Metrics;
use hostmesh_operator::ops::{OperatorCommand, run_with};
use hostmesh_testkit::http::get;
use hostmesh_testkit::{PATIENCE, eventually_async, eventually_ok};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    cmd: OperatorCommand,
}

fn command(identity: &str) -> OperatorCommand {
    Cli::parse_from([
        "hostmesh-operator",
        "--watch-namespaces",
        "default",
        "--leader-elect",
        "--leader-elect-namespace",
        "default",
        "--leader-elect-identity",
        identity,
        "--leader-elect-lease-duration",
        "2s",
        "--leader-elect-renew-deadline",
        "1500ms",
        "--leader-elect-retry-period",
        "200ms",
    ])
    .cmd
}

/// Polls `addr` `path` until it answers `code` with `needle` in the body.
async fn wait_for_body(addr: std::net::SocketAddr, path: &str, code: u16, needle: &str) -> String {
    let what = format!("{code} {needle:?} from {addr}{path}");
    eventually_ok(&what, async || match get(addr, path).await {
        Some((c, body)) if c == code && body.contains(needle) => Ok(body),
        other => Err(other),
    })
    .await
}

struct Replica {
    addr: std::net::SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), hostmesh_operator::ops::OpsError>>,
}

/// A replica with its own client, built as `hostmesh operator` builds it
/// (status writes counted at the client).
async fn replica(kubeconfig_yaml: &str, identity: &str) -> Replica {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig_yaml).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    let metrics = Arc::new(Metrics::new());
    let client = client_metrics::client(config, metrics.clone()).expect("client");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(run_with(
        command(identity),
        client,
        metrics,
        listener,
        async {
            let _ = rx.await;
        },
    ));
    Replica { addr, stop, task }
}

#[tokio::test]
async fn one_replica_leads_the_other_stands_by_and_takes_over_on_shutdown() {
    // Logs show in the output of a failing run.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info,kube=warn")
        .with_test_writer()
        .try_init();
    let (server, client) = hostmesh_testkit::cluster::api_server().await;
    hostmesh_testkit::cluster::install_crds(&client).await;

    let a = replica(server.kubeconfig_yaml(), "replica-a").await;
    wait_for_body(a.addr, "/readyz", 200, "[+]leader-election leader").await;
    let b = replica(server.kubeconfig_yaml(), "replica-b").await;
    wait_for_body(b.addr, "/readyz", 200, "standby, leader is replica-a").await;
    wait_for_body(a.addr, "/metrics", 200, "hostmesh_leader 1\n").await;
    wait_for_body(b.addr, "/metrics", 200, "hostmesh_leader 0\n").await;
    wait_for_body(b.addr, "/healthz", 200, "ok").await;

    // The leader's controllers act on a World: its agent Secret appears.
    let world = r#"
apiVersion: hostmesh.dev/v1alpha1
kind: World
metadata: {name: ha, namespace: default}
spec:
  hosts: 1
  template: {spec: {containers: [{name: host, image: busybox}]}}
"#;
    create_world(&client, world).await;
    wait_for_secret(&client, "ha").await;

    // Its status writes are counted at the client, on the leader only.
    wait_for_body(
        a.addr,
        "/metrics",
        200,
        "hostmesh_status_writes_total{kind=\"World\",outcome=\"applied\"}",
    )
    .await;
    wait_for_body(
        a.addr,
        "/metrics",
        200,
        "hostmesh_reconcile_duration_seconds_count{controller=\"world\"}",
    )
    .await;
    let (_, standby_metrics) = get(b.addr, "/metrics").await.expect("b's metrics");
    assert!(
        !standby_metrics.contains("hostmesh_reconciles_total{"),
        "{standby_metrics}"
    );
    assert!(
        !standby_metrics.contains("hostmesh_status_writes_total{"),
        "{standby_metrics}"
    );

    // Graceful shutdown of the leader: it releases the Lease, b takes over.
    a.stop.send(()).expect("replica a running");
    tokio::time::timeout(PATIENCE, a.task)
        .await
        .expect("replica a stops in time")
        .expect("task")
        .expect("replica a exits cleanly");
    assert!(
        get(a.addr, "/healthz").await.is_none(),
        "a's endpoint closed"
    );
    wait_for_body(b.addr, "/readyz", 200, "[+]leader-election leader").await;
    wait_for_body(b.addr, "/metrics", 200, "hostmesh_leader 1\n").await;

    b.stop.send(()).expect("replica b running");
    tokio::time::timeout(PATIENCE, b.task)
        .await
        .expect("replica b stops in time")
        .expect("task")
        .expect("replica b exits cleanly");
    server.shutdown().await;
}

/// Polls until the agent Secret of World `name` exists (a leader's World
/// controller created it).
async fn wait_for_secret(client: &kube::Client, name: &str) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let secret = format!("{name}-agent");
    eventually_async(&format!("the agent Secret of {name}"), async || {
        secrets.get_opt(&secret).await.ok().flatten()
    })
    .await;
}

async fn apply_world(client: &kube::Client, name: &str) {
    let world = format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {{name: {name}, namespace: default}}\n\
         spec:\n  hosts: 1\n  template: {{spec: {{containers: [{{name: host, image: busybox}}]}}}}\n"
    );
    create_world(client, &world).await;
}

/// Creates the World in `yaml` in `default` (retried while the CRD or the
/// namespace is not served yet).
async fn create_world(client: &kube::Client, yaml: &str) {
    let world: World = serde_saphyr::from_str(yaml).expect("a World manifest");
    let api: Api<World> = Api::namespaced(client.clone(), "default");
    eventually_ok("the World to be created", async || {
        api.create(&PostParams::default(), &world).await
    })
    .await;
}

#[tokio::test]
async fn a_leader_that_loses_its_lease_stands_by_and_leads_again_when_it_is_free() {
    let (server, client) = hostmesh_testkit::cluster::api_server().await;
    hostmesh_testkit::cluster::install_crds(&client).await;
    let a = replica(server.kubeconfig_yaml(), "replica-a").await;
    wait_for_body(a.addr, "/readyz", 200, "[+]leader-election leader").await;
    apply_world(&client, "first").await;
    wait_for_secret(&client, "first").await;

    // Another holder takes the Lease: a stops leading but stays ready.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let set_holder = |holder: Option<&'static str>, seconds: i32| {
        let leases = leases.clone();
        async move {
            let Ok(mut lease) = leases.get("hostmesh-operator").await else {
                return false;
            };
            let spec = lease.spec.get_or_insert_with(Default::default);
            spec.holder_identity = holder.map(Into::into);
            spec.lease_duration_seconds = Some(seconds);
            leases
                .replace("hostmesh-operator", &PostParams::default(), &lease)
                .await
                .is_ok()
        }
    };
    eventually_async("the intruder to take the Lease", async || {
        set_holder(Some("intruder"), 3600).await.then_some(())
    })
    .await;
    wait_for_body(a.addr, "/readyz", 200, "standby, leader is intruder").await;
    wait_for_body(a.addr, "/metrics", 200, "hostmesh_leader 0\n").await;

    // The intruder releases the Lease: a leads again with fresh controllers.
    eventually_async("the intruder to release the Lease", async || {
        set_holder(None, 1).await.then_some(())
    })
    .await;
    wait_for_body(a.addr, "/readyz", 200, "[+]leader-election leader").await;
    apply_world(&client, "second").await;
    wait_for_secret(&client, "second").await;

    a.stop.send(()).expect("replica a running");
    tokio::time::timeout(PATIENCE, a.task)
        .await
        .expect("replica a stops in time")
        .expect("task")
        .expect("replica a exits cleanly");
    server.shutdown().await;
}
