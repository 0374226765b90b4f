//! The chart ⇄ binary contract: the environment the chart's Deployment gives
//! the operator container (rendered with real Helm) is accepted by
//! `hostmesh operator`, which gets past argument parsing, logging and
//! election setup and stops only at connecting to a cluster (there is none
//! here). Needs `pip install helm-python-sdk`.

use std::path::PathBuf;
use std::process::Command;

/// Renders the chart with `values` (JSON) and returns the operator
/// container's `(name, value)` environment (downward-API entries get
/// stand-in values, `$(NAME)` references are expanded as a kubelet does)
/// and its args.
fn rendered_env(values: &str) -> (Vec<(String, String)>, Vec<String>) {
    let chart = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/hostmesh");
    let script = r#"
import json, re, sys
import helm_python as helm
chart = helm.Chart.load(sys.argv[1])
out = chart.render(json.loads(sys.argv[2]), name="hm", namespace="hostmesh-system", is_install=True)
dep = next(helm.values_from_yaml(d) for d in re.split(r"(?m)^---\s*$", out["hostmesh/templates/deployment.yaml"]) if d.strip())
c = dep["spec"]["template"]["spec"]["containers"][0]
env = []
seen = {}
def expand(v):
    # $(NAME) of an earlier entry, as the kubelet expands it.
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: seen.get(m.group(1), m.group(0)), v)
for e in c.get("env", []):
    if "value" in e:
        value = expand(e["value"])
    else:
        value = {"metadata.name": "hm-hostmesh-abc", "metadata.namespace": "hostmesh-system", "metadata.uid": "0b2d1c3e-5f4a-4b6c-9d8e-7f6a5b4c3d2e", "status.podIP": "127.0.0.1"}[e["valueFrom"]["fieldRef"]["fieldPath"]]
    seen[e["name"]] = value
    env.append([e["name"], value])
print(json.dumps({"env": env, "args": c.get("args", [])}))
"#;
    let out = Command::new(hostmesh_testkit::helm::python())
        .args(["-c", script])
        .arg(&chart)
        .arg(values)
        .output()
        .expect("python3 must be installed");
    assert!(
        out.status.success(),
        "rendering failed (needs `pip install helm-python-sdk`): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let env = v["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|p| {
            (
                p[0].as_str().expect("name").to_owned(),
                p[1].as_str().expect("value").to_owned(),
            )
        })
        .collect();
    let args = v["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg").to_owned())
        .collect();
    (env, args)
}

fn run_operator_with(values: &str) -> String {
    let (env, args) = rendered_env(values);
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_hostmesh"))
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", tmp.path())
        .env("KUBECONFIG", tmp.path().join("missing-kubeconfig"))
        .envs(env)
        .output()
        .expect("run hostmesh");
    assert!(!out.status.success(), "there is no cluster to connect to");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn default_chart_environment_is_accepted_by_the_operator() {
    let err = run_operator_with("{}");
    assert!(
        err.contains("cannot configure the Kubernetes client"),
        "the operator must get as far as connecting:\n{err}"
    );
}

#[test]
fn non_default_chart_environment_is_accepted_by_the_operator() {
    let values = r#"{"logFormat": "text", "logLevel": "info,hostmesh_operator=debug",
        "watchNamespaces": ["team-a", "team-b"], "replicas": 2,
        "leaderElection": {"enabled": true, "leaseDuration": "30s", "renewDeadline": "20s", "retryPeriod": "5s"},
        "metrics": {"port": 9090}}"#;
    let err = run_operator_with(values);
    assert!(
        err.contains("cannot configure the Kubernetes client"),
        "the operator must get as far as connecting:\n{err}"
    );
}

#[test]
fn inconsistent_election_timing_from_the_chart_is_reported_with_the_flag() {
    // The schema accepts each duration alone; their order is checked by the
    // operator at start-up, with the flag's name.
    let values =
        r#"{"leaderElection": {"enabled": true, "leaseDuration": "5s", "renewDeadline": "10s"}}"#;
    let (env, args) = rendered_env(values);
    let out = Command::new(env!("CARGO_BIN_EXE_hostmesh"))
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env)
        .output()
        .expect("run hostmesh");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--leader-elect-renew-deadline"),
        "the error names the flag:\n{err}"
    );
}

#[test]
fn the_operator_binds_the_pod_ip_and_extra_env_replaces_any_chart_entry() {
    let (env, _) = rendered_env("{}");
    let addr: Vec<&str> = env
        .iter()
        .filter(|(k, _)| k == "HOSTMESH_HTTP_ADDR")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        addr,
        ["127.0.0.1:8080"],
        "the pod's IP, not every interface"
    );

    let values = r#"{"extraEnv": [{"name": "HOSTMESH_HTTP_ADDR", "value": "0.0.0.0:9999"},
        {"name": "HOSTMESH_LOG_LEVEL", "value": "debug"}, {"name": "EXTRA", "value": "1"}]}"#;
    let (env, _) = rendered_env(values);
    let get = |name: &str| {
        env.iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
    };
    assert_eq!(get("HOSTMESH_HTTP_ADDR"), ["0.0.0.0:9999"], "{env:?}");
    assert_eq!(get("HOSTMESH_LOG_LEVEL"), ["debug"], "{env:?}");
    assert_eq!(get("EXTRA"), ["1"], "{env:?}");
    let err = run_operator_with(values);
    assert!(
        err.contains("cannot configure the Kubernetes client"),
        "the operator must get as far as connecting:\n{err}"
    );
}

#[test]
fn network_policies_without_the_operator_pod_labels_stop_the_operator_with_the_flag() {
    // The chart passes its selector labels with networkPolicy.enabled (the
    // default); without them a policy could not name the operator's pods.
    let (env, args) = rendered_env("{}");
    let labels: Vec<&str> = env
        .iter()
        .filter(|(k, _)| k == "HOSTMESH_OPERATOR_POD_LABELS")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        labels,
        [
            "app.kubernetes.io/component=operator,app.kubernetes.io/instance=hm,app.kubernetes.io/name=hostmesh"
        ]
    );
    let out = Command::new(env!("CARGO_BIN_EXE_hostmesh"))
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(
            env.into_iter()
                .filter(|(k, _)| k != "HOSTMESH_OPERATOR_POD_LABELS"),
        )
        .output()
        .expect("run hostmesh");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--operator-pod-labels"),
        "the error names the flag:\n{err}"
    );
    // Off: nothing to pass, and the operator starts as before.
    let (env, _) = rendered_env(r#"{"networkPolicy": {"enabled": false}}"#);
    assert!(
        env.iter()
            .any(|(k, v)| k == "HOSTMESH_NETWORK_POLICY" && v == "false")
    );
    assert!(!env.iter().any(|(k, _)| k == "HOSTMESH_OPERATOR_POD_LABELS"));
    let err = run_operator_with(r#"{"networkPolicy": {"enabled": false}}"#);
    assert!(
        err.contains("cannot configure the Kubernetes client"),
        "the operator must get as far as connecting:\n{err}"
    );
}
