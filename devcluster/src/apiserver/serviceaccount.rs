//! Owns service account credentials in the cluster: the TokenRequest
//! subresource (`POST serviceaccounts/{name}/token`), the ServiceAccount
//! admission step on pod create (the projected `kube-api-access-*` volume),
//! and what every namespace holds (a `default` ServiceAccount and the
//! `kube-root-ca.crt` ConfigMap).
//!
//! Invariants:
//! 1. A pod is created only if its ServiceAccount exists (403 otherwise,
//!    as the real admission plugin answers).
//! 2. Unless `automountServiceAccountToken: false` (pod, else its
//!    ServiceAccount), every container and init container that does not
//!    already mount something at [`TOKEN_MOUNT_PATH`] gets the
//!    `kube-api-access-*` volume mounted there read-only.
//! 3. A token names the ServiceAccount's uid and, when bound, the pod's;
//!    `status.expirationTimestamp` is the requested lifetime (capped by the
//!    server's maximum). A pod-bound token asking for the kubelet's 3607 s
//!    lives a year, as with the real server's
//!    `--service-account-extend-token-expiration` (the process kubelet does
//!    not rotate tokens).

use std::time::Duration;

use serde_json::{Value, json};

use super::auth::token::{API_AUDIENCE, Claims, ObjRef, Signer};
use super::meta;
use super::request::{Request, name_of, ns_of};
use super::route::RouteTarget;
use super::status::ApiError;
use super::store::{Store, StoreState};

/// Where the API credentials appear in a container.
pub(crate) const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The prefix of the volume admission adds.
const VOLUME_PREFIX: &str = "kube-api-access-";

/// The name of the CA ConfigMap in every namespace.
pub(crate) const ROOT_CA: &str = "kube-root-ca.crt";

/// The lifetime the kubelet asks for on projected tokens, and what the
/// server extends it to (one year).
const KUBELET_TOKEN_SECS: i64 = 3607;
const EXTENDED_TOKEN_SECS: i64 = 365 * 24 * 3600;

fn uid_of(v: &Value) -> String {
    v.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// The ServiceAccount a pod runs as.
pub(crate) fn pod_service_account(pod: &Value) -> String {
    ["/spec/serviceAccountName", "/spec/serviceAccount"]
        .iter()
        .find_map(|p| {
            pod.pointer(p)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        })
        .unwrap_or("default")
        .to_string()
}

/// What admission needs of a pod's ServiceAccount: its
/// `automountServiceAccountToken`, or 403 when it does not exist.
pub(crate) fn lookup(store: &Store, ns: &str, pod: &Value) -> Result<Option<bool>, ApiError> {
    let sa = pod_service_account(pod);
    let found = store.lock().get("/serviceaccounts", ns, &sa);
    match found {
        Some(obj) => Ok(obj
            .get("automountServiceAccountToken")
            .and_then(Value::as_bool)),
        None => Err(ApiError::forbidden(format!(
            "pods \"{}\" is forbidden: error looking up service account {ns}/{sa}: serviceaccount \"{sa}\" not found",
            meta::name(pod)
        ))),
    }
}

/// The ServiceAccount admission step on a new pod (see invariant 2);
/// `sa_automount` is the ServiceAccount's `automountServiceAccountToken`.
pub(crate) fn admit_pod(pod: &mut Value, sa_automount: Option<bool>) {
    let automount = pod
        .pointer("/spec/automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or(sa_automount)
        .unwrap_or(true);
    if !automount {
        return;
    }
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let existing = spec
        .get("volumes")
        .and_then(Value::as_array)
        .and_then(|vs| {
            vs.iter()
                .filter_map(|v| v.get("name").and_then(Value::as_str))
                .find(|n| n.starts_with(VOLUME_PREFIX))
                .map(str::to_string)
        });
    let volume = existing
        .clone()
        .unwrap_or_else(|| format!("{VOLUME_PREFIX}{}", meta::name_suffix()));
    let mut needed = false;
    for list in ["initContainers", "containers"] {
        let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in cs.iter_mut().filter(|c| c.is_object()) {
            let mounted = c
                .get("volumeMounts")
                .and_then(Value::as_array)
                .is_some_and(|ms| ms.iter().any(|m| m["mountPath"] == TOKEN_MOUNT_PATH));
            if mounted {
                continue;
            }
            let mounts = c
                .as_object_mut()
                .map(|o| o.entry("volumeMounts").or_insert_with(|| json!([])));
            if let Some(ms) = mounts.and_then(Value::as_array_mut) {
                ms.push(json!({"name": volume, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH}));
                needed = true;
            }
        }
    }
    if !needed || existing.is_some() {
        return;
    }
    let vols = spec.entry("volumes").or_insert_with(|| json!([]));
    if let Some(vs) = vols.as_array_mut() {
        vs.push(json!({
            "name": volume,
            "projected": {
                "defaultMode": 420,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": KUBELET_TOKEN_SECS, "path": "token"}},
                    {"configMap": {"name": ROOT_CA, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                ],
            },
        }));
    }
}

/// Gives namespace `ns` what the controller manager would: a `default`
/// ServiceAccount and the `kube-root-ca.crt` ConfigMap (kept current with
/// the server's CA).
pub(crate) fn namespace_defaults(st: &mut StoreState, ns: &str, ca_pem: Option<&str>) {
    if st.get("/serviceaccounts", ns, "default").is_none() {
        let sa = json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": ns, "uid": meta::new_uid(), "creationTimestamp": meta::now()},
        });
        st.put("/serviceaccounts", ns, "default", sa);
    }
    let Some(ca) = ca_pem else { return };
    let current = st.get("/configmaps", ns, ROOT_CA);
    if current
        .as_ref()
        .is_some_and(|cm| cm.pointer("/data/ca.crt").and_then(Value::as_str) == Some(ca))
    {
        return;
    }
    let mut cm = current.map(|c| (*c).clone()).unwrap_or_else(|| {
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": ROOT_CA, "namespace": ns, "uid": meta::new_uid(), "creationTimestamp": meta::now(),
                         "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
        })
    });
    cm["data"] = json!({"ca.crt": ca});
    st.put("/configmaps", ns, ROOT_CA, cm);
}

/// How the server issues tokens.
#[derive(Debug)]
pub(crate) struct TokenIssuer {
    pub(crate) signer: std::sync::Arc<Signer>,
    /// Longest lifetime a token gets (longer requests are shortened).
    pub(crate) max_expiration: Option<Duration>,
}

/// `POST serviceaccounts/{name}/token`: a TokenRequest answered with a
/// token for the ServiceAccount.
pub(crate) fn token_request(
    issuer: &TokenIssuer,
    store: &Store,
    t: &RouteTarget,
    req: &Request,
) -> Result<(u16, Value), ApiError> {
    let name = name_of(t)?.to_string();
    let ns = ns_of(t).to_string();
    let body = req.json_body()?;
    let invalid = |field: &str, msg: String| {
        ApiError::invalid(
            "TokenRequest.authentication.k8s.io",
            &name,
            vec![(field.into(), msg)],
        )
    };
    let spec = body.get("spec").cloned().unwrap_or(json!({}));
    let requested = match spec.get("expirationSeconds") {
        None | Some(Value::Null) => 3600,
        Some(v) => v.as_i64().ok_or_else(|| {
            invalid(
                "spec.expirationSeconds",
                format!("Invalid value: {v}: must be an integer"),
            )
        })?,
    };
    if requested < 600 {
        return Err(invalid(
            "spec.expirationSeconds",
            format!("Invalid value: {requested}: may not specify a duration less than 10 minutes"),
        ));
    }
    if requested > 1 << 32 {
        return Err(invalid(
            "spec.expirationSeconds",
            format!(
                "Invalid value: {requested}: may not specify a duration larger than 2^32 seconds"
            ),
        ));
    }
    let audiences: Vec<String> = spec
        .get("audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let audiences = if audiences.is_empty() {
        vec![API_AUDIENCE.to_string()]
    } else {
        audiences
    };
    let bound = spec.get("boundObjectRef").filter(|b| !b.is_null());
    let (sa_uid, pod) = {
        let st = store.lock();
        let sa = st
            .get("/serviceaccounts", &ns, &name)
            .ok_or_else(|| ApiError::not_found("", "serviceaccounts", &name))?;
        let pod = match bound {
            None => None,
            Some(b) => {
                let kind = b.get("kind").and_then(Value::as_str).unwrap_or("");
                if kind != "Pod" {
                    return Err(invalid(
                        "spec.boundObjectRef.kind",
                        format!("Unsupported value: \"{kind}\": supported values: \"Pod\""),
                    ));
                }
                let pod_name = b.get("name").and_then(Value::as_str).unwrap_or("");
                let live = st
                    .get("/pods", &ns, pod_name)
                    .ok_or_else(|| ApiError::not_found("", "pods", pod_name))?;
                let uid = uid_of(&live);
                if let Some(want) = b
                    .get("uid")
                    .and_then(Value::as_str)
                    .filter(|u| !u.is_empty())
                    && want != uid
                {
                    return Err(ApiError::conflict(format!(
                        "the UID in the bound object reference ({want}) does not match the UID in record. The object might have been deleted and then recreated"
                    )));
                }
                Some(ObjRef {
                    name: pod_name.to_string(),
                    uid,
                })
            }
        };
        (uid_of(&sa), pod)
    };
    let max = issuer
        .max_expiration
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX).max(1));
    let granted = max.map_or(requested, |m| requested.min(m));
    let extended = pod.is_some()
        && granted == KUBELET_TOKEN_SECS
        && audiences.iter().any(|a| a == API_AUDIENCE);
    let lifetime = if extended {
        EXTENDED_TOKEN_SECS
    } else {
        granted
    };
    let now = chrono::Utc::now().timestamp();
    let claims = Claims::new(
        &ns,
        ObjRef {
            name: name.clone(),
            uid: sa_uid,
        },
        pod,
        audiences.clone(),
        now,
        lifetime,
    );
    let token = issuer.signer.mint(&claims);
    let mut out_spec = spec.clone();
    out_spec["audiences"] = json!(audiences);
    out_spec["expirationSeconds"] = json!(granted);
    Ok((
        201,
        json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": meta::now()},
            "spec": out_spec,
            "status": {"token": token, "expirationTimestamp": meta::in_secs(granted)},
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "a"}, "spec": spec})
    }

    fn mounts(p: &Value, list: &str, i: usize) -> Vec<Value> {
        p["spec"][list][i]["volumeMounts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    #[test]
    fn every_container_gets_the_api_access_volume_read_only() {
        let mut p = pod(json!({
            "initContainers": [{"name": "i", "image": "x"}],
            "containers": [{"name": "c", "image": "x", "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        }));
        admit_pod(&mut p, None);
        let vols = p["spec"]["volumes"].as_array().unwrap();
        assert_eq!(vols.len(), 2);
        let name = vols[1]["name"].as_str().unwrap();
        assert!(
            name.starts_with("kube-api-access-") && name.len() == 21,
            "{name}"
        );
        let sources = vols[1]["projected"]["sources"].as_array().unwrap();
        assert_eq!(sources[0]["serviceAccountToken"]["expirationSeconds"], 3607);
        assert_eq!(sources[1]["configMap"]["name"], "kube-root-ca.crt");
        assert_eq!(
            sources[2]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"],
            "metadata.namespace"
        );
        let want = json!({"name": name, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH});
        assert_eq!(mounts(&p, "initContainers", 0), vec![want.clone()]);
        assert_eq!(mounts(&p, "containers", 0)[1], want);
    }

    #[test]
    fn automount_false_on_the_pod_or_its_service_account_adds_nothing() {
        let spec = json!({"containers": [{"name": "c", "image": "x"}]});
        let mut p = pod(spec.clone());
        admit_pod(&mut p, Some(false));
        assert_eq!(p, pod(spec.clone()));
        let mut with_false = spec.clone();
        with_false["automountServiceAccountToken"] = json!(false);
        let mut p = pod(with_false.clone());
        admit_pod(&mut p, Some(true));
        assert_eq!(p, pod(with_false));
        // The pod's true wins over the ServiceAccount's false.
        let mut with_true = spec;
        with_true["automountServiceAccountToken"] = json!(true);
        let mut p = pod(with_true);
        admit_pod(&mut p, Some(false));
        assert_eq!(p["spec"]["volumes"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn a_container_that_mounts_the_path_itself_keeps_its_mount() {
        let mut p = pod(json!({
            "containers": [
                {"name": "own", "image": "x", "volumeMounts": [{"name": "mine", "mountPath": TOKEN_MOUNT_PATH}]},
                {"name": "other", "image": "x"},
            ],
            "volumes": [{"name": "mine", "secret": {"secretName": "s"}}],
        }));
        admit_pod(&mut p, None);
        assert_eq!(mounts(&p, "containers", 0).len(), 1);
        assert_eq!(mounts(&p, "containers", 1).len(), 1);
        let mut all_own = pod(json!({
            "containers": [{"name": "own", "image": "x", "volumeMounts": [{"name": "mine", "mountPath": TOKEN_MOUNT_PATH}]}],
            "volumes": [{"name": "mine", "secret": {"secretName": "s"}}],
        }));
        let before = all_own.clone();
        admit_pod(&mut all_own, None);
        assert_eq!(all_own, before, "no container needs the volume");
    }

    #[test]
    fn the_service_account_name_defaults_to_default() {
        assert_eq!(pod_service_account(&pod(json!({}))), "default");
        assert_eq!(
            pod_service_account(&pod(json!({"serviceAccount": "legacy"}))),
            "legacy"
        );
        assert_eq!(
            pod_service_account(&pod(
                json!({"serviceAccountName": "op", "serviceAccount": "legacy"})
            )),
            "op"
        );
    }
}
