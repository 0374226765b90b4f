//! Owns who a request comes from and what it may do: bearer token
//! authentication (the admin token, service account tokens) and RBAC
//! authorization of every request from a user that is not a superuser.
//!
//! Submodules: `token` (minting and verifying service account tokens),
//! `attrs` (request attributes from the URL), `rbac` (rule matching and the
//! binding index), `review` (access reviews and `SelfSubjectReview`).
//!
//! Invariants:
//! 1. The admin token is the user `hostmesh-admin` in `system:masters`, a
//!    superuser RBAC never restricts.
//! 2. A service account token authenticates only while its signature,
//!    expiry and audience verify, its ServiceAccount still exists with the
//!    uid it was minted for, and the pod it is bound to (if any) still
//!    exists with its uid. It is the user `system:serviceaccount:<ns>:<name>`
//!    in `system:serviceaccounts`, `system:serviceaccounts:<ns>` and
//!    `system:authenticated`.
//! 3. Anything else is 401; a denied request is 403 with the real server's
//!    message. Tokens are never logged.

pub(crate) mod attrs;
pub(crate) mod rbac;
pub(crate) mod review;
pub(crate) mod token;
pub(crate) mod x509;

use tracing::debug;

use super::status::ApiError;
use super::store::Store;
use super::tls::constant_time_eq;
use attrs::Attributes;
use token::Signer;

/// The group whose members RBAC never restricts.
pub(crate) const MASTERS: &str = "system:masters";

/// An authenticated user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct User {
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) groups: Vec<String>,
    /// Extra attributes (`authentication.kubernetes.io/pod-name`, ...).
    pub(crate) extra: Vec<(String, String)>,
}

impl User {
    /// The holder of the admin token.
    pub(crate) fn admin() -> Self {
        Self {
            name: "hostmesh-admin".into(),
            uid: String::new(),
            groups: vec![MASTERS.into(), "system:authenticated".into()],
            extra: Vec::new(),
        }
    }

    /// A request without credentials (only the public health and version
    /// paths serve one).
    pub(crate) fn anonymous() -> Self {
        Self {
            name: "system:anonymous".into(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".into()],
            extra: Vec::new(),
        }
    }

    /// The user a service account token stands for.
    pub(crate) fn service_account(ns: &str, name: &str, uid: &str) -> Self {
        Self {
            name: format!("system:serviceaccount:{ns}:{name}"),
            uid: uid.into(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ],
            extra: Vec::new(),
        }
    }

    /// Whether RBAC is bypassed for this user (`system:masters`).
    pub(crate) fn is_superuser(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }
}

/// Checks bearer tokens.
#[derive(Debug)]
pub(crate) struct Authenticator {
    admin_token: String,
    pub(crate) signer: std::sync::Arc<Signer>,
}

impl Authenticator {
    /// An authenticator for the admin token and service account tokens
    /// signed with `sa_key`.
    pub(crate) fn new(admin_token: String, sa_key: &[u8]) -> Self {
        Self {
            admin_token,
            signer: std::sync::Arc::new(Signer::new(sa_key)),
        }
    }

    /// The user behind an `Authorization` header value, or 401.
    pub(crate) fn authenticate(
        &self,
        store: &Store,
        header: Option<&str>,
    ) -> Result<User, ApiError> {
        let token = header
            .and_then(|h| {
                h.strip_prefix("Bearer ")
                    .or_else(|| h.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(ApiError::unauthorized)?;
        self.token_user(store, token, &[token::API_AUDIENCE])
            .map(|(user, _)| user)
            .map_err(|e| {
                debug!(reason = %e, "bearer token refused");
                ApiError::unauthorized()
            })
    }

    /// The user a bearer token stands for if it is valid for one of
    /// `audiences`, with the audiences it is valid for; else why not.
    pub(crate) fn token_user(
        &self,
        store: &Store,
        token: &str,
        audiences: &[&str],
    ) -> Result<(User, Vec<String>), String> {
        if constant_time_eq(token.as_bytes(), self.admin_token.as_bytes()) {
            if !audiences.contains(&token::API_AUDIENCE) {
                return Err("the admin token is valid for the API server's audience only".into());
            }
            return Ok((User::admin(), vec![token::API_AUDIENCE.to_string()]));
        }
        let now = chrono::Utc::now().timestamp();
        let claims = self
            .signer
            .verify_for(token, now, audiences)
            .map_err(|e| e.to_string())?;
        let k = &claims.kube;
        let st = store.lock();
        let uid_of = |key: &str, name: &str| {
            st.get(key, &k.namespace, name).map(|o| {
                o.pointer("/metadata/uid")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("")
                    .to_string()
            })
        };
        if uid_of("/serviceaccounts", &k.serviceaccount.name).as_deref()
            != Some(k.serviceaccount.uid.as_str())
        {
            return Err(format!(
                "service account {}/{} no longer exists",
                k.namespace, k.serviceaccount.name
            ));
        }
        if let Some(pod) = &k.pod
            && uid_of("/pods", &pod.name).as_deref() != Some(pod.uid.as_str())
        {
            return Err(format!(
                "the token is bound to pod {}/{}, which no longer exists",
                k.namespace, pod.name
            ));
        }
        let mut user =
            User::service_account(&k.namespace, &k.serviceaccount.name, &k.serviceaccount.uid);
        if let Some(pod) = &k.pod {
            user.extra = vec![
                (
                    "authentication.kubernetes.io/pod-name".into(),
                    pod.name.clone(),
                ),
                (
                    "authentication.kubernetes.io/pod-uid".into(),
                    pod.uid.clone(),
                ),
            ];
        }
        let matched = claims
            .aud
            .iter()
            .filter(|a| audiences.contains(&a.as_str()))
            .cloned()
            .collect();
        Ok((user, matched))
    }
}

/// Allows the request or answers 403.
pub(crate) fn authorize(store: &Store, user: &User, a: &Attributes) -> Result<(), ApiError> {
    if user.is_superuser() {
        return Ok(());
    }
    let index = store.lock().rbac_index();
    if index.allows(user, a) {
        Ok(())
    } else {
        debug!(user = %user.name, verb = %a.verb, resource = %a.resource, subresource = %a.subresource, namespace = %a.namespace, path = %a.path, "forbidden");
        Err(rbac::forbidden(user, a))
    }
}
