//! The cluster zone as plain data: every record the cluster DNS serves,
//! computed from Services, EndpointSlices and Pods as the Kubernetes DNS
//! specification (<https://github.com/kubernetes/dns/blob/master/docs/specification.md>)
//! lays them out, and the answer to one question. No I/O, no clock: the
//! feed rebuilds a [`Zone`] on every change and the server only reads it.
//!
//! Records (zone `cluster.local` by default, every TTL the configured one):
//! - ClusterIP Service: `A`/`AAAA` `<svc>.<ns>.svc.<zone>` -> each
//!   `spec.clusterIPs`; `SRV _<port>._<proto>.<svc>.<ns>.svc.<zone>` per
//!   named port, target `<svc>.<ns>.svc.<zone>`; `PTR` for the cluster IPs.
//! - Headless Service (`clusterIP: None`): `<svc>...` -> the addresses of
//!   its endpoints; `<hostname>.<svc>...` (or `<a-b-c-d>.<svc>...` for an
//!   endpoint with no hostname) -> that endpoint's addresses; `SRV` per
//!   named EndpointSlice port and endpoint, target the endpoint's name; `PTR`
//!   for each endpoint address to its name.
//! - ExternalName Service: `CNAME <svc>... -> spec.externalName`.
//! - Pod: `A`/`AAAA` `<a-b-c-d>.<ns>.pod.<zone>` for each pod IP.
//!
//! Invariants:
//! 1. An endpoint counts when its `conditions.ready` is not `false` (unset
//!    means ready, as the EndpointSlice API says), or always when the
//!    Service sets `publishNotReadyAddresses`.
//! 2. EndpointSlices belong to the Service named by their
//!    `kubernetes.io/service-name` label in their namespace; slices of a
//!    Service that does not exist, or is not headless, add nothing.
//! 3. Names compare case-insensitively ([`LowerName`]); a name below the
//!    zone that holds no record but has a descendant that does (an empty
//!    non-terminal such as `<ns>.svc.<zone>`) exists: it answers NODATA,
//!    never NXDOMAIN.
//! 4. Names outside the zone are not ours ([`Answer::NotAuthoritative`]),
//!    except the reverse names of addresses the zone knows.
//! 5. Objects with fields the spec cannot turn into a DNS name (which a
//!    real API server's validation would have refused) add nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use hickory_server::proto::rr::rdata::{A, AAAA, CNAME, PTR, SOA, SRV};
use hickory_server::proto::rr::{LowerName, Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The answer to one question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The name has records of the asked type (or a CNAME).
    Found {
        /// The answer section.
        answers: Vec<Record>,
        /// Addresses of SRV targets, for the additional section.
        additionals: Vec<Record>,
    },
    /// The name exists but has no record of the asked type.
    NoData,
    /// The name is in the zone and does not exist.
    NxDomain,
    /// The name is outside the zone (invariant 4).
    NotAuthoritative,
}

/// The records of the cluster zone at one moment.
#[derive(Debug, Clone)]
pub struct Zone {
    origin: LowerName,
    soa: Record,
    records: HashMap<LowerName, Vec<Record>>,
    /// In-zone names that exist: every owner name and its ancestors.
    nodes: HashSet<LowerName>,
}

/// The objects a zone is built from.
#[derive(Debug, Default, Clone, Copy)]
pub struct Objects<'a> {
    /// Every Service.
    pub services: &'a [&'a Service],
    /// Every EndpointSlice.
    pub slices: &'a [&'a EndpointSlice],
    /// Every Pod.
    pub pods: &'a [&'a Pod],
}

impl Zone {
    /// The zone `origin` (e.g. `cluster.local.`) holding the records of
    /// `objects`, each with `ttl` seconds; `serial` goes into the SOA.
    pub fn build(origin: &Name, ttl: u32, serial: u32, objects: Objects<'_>) -> Self {
        let mut origin = origin.to_lowercase();
        origin.set_fqdn(true);
        let soa = soa_record(&origin, ttl, serial);
        let mut b = Builder {
            origin: origin.clone(),
            ttl,
            records: HashMap::new(),
        };
        b.push(origin.clone(), soa.data.clone());
        let mut slices_by_service: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
        for slice in objects.slices {
            let ns = slice.metadata.namespace.as_deref().unwrap_or_default();
            if let Some(svc) = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
            {
                slices_by_service
                    .entry((ns, svc.as_str()))
                    .or_default()
                    .push(slice);
            }
        }
        for svc in objects.services {
            let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
            let name = svc.metadata.name.as_deref().unwrap_or_default();
            let slices = slices_by_service
                .get(&(ns, name))
                .map(Vec::as_slice)
                .unwrap_or_default();
            b.service(svc, slices);
        }
        for pod in objects.pods {
            b.pod(pod);
        }
        b.finish(soa)
    }

    /// The zone's origin.
    pub fn origin(&self) -> &LowerName {
        &self.origin
    }

    /// The zone's SOA record (for the authority section of NXDOMAIN and
    /// NODATA answers).
    pub fn soa(&self) -> &Record {
        &self.soa
    }

    /// The answer to `name`/`qtype` (class IN).
    pub fn lookup(&self, name: &LowerName, qtype: RecordType) -> Answer {
        let in_zone = self.origin.zone_of(name);
        if !in_zone {
            // Reverse names of known addresses only (invariant 4).
            return match self.records.get(name) {
                Some(rrs) if matches!(qtype, RecordType::PTR | RecordType::ANY) => Answer::Found {
                    answers: rrs.clone(),
                    additionals: Vec::new(),
                },
                _ => Answer::NotAuthoritative,
            };
        }
        let Some(rrs) = self.records.get(name) else {
            return if self.nodes.contains(name) {
                Answer::NoData
            } else {
                Answer::NxDomain
            };
        };
        if qtype != RecordType::CNAME
            && let Some(cname) = rrs.iter().find(|r| r.record_type() == RecordType::CNAME)
        {
            return self.follow_cname(cname.clone(), qtype);
        }
        let answers: Vec<Record> = rrs
            .iter()
            .filter(|r| qtype == RecordType::ANY || r.record_type() == qtype)
            .cloned()
            .collect();
        if answers.is_empty() {
            return Answer::NoData;
        }
        let additionals = self.srv_addresses(&answers);
        Answer::Found {
            answers,
            additionals,
        }
    }

    /// A CNAME and, while the chain stays in the zone (at most 8 links,
    /// never around a loop), what its target holds.
    fn follow_cname(&self, first: Record, qtype: RecordType) -> Answer {
        let mut answers = vec![first];
        for _ in 0..8 {
            let Some(RData::CNAME(CNAME(target))) = answers.last().map(|r| &r.data) else {
                break;
            };
            let target = LowerName::new(target);
            if !self.origin.zone_of(&target) {
                break;
            }
            let Some(rrs) = self.records.get(&target) else {
                break;
            };
            if let Some(next) = rrs.iter().find(|r| r.record_type() == RecordType::CNAME) {
                if answers.contains(next) {
                    break;
                }
                answers.push(next.clone());
                continue;
            }
            answers.extend(
                rrs.iter()
                    .filter(|r| qtype == RecordType::ANY || r.record_type() == qtype)
                    .cloned(),
            );
            break;
        }
        let additionals = self.srv_addresses(&answers);
        Answer::Found {
            answers,
            additionals,
        }
    }

    /// The address records of the targets of the SRV records in `answers`.
    fn srv_addresses(&self, answers: &[Record]) -> Vec<Record> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for r in answers {
            if let RData::SRV(srv) = &r.data {
                let target = LowerName::new(&srv.target);
                if !seen.insert(target.to_string()) {
                    continue;
                }
                out.extend(
                    self.records
                        .get(&target)
                        .into_iter()
                        .flatten()
                        .filter(|r| matches!(r.record_type(), RecordType::A | RecordType::AAAA))
                        .cloned(),
                );
            }
        }
        out
    }
}

/// `cluster.local. IN SOA ns.dns.cluster.local. hostmaster.cluster.local.`
/// with CoreDNS' timers and the TTL as the negative-caching time.
fn soa_record(origin: &Name, ttl: u32, serial: u32) -> Record {
    let label = |l: &str| {
        Name::from_ascii(l)
            .and_then(|n| n.append_domain(origin))
            .unwrap_or_else(|_| origin.clone())
    };
    Record::from_rdata(
        origin.clone(),
        ttl,
        RData::SOA(SOA::new(
            label("ns.dns"),
            label("hostmaster"),
            serial,
            7200,
            1800,
            86400,
            ttl,
        )),
    )
}

/// One endpoint of a headless Service, as DNS sees it.
#[derive(Debug, Default)]
struct Endpoint {
    /// The first label of its name: the hostname, else the dashed address.
    label: String,
    addresses: BTreeSet<IpAddr>,
}

struct Builder {
    origin: Name,
    ttl: u32,
    records: HashMap<LowerName, Vec<Record>>,
}

impl Builder {
    /// `labels` (relative, dot-separated) under the origin, if they make a
    /// valid name (invariant 5).
    fn name(&self, labels: &str) -> Option<Name> {
        match Name::from_ascii(labels).and_then(|n| n.append_domain(&self.origin)) {
            Ok(n) => Some(n.to_lowercase()),
            Err(e) => {
                tracing::debug!(name = labels, error = %e, "not a DNS name; no record");
                None
            }
        }
    }

    fn push(&mut self, owner: Name, data: RData) {
        let record = Record::from_rdata(owner.clone(), self.ttl, data);
        let rrs = self.records.entry(LowerName::new(&owner)).or_default();
        if !rrs.contains(&record) {
            rrs.push(record);
        }
    }

    fn address(&mut self, owner: &Name, ip: IpAddr) {
        let data = match ip {
            IpAddr::V4(v4) => RData::A(A(v4)),
            IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
        };
        self.push(owner.clone(), data);
    }

    fn ptr(&mut self, ip: IpAddr, target: &Name) {
        let reverse = Name::from(ip);
        self.push(reverse, RData::PTR(PTR(target.clone())));
    }

    fn service(&mut self, svc: &Service, slices: &[&EndpointSlice]) {
        let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        let Some(spec) = svc.spec.as_ref() else {
            return;
        };
        let Some(owner) = self.name(&format!("{name}.{ns}.svc")) else {
            return;
        };
        if spec.type_.as_deref() == Some("ExternalName") {
            match spec.external_name.as_deref().map(Name::from_ascii) {
                Some(Ok(mut target)) => {
                    target.set_fqdn(true);
                    self.push(owner, RData::CNAME(CNAME(target)));
                }
                other => tracing::debug!(
                    service = %format!("{ns}/{name}"),
                    external_name = ?other,
                    "ExternalName Service without a valid spec.externalName; no record"
                ),
            }
            return;
        }
        let headless = spec.cluster_ip.as_deref() == Some("None");
        if !headless {
            let ips: Vec<IpAddr> = spec
                .cluster_ips
                .iter()
                .flatten()
                .chain(spec.cluster_ip.iter())
                .filter_map(|ip| ip.parse().ok())
                .collect();
            if ips.is_empty() {
                return;
            }
            for ip in ips {
                self.address(&owner, ip);
                self.ptr(ip, &owner);
            }
            for port in spec.ports.iter().flatten() {
                let Some(port_name) = port.name.as_deref().filter(|n| !n.is_empty()) else {
                    continue;
                };
                let proto = port.protocol.as_deref().unwrap_or("TCP").to_lowercase();
                let Ok(number) = u16::try_from(port.port) else {
                    continue;
                };
                if let Some(srv) = self.name(&format!("_{port_name}._{proto}.{name}.{ns}.svc")) {
                    self.push(srv, RData::SRV(SRV::new(0, 100, number, owner.clone())));
                }
            }
            return;
        }
        // Headless: the name exists even with no endpoint yet (NODATA).
        self.records.entry(LowerName::new(&owner)).or_default();
        let publish_not_ready = spec.publish_not_ready_addresses == Some(true);
        // Endpoints by name, merged across slices (a pod may be in two
        // slices while they are rewritten).
        let mut endpoints: BTreeMap<String, Endpoint> = BTreeMap::new();
        let mut srvs: Vec<(String, u16, String)> = Vec::new();
        for slice in slices {
            let ports: Vec<(String, String, u16)> = slice
                .ports
                .iter()
                .flatten()
                .filter_map(|p| {
                    let port_name = p.name.as_deref().filter(|n| !n.is_empty())?;
                    let number = u16::try_from(p.port?).ok()?;
                    let proto = p.protocol.as_deref().unwrap_or("TCP").to_lowercase();
                    Some((port_name.to_string(), proto, number))
                })
                .collect();
            for ep in &slice.endpoints {
                let ready = ep.conditions.as_ref().and_then(|c| c.ready) != Some(false);
                if !(ready || publish_not_ready) {
                    continue;
                }
                let addresses: Vec<IpAddr> =
                    ep.addresses.iter().filter_map(|a| a.parse().ok()).collect();
                let Some(first) = addresses.first() else {
                    continue;
                };
                let label = match ep.hostname.as_deref().filter(|h| !h.is_empty()) {
                    Some(h) => h.to_lowercase(),
                    None => dashed(*first),
                };
                let entry = endpoints.entry(label.clone()).or_default();
                entry.label = label.clone();
                entry.addresses.extend(addresses);
                for (port_name, proto, number) in &ports {
                    srvs.push((format!("_{port_name}._{proto}"), *number, label.clone()));
                }
            }
        }
        let mut targets: HashMap<String, Name> = HashMap::new();
        for ep in endpoints.values() {
            let Some(ep_name) = self.name(&format!("{}.{name}.{ns}.svc", ep.label)) else {
                continue;
            };
            for ip in &ep.addresses {
                self.address(&owner, *ip);
                self.address(&ep_name, *ip);
                self.ptr(*ip, &ep_name);
            }
            targets.insert(ep.label.clone(), ep_name);
        }
        // Equal weights that add up to about 100 per SRV name.
        let mut per_name: BTreeMap<String, Vec<(u16, Name)>> = BTreeMap::new();
        for (prefix, number, label) in srvs {
            if let Some(target) = targets.get(&label) {
                let entry = per_name.entry(prefix).or_default();
                if !entry.contains(&(number, target.clone())) {
                    entry.push((number, target.clone()));
                }
            }
        }
        for (prefix, targets) in per_name {
            let Some(srv_name) = self.name(&format!("{prefix}.{name}.{ns}.svc")) else {
                continue;
            };
            let weight = u16::try_from(100 / targets.len().max(1))
                .unwrap_or(1)
                .max(1);
            for (number, target) in targets {
                self.push(
                    srv_name.clone(),
                    RData::SRV(SRV::new(0, weight, number, target)),
                );
            }
        }
    }

    fn pod(&mut self, pod: &Pod) {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let Some(status) = pod.status.as_ref() else {
            return;
        };
        let ips: BTreeSet<IpAddr> = status
            .pod_ips
            .iter()
            .flatten()
            .map(|p| p.ip.as_str())
            .chain(status.pod_ip.as_deref())
            .filter_map(|ip| ip.parse().ok())
            .collect();
        for ip in ips {
            if let Some(owner) = self.name(&format!("{}.{ns}.pod", dashed(ip))) {
                self.address(&owner, ip);
            }
        }
    }

    fn finish(self, soa: Record) -> Zone {
        let origin = LowerName::new(&self.origin);
        let mut nodes = HashSet::new();
        for base in ["svc", "pod"] {
            if let Some(n) = self.name(base) {
                nodes.insert(LowerName::new(&n));
            }
        }
        for name in self.records.keys() {
            if !origin.zone_of(name) {
                continue;
            }
            let mut n = name.clone();
            while n != origin && nodes.insert(n.clone()) {
                n = n.base_name();
            }
        }
        nodes.insert(origin.clone());
        Zone {
            origin,
            soa,
            records: self.records,
            nodes,
        }
    }
}

/// `10.0.0.1` -> `10-0-0-1`; `fd00::1` -> `fd00--1`.
pub fn dashed(ip: IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}

#[cfg(test)]
mod tests;
