//! Verified TLS for Monarch's own transport (`spec.monarch.transport: Tls`,
//! docs/monarch.md "TLS"): a CA per World, a certificate per host, one for
//! the World's clients, each in a Secret.
//!
//! Invariants:
//! 1. The World's CA is in `<world>-monarch-ca` (keys `ca.crt`, `ca.key`),
//!    made once and owned by the World. Only the operator reads it: no pod
//!    mounts it, and what hosts and clients get holds its certificate only.
//! 2. Host `r`'s certificate is in `<world>-host-<r>-tls`, a
//!    `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`, `ca.crt`) made
//!    before the host's pod, which mounts it at
//!    [`TLS_DIR`](hostmesh_crds::monarch::TLS_DIR), where Monarch's
//!    transport reads it by default. Its names are the DNS names of the
//!    host pod (hostname `<world>-host-<r>`, subdomain `<world>`), from the
//!    cluster domain's FQDN the worker advertises down to the bare
//!    hostname. A replaced host's pod has the same names, so it keeps the
//!    certificate.
//! 3. Clients get `<world>-monarch-client` (`kubernetes.io/tls`): a
//!    certificate of the CA with the common name `monarch-client` and no
//!    host name, which Monarch's acceptors check against the CA only, and
//!    the CA to verify the workers with. `status.monarch.clientSecret`
//!    names it.
//! 4. Every certificate may serve and dial (a Monarch worker does both)
//!    and is valid for [`VALIDITY`] from a few minutes back (clock skew).
//! 5. With only `get` and `create` on Secrets, a Secret that exists is
//!    never rewritten: a deleted one is made anew at the next reconcile
//!    (a deleted CA is a new CA: the Secrets it signed must then be
//!    deleted too, which `TlsStale` Warning Events say).

use std::time::Duration;

use hostmesh_crds::monarch::MonarchStatus;
use hostmesh_crds::{Rank, World};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, ResourceExt as _};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use super::desired;
use super::secret::create;
use crate::OperatorError;
use crate::controllers::shared::ControllerContext;

/// How long a certificate is valid. Rotation and renewal are not done
/// yet (docs/monarch.md says so); a year outlives any training job.
pub const VALIDITY: Duration = Duration::from_secs(365 * 86_400);
/// How far back validity starts.
const BACKDATE: Duration = Duration::from_secs(300);
/// The cluster domain of the FQDN a host pod's `/etc/hosts` gives it.
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// The common name of the clients' certificate.
pub const CLIENT_NAME: &str = "monarch-client";

/// Keys of a `kubernetes.io/tls` Secret, and of the CA.
const CRT: &str = "tls.crt";
const KEY: &str = "tls.key";
const CA_CRT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";

/// Name of the World's CA Secret (invariant 1).
pub fn ca_name(world: &str) -> String {
    format!("{world}-monarch-ca")
}

/// Name of host `rank`'s certificate Secret (invariant 2).
pub fn host_name(world: &str, rank: Rank) -> String {
    format!("{}-tls", desired::pod_name(world, rank))
}

/// Name of the clients' certificate Secret (invariant 3).
pub fn client_name(world: &str) -> String {
    format!("{world}-monarch-client")
}

/// What `status.monarch` says of `world`: the client Secret, for a TLS
/// World.
pub fn status(world: &World) -> Option<MonarchStatus> {
    let m = world.spec.monarch.as_ref()?;
    m.tls().then(|| MonarchStatus {
        client_secret: client_name(&world.name_any()),
    })
}

/// The DNS names of host `rank`'s pod, longest first (invariant 2).
pub fn host_dns_names(world: &str, ns: &str, rank: Rank) -> Vec<String> {
    let host = desired::pod_name(world, rank);
    vec![
        format!("{host}.{world}.{ns}.svc.{CLUSTER_DOMAIN}"),
        format!("{host}.{world}.{ns}.svc"),
        format!("{host}.{world}.{ns}"),
        format!("{host}.{world}"),
        host,
    ]
}

/// A World's CA: its certificate (PEM) and what signs with it.
pub struct Ca {
    /// The CA certificate, PEM.
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn tls_error(what: &str, e: rcgen::Error) -> OperatorError {
    OperatorError::Tls(format!("{what}: {e}"))
}

/// The CA's parameters; the same for a World each time, so that a stored
/// key signs with the subject its certificate names.
fn ca_params(ns: &str, world: &str) -> Result<CertificateParams, OperatorError> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(|e| tls_error("CA", e))?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("hostmesh Monarch CA {ns}/{world}"),
    );
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut p);
    Ok(p)
}

fn validity(p: &mut CertificateParams) {
    let now = std::time::SystemTime::now();
    p.not_before = (now - BACKDATE).into();
    p.not_after = (now + VALIDITY).into();
}

impl Ca {
    /// A new CA for `world` in `ns`; also returns its key (PEM).
    pub fn generate(ns: &str, world: &str) -> Result<(Self, String), OperatorError> {
        let key = KeyPair::generate().map_err(|e| tls_error("CA key", e))?;
        let key_pem = key.serialize_pem();
        let params = ca_params(ns, world)?;
        let cert = params
            .self_signed(&key)
            .map_err(|e| tls_error("CA certificate", e))?;
        Ok((
            Ca {
                pem: cert.pem(),
                issuer: Issuer::new(params, key),
            },
            key_pem,
        ))
    }

    /// The CA stored for `world` (its certificate and key, PEM).
    pub fn load(ns: &str, world: &str, pem: &str, key_pem: &str) -> Result<Self, OperatorError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| tls_error("stored CA key", e))?;
        Ok(Ca {
            pem: pem.to_string(),
            issuer: Issuer::new(ca_params(ns, world)?, key),
        })
    }

    /// A leaf certificate and key (PEM) with common name `cn` and DNS
    /// names `dns` (invariant 4).
    pub fn issue(&self, cn: &str, dns: &[String]) -> Result<(String, String), OperatorError> {
        let key = KeyPair::generate().map_err(|e| tls_error("key", e))?;
        let mut p = CertificateParams::new(Vec::<String>::new()).map_err(|e| tls_error(cn, e))?;
        p.distinguished_name.push(DnType::CommonName, cn);
        for name in dns {
            let name = name
                .clone()
                .try_into()
                .map_err(|e| tls_error("DNS name", e))?;
            p.subject_alt_names.push(SanType::DnsName(name));
        }
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        validity(&mut p);
        let cert = p
            .signed_by(&key, &self.issuer)
            .map_err(|e| tls_error(cn, e))?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

fn data(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, ByteString> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect()
}

fn text(s: &Secret, key: &str) -> Option<String> {
    let b = s.data.as_ref()?.get(key)?;
    String::from_utf8(b.0.clone()).ok()
}

fn owned(world: &World, name: String, tls: bool) -> Result<Secret, OperatorError> {
    let mut s = desired::secret(world, [0; 32])?;
    s.metadata.name = Some(name);
    s.type_ = Some(if tls { "kubernetes.io/tls" } else { "Opaque" }.to_string());
    Ok(s)
}

/// The World's CA, made and stored when there is none (invariant 1), and
/// the client Secret (invariant 3). `None` for a World without TLS.
pub async fn ensure(world: &World, ctx: &ControllerContext) -> Result<Option<Ca>, OperatorError> {
    if !world.spec.monarch.as_ref().is_some_and(|m| m.tls()) {
        return Ok(None);
    }
    let name = world.name_any();
    let ns = world.namespace().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let ca_secret = ca_name(&name);
    let ca = match api.get_opt(&ca_secret).await? {
        Some(s) => {
            let (Some(pem), Some(key)) = (text(&s, CA_CRT), text(&s, CA_KEY)) else {
                return Err(OperatorError::Tls(format!(
                    "Secret {ca_secret} lacks {CA_CRT} or {CA_KEY}: delete it and the operator makes a new CA"
                )));
            };
            Ca::load(&ns, &name, &pem, &key)?
        }
        None => {
            let (ca, key) = Ca::generate(&ns, &name)?;
            let mut s = owned(world, ca_secret.clone(), false)?;
            s.data = Some(data(&[(CA_CRT, &ca.pem), (CA_KEY, &key)]));
            match api.create(&PostParams::default(), &s).await {
                Ok(_) => ca,
                // Another pass made it first: use that one.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    return Err(crate::Pending::SecretCreating(name).into());
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    let client = client_name(&name);
    match api.get_opt(&client).await? {
        Some(s) => stale_check(world, ctx, &s, &ca).await,
        None => {
            let (crt, key) = ca.issue(CLIENT_NAME, &[])?;
            let mut s = owned(world, client, true)?;
            s.data = Some(data(&[(CRT, &crt), (KEY, &key), (CA_CRT, &ca.pem)]));
            create(&api, &s).await?;
        }
    }
    Ok(Some(ca))
}

/// Invariant 5: a Secret signed by another CA than the stored one.
async fn stale_check(world: &World, ctx: &ControllerContext, s: &Secret, ca: &Ca) {
    if text(s, CA_CRT).as_deref() != Some(ca.pem.as_str()) {
        ctx.event(
            world,
            true,
            "TlsStale",
            format!(
                "Secret {} was issued by an earlier CA of this World (its {} was deleted): delete it and the operator issues it anew",
                s.name_any(),
                ca_name(&world.name_any())
            ),
        )
        .await;
    }
}

/// Makes host `rank`'s certificate Secret unless it exists (invariant 2).
pub async fn ensure_host(
    world: &World,
    ctx: &ControllerContext,
    ca: &Ca,
    rank: Rank,
) -> Result<(), OperatorError> {
    let name = world.name_any();
    let ns = world.namespace().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let secret = host_name(&name, rank);
    if let Some(s) = api.get_opt(&secret).await? {
        stale_check(world, ctx, &s, ca).await;
        return Ok(());
    }
    let dns = host_dns_names(&name, &ns, rank);
    let (crt, key) = ca.issue(&dns[0], &dns)?;
    let mut s = owned(world, secret, true)?;
    s.data = Some(data(&[(CRT, &crt), (KEY, &key), (CA_CRT, &ca.pem)]));
    create(&api, &s).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier as _;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use std::sync::Arc;

    fn der(pem: &str) -> CertificateDer<'static> {
        use base64::Engine as _;
        let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        CertificateDer::from(bytes)
    }

    fn roots(ca_pem: &str) -> Arc<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(ca_pem)).unwrap();
        Arc::new(roots)
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// Whether an acceptor trusting `ca_pem` admits `crt` as a client.
    fn admits_client(ca_pem: &str, crt: &str) -> bool {
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca_pem), provider())
            .build()
            .unwrap()
            .verify_client_cert(&der(crt), &[], UnixTime::now())
            .is_ok()
    }

    /// Invariants 2 and 4: a host certificate verifies against the CA as
    /// a server for the names the worker advertises, and as a client.
    #[test]
    fn a_host_certificate_chains_to_its_ca_for_its_names_only() {
        let (ca, key) = Ca::generate("ml", "w").unwrap();
        let again = Ca::load("ml", "w", &ca.pem, &key).unwrap();
        let dns = host_dns_names("w", "ml", 1);
        assert_eq!(dns[0], "w-host-1.w.ml.svc.cluster.local");
        assert_eq!(dns.last().unwrap(), "w-host-1");
        // Issued by the reloaded CA: the same subject and key.
        let (crt, _) = again.issue(&dns[0], &dns).unwrap();
        let server =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots(&ca.pem), provider())
                .build()
                .unwrap();
        let leaf = der(&crt);
        let now = UnixTime::now();
        for name in &dns {
            let sn = ServerName::try_from(name.clone()).unwrap();
            server
                .verify_server_cert(&leaf, &[], &sn, &[], now)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let other = ServerName::try_from("w-host-2.w.ml.svc.cluster.local").unwrap();
        assert!(
            server
                .verify_server_cert(&leaf, &[], &other, &[], now)
                .is_err()
        );
        assert!(admits_client(&ca.pem, &crt));
        // Another World's CA does not admit it.
        let (foreign, _) = Ca::generate("ml", "other").unwrap();
        assert!(!admits_client(&foreign.pem, &crt));
    }

    /// Invariant 3: the clients' certificate names no host and is admitted
    /// as a client.
    #[test]
    fn the_client_certificate_is_a_client_of_the_ca() {
        let (ca, _) = Ca::generate("ml", "w").unwrap();
        let (crt, key) = ca.issue(CLIENT_NAME, &[]).unwrap();
        assert!(key.contains("PRIVATE KEY"));
        assert!(admits_client(&ca.pem, &crt));
    }
}
