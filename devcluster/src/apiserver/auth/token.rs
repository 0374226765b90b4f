//! Owns service account tokens: minting (TokenRequest) and verifying them.
//!
//! A token is a JWT signed with HS256 under a per-server key (32 random
//! bytes, kept with the server's other credentials in the data directory),
//! with the claims a real API server puts in its tokens: `iss`, `sub`
//! (`system:serviceaccount:<ns>:<name>`), `aud`, `iat`/`nbf`/`exp` and the
//! `kubernetes.io` claim naming the namespace, the service account (and
//! its uid) and the bound pod, if any.
//!
//! Invariants:
//! 1. Only a token whose signature verifies under this server's key, whose
//!    header is exactly the one minted here, that has not expired and whose
//!    audiences include the API server's is accepted; anything else is an
//!    error (the caller answers 401).
//! 2. Tokens and the key never reach a log or a `Debug` output.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use serde::{Deserialize, Serialize};

/// The audience (and issuer) of tokens for this API server, as a real
/// cluster's default `--api-audiences`.
pub(crate) const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// The only JWT header this server mints and accepts.
const HEADER: &str = r#"{"alg":"HS256","typ":"JWT"}"#;

/// Clock skew tolerated on `nbf`.
const SKEW_SECS: i64 = 60;

/// Why a token was refused (logged at debug, never the token itself).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum TokenError {
    /// Not three base64url parts, or not the header minted here.
    #[error("not a service account token of this server")]
    Malformed,
    /// The signature does not verify under this server's key.
    #[error("the signature does not verify")]
    BadSignature,
    /// The claims are not valid JSON of the expected shape.
    #[error("the claims are malformed")]
    BadClaims,
    /// `exp` is in the past.
    #[error("the token has expired")]
    Expired,
    /// `nbf` is in the future.
    #[error("the token is not valid yet")]
    NotYetValid,
    /// None of the token's audiences is this API server's.
    #[error("the token's audiences do not include the API server")]
    WrongAudience,
}

/// A name and uid of an object a token is bound to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ObjRef {
    pub(crate) name: String,
    pub(crate) uid: String,
}

/// The `kubernetes.io` claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KubeClaims {
    pub(crate) namespace: String,
    pub(crate) serviceaccount: ObjRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pod: Option<ObjRef>,
}

/// The claims of a service account token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Claims {
    pub(crate) iss: String,
    pub(crate) sub: String,
    pub(crate) aud: Vec<String>,
    pub(crate) iat: i64,
    pub(crate) nbf: i64,
    pub(crate) exp: i64,
    #[serde(rename = "kubernetes.io")]
    pub(crate) kube: KubeClaims,
}

impl Claims {
    /// Claims for `namespace/serviceaccount` valid from `now` for
    /// `lifetime_secs`, for `audiences` (the API server's when empty).
    pub(crate) fn new(
        namespace: &str,
        sa: ObjRef,
        pod: Option<ObjRef>,
        audiences: Vec<String>,
        now: i64,
        lifetime_secs: i64,
    ) -> Self {
        let aud = if audiences.is_empty() {
            vec![API_AUDIENCE.to_string()]
        } else {
            audiences
        };
        Self {
            iss: API_AUDIENCE.to_string(),
            sub: format!("system:serviceaccount:{namespace}:{}", sa.name),
            aud,
            iat: now,
            nbf: now,
            exp: now.saturating_add(lifetime_secs),
            kube: KubeClaims {
                namespace: namespace.to_string(),
                serviceaccount: sa,
                pod,
            },
        }
    }
}

/// Mints and verifies tokens under one key.
pub(crate) struct Signer {
    key: ring::hmac::Key,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(<key redacted>)")
    }
}

impl Signer {
    /// A signer with `key` (any length; the server uses 32 random bytes).
    pub(crate) fn new(key: &[u8]) -> Self {
        Self {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key),
        }
    }

    /// The signed token for `claims`.
    pub(crate) fn mint(&self, claims: &Claims) -> String {
        let payload = serde_json::to_vec(claims).unwrap_or_default();
        let signing_input = format!("{}.{}", B64.encode(HEADER), B64.encode(payload));
        let tag = ring::hmac::sign(&self.key, signing_input.as_bytes());
        format!("{signing_input}.{}", B64.encode(tag.as_ref()))
    }

    /// The claims of `token` if it is valid at `now` (unix seconds) for
    /// this API server.
    #[cfg(test)]
    pub(crate) fn verify(&self, token: &str, now: i64) -> Result<Claims, TokenError> {
        self.verify_for(token, now, &[API_AUDIENCE])
    }

    /// The claims of `token` if it is valid at `now` for one of
    /// `audiences` (a TokenReview may ask about other audiences).
    pub(crate) fn verify_for(
        &self,
        token: &str,
        now: i64,
        audiences: &[&str],
    ) -> Result<Claims, TokenError> {
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(sig), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        if B64.decode(header).ok().as_deref() != Some(HEADER.as_bytes()) {
            return Err(TokenError::Malformed);
        }
        let sig = B64.decode(sig).map_err(|_| TokenError::Malformed)?;
        let signing_input = &token[..header.len() + 1 + payload.len()];
        ring::hmac::verify(&self.key, signing_input.as_bytes(), &sig)
            .map_err(|_| TokenError::BadSignature)?;
        let raw = B64.decode(payload).map_err(|_| TokenError::BadClaims)?;
        let claims: Claims = serde_json::from_slice(&raw).map_err(|_| TokenError::BadClaims)?;
        if now >= claims.exp {
            return Err(TokenError::Expired);
        }
        if claims.nbf > now + SKEW_SECS {
            return Err(TokenError::NotYetValid);
        }
        if !claims.aud.iter().any(|a| audiences.contains(&a.as_str())) {
            return Err(TokenError::WrongAudience);
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(aud: Vec<String>, now: i64, life: i64) -> Claims {
        Claims::new(
            "team",
            ObjRef {
                name: "op".into(),
                uid: "u-1".into(),
            },
            None,
            aud,
            now,
            life,
        )
    }

    #[test]
    fn a_minted_token_verifies_until_it_expires() {
        let s = Signer::new(b"0123456789abcdef0123456789abcdef");
        let c = claims(vec![], 1_000, 600);
        let t = s.mint(&c);
        assert_eq!(s.verify(&t, 1_000).unwrap(), c);
        assert_eq!(c.sub, "system:serviceaccount:team:op");
        assert_eq!(c.aud, vec![API_AUDIENCE.to_string()]);
        assert_eq!(s.verify(&t, 1_599).unwrap().exp, 1_600);
        assert_eq!(s.verify(&t, 1_600), Err(TokenError::Expired));
    }

    #[test]
    fn forged_tampered_and_foreign_tokens_are_refused() {
        let s = Signer::new(b"key-one");
        let other = Signer::new(b"key-two");
        let t = other.mint(&claims(vec![], 1_000, 600));
        assert_eq!(s.verify(&t, 1_000), Err(TokenError::BadSignature));
        // Same signature, claims swapped for another service account.
        let good = s.mint(&claims(vec![], 1_000, 600));
        let mut forged = claims(vec![], 1_000, 600);
        forged.kube.serviceaccount.name = "admin".into();
        let forged_payload = B64.encode(serde_json::to_vec(&forged).unwrap());
        let parts: Vec<&str> = good.split('.').collect();
        let tampered = format!("{}.{forged_payload}.{}", parts[0], parts[2]);
        assert_eq!(s.verify(&tampered, 1_000), Err(TokenError::BadSignature));
        // Another algorithm in the header.
        let none = format!(
            "{}.{}.",
            B64.encode(r#"{"alg":"none","typ":"JWT"}"#),
            parts[1]
        );
        assert_eq!(s.verify(&none, 1_000), Err(TokenError::Malformed));
        for junk in ["", "a.b", "a.b.c.d", "!!.!!.!!", "hostmesh-admin-token"] {
            assert!(s.verify(junk, 1_000).is_err(), "{junk}");
        }
    }

    #[test]
    fn tokens_for_other_audiences_and_future_tokens_are_refused() {
        let s = Signer::new(b"k");
        let t = s.mint(&claims(vec!["vault".into()], 1_000, 600));
        assert_eq!(s.verify(&t, 1_000), Err(TokenError::WrongAudience));
        let t = s.mint(&claims(
            vec!["vault".into(), API_AUDIENCE.into()],
            1_000,
            600,
        ));
        assert!(s.verify(&t, 1_000).is_ok());
        let t = s.mint(&claims(vec![], 5_000, 600));
        assert_eq!(s.verify(&t, 1_000), Err(TokenError::NotYetValid));
    }

    #[test]
    fn debug_output_hides_the_key() {
        let s = Signer::new(b"super-secret-key");
        assert!(!format!("{s:?}").contains("secret"));
    }
}
