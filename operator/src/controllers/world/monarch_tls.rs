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
//!    and is valid for the operator's `--monarch-cert-validity` (a year by
//!    default) from a few minutes back (clock skew).
//! 5. Renewal: a certificate with less than a third of its validity left
//!    is issued anew in place (`update` on its Secret), the CA's with the
//!    same key (so what it signed still chains to it). A host or client
//!    Secret whose CA is not the stored one (the CA Secret was deleted: a
//!    new CA, which is how a CA is rotated) is issued anew too. Each leaf
//!    Secret records its CA's fingerprint and its expiry in annotations
//!    ([`ISSUER_ANNOTATION`], [`NOT_AFTER_ANNOTATION`]), so a pass lists the
//!    World's Secrets' metadata only; one without them is issued anew once.
//!    Mounted Secrets reach running pods without a restart (the kubelet
//!    refreshes Secret volumes) and Monarch reads the files per connection.

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

/// How long a certificate is valid by default (invariant 4).
pub const VALIDITY: Duration = Duration::from_secs(365 * 86_400);
/// Annotation of a leaf Secret: the fingerprint of the CA that issued it
/// (invariant 5).
pub const ISSUER_ANNOTATION: &str = "hostmesh.dev/tls-issuer";
/// Annotation of a leaf Secret: its certificate's expiry, Unix seconds
/// (invariant 5).
pub const NOT_AFTER_ANNOTATION: &str = "hostmesh.dev/tls-not-after";
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
    /// How long what it issues is valid.
    validity: Duration,
}

fn tls_error(what: &str, e: rcgen::Error) -> OperatorError {
    OperatorError::Tls(format!("{what}: {e}"))
}

/// The CA's parameters; the same for a World each time, so that a stored
/// key signs with the subject its certificate names.
fn ca_params(
    ns: &str,
    world: &str,
    validity: Duration,
) -> Result<CertificateParams, OperatorError> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(|e| tls_error("CA", e))?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("hostmesh Monarch CA {ns}/{world}"),
    );
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    valid_for(&mut p, validity);
    Ok(p)
}

/// Sets `p`'s validity (invariant 4); returns its expiry, Unix seconds.
fn valid_for(p: &mut CertificateParams, validity: Duration) -> u64 {
    let now = std::time::SystemTime::now();
    p.not_before = (now - BACKDATE).into();
    let until = now + validity;
    p.not_after = until.into();
    unix(until)
}

fn unix(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Whether a certificate valid for `validity` and expiring at `not_after`
/// (Unix seconds) is due for renewal: less than a third left (invariant 5).
pub fn due(not_after: u64, validity: Duration) -> bool {
    unix(std::time::SystemTime::now()) + validity.as_secs() / 3 >= not_after
}

/// The expiry of a PEM certificate, Unix seconds.
fn not_after_of(pem: &str) -> Result<u64, OperatorError> {
    let bad = |e: String| {
        OperatorError::Tls(format!(
            "stored CA certificate: {e}: delete its Secret and the operator makes a new CA"
        ))
    };
    let (_, p) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| bad(e.to_string()))?;
    let cert = p.parse_x509().map_err(|e| bad(e.to_string()))?;
    Ok(u64::try_from(cert.validity().not_after.timestamp()).unwrap_or(0))
}

impl Ca {
    /// A new CA for `world` in `ns`; also returns its key (PEM).
    pub fn generate(
        ns: &str,
        world: &str,
        validity: Duration,
    ) -> Result<(Self, String), OperatorError> {
        let key = KeyPair::generate().map_err(|e| tls_error("CA key", e))?;
        let key_pem = key.serialize_pem();
        Ok((Self::signed(ns, world, key, validity)?, key_pem))
    }

    /// A CA certificate for `key`, valid for `validity` from now: a new CA,
    /// or a renewed one (the same key and subject, so what the earlier
    /// certificate signed chains to this one too).
    fn signed(
        ns: &str,
        world: &str,
        key: KeyPair,
        validity: Duration,
    ) -> Result<Self, OperatorError> {
        let params = ca_params(ns, world, validity)?;
        let cert = params
            .self_signed(&key)
            .map_err(|e| tls_error("CA certificate", e))?;
        Ok(Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
            validity,
        })
    }

    /// A certificate for the CA key `key_pem` of `world`, valid for
    /// `validity` from now: what renewal writes (the same key and subject).
    pub fn from_key(
        ns: &str,
        world: &str,
        key_pem: &str,
        validity: Duration,
    ) -> Result<Self, OperatorError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| tls_error("stored CA key", e))?;
        Self::signed(ns, world, key, validity)
    }

    /// The CA stored for `world` (its certificate and key, PEM); renewed
    /// (`true`) when its certificate is due (invariant 5).
    pub fn load(
        ns: &str,
        world: &str,
        pem: &str,
        key_pem: &str,
        validity: Duration,
    ) -> Result<(Self, bool), OperatorError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| tls_error("stored CA key", e))?;
        if due(not_after_of(pem)?, validity) {
            return Ok((Self::signed(ns, world, key, validity)?, true));
        }
        Ok((
            Ca {
                pem: pem.to_string(),
                issuer: Issuer::new(ca_params(ns, world, validity)?, key),
                validity,
            },
            false,
        ))
    }

    /// A short fingerprint of the CA certificate (invariant 5).
    pub fn fingerprint(&self) -> String {
        let d = ring::digest::digest(&ring::digest::SHA256, self.pem.as_bytes());
        d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A leaf certificate and key (PEM) with common name `cn` and DNS
    /// names `dns` (invariant 4), and its expiry (Unix seconds).
    pub fn issue(&self, cn: &str, dns: &[String]) -> Result<Leaf, OperatorError> {
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
        let not_after = valid_for(&mut p, self.validity);
        let cert = p
            .signed_by(&key, &self.issuer)
            .map_err(|e| tls_error(cn, e))?;
        Ok(Leaf {
            crt: cert.pem(),
            key: key.serialize_pem(),
            not_after,
        })
    }

    /// Why a leaf Secret with record `r` must be issued anew, if it must
    /// (invariant 5).
    fn reissue_reason(&self, r: &LeafRecord) -> Option<&'static str> {
        match (&r.issuer, r.not_after) {
            (None, _) | (_, None) => Some("it carries no record of its CA and expiry"),
            (Some(fp), _) if *fp != self.fingerprint() => {
                Some("it was issued by an earlier CA of this World")
            }
            (_, Some(t)) if due(t, self.validity) => {
                Some("it has less than a third of its validity left")
            }
            _ => None,
        }
    }

    /// The Secret `name` of `world` holding `leaf` (invariants 2, 3, 5).
    fn leaf_secret(
        &self,
        world: &World,
        name: String,
        leaf: &Leaf,
    ) -> Result<Secret, OperatorError> {
        let mut s = owned(world, name, true)?;
        s.data = Some(data(&[
            (CRT, &leaf.crt),
            (KEY, &leaf.key),
            (CA_CRT, &self.pem),
        ]));
        s.metadata.annotations = Some(
            [
                (ISSUER_ANNOTATION.to_string(), self.fingerprint()),
                (NOT_AFTER_ANNOTATION.to_string(), leaf.not_after.to_string()),
            ]
            .into(),
        );
        Ok(s)
    }
}

/// What a leaf Secret's annotations record (invariant 5).
#[derive(Debug, Clone, PartialEq, Eq)]
struct LeafRecord {
    issuer: Option<String>,
    not_after: Option<u64>,
}

impl LeafRecord {
    fn of(annotations: Option<&std::collections::BTreeMap<String, String>>) -> Self {
        let get = |k: &str| annotations.and_then(|a| a.get(k));
        LeafRecord {
            issuer: get(ISSUER_ANNOTATION).cloned(),
            not_after: get(NOT_AFTER_ANNOTATION).and_then(|t| t.parse().ok()),
        }
    }
}

/// A leaf Secret that exists: its record and, when it was just read, its
/// `resourceVersion` (`None`: from [`Leaves`], and a replace overwrites
/// unconditionally).
struct Found {
    record: LeafRecord,
    version: Option<String>,
}

impl Found {
    fn read(meta: kube::api::ObjectMeta) -> Self {
        Found {
            record: LeafRecord::of(meta.annotations.as_ref()),
            version: meta.resource_version,
        }
    }
}

/// The records of the leaf Secrets this operator wrote or read, by
/// `<namespace>/<name>`: a pass checks running hosts' certificates in
/// memory, and reads a Secret once after the operator starts (no list or
/// watch on Secrets).
#[derive(Default)]
pub struct Leaves(std::sync::Mutex<std::collections::HashMap<String, LeafRecord>>);

impl Leaves {
    fn get(&self, key: &str) -> Option<LeafRecord> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }

    fn put(&self, key: String, r: LeafRecord) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, r);
    }

    /// Drops the records of World `world` in `ns` (deleted): those of its
    /// host certificate Secrets, `<world>-host-<rank>-tls`.
    pub fn forget_world(&self, ns: &str, world: &str) {
        let prefix = format!("{ns}/{world}-host-");
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| {
                let rank = k.strip_prefix(&prefix).and_then(|r| r.strip_suffix("-tls"));
                !rank.is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
            });
    }

    /// How many records it holds.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A leaf certificate, its key (PEM both) and its expiry (Unix seconds).
pub struct Leaf {
    /// The certificate.
    pub crt: String,
    /// Its key.
    pub key: String,
    /// Its expiry.
    pub not_after: u64,
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

/// The World's CA, made and stored when there is none (invariant 1) and
/// renewed when due, and the client Secret (invariants 3 and 5). `None`
/// for a World without TLS.
pub async fn ensure(world: &World, ctx: &ControllerContext) -> Result<Option<Ca>, OperatorError> {
    if !world.spec.monarch.as_ref().is_some_and(|m| m.tls()) {
        return Ok(None);
    }
    let validity = ctx.args.monarch_cert_validity();
    let name = world.name_any();
    let ns = world.namespace().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let ca_secret = ca_name(&name);
    let ca = match api.get_opt(&ca_secret).await? {
        Some(mut s) => {
            let (Some(pem), Some(key)) = (text(&s, CA_CRT), text(&s, CA_KEY)) else {
                return Err(OperatorError::Tls(format!(
                    "Secret {ca_secret} lacks {CA_CRT} or {CA_KEY}: delete it and the operator makes a new CA"
                )));
            };
            let (ca, renewed) = Ca::load(&ns, &name, &pem, &key, validity)?;
            if renewed {
                s.data = Some(data(&[(CA_CRT, &ca.pem), (CA_KEY, &key)]));
                replace(&api, &s).await?;
                ctx.event(
                    world,
                    false,
                    "TlsRenewed",
                    format!("renewed the CA certificate in Secret {ca_secret} (same key): it had less than a third of its validity left"),
                )
                .await;
            }
            ca
        }
        None => {
            let (ca, key) = Ca::generate(&ns, &name, validity)?;
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
    // Read every pass: a deleted client Secret is made anew at once.
    let found = api.get_opt(&client).await?.map(|s| Found::read(s.metadata));
    leaf(world, ctx, &api, &ca, client, found, || {
        ca.issue(CLIENT_NAME, &[])
    })
    .await?;
    Ok(Some(ca))
}

/// Leaf Secret `name`: from [`Leaves`] when this operator recorded it,
/// else read (`None`: it does not exist).
async fn recorded_or_read(
    ctx: &ControllerContext,
    api: &Api<Secret>,
    ns: &str,
    name: &str,
) -> Result<Option<Found>, OperatorError> {
    if let Some(record) = ctx.tls_leaves.get(&format!("{ns}/{name}")) {
        return Ok(Some(Found {
            record,
            version: None,
        }));
    }
    Ok(api.get_opt(name).await?.map(|s| Found::read(s.metadata)))
}

/// Replaces `s` (its `resourceVersion` guards against a concurrent
/// writer: a conflict is retried at the next pass).
async fn replace(api: &Api<Secret>, s: &Secret) -> Result<(), OperatorError> {
    match api.replace(&s.name_any(), &PostParams::default(), s).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            Err(crate::Pending::SecretChanged(s.name_any()).into())
        }
        Err(e) => Err(e.into()),
    }
}

/// Makes the leaf Secret `name` (`found`: when it exists), or issues it
/// anew when it must be (invariant 5). `Some(why)`: it was (re)issued.
async fn leaf(
    world: &World,
    ctx: &ControllerContext,
    api: &Api<Secret>,
    ca: &Ca,
    name: String,
    found: Option<Found>,
    issue: impl FnOnce() -> Result<Leaf, OperatorError>,
) -> Result<Option<&'static str>, OperatorError> {
    let key = format!("{}/{name}", world.namespace().unwrap_or_default());
    let Some(found) = found else {
        let s = ca.leaf_secret(world, name, &issue()?)?;
        create(api, &s).await?;
        ctx.tls_leaves
            .put(key, LeafRecord::of(s.metadata.annotations.as_ref()));
        return Ok(Some("it did not exist"));
    };
    let Some(why) = ca.reissue_reason(&found.record) else {
        ctx.tls_leaves.put(key, found.record);
        return Ok(None);
    };
    let mut s = ca.leaf_secret(world, name.clone(), &issue()?)?;
    let written = LeafRecord::of(s.metadata.annotations.as_ref());
    s.metadata.resource_version = found.version;
    match api.replace(&name, &PostParams::default(), &s).await {
        Ok(_) => {}
        // Deleted since it was read: made anew.
        Err(kube::Error::Api(e)) if e.code == 404 => {
            s.metadata.resource_version = None;
            create(api, &s).await?;
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            return Err(crate::Pending::SecretChanged(name).into());
        }
        Err(e) => return Err(e.into()),
    }
    ctx.tls_leaves.put(key, written);
    tracing::info!(world = %world.name_any(), secret = %name, reason = why, "Monarch certificate issued anew");
    Ok(Some(why))
}

/// Makes host `rank`'s certificate Secret unless it exists, or issues it
/// anew when it must be (invariants 2 and 5).
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
    let found = api.get_opt(&secret).await?.map(|s| Found::read(s.metadata));
    leaf(world, ctx, &api, ca, secret, found, || {
        let dns = host_dns_names(&name, &ns, rank);
        ca.issue(&dns[0], &dns)
    })
    .await?;
    Ok(())
}

/// Invariant 5 for running hosts: checks each host certificate Secret's
/// record ([`Leaves`]; read once when there is none) and issues anew each
/// one that must be, with one Event per pass that did.
pub async fn renew_hosts(
    world: &World,
    ctx: &ControllerContext,
    ca: &Ca,
) -> Result<(), OperatorError> {
    let name = world.name_any();
    let ns = world.namespace().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let mut renewed = Vec::new();
    for rank in 0..world.spec.full_shape().num_ranks() {
        let secret = host_name(&name, rank);
        // A host whose Secret is not made yet gets it with its pod.
        let Some(found) = recorded_or_read(ctx, &api, &ns, &secret).await? else {
            continue;
        };
        let issue = || {
            let dns = host_dns_names(&name, &ns, rank);
            ca.issue(&dns[0], &dns)
        };
        if let Some(why) = leaf(world, ctx, &api, ca, secret.clone(), Some(found), issue).await? {
            renewed.push((secret, why));
        }
    }
    if let Some((first, why)) = renewed.first() {
        ctx.event(
            world,
            false,
            "TlsRenewed",
            format!(
                "issued {} host certificate Secret(s) anew ({first}{}): {why}; running hosts read them without a restart",
                renewed.len(),
                if renewed.len() > 1 { ", ..." } else { "" }
            ),
        )
        .await;
    }
    Ok(())
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
        let (ca, key) = Ca::generate("ml", "w", VALIDITY).unwrap();
        let (again, renewed) = Ca::load("ml", "w", &ca.pem, &key, VALIDITY).unwrap();
        assert!(!renewed, "a fresh CA is not due");
        let dns = host_dns_names("w", "ml", 1);
        assert_eq!(dns[0], "w-host-1.w.ml.svc.cluster.local");
        assert_eq!(dns.last().unwrap(), "w-host-1");
        // Issued by the reloaded CA: the same subject and key.
        let crt = again.issue(&dns[0], &dns).unwrap().crt;
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
        let (foreign, _) = Ca::generate("ml", "other", VALIDITY).unwrap();
        assert!(!admits_client(&foreign.pem, &crt));
    }

    /// Invariant 3: the clients' certificate names no host and is admitted
    /// as a client.
    #[test]
    fn the_client_certificate_is_a_client_of_the_ca() {
        let (ca, _) = Ca::generate("ml", "w", VALIDITY).unwrap();
        let leaf = ca.issue(CLIENT_NAME, &[]).unwrap();
        assert!(leaf.key.contains("PRIVATE KEY"));
        assert!(admits_client(&ca.pem, &leaf.crt));
    }

    /// Invariant 5: a certificate is due with less than a third of its
    /// validity left; a CA due for renewal is signed anew with its key, and
    /// what the earlier certificate signed chains to the renewed one.
    #[test]
    fn a_due_ca_is_renewed_with_its_key_and_still_admits_what_it_signed() {
        let now = unix(std::time::SystemTime::now());
        let year = VALIDITY;
        assert!(!due(now + year.as_secs(), year));
        assert!(!due(now + year.as_secs() / 3 + 60, year));
        assert!(due(now + year.as_secs() / 3 - 60, year));
        assert!(due(now.saturating_sub(1), year));
        // A CA certificate of a day, loaded by an operator issuing for a
        // year: due, renewed with the same key.
        let (short, key) = Ca::generate("ml", "w", Duration::from_secs(86_400)).unwrap();
        let old_leaf = short.issue(CLIENT_NAME, &[]).unwrap();
        let (renewed, was) = Ca::load("ml", "w", &short.pem, &key, year).unwrap();
        assert!(was);
        assert_ne!(renewed.pem, short.pem);
        assert!(not_after_of(&renewed.pem).unwrap() > now + year.as_secs() - 3600);
        assert!(
            admits_client(&renewed.pem, &old_leaf.crt),
            "same key and subject"
        );
        assert_ne!(renewed.fingerprint(), short.fingerprint());
    }

    /// Invariant 5: which leaf Secrets are issued anew, and why.
    #[test]
    fn a_leaf_is_issued_anew_when_due_or_of_another_ca_or_unrecorded() {
        let (ca, _) = Ca::generate("ml", "w", VALIDITY).unwrap();
        let now = unix(std::time::SystemTime::now());
        let notes = |fp: &str, t: u64| {
            std::collections::BTreeMap::from([
                (ISSUER_ANNOTATION.to_string(), fp.to_string()),
                (NOT_AFTER_ANNOTATION.to_string(), t.to_string()),
            ])
        };
        let fresh = notes(&ca.fingerprint(), now + VALIDITY.as_secs());
        assert_eq!(ca.reissue_reason(&LeafRecord::of(Some(&fresh))), None);
        let why = |a: Option<&std::collections::BTreeMap<String, String>>| {
            ca.reissue_reason(&LeafRecord::of(a)).unwrap_or_default()
        };
        assert!(why(None).contains("no record"));
        assert!(
            why(Some(&notes("0011223344556677", now + VALIDITY.as_secs()))).contains("earlier CA")
        );
        assert!(why(Some(&notes(&ca.fingerprint(), now + 60))).contains("validity left"));
        assert!(why(Some(&notes(&ca.fingerprint(), 0))).contains("validity left"));
    }

    #[test]
    fn a_deleted_worlds_leaf_records_go_and_no_others() {
        let leaves = Leaves::default();
        for key in [
            "ns/a-host-0-tls",
            "ns/a-host-12-tls",
            "ns/a-host-host-0-tls",
            "other/a-host-0-tls",
        ] {
            leaves.put(key.to_string(), LeafRecord::of(None));
        }
        leaves.forget_world("ns", "a");
        let mut left: Vec<String> = leaves.0.lock().unwrap().keys().cloned().collect();
        left.sort();
        assert_eq!(left, ["ns/a-host-host-0-tls", "other/a-host-0-tls"]);
        leaves.forget_world("ns", "a-host");
        assert_eq!(leaves.len(), 1);
    }
}
