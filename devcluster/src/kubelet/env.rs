//! A container's environment: `env` and `envFrom` resolved against the pod
//! (downward API field refs), its secrets and config maps, with `$(VAR)`
//! expansion in values as Kubernetes does.
//!
//! Invariants:
//! 1. `envFrom` sources apply first, in order; `env` entries then override.
//! 2. An `env` value may refer to variables defined before it; references to
//!    later or unknown variables stay verbatim.
//! 3. A missing secret, config map or key is an error naming it, unless the
//!    reference is `optional: true` (then the variable is skipped).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};

use super::error::{KubeletError, Result};
use super::expand::expand;

/// Facts about a pod that only the kubelet knows.
#[derive(Debug, Clone)]
pub(crate) struct PodFacts {
    /// The pod's own loopback IP.
    pub(crate) pod_ip: Ipv4Addr,
    /// The node's IP.
    pub(crate) host_ip: Ipv4Addr,
    /// The node's name.
    pub(crate) node_name: String,
}

/// The secrets and config maps of a pod's namespace that its spec refers
/// to; `None` means the object does not exist.
#[derive(Debug, Default, Clone)]
pub(crate) struct Lookups {
    pub(crate) secrets: BTreeMap<String, Option<Secret>>,
    pub(crate) config_maps: BTreeMap<String, Option<ConfigMap>>,
    /// Service account tokens by [`token_key`]; `None` when the API server
    /// would not issue one.
    pub(crate) tokens: BTreeMap<String, Option<String>>,
}

/// A projected `serviceAccountToken` source: audience and lifetime.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TokenSpec {
    /// Audience, empty for the API server's default.
    pub(crate) audience: String,
    /// Requested lifetime in seconds.
    pub(crate) expiration_seconds: Option<i64>,
}

/// The key of a token in [`Lookups::tokens`].
pub(crate) fn token_key(spec: &TokenSpec) -> String {
    format!("{}|{}", spec.audience, spec.expiration_seconds.unwrap_or(0))
}

/// The service account tokens the pod's projected volumes ask for.
pub(crate) fn token_specs(pod: &Pod) -> BTreeSet<TokenSpec> {
    let mut out = BTreeSet::new();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(t) = &src.service_account_token {
                out.insert(TokenSpec {
                    audience: t.audience.clone().unwrap_or_default(),
                    expiration_seconds: t.expiration_seconds,
                });
            }
        }
    }
    out
}

impl Lookups {
    /// The value of `key` in secret `name`, as text.
    pub(crate) fn secret_value(&self, name: &str, key: &str) -> Option<Result<String>> {
        let secret = self.secrets.get(name)?.as_ref()?;
        if let Some(v) = secret.data.as_ref().and_then(|d| d.get(key)) {
            return Some(String::from_utf8(v.0.clone()).map_err(|_| {
                KubeletError::PodSpec(format!("secret {name:?} key {key:?} is not UTF-8 text"))
            }));
        }
        let v = secret.string_data.as_ref().and_then(|d| d.get(key))?;
        Some(Ok(v.clone()))
    }

    /// The value of `key` in config map `name`.
    pub(crate) fn config_map_value(&self, name: &str, key: &str) -> Option<String> {
        let cm = self.config_maps.get(name)?.as_ref()?;
        cm.data.as_ref().and_then(|d| d.get(key)).cloned()
    }
}

/// The names of the secrets and config maps a pod's containers and volumes
/// refer to.
pub(crate) fn referenced_objects(pod: &Pod) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut secrets = BTreeSet::new();
    let mut cms = BTreeSet::new();
    let Some(spec) = &pod.spec else {
        return (secrets, cms);
    };
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    for c in containers {
        for e in c.env.iter().flatten() {
            if let Some(from) = &e.value_from {
                if let Some(s) = &from.secret_key_ref {
                    secrets.insert(s.name.clone());
                }
                if let Some(m) = &from.config_map_key_ref {
                    cms.insert(m.name.clone());
                }
            }
        }
        for f in c.env_from.iter().flatten() {
            if let Some(s) = &f.secret_ref {
                secrets.insert(s.name.clone());
            }
            if let Some(m) = &f.config_map_ref {
                cms.insert(m.name.clone());
            }
        }
    }
    for v in spec.volumes.iter().flatten() {
        if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            secrets.insert(s);
        }
        if let Some(m) = &v.config_map {
            cms.insert(m.name.clone());
        }
        for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(s) = &src.secret {
                secrets.insert(s.name.clone());
            }
            if let Some(m) = &src.config_map {
                cms.insert(m.name.clone());
            }
        }
    }
    (secrets, cms)
}

/// Resolves a downward-API field path.
pub(crate) fn field_value(pod: &Pod, facts: &PodFacts, path: &str) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let keyed = |prefix: &str, map: Option<&BTreeMap<String, String>>| -> Option<String> {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => Some(meta.namespace.clone().unwrap_or_else(|| "default".into())),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => Some(facts.node_name.clone()),
        "spec.serviceAccountName" => Some(
            spec.and_then(|s| s.service_account_name.clone())
                .unwrap_or_else(|| "default".into()),
        ),
        "status.podIP" | "status.podIPs" => Some(facts.pod_ip.to_string()),
        "status.hostIP" | "status.hostIPs" => Some(facts.host_ip.to_string()),
        _ => keyed("metadata.labels['", meta.labels.as_ref())
            .or_else(|| keyed("metadata.annotations['", meta.annotations.as_ref())),
    }
}

fn is_env_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('=') && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// The environment of `container` (at `field`, e.g. `spec.containers[0]`),
/// in definition order.
pub(crate) fn resolve_env(
    pod: &Pod,
    container: &Container,
    field: &str,
    facts: &PodFacts,
    lookups: &Lookups,
) -> Result<Vec<(String, String)>> {
    let mut vars: Vec<(String, String)> = Vec::new();
    let set = |vars: &mut Vec<(String, String)>, k: String, v: String| {
        if let Some(slot) = vars.iter_mut().find(|(name, _)| *name == k) {
            slot.1 = v;
        } else {
            vars.push((k, v));
        }
    };
    for (i, from) in container.env_from.iter().flatten().enumerate() {
        let prefix = from.prefix.clone().unwrap_or_default();
        if let Some(r) = &from.secret_ref {
            match lookups.secrets.get(&r.name).and_then(Option::as_ref) {
                Some(secret) => {
                    let mut keys: BTreeMap<String, String> = BTreeMap::new();
                    for (k, v) in secret.data.iter().flatten() {
                        if let Ok(text) = String::from_utf8(v.0.clone()) {
                            keys.insert(k.clone(), text);
                        }
                    }
                    for (k, v) in secret.string_data.iter().flatten() {
                        keys.insert(k.clone(), v.clone());
                    }
                    for (k, v) in keys {
                        let name = format!("{prefix}{k}");
                        if is_env_name(&name) {
                            set(&mut vars, name, v);
                        }
                    }
                }
                None if r.optional == Some(true) => {}
                None => {
                    return Err(KubeletError::MissingReference(format!(
                        "{field}.envFrom[{i}].secretRef: secret {:?} not found",
                        r.name
                    )));
                }
            }
        }
        if let Some(r) = &from.config_map_ref {
            match lookups.config_maps.get(&r.name).and_then(Option::as_ref) {
                Some(cm) => {
                    for (k, v) in cm.data.iter().flatten() {
                        let name = format!("{prefix}{k}");
                        if is_env_name(&name) {
                            set(&mut vars, name, v.clone());
                        }
                    }
                }
                None if r.optional == Some(true) => {}
                None => {
                    return Err(KubeletError::MissingReference(format!(
                        "{field}.envFrom[{i}].configMapRef: config map {:?} not found",
                        r.name
                    )));
                }
            }
        }
    }
    for (i, e) in container.env.iter().flatten().enumerate() {
        let at = format!("{field}.env[{i}]");
        if !is_env_name(&e.name) {
            return Err(KubeletError::PodSpec(format!(
                "{at}.name: {:?} is not a valid environment variable name",
                e.name
            )));
        }
        let value = if let Some(from) = &e.value_from {
            if let Some(f) = &from.field_ref {
                match field_value(pod, facts, &f.field_path) {
                    Some(v) => Some(v),
                    None => {
                        return Err(KubeletError::PodSpec(format!(
                            "{at}.valueFrom.fieldRef.fieldPath: unsupported field {:?}",
                            f.field_path
                        )));
                    }
                }
            } else if let Some(r) = &from.secret_key_ref {
                match lookups.secret_value(&r.name, &r.key) {
                    Some(v) => Some(v?),
                    None if r.optional == Some(true) => None,
                    None => {
                        return Err(KubeletError::MissingReference(format!(
                            "{at}.valueFrom.secretKeyRef: key {:?} of secret {:?} not found",
                            r.key, r.name
                        )));
                    }
                }
            } else if let Some(r) = &from.config_map_key_ref {
                match lookups.config_map_value(&r.name, &r.key) {
                    Some(v) => Some(v),
                    None if r.optional == Some(true) => None,
                    None => {
                        return Err(KubeletError::MissingReference(format!(
                            "{at}.valueFrom.configMapKeyRef: key {:?} of config map {:?} not found",
                            r.key, r.name
                        )));
                    }
                }
            } else if let Some(r) = &from.resource_field_ref {
                Some(resource_value(container, &r.resource).ok_or_else(|| {
                    KubeletError::PodSpec(format!(
                        "{at}.valueFrom.resourceFieldRef.resource: {:?} is not set on the container",
                        r.resource
                    ))
                })?)
            } else {
                return Err(KubeletError::PodSpec(format!(
                    "{at}.valueFrom: set one of fieldRef, secretKeyRef, configMapKeyRef, resourceFieldRef"
                )));
            }
        } else {
            let raw = e.value.clone().unwrap_or_default();
            let snapshot: BTreeMap<&str, &str> =
                vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            Some(expand(&raw, |k| snapshot.get(k).copied()))
        };
        if let Some(v) = value {
            set(&mut vars, e.name.clone(), v);
        }
    }
    Ok(vars)
}

/// `limits.cpu`, `requests.memory`, ... of a container, as the quantity
/// written in its spec.
fn resource_value(container: &Container, resource: &str) -> Option<String> {
    let (kind, name) = resource.split_once('.')?;
    let res = container.resources.as_ref()?;
    let map = match kind {
        "limits" => res.limits.as_ref(),
        "requests" => res.requests.as_ref(),
        _ => None,
    }?;
    map.get(name).map(|q| q.0.clone())
}

/// Expands `$(VAR)` in a command or args with the container's environment.
pub(crate) fn expand_all(words: &[String], env: &[(String, String)]) -> Vec<String> {
    let map: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    words
        .iter()
        .map(|w| expand(w, |k| map.get(k).copied()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn pod(yaml: &str) -> Pod {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn facts() -> PodFacts {
        PodFacts {
            pod_ip: Ipv4Addr::new(127, 0, 0, 9),
            host_ip: Ipv4Addr::LOCALHOST,
            node_name: "n1".into(),
        }
    }

    const POD: &str = r#"
metadata: {name: p, namespace: ns, labels: {app: web}}
spec:
  containers:
  - name: c
    envFrom:
    - configMapRef: {name: cm}
      prefix: CM_
    env:
    - {name: IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    - {name: NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: APP, valueFrom: {fieldRef: {fieldPath: "metadata.labels['app']"}}}
    - {name: TOKEN, valueFrom: {secretKeyRef: {name: s, key: token}}}
    - {name: MODE, valueFrom: {configMapKeyRef: {name: cm, key: mode}}}
    - {name: URL, value: "http://$(IP):80/$(NAME)/$(LATER)"}
    - {name: LATER, value: x}
    - {name: OPT, valueFrom: {secretKeyRef: {name: nope, key: k, optional: true}}}
"#;

    fn lookups() -> Lookups {
        let mut l = Lookups::default();
        let s = Secret {
            data: Some([("token".to_string(), ByteString(b"sekret".to_vec()))].into()),
            ..Default::default()
        };
        l.secrets.insert("s".into(), Some(s));
        l.secrets.insert("nope".into(), None);
        let cm = ConfigMap {
            data: Some([("mode".to_string(), "fast".to_string())].into()),
            ..Default::default()
        };
        l.config_maps.insert("cm".into(), Some(cm));
        l
    }

    #[test]
    fn resolves_every_source_in_order() {
        let p = pod(POD);
        let c = &p.spec.as_ref().unwrap().containers[0];
        let env = resolve_env(&p, c, "spec.containers[0]", &facts(), &lookups()).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("CM_mode"), Some("fast"));
        assert_eq!(get("IP"), Some("127.0.0.9"));
        assert_eq!(get("NAME"), Some("p"));
        assert_eq!(get("APP"), Some("web"));
        assert_eq!(get("TOKEN"), Some("sekret"));
        assert_eq!(get("MODE"), Some("fast"));
        assert_eq!(get("URL"), Some("http://127.0.0.9:80/p/$(LATER)"));
        assert_eq!(get("OPT"), None);
        assert_eq!(env[0].0, "CM_mode");
    }

    #[test]
    fn missing_secret_names_the_field() {
        let p = pod(POD);
        let c = &p.spec.as_ref().unwrap().containers[0];
        let mut l = lookups();
        l.secrets.insert("s".into(), None);
        let err = resolve_env(&p, c, "spec.containers[0]", &facts(), &l).unwrap_err();
        assert!(
            err.to_string()
                .contains("spec.containers[0].env[3].valueFrom.secretKeyRef"),
            "{err}"
        );
    }

    #[test]
    fn unsupported_field_path_is_an_error() {
        let p = pod(
            "spec:\n  containers:\n  - name: c\n    env:\n    - {name: X, valueFrom: {fieldRef: {fieldPath: status.phase}}}\n",
        );
        let c = &p.spec.as_ref().unwrap().containers[0];
        let err =
            resolve_env(&p, c, "spec.containers[0]", &facts(), &Lookups::default()).unwrap_err();
        assert!(err.to_string().contains("fieldPath"), "{err}");
    }

    #[test]
    fn referenced_objects_cover_env_and_volumes() {
        let p = pod(
            "spec:\n  containers: [{name: c, envFrom: [{secretRef: {name: a}}]}]\n  volumes:\n  - {name: v, secret: {secretName: b}}\n  - {name: w, configMap: {name: c}}\n",
        );
        let (s, c) = referenced_objects(&p);
        assert_eq!(s.into_iter().collect::<Vec<_>>(), vec!["a", "b"]);
        assert_eq!(c.into_iter().collect::<Vec<_>>(), vec!["c"]);
    }

    #[test]
    fn commands_expand_with_the_environment() {
        let env = vec![("A".to_string(), "1".to_string())];
        let out = expand_all(&["echo".into(), "$(A)".into(), "$$(A)".into()], &env);
        assert_eq!(out, vec!["echo", "1", "$(A)"]);
    }
}
