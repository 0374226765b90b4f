//! Owns client-certificate authentication: the user of a verified client
//! certificate is its subject's Common Name, its groups the subject's
//! Organizations (plus `system:authenticated`), as kube-apiserver's x509
//! authenticator reads them.
//!
//! Invariants:
//! 1. Only certificates rustls has already verified against the cluster CA
//!    reach `user_of` (the TLS layer refuses others at the handshake).
//! 2. The DER reader is bounded by its input and never panics: a
//!    certificate it cannot read yields no user (401), not an error path
//!    that trusts anything.

use super::User;
use crate::apiserver::certs::der;

/// The subject's (CN, [O]) of a DER certificate (the DER reader is
/// `certs::der`'s, bounded by its input).
fn subject(cert: &[u8]) -> Option<(String, Vec<String>)> {
    let name = der::certificate_subject(cert)?;
    der::common_name_and_orgs(&name)
}

/// The user a verified client certificate stands for (invariant 1).
pub(crate) fn user_of(der: &[u8]) -> Option<User> {
    let (name, mut groups) = subject(der)?;
    if name.is_empty() {
        return None;
    }
    groups.push("system:authenticated".into());
    Some(User {
        name,
        uid: String::new(),
        groups,
        extra: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEQUENCE: u8 = 0x30;
    const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
    const OID_O: &[u8] = &[0x55, 0x04, 0x0a];

    fn der(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag, u8::try_from(content.len()).expect("short")];
        out.extend_from_slice(content);
        out
    }

    fn der_seq(items: &[&[u8]]) -> Vec<u8> {
        der(SEQUENCE, &items.concat())
    }

    #[test]
    fn subject_names_user_and_groups() {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(rcgen::DnType::CommonName, "jane");
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "dev");
        p.distinguished_name
            .push(rcgen::DnType::CustomDnType(vec![2, 5, 4, 10]), "ops");
        let cert = p.self_signed(&key).expect("cert");
        let u = user_of(cert.der()).expect("user");
        assert_eq!(u.name, "jane");
        assert_eq!(u.groups, ["dev", "ops", "system:authenticated"]);
        // Two O attributes in one certificate (as openssl writes them):
        // both are groups. Built by hand, rcgen writes one per type.
        let two = der_seq(&[&der_seq(&[
            &der(0xa0, &der(0x02, &[2])),
            &der(0x02, &[1]),
            &der_seq(&[]),
            &der_seq(&[]),
            &der_seq(&[]),
            &der_seq(&[
                &der(0x31, &der_seq(&[&der(0x06, OID_CN), &der(0x0c, b"bob")])),
                &der(0x31, &der_seq(&[&der(0x06, OID_O), &der(0x0c, b"a")])),
                &der(0x31, &der_seq(&[&der(0x06, OID_O), &der(0x0c, b"b")])),
            ]),
        ])]);
        let u = user_of(&two).expect("user");
        assert_eq!(
            (u.name.as_str(), u.groups.as_slice()),
            (
                "bob",
                &["a".to_string(), "b".into(), "system:authenticated".into()][..]
            )
        );
        for junk in [
            &b""[..],
            b"\x30",
            b"\x30\x84\xff\xff\xff\xff",
            b"\x30\x03\x30\x01\x00",
        ] {
            assert!(user_of(junk).is_none());
        }
        let der = cert.der().to_vec();
        for cut in 0..der.len() {
            let _ = user_of(&der[..cut]);
        }
    }
}
