//! Helm v4 (its library through the PyPI package `helm-python-sdk`)
//! installs and uninstalls `charts/hostmesh` against the embedded API
//! server: release Secrets (protobuf bodies from client-go), CRDs from the
//! chart's `crds/`, RBAC, the operator Deployment, then removal.

use hostmesh_testkit::cluster::api_server_with_kubeconfig;
use hostmesh_testkit::eventually_async;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};

const SCRIPT: &str = r#"
import os, sys
import helm_python as helm
chart, action = sys.argv[1], sys.argv[2]
cfg = helm.Config(kubeconfig_path=os.environ["KUBECONFIG"], namespace="default")
if action == "install":
    cfg.install(chart, "hm", {"replicas": 1}, namespace="default", timeout=120)
    print("status:", cfg.status("hm")["status"])
else:
    cfg.uninstall("hm", timeout=120)
    try:
        cfg.status("hm")
        sys.exit("release still present")
    except helm.HelmError:
        print("uninstalled")
"#;

fn helm(kubeconfig: &std::path::Path, action: &str) -> String {
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/hostmesh");
    let out = std::process::Command::new(hostmesh_testkit::helm::python())
        .arg("-c")
        .arg(SCRIPT)
        .arg(&chart)
        .arg(action)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("python3 runs (pip install helm-python-sdk; .ci/run does)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "helm {action} failed:\n{text}");
    text
}

#[tokio::test(flavor = "multi_thread")]
async fn helm_installs_and_uninstalls_the_chart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    let (server, client) = api_server_with_kubeconfig(&kubeconfig).await;

    let kc = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || helm(&kc, "install"))
        .await
        .expect("join");
    assert!(out.contains("status: deployed"), "{out}");

    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let d = deploys
        .list(&ListParams::default())
        .await
        .expect("deployments");
    assert_eq!(d.items.len(), 1, "the operator Deployment");
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    assert!(
        sas.list(&ListParams::default())
            .await
            .expect("sas")
            .items
            .len()
            >= 2
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let releases = secrets
        .list(&ListParams::default().labels("owner=helm,name=hm"))
        .await
        .expect("release secrets");
    assert_eq!(releases.items.len(), 1);
    assert_eq!(
        releases.items[0].type_.as_deref(),
        Some("helm.sh/release.v1")
    );
    // The chart's CRDs are served.
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("hostmesh.dev", "v1alpha1", "World"),
        "worlds",
    );
    let worlds: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    worlds
        .list(&ListParams::default())
        .await
        .expect("worlds are served");

    let kc = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || helm(&kc, "uninstall"))
        .await
        .expect("join");
    assert!(out.contains("uninstalled"), "{out}");
    eventually_async("uninstall to remove the Deployment", async || {
        let list = deploys.list(&ListParams::default()).await.expect("list");
        list.items.is_empty().then_some(())
    })
    .await;
    assert!(
        secrets
            .list(&ListParams::default().labels("owner=helm"))
            .await
            .expect("list")
            .items
            .is_empty()
    );
    server.shutdown().await;
}
