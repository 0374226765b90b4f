//! Monarch on the e2e harness (docs/monarch.md), shared by the `monarch`
//! tests and the `monarch` bench suite: a World of Monarch hosts whose
//! `python` is the Monarch venv's, a Monarch client pod with the RBAC
//! attach mode needs, and the worker process of a host.

use std::path::Path;

use crate::{Env, NODE_TAINT, Placement, find_pids, world_yaml_with_image};

/// A World `name` of `hosts` Monarch hosts (`spec.monarch: {}`, the default
/// worker command) whose `python` is `python`'s (PATH is all the image
/// gives: the process kubelet runs the local one, the `monarch` image has
/// the venv at the same path), replacing a failed host at once; `extra`
/// spec lines follow.
pub fn world(name: &str, hosts: u32, python: &Path, extra: &str) -> String {
    world_of(Monarch::Release, name, hosts, python, extra)
}

/// Which Monarch a test runs (testkit's `TORCHMONARCH` or
/// `TORCHMONARCH_NEXT`), and so which image placeholder its pods get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Monarch {
    /// The release (`monarch` image).
    Release,
    /// The next pre-release (`monarch-next` image).
    Next,
}

impl Monarch {
    /// The image placeholder of its workers ([`Env::image`]).
    pub fn image(self) -> &'static str {
        match self {
            Monarch::Release => "monarch",
            Monarch::Next => "monarch-next",
        }
    }

    /// The venv's python on this machine (made on first use).
    pub fn python(self) -> std::path::PathBuf {
        match self {
            Monarch::Release => hostmesh_testkit::monarch::python(),
            Monarch::Next => hostmesh_testkit::monarch::python_next(),
        }
    }
}

/// Like [`world`], for `monarch`'s image.
pub fn world_of(monarch: Monarch, name: &str, hosts: u32, python: &Path, extra: &str) -> String {
    let bin = python.parent().unwrap_or(Path::new("/")).display();
    world_yaml_with_image(
        name,
        &[("host", hosts)],
        monarch.image(),
        &format!(
            "        env: [{{name: PATH, value: \"{bin}:/usr/local/bin:/usr/bin:/bin\"}}]\n  monarch: {{}}\n  failurePolicy: {{action: ReplaceHost, maxRestarts: 3, backoff: 1s}}\n{extra}"
        ),
    )
}

/// A ServiceAccount `name` that may get, list and watch pods (what
/// `KubernetesJob` attach mode needs), a ConfigMap `<name>-script` holding
/// `script`, and a pod `name` that runs it once with `python -u` and `args`
/// (`restartPolicy: Never`): on the process kubelet's node when one joined
/// a cluster, from the `monarch-client` image ([`Env::image`]).
pub fn client_pod(
    env: &Env,
    name: &str,
    python: &Path,
    script: &Path,
    args: &[String],
) -> anyhow::Result<String> {
    client_pod_with(env, name, python, script, args, &ClientExtras::default())
}

/// What a client pod has beyond [`client_pod`]'s.
#[derive(Debug, Clone, Default)]
pub struct ClientExtras {
    /// The image placeholder ([`Env::image`]); default `monarch-client`.
    pub image: Option<&'static str>,
    /// A `kubernetes.io/tls` Secret mounted at `/etc/hyperactor/tls`,
    /// with `HYPERACTOR_TLS_CERT`, `_KEY` and `_CA` naming its files.
    pub tls_secret: Option<String>,
    /// `hostAliases`: an IP and the names it has (the clusters the suite
    /// runs on have no cluster DNS).
    pub host_aliases: Vec<(String, Vec<String>)>,
}

/// [`client_pod`] with `extras`.
pub fn client_pod_with(
    env: &Env,
    name: &str,
    python: &Path,
    script: &Path,
    args: &[String],
    extras: &ClientExtras,
) -> anyhow::Result<String> {
    let ns = &env.namespace;
    let placement = if env.placement == Placement::ProcessKubelet {
        format!(
            "  nodeName: {}\n  tolerations: [{{key: {NODE_TAINT}, operator: Exists, effect: NoSchedule}}]\n",
            env.node
        )
    } else {
        String::new()
    };
    let file = script
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or("client.py");
    let mut command = vec![
        python.display().to_string(),
        "-u".into(),
        format!("/e2e/{file}"),
    ];
    command.extend_from_slice(args);
    let command = serde_json::to_string(&command)?;
    let data = serde_json::to_string(&std::collections::BTreeMap::from([(
        file,
        std::fs::read_to_string(script)?,
    )]))?;
    let image = env.image(extras.image.unwrap_or("monarch-client"))?;
    let mut mounts =
        vec![serde_json::json!({"name": "script", "mountPath": "/e2e", "readOnly": true})];
    let mut volumes = vec![
        serde_json::json!({"name": "script", "configMap": {"name": format!("{name}-script")}}),
    ];
    let mut tls_env = Vec::new();
    if let Some(secret) = &extras.tls_secret {
        mounts.push(serde_json::json!({"name": "tls", "mountPath": "/etc/hyperactor/tls", "readOnly": true}));
        volumes.push(serde_json::json!({"name": "tls", "secret": {"secretName": secret}}));
        for (var, file) in [
            ("HYPERACTOR_TLS_CERT", "tls.crt"),
            ("HYPERACTOR_TLS_KEY", "tls.key"),
            ("HYPERACTOR_TLS_CA", "ca.crt"),
        ] {
            tls_env.push(
                serde_json::json!({"name": var, "value": format!("/etc/hyperactor/tls/{file}")}),
            );
        }
    }
    let aliases: Vec<serde_json::Value> = extras
        .host_aliases
        .iter()
        .map(|(ip, names)| serde_json::json!({"ip": ip, "hostnames": names}))
        .collect();
    let mounts = serde_json::Value::from(mounts);
    let volumes = serde_json::Value::from(volumes);
    let tls_env = serde_json::Value::from(tls_env);
    let aliases = serde_json::Value::from(aliases);
    Ok(format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: {name}, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {name}, namespace: {ns}}}
rules:
- {{apiGroups: [""], resources: [pods], verbs: [get, list, watch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {name}, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {name}}}
subjects: [{{kind: ServiceAccount, name: {name}, namespace: {ns}}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: {name}-script, namespace: {ns}}}
data: {data}
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}}}
spec:
  serviceAccountName: {name}
  restartPolicy: Never
  hostAliases: {aliases}
{placement}  containers:
  - name: client
    image: {image}
    imagePullPolicy: IfNotPresent
    workingDir: /tmp
    command: {command}
    env: {tls_env}
    volumeMounts: {mounts}
  volumes: {volumes}
"#
    ))
}

impl Env {
    /// Applies a multi-document manifest with `kubectl apply`.
    pub fn kubectl_apply(&self, name: &str, yaml: &str) -> anyhow::Result<()> {
        let path = self.kubeconfig.with_file_name(format!("{name}.yaml"));
        std::fs::write(&path, yaml)?;
        self.kubectl(&["apply", "-f", path.to_str().unwrap_or_default()])?;
        Ok(())
    }

    /// The logs of pod `name` in the test namespace (empty until it runs).
    pub fn pod_logs(&self, name: &str) -> String {
        self.kubectl(&["logs", "-n", &self.namespace, name])
            .unwrap_or_default()
    }

    /// The phase of pod `name` in the test namespace.
    pub fn pod_phase(&self, name: &str) -> String {
        self.kubectl(&[
            "get",
            "pod",
            "-n",
            &self.namespace,
            name,
            "-o",
            "jsonpath={.status.phase}",
        ])
        .unwrap_or_default()
    }

    /// The Monarch worker of host `rank` of World `world`: the agent's
    /// child carrying the Monarch rank (its procs are the worker's
    /// children, not the agent's).
    pub fn monarch_worker_pid(&self, world: &str, rank: u32) -> anyhow::Result<i32> {
        let agents = self.agent_pids(world, rank);
        let rank = rank.to_string();
        let pids: Vec<i32> = find_pids(|e| {
            e.get("MONARCH_SERVICE_PROC_RANK") == Some(&rank) && !e.contains_key("HOSTMESH_WORLD")
        })
        .into_iter()
        .filter(|p| crate::parent_of(*p).is_some_and(|pp| agents.contains(&pp)))
        .collect();
        anyhow::ensure!(
            pids.len() == 1,
            "expected one Monarch worker of host {rank} (agents {agents:?}), found {pids:?}"
        );
        Ok(pids[0])
    }
}
