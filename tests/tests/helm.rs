//! e2e: the Helm chart installs into the cluster with real Helm (Helm v4's
//! library through `helm-python-sdk`), the operator it describes is created
//! with least privilege, and uninstall removes it.

use std::process::Command;

use hostmesh_e2e::Env;

#[tokio::test(flavor = "multi_thread")]
async fn helm_installs_and_uninstalls_the_chart() -> anyhow::Result<()> {
    let env = Env::start("helm").await?;
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/hostmesh");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("helm_install.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&chart)
        .arg(&env.namespace)
        .env("KUBECONFIG", &env.kubeconfig)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "helm install/uninstall failed:\n{text}"
    );
    assert!(
        text.contains("installed") && text.contains("uninstalled"),
        "{text}"
    );
    Ok(())
}
