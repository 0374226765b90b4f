//! Reading a PKCS#10 certificate signing request as kube-apiserver's
//! validation and signers do: the first PEM block must be a `CERTIFICATE
//! REQUEST`, its signature must verify with its own public key, and the
//! subject, public key and requested extensions are kept as written, so a
//! certificate made from it names exactly what was asked for.

use super::der::{self, BIT_STRING, Element, OID, SEQUENCE};

/// `extensionRequest` (PKCS#9).
const OID_EXTENSION_REQUEST: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x0e];
/// `subjectAltName`.
pub(crate) const OID_SAN: &[u8] = &[0x55, 0x1d, 0x11];

/// A parsed certificate signing request.
#[derive(Debug)]
pub(crate) struct Csr {
    /// The subject `Name`, as encoded in the request.
    pub(crate) subject: Vec<u8>,
    /// The subject's common name.
    pub(crate) common_name: String,
    /// The subject's organizations, in order.
    pub(crate) organizations: Vec<String>,
    /// The `SubjectPublicKeyInfo`, as encoded.
    pub(crate) public_key_info: Vec<u8>,
    /// The `subjectAltName` extension as encoded, if requested.
    pub(crate) san: Option<Vec<u8>>,
    /// Kinds of subject alternative names present (`dns`, `email`, `ip`,
    /// `uri`).
    pub(crate) san_kinds: Vec<&'static str>,
}

/// The first PEM block of `pem` and its type.
fn first_pem_block(pem: &[u8]) -> Option<(String, Vec<u8>)> {
    use base64::Engine as _;
    let text = std::str::from_utf8(pem).ok()?;
    let start = text.find("-----BEGIN ")?;
    let rest = &text[start + 11..];
    let type_end = rest.find("-----")?;
    let type_ = rest[..type_end].to_string();
    let body = &rest[type_end + 5..];
    let end = body.find(&format!("-----END {type_}-----"))?;
    let b64: String = body[..end]
        .lines()
        .filter(|l| !l.contains(':'))
        .flat_map(|l| l.trim().chars())
        .collect();
    let der = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    Some((type_, der))
}

/// Parses and verifies a PEM certificate signing request; the error is the
/// real server's words.
pub(crate) fn parse(pem: &[u8]) -> Result<Csr, String> {
    let (type_, der_bytes) = first_pem_block(pem)
        .filter(|(t, _)| t == "CERTIFICATE REQUEST")
        .ok_or_else(|| "PEM block type must be CERTIFICATE REQUEST".to_string())?;
    debug_assert_eq!(type_, "CERTIFICATE REQUEST");
    let malformed = || "asn1: structure error: malformed certificate request".to_string();
    let outer = der::whole(&der_bytes)
        .filter(|e| e.tag == SEQUENCE)
        .ok_or_else(malformed)?;
    let parts = der::children(outer.content).ok_or_else(malformed)?;
    let [info, alg, sig] = parts.as_slice() else {
        return Err(malformed());
    };
    if info.tag != SEQUENCE || alg.tag != SEQUENCE || sig.tag != BIT_STRING {
        return Err(malformed());
    }
    let fields = der::children(info.content).ok_or_else(malformed)?;
    let (subject, spki, attributes) = match fields.as_slice() {
        [_version, subject, spki, rest @ ..] => (subject, spki, rest.first()),
        _ => return Err(malformed()),
    };
    let (common_name, organizations) = der::common_name_and_orgs(subject).ok_or_else(malformed)?;
    let (key_alg, key_bits) = public_key(spki).ok_or_else(malformed)?;
    verify(alg, sig, info.raw, key_alg, key_bits)?;
    let (san, san_kinds) = attributes
        .and_then(|a| subject_alt_names(a))
        .unwrap_or_default();
    Ok(Csr {
        subject: subject.raw.to_vec(),
        common_name,
        organizations,
        public_key_info: spki.raw.to_vec(),
        san,
        san_kinds,
    })
}

/// The key algorithm OID (with its curve, for EC keys) and the key bits.
fn public_key<'a>(spki: &Element<'a>) -> Option<(Vec<u8>, &'a [u8])> {
    let parts = der::children(spki.content)?;
    let [alg, key] = parts.as_slice() else {
        return None;
    };
    let alg_parts = der::children(alg.content)?;
    let mut id = alg_parts.first()?.content.to_vec();
    if let Some(param) = alg_parts.get(1).filter(|p| p.tag == OID) {
        id.extend_from_slice(param.content);
    }
    // The bit string's first byte counts unused bits (always 0 for keys).
    let bits = key.content.split_first()?.1;
    Some((id, bits))
}

/// Verifies the request's signature with its own key.
fn verify(
    alg: &Element<'_>,
    sig: &Element<'_>,
    signed: &[u8],
    key_alg: Vec<u8>,
    key: &[u8],
) -> Result<(), String> {
    use ring::signature as s;
    const EC: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    const P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
    const P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];
    const ED25519: &[u8] = &[0x2b, 0x65, 0x70];
    let sig_alg = der::children(alg.content)
        .and_then(|p| p.first().map(|o| o.content.to_vec()))
        .unwrap_or_default();
    let ecdsa_sha256 = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
    let ecdsa_sha384 = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03];
    let rsa_prefix = [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    let ec = |curve: &[u8]| key_alg.starts_with(EC) && key_alg[EC.len()..] == *curve;
    let algorithm: &dyn s::VerificationAlgorithm = if sig_alg == ecdsa_sha256 && ec(P256) {
        &s::ECDSA_P256_SHA256_ASN1
    } else if sig_alg == ecdsa_sha384 && ec(P384) {
        &s::ECDSA_P384_SHA384_ASN1
    } else if sig_alg == ecdsa_sha256 && ec(P384) {
        &s::ECDSA_P384_SHA256_ASN1
    } else if sig_alg == ecdsa_sha384 && ec(P256) {
        &s::ECDSA_P256_SHA384_ASN1
    } else if sig_alg == ED25519 && key_alg == ED25519 {
        &s::ED25519
    } else if sig_alg.starts_with(&rsa_prefix) && sig_alg.len() == rsa_prefix.len() + 1 {
        match sig_alg[rsa_prefix.len()] {
            11 => &s::RSA_PKCS1_2048_8192_SHA256,
            12 => &s::RSA_PKCS1_2048_8192_SHA384,
            13 => &s::RSA_PKCS1_2048_8192_SHA512,
            _ => return Err("x509: cannot verify signature: algorithm unimplemented".into()),
        }
    } else {
        return Err("x509: cannot verify signature: algorithm unimplemented".into());
    };
    let signature = sig
        .content
        .split_first()
        .map(|(_, s)| s)
        .unwrap_or_default();
    s::UnparsedPublicKey::new(algorithm, key)
        .verify(signed, signature)
        .map_err(|_| "x509: signature verification failure".to_string())
}

/// The `subjectAltName` extension of the request's attributes, and the
/// kinds of names it holds.
fn subject_alt_names(attributes: &Element<'_>) -> Option<(Option<Vec<u8>>, Vec<&'static str>)> {
    for attr in der::children(attributes.content)? {
        let parts = der::children(attr.content)?;
        let [oid, values] = parts.as_slice() else {
            continue;
        };
        if oid.content != OID_EXTENSION_REQUEST {
            continue;
        }
        for exts in der::children(values.content)? {
            for ext in der::children(exts.content)? {
                let fields = der::children(ext.content)?;
                if fields.first()?.content != OID_SAN {
                    continue;
                }
                let value = fields.last()?;
                let names = der::whole(value.content)?;
                let mut kinds = Vec::new();
                for n in der::children(names.content)? {
                    kinds.push(match n.tag & 0x1f {
                        1 => "email",
                        2 => "dns",
                        6 => "uri",
                        7 => "ip",
                        _ => "other",
                    });
                }
                return Some((Some(ext.raw.to_vec()), kinds));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(cn: &str, orgs: &[&str], sans: Vec<String>) -> String {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut p = rcgen::CertificateParams::new(sans).expect("params");
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        if let Some(o) = orgs.first() {
            p.distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        p.serialize_request(&key).expect("csr").pem().expect("pem")
    }

    #[test]
    fn a_request_is_read_and_its_signature_checked() {
        let pem = request("alice", &["dev"], vec![]);
        let csr = parse(pem.as_bytes()).expect("parses");
        assert_eq!(csr.common_name, "alice");
        assert_eq!(csr.organizations, ["dev"]);
        assert!(csr.san.is_none());
        let with_san =
            parse(request("n", &[], vec!["x.example".into()]).as_bytes()).expect("parses");
        assert_eq!(with_san.san_kinds, ["dns"]);
        // A changed byte in the signed part fails the signature.
        let (_, mut der) = first_pem_block(pem.as_bytes()).expect("pem");
        let at = der.windows(5).position(|w| w == b"alice").expect("cn");
        der[at] = b'b';
        use base64::Engine as _;
        let forged = format!(
            "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
            base64::engine::general_purpose::STANDARD.encode(&der)
        );
        assert_eq!(
            parse(forged.as_bytes()).unwrap_err(),
            "x509: signature verification failure"
        );
        assert_eq!(
            parse(b"hello").unwrap_err(),
            "PEM block type must be CERTIFICATE REQUEST"
        );
        for cut in 0..der.len() {
            let _ = parse(
                format!(
                    "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
                    base64::engine::general_purpose::STANDARD.encode(&der[..cut])
                )
                .as_bytes(),
            );
        }
    }
}
