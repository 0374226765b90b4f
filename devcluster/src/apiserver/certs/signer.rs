//! The certificate controllers a real cluster runs beside its API server,
//! run here after every write (as kube-controller-manager's do):
//!
//! - approving: a `kubernetes.io/kube-apiserver-client-kubelet` request
//!   that is a valid kubelet client request, from a requester allowed to
//!   `create` `certificatesigningrequests/nodeclient` (or `selfnodeclient`
//!   for its own node name), is approved (`AutoApproved`);
//! - signing: an approved request for `kubernetes.io/kube-apiserver-client`
//!   or `kubernetes.io/kube-apiserver-client-kubelet`, neither failed nor
//!   signed yet, gets `status.certificate` signed by the cluster CA, or a
//!   `Failed` condition (`SignerValidationFailure`) saying what the signer
//!   refuses. Other signers' requests are left to their signers.
//!
//! Approving is authorized as the real admission does: `approve` on
//! `certificates.k8s.io/signers` named by the signer (or `<domain>/*`).
//!
//! Invariant: each pass writes a request only when its state moves
//! (pending to approved, approved to signed or failed), so passes end.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::super::auth::User;
use super::super::auth::attrs::Attributes;
use super::super::meta;
use super::super::route::RouteTarget;
use super::super::ssa::{self, FieldShape};
use super::super::status::ApiError;
use super::super::store::Store;
use super::{issue, pkcs10, request_bytes};

/// The storage key of CertificateSigningRequests.
pub(crate) const KEY: &str = "certificates.k8s.io/certificatesigningrequests";
const CLIENT: &str = "kubernetes.io/kube-apiserver-client";
const KUBELET: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// kube-controller-manager's `--cluster-signing-duration` default.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The cluster CA the signers sign with.
#[derive(Clone)]
pub(crate) struct Ca {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: Option<String>,
}

/// Refuses an approval by a user not allowed to approve for the request's
/// signer (403, the real admission's message).
pub(crate) fn may_approve(store: &Store, user: &User, t: &RouteTarget) -> Result<(), ApiError> {
    if user.is_superuser() {
        return Ok(());
    }
    let name = t.name.clone().unwrap_or_default();
    let mut st = store.lock();
    let Some(csr) = st.get(KEY, "", &name) else {
        return Ok(()); // the update answers 404
    };
    let signer = csr
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let index = st.rbac_index();
    drop(st);
    let domain_wildcard = signer
        .split_once('/')
        .map(|(d, _)| format!("{d}/*"))
        .unwrap_or_default();
    let allowed = [signer.as_str(), domain_wildcard.as_str()].iter().any(|n| {
        index.allows(
            user,
            &Attributes::resource("approve", "certificates.k8s.io", "signers", "", "", n),
        )
    });
    if allowed {
        Ok(())
    } else {
        Err(ApiError::forbidden_on(
            "certificates.k8s.io",
            "certificatesigningrequests",
            &name,
            &format!("user not permitted to approve requests with signerName {signer:?}"),
        ))
    }
}

/// Runs the controllers until shutdown, a pass after every write.
pub(crate) async fn run(store: Arc<Store>, ca: Ca, shutdown: CancellationToken) {
    let mut seen = u64::MAX;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let rv = store.lock().rv();
        if rv != seen {
            // A pass that approves leaves the signing to the next one
            // (invariant: each write moves a request one step).
            for _ in 0..4 {
                if !pass(&store, &ca) {
                    break;
                }
            }
            seen = store.lock().rv();
        }
    }
}

fn has(conds: &[Value], t: &str) -> bool {
    conds
        .iter()
        .any(|c| c["type"] == t && c["status"] == "True")
}

fn condition(t: &str, reason: &str, message: &str) -> Value {
    let now = meta::now();
    json!({"type": t, "status": "True", "reason": reason, "message": message, "lastUpdateTime": now, "lastTransitionTime": now})
}

/// The usages of a request.
fn usages(csr: &Value) -> Vec<String> {
    csr.pointer("/spec/usages")
        .and_then(Value::as_array)
        .map(|u| {
            u.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Why the kubelet client signer refuses `req` with `usages`, as
/// `ValidateKubeletClientCSR` words it.
fn kubelet_client_problem(req: &pkcs10::Csr, usages: &[String]) -> Option<String> {
    if req.organizations != ["system:nodes"] {
        return Some("subject organization is not system:nodes".into());
    }
    for (kind, message) in [
        ("dns", "DNS subjectAltNames are not allowed"),
        ("email", "Email subjectAltNames are not allowed"),
        ("ip", "IP subjectAltNames are not allowed"),
        ("uri", "URI subjectAltNames are not allowed"),
    ] {
        if req.san_kinds.contains(&kind) {
            return Some(message.into());
        }
    }
    if !req.common_name.starts_with("system:node:") {
        return Some("subject common name does not begin with system:node:".into());
    }
    let mut got: Vec<&str> = usages.iter().map(String::as_str).collect();
    got.sort();
    got.dedup();
    let with_rsa = ["client auth", "digital signature", "key encipherment"];
    let without = ["client auth", "digital signature"];
    if got != with_rsa && got != without {
        return Some(
            "usages did not match [client auth digital signature key encipherment]".into(),
        );
    }
    None
}

/// Why the kube-apiserver client signer refuses `usages`.
fn client_problem(usages: &[String]) -> Option<String> {
    let mut client_auth = false;
    for u in usages {
        match u.as_str() {
            "digital signature" | "key encipherment" => {}
            "client auth" => client_auth = true,
            other => return Some(format!("invalid usage for client certificate: {other}")),
        }
    }
    (!client_auth).then(|| "missing required usage for client certificate: client auth".into())
}

/// The request's new state, if a controller moves it (module invariant).
fn step(
    st: &mut super::super::store::StoreState,
    csr: &Value,
    ca: &Ca,
) -> Option<(Value, &'static str)> {
    let signer = csr.pointer("/spec/signerName").and_then(Value::as_str)?;
    if signer != CLIENT && signer != KUBELET {
        return None;
    }
    let conds = csr
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let signed = csr
        .pointer("/status/certificate")
        .and_then(Value::as_str)
        .is_some_and(|c| !c.is_empty());
    if has(&conds, "Denied") || has(&conds, "Failed") || signed {
        return None;
    }
    let bytes = request_bytes(csr).ok().flatten()?;
    let req = pkcs10::parse(&bytes).ok()?;
    let usages = usages(csr);
    let mut out = csr.clone();
    let push = |out: &mut Value, c: Value| {
        let mut all = conds.clone();
        all.push(c);
        out["status"]["conditions"] = json!(all);
    };
    if !has(&conds, "Approved") {
        // Auto-approval of kubelet client requests.
        if signer != KUBELET || kubelet_client_problem(&req, &usages).is_some() {
            return None;
        }
        let user = User {
            name: csr
                .pointer("/spec/username")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into(),
            uid: String::new(),
            groups: csr
                .pointer("/spec/groups")
                .and_then(Value::as_array)
                .map(|g| {
                    g.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            extra: Vec::new(),
        };
        let index = st.rbac_index();
        let may = |sub: &str| {
            index.allows(
                &user,
                &Attributes::resource(
                    "create",
                    "certificates.k8s.io",
                    "certificatesigningrequests",
                    sub,
                    "",
                    "",
                ),
            )
        };
        let own = user.name == req.common_name;
        if !(may("nodeclient") || (own && may("selfnodeclient"))) {
            return None;
        }
        push(
            &mut out,
            condition(
                "Approved",
                "AutoApproved",
                "Auto approving kubelet client certificate after SubjectAccessReview.",
            ),
        );
        return Some((out, "approval"));
    }
    let problem = if signer == KUBELET {
        kubelet_client_problem(&req, &usages)
    } else {
        client_problem(&usages)
    };
    if let Some(message) = problem {
        push(
            &mut out,
            condition("Failed", "SignerValidationFailure", &message),
        );
        return Some((out, "status"));
    }
    let Some(key) = ca.key_pem.as_deref() else {
        tracing::warn!(
            csr = meta::name(csr),
            "no CA key in this data directory (ca-key.pem): approved requests stay unsigned"
        );
        return None;
    };
    let duration = csr
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_u64)
        .map_or(MAX_DURATION, |s| Duration::from_secs(s).min(MAX_DURATION));
    match issue::issue(&req, &usages, duration, &ca.cert_pem, key) {
        Ok(pem) => {
            use base64::Engine as _;
            out["status"]["certificate"] =
                json!(base64::engine::general_purpose::STANDARD.encode(pem));
            tracing::info!(csr = meta::name(csr), user = %req.common_name, "signed a certificate signing request");
            Some((out, "status"))
        }
        Err(e) => {
            tracing::warn!(csr = meta::name(csr), error = %e, "cannot sign a certificate signing request");
            None
        }
    }
}

/// One pass over every request; whether it wrote any.
fn pass(store: &Store, ca: &Ca) -> bool {
    let mut st = store.lock();
    let csrs: Vec<(String, Arc<Value>)> = st
        .scan(KEY, None, None)
        .map(|((_, n), v)| (n.clone(), v.clone()))
        .collect();
    let mut wrote = false;
    for (name, csr) in csrs {
        if let Some((mut new, sub)) = step(&mut st, &csr, ca) {
            let shape = FieldShape {
                builtin: true,
                schema: None,
            };
            ssa::record_update(
                Some(&csr),
                &mut new,
                "kube-controller-manager",
                "certificates.k8s.io/v1",
                sub,
                shape,
            );
            st.put(KEY, "", &name, new);
            wrote = true;
        }
    }
    drop(st);
    if wrote {
        store.wrote(false);
    }
    wrote
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(cn: &str, orgs: &[&str]) -> pkcs10::Csr {
        pkcs10::Csr {
            subject: Vec::new(),
            common_name: cn.into(),
            organizations: orgs.iter().map(|o| o.to_string()).collect(),
            public_key_info: Vec::new(),
            san: None,
            san_kinds: Vec::new(),
        }
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn the_signers_refuse_what_the_real_ones_refuse() {
        assert_eq!(
            kubelet_client_problem(&req("alice", &["dev"]), &s(&["client auth"])).as_deref(),
            Some("subject organization is not system:nodes")
        );
        assert_eq!(
            kubelet_client_problem(
                &req("n1", &["system:nodes"]),
                &s(&["client auth", "digital signature"])
            )
            .as_deref(),
            Some("subject common name does not begin with system:node:")
        );
        assert_eq!(
            kubelet_client_problem(
                &req("system:node:n1", &["system:nodes"]),
                &s(&["digital signature", "client auth"])
            ),
            None
        );
        assert_eq!(client_problem(&s(&["client auth"])), None);
        assert_eq!(
            client_problem(&s(&["server auth"])).as_deref(),
            Some("invalid usage for client certificate: server auth")
        );
        assert_eq!(
            client_problem(&s(&["digital signature"])).as_deref(),
            Some("missing required usage for client certificate: client auth")
        );
    }
}
