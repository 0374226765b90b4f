//! The Helm chart on the e2e harness's cluster, with real Helm (Helm v4's
//! library through `helm-python-sdk`, `tests/helm_install.py`, waiting as
//! `helm --wait` does): install, upgrade and uninstall of release
//! [`RELEASE`] in the test's namespace, and the chart's `image` values for
//! the hostmesh image a cluster's own nodes have.

use std::path::PathBuf;
use std::process::Command;

use crate::{Env, Placement, tail};

/// The release name `tests/helm_install.py` uses.
pub const RELEASE: &str = "hm-e2e";

/// The label selector of every object of the release.
pub const SELECTOR: &str = "app.kubernetes.io/instance=hm-e2e";

/// `charts/hostmesh` of this checkout.
pub fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/hostmesh")
}

/// Runs `helm_install.py <args>` against the test's cluster: its output,
/// or an error with it and the embedded cluster's logs.
pub fn helm(env: &Env, args: &[&str]) -> anyhow::Result<String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("helm_install.py");
    let out = Command::new(hostmesh_testkit::helm::python())
        .arg(&script)
        .args(args)
        .env("KUBECONFIG", &env.kubeconfig)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    anyhow::ensure!(
        out.status.success(),
        "helm_install.py {} failed:\n{text}\n--- controller-manager log ---\n{}\n--- kubelet log ---\n{}",
        args.first().copied().unwrap_or_default(),
        tail(&env.log("controller-manager"), 30),
        tail(&env.log("kubelet"), 40)
    );
    Ok(text)
}

/// `helm install` of the chart into the test's namespace with `values`.
pub fn install(env: &Env, values: &serde_json::Value) -> anyhow::Result<()> {
    let chart = chart_dir();
    let out = helm(
        env,
        &[
            "install",
            chart.to_str().unwrap_or_default(),
            &env.namespace,
            &values.to_string(),
        ],
    )?;
    anyhow::ensure!(out.contains("installed"), "{out}");
    Ok(())
}

/// `helm upgrade` of the release to `values`.
pub fn upgrade(env: &Env, values: &serde_json::Value) -> anyhow::Result<()> {
    let chart = chart_dir();
    let out = helm(
        env,
        &[
            "upgrade",
            chart.to_str().unwrap_or_default(),
            &env.namespace,
            &values.to_string(),
        ],
    )?;
    anyhow::ensure!(out.contains("upgraded"), "{out}");
    Ok(())
}

/// `helm uninstall` of the release.
pub fn uninstall(env: &Env) -> anyhow::Result<()> {
    let out = helm(env, &["uninstall", &env.namespace])?;
    anyhow::ensure!(out.contains("uninstalled"), "{out}");
    Ok(())
}

/// On a cluster's own nodes, the chart's `image` values for the hostmesh
/// image loaded there (`HOSTMESH_TEST_IMAGE`, never pulled); `None` on the
/// process kubelet, which runs the chart's default image as this build.
pub fn image_values(env: &Env) -> Option<serde_json::Value> {
    if env.placement != Placement::ClusterNodes {
        return None;
    }
    let image = env.images.hostmesh.as_deref()?;
    // The tag follows the last ':' after the last '/' (a registry may have a port).
    let (repository, tag) = match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, tag),
        _ => (image, "latest"),
    };
    Some(serde_json::json!({"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"}))
}
