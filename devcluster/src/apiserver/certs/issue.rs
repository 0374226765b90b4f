//! Issuing an X.509 certificate for a certificate signing request with the
//! cluster CA, as kube-controller-manager's signers do: the request's
//! subject, public key and subject alternative names exactly as asked, the
//! key usages and extended key usages of `spec.usages`, not a CA, valid
//! from five minutes ago (clock skew) for the requested duration.

use std::time::Duration;

use rcgen::{KeyPair, SigningKey as _};

use super::der::{self, BIT_STRING, BOOLEAN, INTEGER, OCTET_STRING, SEQUENCE};
use super::pkcs10::Csr;

/// How far back a certificate's validity starts (the signers' backdate).
const BACKDATE: Duration = Duration::from_secs(300);

/// The DER `Name` of a PEM certificate's subject (the issuer of what it
/// signs).
fn subject_of(cert_pem: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let b64: String = cert_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .flat_map(|l| l.trim().chars())
        .collect();
    let cert = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    Some(der::certificate_subject(&cert)?.raw.to_vec())
}

/// A key usage's bit (`KeyUsage` of RFC 5280), if `usage` is one.
fn key_usage_bit(usage: &str) -> Option<u8> {
    Some(match usage {
        "signing" | "digital signature" => 0,
        "content commitment" => 1,
        "key encipherment" => 2,
        "data encipherment" => 3,
        "key agreement" => 4,
        "cert sign" => 5,
        "crl sign" => 6,
        "encipher only" => 7,
        "decipher only" => 8,
        _ => return None,
    })
}

/// An extended key usage's OID, if `usage` is one.
fn ext_key_usage(usage: &str) -> Option<&'static [u64]> {
    Some(match usage {
        "any" => &[2, 5, 29, 37, 0],
        "server auth" => &[1, 3, 6, 1, 5, 5, 7, 3, 1],
        "client auth" => &[1, 3, 6, 1, 5, 5, 7, 3, 2],
        "code signing" => &[1, 3, 6, 1, 5, 5, 7, 3, 3],
        "email protection" | "s/mime" => &[1, 3, 6, 1, 5, 5, 7, 3, 4],
        "ipsec end system" => &[1, 3, 6, 1, 5, 5, 7, 3, 5],
        "ipsec tunnel" => &[1, 3, 6, 1, 5, 5, 7, 3, 6],
        "ipsec user" => &[1, 3, 6, 1, 5, 5, 7, 3, 7],
        "timestamping" => &[1, 3, 6, 1, 5, 5, 7, 3, 8],
        "ocsp signing" => &[1, 3, 6, 1, 5, 5, 7, 3, 9],
        "microsoft sgc" => &[1, 3, 6, 1, 4, 1, 311, 10, 3, 3],
        "netscape sgc" => &[2, 16, 840, 1, 113730, 4, 1],
        _ => return None,
    })
}

fn extension(oid: &[u64], critical: bool, value: &[u8]) -> Vec<u8> {
    let id = der::tlv(der::OID, &der::oid(oid));
    let value = der::tlv(OCTET_STRING, value);
    if critical {
        der::seq(&[&id, &der::tlv(BOOLEAN, &[0xff]), &value])
    } else {
        der::seq(&[&id, &value])
    }
}

fn time(t: chrono::DateTime<chrono::Utc>) -> Vec<u8> {
    use chrono::Datelike as _;
    if t.year() < 2050 {
        der::tlv(0x17, t.format("%y%m%d%H%M%SZ").to_string().as_bytes())
    } else {
        der::tlv(0x18, t.format("%Y%m%d%H%M%SZ").to_string().as_bytes())
    }
}

/// The `AlgorithmIdentifier` of signatures made with `key`.
fn signature_algorithm(key: &KeyPair) -> Result<Vec<u8>, String> {
    let alg = key.algorithm();
    let id: &[u64] = if alg == &rcgen::PKCS_ECDSA_P256_SHA256 {
        &[1, 2, 840, 10045, 4, 3, 2]
    } else if alg == &rcgen::PKCS_ECDSA_P384_SHA384 {
        &[1, 2, 840, 10045, 4, 3, 3]
    } else if alg == &rcgen::PKCS_ED25519 {
        &[1, 3, 101, 112]
    } else if alg == &rcgen::PKCS_RSA_SHA256 {
        return Ok(der::seq(&[
            &der::tlv(der::OID, &der::oid(&[1, 2, 840, 113549, 1, 1, 11])),
            &[0x05, 0x00],
        ]));
    } else {
        return Err(format!(
            "the cluster CA's key algorithm {alg:?} cannot sign here"
        ));
    };
    Ok(der::seq(&[&der::tlv(der::OID, &der::oid(id))]))
}

/// A PEM certificate for `csr` with `usages`, valid for `duration`, signed
/// by the CA (`ca_pem`, `ca_key_pem`).
pub(crate) fn issue(
    csr: &Csr,
    usages: &[String],
    duration: Duration,
    ca_pem: &str,
    ca_key_pem: &str,
) -> Result<String, String> {
    use base64::Engine as _;
    let key = KeyPair::from_pem(ca_key_pem).map_err(|e| format!("the cluster CA key: {e}"))?;
    let issuer = subject_of(ca_pem).ok_or("the cluster CA certificate cannot be read")?;
    let sig_alg = signature_algorithm(&key)?;
    let mut serial = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut serial)
        .map_err(|_| "no randomness for a serial number")?;
    serial[0] &= 0x7f;
    serial[0] |= 0x01;
    let now = chrono::Utc::now();
    let not_before = now - chrono::Duration::from_std(BACKDATE).unwrap_or_default();
    let not_after = now + chrono::Duration::from_std(duration).unwrap_or_default();
    let mut extensions = Vec::new();
    let bits: Vec<u8> = usages.iter().filter_map(|u| key_usage_bit(u)).collect();
    if !bits.is_empty() {
        let mut bytes = [0u8; 2];
        for b in &bits {
            bytes[usize::from(b / 8)] |= 0x80 >> (b % 8);
        }
        let highest = bits.iter().copied().max().unwrap_or(0);
        let len = usize::from(highest / 8) + 1;
        let unused = 7 - (highest % 8);
        let mut content = vec![unused];
        content.extend_from_slice(&bytes[..len]);
        extensions.push(extension(
            &[2, 5, 29, 15],
            true,
            &der::tlv(BIT_STRING, &content),
        ));
    }
    let ekus: Vec<Vec<u8>> = usages
        .iter()
        .filter_map(|u| ext_key_usage(u))
        .map(|oid| der::tlv(der::OID, &der::oid(oid)))
        .collect();
    if !ekus.is_empty() {
        let refs: Vec<&[u8]> = ekus.iter().map(Vec::as_slice).collect();
        extensions.push(extension(&[2, 5, 29, 37], false, &der::seq(&refs)));
    }
    extensions.push(extension(&[2, 5, 29, 19], true, &der::seq(&[])));
    if let Some(san) = &csr.san {
        extensions.push(san.clone());
    }
    let ext_refs: Vec<&[u8]> = extensions.iter().map(Vec::as_slice).collect();
    let tbs = der::seq(&[
        &der::tlv(0xa0, &der::tlv(INTEGER, &[2])),
        &der::tlv(INTEGER, &serial),
        &sig_alg,
        &issuer,
        &der::seq(&[&time(not_before), &time(not_after)]),
        &csr.subject,
        &csr.public_key_info,
        &der::tlv(0xa3, &der::seq(&ext_refs)),
    ]);
    let signature = key.sign(&tbs).map_err(|e| format!("signing failed: {e}"))?;
    let mut bits = vec![0u8];
    bits.extend(signature);
    let cert = der::tlv(
        SEQUENCE,
        &[tbs, sig_alg, der::tlv(BIT_STRING, &bits)].concat(),
    );
    let b64 = base64::engine::general_purpose::STANDARD.encode(cert);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    Ok(pem)
}
