//! Owns the API server's credentials: a generated CA, a serving certificate
//! for loopback signed by it, a random bearer token, the key service account
//! tokens are signed with, and the kubeconfig that hands the first three to
//! clients.
//!
//! Invariants:
//! 1. The serving certificate names `127.0.0.1`, `::1`, `localhost`, the
//!    listen IP and the in-cluster names of the `kubernetes` Service
//!    ([`KUBERNETES_SERVICE_IP`], `kubernetes.default.svc...`), so clients
//!    on the machine and in pods verify it against the CA without special
//!    cases.
//! 2. With a data directory the credentials are written there and reused on
//!    restart, so an existing kubeconfig keeps working. A stored serving
//!    certificate that lacks a name of invariant 1 is replaced on start:
//!    signed by the stored CA key when there is one (older data directories
//!    have none: then the CA is replaced too, and clients need the new
//!    kubeconfig).
//! 3. Clients may present a certificate signed by the CA (client-certificate
//!    authentication, see `auth::x509`); one signed by anyone else fails the
//!    handshake. The CA key, kept beside the CA, issues such certificates.

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

use super::ApiServerError;

/// ClusterIP of the `default/kubernetes` Service.
pub(crate) const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";

/// The names of the API server inside the cluster (invariant 1).
const IN_CLUSTER_NAMES: [&str; 5] = [
    KUBERNETES_SERVICE_IP,
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// Certificates and token the server runs with.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) ca_pem: String,
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
    pub(crate) token: String,
    /// The service account token signing key (hex of 32 random bytes).
    pub(crate) sa_key: String,
    /// The CA's private key (absent in data directories made before the
    /// server could issue client certificates).
    pub(crate) ca_key_pem: Option<String>,
}

impl Credentials {
    /// Loads credentials from `dir` when all files exist there, otherwise
    /// generates new ones (and stores them in `dir` when given).
    pub(crate) fn load_or_generate(
        dir: Option<&Path>,
        ip: std::net::IpAddr,
    ) -> Result<Self, ApiServerError> {
        if let Some(dir) = dir {
            let read = |f: &str| std::fs::read_to_string(dir.join(f));
            if let (Ok(ca_pem), Ok(cert_pem), Ok(key_pem), Ok(token)) = (
                read("ca.pem"),
                read("server.pem"),
                read("server-key.pem"),
                read("token"),
            ) {
                // A data directory from before service account tokens gets
                // its key now.
                let sa_key = match read(SA_KEY_FILE) {
                    Ok(k) if !k.trim().is_empty() => k.trim().to_string(),
                    _ => {
                        let k = random_hex()?;
                        write_private(&dir.join(SA_KEY_FILE), &k)?;
                        k
                    }
                };
                let token = token.trim().to_string();
                let ca_key_pem = read(CA_KEY_FILE).ok();
                if names_everything(&cert_pem) {
                    return Ok(Self {
                        ca_pem,
                        cert_pem,
                        key_pem,
                        token,
                        sa_key,
                        ca_key_pem,
                    });
                }
                // Invariant 2: a serving certificate from before the
                // in-cluster names.
                let ca_key = ca_key_pem
                    .as_deref()
                    .and_then(|k| KeyPair::from_pem(k).ok());
                let fresh = match ca_key {
                    Some(k) => {
                        tracing::info!(
                            "re-issuing the serving certificate with the in-cluster names of the kubernetes Service"
                        );
                        let (cert_pem, key_pem) = serving_cert(&Issuer::new(ca_params()?, k), ip)?;
                        Self {
                            ca_pem,
                            cert_pem,
                            key_pem,
                            token,
                            sa_key,
                            ca_key_pem,
                        }
                    }
                    None => {
                        tracing::warn!(
                            "the stored CA has no key to re-issue the serving certificate with the in-cluster names: making a new CA; clients need the new kubeconfig"
                        );
                        let mut creds = Self::generate(ip)?;
                        if let Some(k) = &creds.ca_key_pem {
                            write_private(&dir.join(CA_KEY_FILE), k)?;
                        }
                        creds.token = token;
                        creds.sa_key = sa_key;
                        creds
                    }
                };
                for (f, body) in [
                    ("ca.pem", &fresh.ca_pem),
                    ("server.pem", &fresh.cert_pem),
                    ("server-key.pem", &fresh.key_pem),
                ] {
                    write_private(&dir.join(f), body)?;
                }
                return Ok(fresh);
            }
        }
        let creds = Self::generate(ip)?;
        if let Some(dir) = dir {
            std::fs::create_dir_all(dir).map_err(|e| ApiServerError::io(dir, e))?;
            for (f, body) in [
                ("ca.pem", &creds.ca_pem),
                ("server.pem", &creds.cert_pem),
                ("server-key.pem", &creds.key_pem),
                ("token", &creds.token),
                (SA_KEY_FILE, &creds.sa_key),
            ] {
                write_private(&dir.join(f), body)?;
            }
            if let Some(k) = &creds.ca_key_pem {
                write_private(&dir.join(CA_KEY_FILE), k)?;
            }
        }
        Ok(creds)
    }

    fn generate(ip: std::net::IpAddr) -> Result<Self, ApiServerError> {
        let ca_key = KeyPair::generate()?;
        let ca_key_pem = ca_key.serialize_pem();
        let ca_params = ca_params()?;
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let (cert_pem, key_pem) = serving_cert(&issuer, ip)?;
        Ok(Self {
            ca_pem: ca_cert.pem(),
            cert_pem,
            key_pem,
            token: random_hex()?,
            sa_key: random_hex()?,
            ca_key_pem: Some(ca_key_pem),
        })
    }

    /// A client certificate and key (PEM) for `user` in `groups` (CN and
    /// O, as kube-apiserver reads them), signed by the CA (rcgen's default validity, as the serving certificate).
    pub(crate) fn issue_client_cert(
        &self,
        user: &str,
        groups: &[&str],
    ) -> Result<(String, String), ApiServerError> {
        let ca_key = self.ca_key_pem.as_deref().ok_or_else(|| {
            ApiServerError::Tls("this data directory has no CA key (ca-key.pem), so no client certificate can be issued: start with a new data directory".into())
        })?;
        let issuer = Issuer::new(ca_params()?, KeyPair::from_pem(ca_key)?);
        // rcgen writes one value per attribute type: a second group goes
        // under the same OID (2.5.4.10) spelled as a custom type; more do
        // not fit. The server reads every O of certificates made elsewhere.
        if groups.len() > 2 {
            return Err(ApiServerError::Tls(format!(
                "a client certificate issued here carries at most two groups (O), not {}: bind RBAC roles to the user or to fewer groups",
                groups.len()
            )));
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        let org_types = [
            DnType::OrganizationName,
            DnType::CustomDnType(vec![2, 5, 4, 10]),
        ];
        for (g, ty) in groups.iter().zip(org_types) {
            params.distinguished_name.push(ty, *g);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// The rustls server configuration (HTTP/2 and HTTP/1.1 via ALPN).
    pub(crate) fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, ApiServerError> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ApiServerError::Tls(format!("bad serving certificate: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| ApiServerError::Tls(format!("bad serving key: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            let ca = ca.map_err(|e| ApiServerError::Tls(format!("bad CA certificate: {e}")))?;
            roots
                .add(ca)
                .map_err(|e| ApiServerError::Tls(format!("bad CA certificate: {e}")))?;
        }
        // Invariant 3: a client certificate is optional, but must be ours.
        let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .map_err(|e| ApiServerError::Tls(e.to_string()))?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ApiServerError::Tls(e.to_string()))?
            .with_client_cert_verifier(clients)
            .with_single_cert(certs, key)
            .map_err(|e| ApiServerError::Tls(e.to_string()))?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }

    /// A kubeconfig (YAML) for `server` with the CA and token embedded.
    pub(crate) fn kubeconfig(&self, server: &str) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem.as_bytes());
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: hostmesh-dev\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: hostmesh-admin\n  user:\n    token: {token}\ncontexts:\n- name: hostmesh-dev\n  context:\n    cluster: hostmesh-dev\n    user: hostmesh-admin\n    namespace: default\ncurrent-context: hostmesh-dev\npreferences: {{}}\n",
            token = self.token
        )
    }
}

/// A serving certificate (PEM) and its key (PEM) with the names of
/// invariant 1, signed by `issuer`.
fn serving_cert(
    issuer: &Issuer<'_, KeyPair>,
    ip: std::net::IpAddr,
) -> Result<(String, String), ApiServerError> {
    let mut sans = vec![
        "127.0.0.1".to_string(),
        "::1".to_string(),
        "localhost".to_string(),
    ];
    sans.extend(IN_CLUSTER_NAMES.iter().map(|n| n.to_string()));
    if !sans.contains(&ip.to_string()) && !ip.is_unspecified() {
        sans.push(ip.to_string());
    }
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(sans)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "hostmesh-devcluster-apiserver");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Whether the PEM certificate names every in-cluster name (invariant 1):
/// DNS names appear verbatim in the DER, the IP as its four bytes.
fn names_everything(cert_pem: &str) -> bool {
    let body: String = cert_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let Ok(der) = base64::engine::general_purpose::STANDARD.decode(body.trim()) else {
        return false;
    };
    let has = |needle: &[u8]| der.windows(needle.len()).any(|w| w == needle);
    let ip: std::net::Ipv4Addr = KUBERNETES_SERVICE_IP
        .parse()
        .expect("a literal IPv4 address");
    has(&ip.octets()) && IN_CLUSTER_NAMES[1..].iter().all(|n| has(n.as_bytes()))
}

/// The CA's parameters (the same on every start, so certificates issued
/// later name the CA exactly as its certificate does).
fn ca_params() -> Result<CertificateParams, ApiServerError> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "hostmesh-devcluster-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(ca_params)
}

/// The file the CA key is kept in.
const CA_KEY_FILE: &str = "ca-key.pem";

/// Writes a file readable by its owner only.
pub(crate) fn write_private(path: &Path, body: &str) -> Result<(), ApiServerError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| ApiServerError::io(&tmp, e))?;
    f.write_all(body.as_bytes())
        .map_err(|e| ApiServerError::io(&tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| ApiServerError::io(path, e))
}

/// The file the service account signing key is kept in.
const SA_KEY_FILE: &str = "sa-signing-key";

/// 32 random bytes as hex.
fn random_hex() -> Result<String, ApiServerError> {
    let mut raw = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw)
        .map_err(|_| ApiServerError::Tls("the system random generator failed".into()))?;
    Ok(hex(&raw))
}

/// The bytes of a hex string (the signing key); `None` if it is not hex.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares two secrets in time independent of where they differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
