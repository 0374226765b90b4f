//! HTTPS for the kubelet endpoint on a real cluster, as a real kubelet
//! serves it to kube-apiserver: a self-signed serving certificate for the
//! node IP and name (kube-apiserver does not verify it unless started with
//! `--kubelet-certificate-authority`), and client certificates signed by
//! the configured client CA (`--client-ca-file`, kubeadm's
//! `/etc/kubernetes/pki/ca.crt`) authenticate the caller: user = subject
//! CN, groups = subject O. Such a caller is authorized as a real kubelet's
//! webhook mode does it: a `SubjectAccessReview` for verb (from the method)
//! on `nodes/proxy` of this node.
//!
//! Invariants:
//! 1. A client certificate is accepted only when it chains to the client
//!    CA; a connection without one is still served, and must then carry
//!    the bearer token (`logs`' rule).
//! 2. A certificate whose subject cannot be read names no user: the
//!    request is refused, never served anonymously.

use std::sync::Arc;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;

use super::error::{KubeletError, Result};
use super::shared::Shared;

/// The caller a verified client certificate names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Peer {
    /// Subject common name.
    pub(crate) user: String,
    /// Subject organizations.
    pub(crate) groups: Vec<String>,
}

/// A TLS acceptor for the endpoint, requesting client certificates signed
/// by `client_ca_pem`.
pub(crate) fn acceptor(shared: &Shared, client_ca_pem: &str) -> Result<tokio_rustls::TlsAcceptor> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |m: String| KubeletError::Config(format!("kubelet client CA: {m}"));
    let mut roots = rustls::RootCertStore::empty();
    let cas = CertificateDer::pem_slice_iter(client_ca_pem.as_bytes())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not PEM certificates: {e}")))?;
    if cas.is_empty() {
        return Err(bad(
            "no certificate in the PEM (give --client-ca-file the cluster CA)".into(),
        ));
    }
    for ca in cas {
        roots.add(ca).map_err(|e| bad(e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| bad(e.to_string()))?;
    let cfg = &shared.config;
    let key = rcgen::KeyPair::generate().map_err(|e| bad(e.to_string()))?;
    let params =
        rcgen::CertificateParams::new(vec![cfg.node_ip.to_string(), cfg.node_name.clone()])
            .map_err(|e| bad(e.to_string()))?;
    let cert = params.self_signed(&key).map_err(|e| bad(e.to_string()))?;
    let chain = vec![CertificateDer::from(cert.der().to_vec())];
    let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes())
        .map_err(|e| bad(e.to_string()))?;
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| bad(e.to_string()))?;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(server)))
}

/// The peer of a verified connection, from its leaf certificate
/// (invariant 2: `None` when there is no readable subject).
pub(crate) fn peer(conn: &rustls::ServerConnection) -> Option<Peer> {
    let leaf = conn.peer_certificates()?.first()?;
    let (cn, orgs) = subject(leaf.as_ref())?;
    Some(Peer {
        user: cn?,
        groups: orgs,
    })
}

/// Asks the API server whether `peer` may `verb` on `nodes/proxy` of this
/// node (the kubelet's webhook authorization).
pub(crate) async fn allowed(
    shared: &Shared,
    peer: &Peer,
    verb: &str,
) -> std::result::Result<(), String> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(peer.user.clone()),
            groups: Some(peer.groups.clone()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_string()),
                resource: Some("nodes".into()),
                subresource: Some("proxy".into()),
                name: Some(shared.config.node_name.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: kube::Api<SubjectAccessReview> = kube::Api::all(shared.client.clone());
    let answer = api
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| format!("cannot check access with the API server: {e}"))?;
    let status = answer.status.unwrap_or_default();
    if status.allowed {
        Ok(())
    } else {
        Err(format!(
            "Forbidden (user={}, verb={verb}, resource=nodes, subresource=proxy){}",
            peer.user,
            status
                .reason
                .filter(|r| !r.is_empty())
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ))
    }
}

/// Reads one DER element: (tag, content, rest).
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, b) = b.split_first()?;
    let (&first, mut b) = b.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || b.len() < n {
            return None;
        }
        let mut len = 0usize;
        for x in &b[..n] {
            len = (len << 8) | usize::from(*x);
        }
        b = &b[n..];
        len
    };
    if b.len() < len {
        return None;
    }
    Some((tag, &b[..len], &b[len..]))
}

const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
const OID_O: &[u8] = &[0x55, 0x04, 0x0a];

/// The subject's common name and organizations of a DER certificate.
fn subject(der: &[u8]) -> Option<(Option<String>, Vec<String>)> {
    let (_, cert, _) = tlv(der)?;
    let (_, tbs, _) = tlv(cert)?;
    let mut rest = tbs;
    // [0] version is optional.
    let (tag, _, r) = tlv(rest)?;
    if tag == 0xa0 {
        rest = r;
    }
    // serialNumber, signature, issuer, validity, then subject.
    for _ in 0..4 {
        rest = tlv(rest)?.2;
    }
    let (_, mut name, _) = tlv(rest)?;
    let (mut cn, mut orgs) = (None, Vec::new());
    while !name.is_empty() {
        let (_, mut rdn, r) = tlv(name)?;
        name = r;
        while !rdn.is_empty() {
            let (_, atv, r) = tlv(rdn)?;
            rdn = r;
            let (_, oid, r) = tlv(atv)?;
            let (_, value, _) = tlv(r)?;
            let value = String::from_utf8_lossy(value).into_owned();
            if oid == OID_CN {
                cn = Some(value);
            } else if oid == OID_O {
                orgs.push(value);
            }
        }
    }
    Some((cn, orgs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_read_from_certificates() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["x".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            subject(cert.der()),
            Some((
                Some("kube-apiserver-kubelet-client".into()),
                vec!["system:masters".into()]
            ))
        );
        assert_eq!(subject(&[0x30, 0x05, 1, 2]), None, "garbage is no subject");
        assert_eq!(subject(&[]), None);
    }
}
