//! Unit tests of the zone: objects from YAML, answers checked record by
//! record. Cited invariants are those of `records.rs`.

use std::str::FromStr as _;

use super::*;

fn svc(yaml: &str) -> Service {
    serde_saphyr::from_str(yaml).expect("service yaml")
}

fn slice(yaml: &str) -> EndpointSlice {
    serde_saphyr::from_str(yaml).expect("slice yaml")
}

fn pod(yaml: &str) -> Pod {
    serde_saphyr::from_str(yaml).expect("pod yaml")
}

fn zone(services: &[Service], slices: &[EndpointSlice], pods: &[Pod]) -> Zone {
    let services: Vec<&Service> = services.iter().collect();
    let slices: Vec<&EndpointSlice> = slices.iter().collect();
    let pods: Vec<&Pod> = pods.iter().collect();
    Zone::build(
        &Name::from_ascii("cluster.local.").unwrap(),
        5,
        1,
        Objects {
            services: &services,
            slices: &slices,
            pods: &pods,
        },
    )
}

fn q(z: &Zone, name: &str, t: RecordType) -> Answer {
    z.lookup(&LowerName::from_str(name).unwrap(), t)
}

fn answers(a: &Answer) -> Vec<String> {
    match a {
        Answer::Found { answers, .. } => {
            let mut v: Vec<String> = answers.iter().map(|r| r.data.to_string()).collect();
            v.sort();
            v
        }
        other => panic!("expected records, got {other:?}"),
    }
}

fn headless() -> Service {
    svc(
        "metadata: {name: w, namespace: ns}\nspec: {clusterIP: None, selector: {app: w}, ports: [{name: rpc, port: 26600}]}",
    )
}

fn two_endpoints() -> EndpointSlice {
    slice(
        "metadata: {name: w-abc, namespace: ns, labels: {kubernetes.io/service-name: w}}
addressType: IPv4
ports: [{name: rpc, port: 26600, protocol: TCP}, {port: 9}]
endpoints:
- {addresses: [10.1.0.2], hostname: w-host-0, conditions: {ready: true}}
- {addresses: [10.1.0.3], conditions: {ready: true}}
- {addresses: [10.1.0.4], hostname: w-host-2, conditions: {ready: false}}
",
    )
}

#[test]
fn headless_service_resolves_to_ready_endpoints() {
    let z = zone(&[headless()], &[two_endpoints()], &[]);
    // Invariant 1: the not-ready endpoint is left out.
    assert_eq!(
        answers(&q(&z, "w.ns.svc.cluster.local.", RecordType::A)),
        ["10.1.0.2", "10.1.0.3"]
    );
    assert_eq!(
        answers(&q(&z, "w-host-0.w.ns.svc.cluster.local.", RecordType::A)),
        ["10.1.0.2"]
    );
    assert_eq!(
        answers(&q(&z, "10-1-0-3.w.ns.svc.cluster.local.", RecordType::A)),
        ["10.1.0.3"]
    );
    assert_eq!(
        q(&z, "w-host-2.w.ns.svc.cluster.local.", RecordType::A),
        Answer::NxDomain
    );
}

#[test]
fn publish_not_ready_addresses_includes_not_ready_endpoints() {
    let mut s = headless();
    s.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
    let z = zone(&[s], &[two_endpoints()], &[]);
    assert_eq!(
        answers(&q(&z, "w-host-2.w.ns.svc.cluster.local.", RecordType::A)),
        ["10.1.0.4"]
    );
}

#[test]
fn headless_srv_per_named_port_and_endpoint_with_addresses_in_additionals() {
    let z = zone(&[headless()], &[two_endpoints()], &[]);
    let a = q(&z, "_rpc._tcp.w.ns.svc.cluster.local.", RecordType::SRV);
    assert_eq!(
        answers(&a),
        [
            "0 50 26600 10-1-0-3.w.ns.svc.cluster.local.",
            "0 50 26600 w-host-0.w.ns.svc.cluster.local.",
        ]
    );
    let Answer::Found { additionals, .. } = a else {
        unreachable!()
    };
    let mut extra: Vec<String> = additionals.iter().map(|r| r.to_string()).collect();
    extra.sort();
    assert_eq!(extra.len(), 2, "{extra:?}");
    assert!(extra[1].starts_with("w-host-0.w.ns.svc.cluster.local. 5 IN A 10.1.0.2"));
    // The unnamed port has no SRV record; `_tcp` is an empty non-terminal.
    assert_eq!(
        q(&z, "_tcp.w.ns.svc.cluster.local.", RecordType::SRV),
        Answer::NoData
    );
}

#[test]
fn cluster_ip_service_a_srv_and_ptr() {
    let s = svc(
        "metadata: {name: web, namespace: ns}\nspec: {clusterIP: 10.96.0.20, clusterIPs: [10.96.0.20], ports: [{name: http, port: 80, protocol: TCP}, {name: dns, port: 53, protocol: UDP}]}",
    );
    let z = zone(&[s], &[], &[]);
    assert_eq!(
        answers(&q(&z, "web.ns.svc.cluster.local.", RecordType::A)),
        ["10.96.0.20"]
    );
    assert_eq!(
        answers(&q(
            &z,
            "_http._tcp.web.ns.svc.cluster.local.",
            RecordType::SRV
        )),
        ["0 100 80 web.ns.svc.cluster.local."]
    );
    assert_eq!(
        answers(&q(
            &z,
            "_dns._udp.web.ns.svc.cluster.local.",
            RecordType::SRV
        )),
        ["0 100 53 web.ns.svc.cluster.local."]
    );
    assert_eq!(
        answers(&q(&z, "20.0.96.10.in-addr.arpa.", RecordType::PTR)),
        ["web.ns.svc.cluster.local."]
    );
}

#[test]
fn slices_of_a_cluster_ip_service_do_not_add_endpoint_names() {
    // Invariant 2.
    let s = svc("metadata: {name: w, namespace: ns}\nspec: {clusterIP: 10.96.0.21}");
    let z = zone(&[s], &[two_endpoints()], &[]);
    assert_eq!(
        answers(&q(&z, "w.ns.svc.cluster.local.", RecordType::A)),
        ["10.96.0.21"]
    );
    assert_eq!(
        q(&z, "w-host-0.w.ns.svc.cluster.local.", RecordType::A),
        Answer::NxDomain
    );
}

#[test]
fn external_name_is_a_cname_followed_inside_the_zone() {
    let ext = svc(
        "metadata: {name: ext, namespace: ns}\nspec: {type: ExternalName, externalName: example.org}",
    );
    let alias = svc(
        "metadata: {name: alias, namespace: ns}\nspec: {type: ExternalName, externalName: w.ns.svc.cluster.local}",
    );
    let z = zone(&[ext, alias, headless()], &[two_endpoints()], &[]);
    assert_eq!(
        answers(&q(&z, "ext.ns.svc.cluster.local.", RecordType::A)),
        ["example.org."]
    );
    assert_eq!(
        answers(&q(&z, "alias.ns.svc.cluster.local.", RecordType::A)),
        ["10.1.0.2", "10.1.0.3", "w.ns.svc.cluster.local."]
    );
}

#[test]
fn cname_loops_end() {
    let a = svc(
        "metadata: {name: a, namespace: ns}\nspec: {type: ExternalName, externalName: b.ns.svc.cluster.local}",
    );
    let b = svc(
        "metadata: {name: b, namespace: ns}\nspec: {type: ExternalName, externalName: a.ns.svc.cluster.local}",
    );
    let z = zone(&[a, b], &[], &[]);
    assert_eq!(
        answers(&q(&z, "a.ns.svc.cluster.local.", RecordType::A)),
        ["a.ns.svc.cluster.local.", "b.ns.svc.cluster.local."]
    );
}

#[test]
fn pod_records_by_dashed_address() {
    let p = pod(
        "metadata: {name: p, namespace: ns}\nstatus: {podIP: 10.1.0.9, podIPs: [{ip: 10.1.0.9}, {ip: 'fd00::9'}]}",
    );
    let z = zone(&[], &[], &[p]);
    assert_eq!(
        answers(&q(&z, "10-1-0-9.ns.pod.cluster.local.", RecordType::A)),
        ["10.1.0.9"]
    );
    assert_eq!(
        answers(&q(&z, "fd00--9.ns.pod.cluster.local.", RecordType::AAAA)),
        ["fd00::9"]
    );
    assert_eq!(
        q(&z, "10-1-0-8.ns.pod.cluster.local.", RecordType::A),
        Answer::NxDomain
    );
}

#[test]
fn missing_names_other_types_and_outside_names() {
    let z = zone(&[headless()], &[two_endpoints()], &[]);
    // Invariant 3: other types of an existing name, and empty
    // non-terminals, are NODATA; AAAA of a v4-only name too.
    assert_eq!(
        q(&z, "w.ns.svc.cluster.local.", RecordType::AAAA),
        Answer::NoData
    );
    for ent in [
        "ns.svc.cluster.local.",
        "svc.cluster.local.",
        "pod.cluster.local.",
    ] {
        assert_eq!(q(&z, ent, RecordType::A), Answer::NoData, "{ent}");
    }
    assert_eq!(
        q(&z, "nope.ns.svc.cluster.local.", RecordType::A),
        Answer::NxDomain
    );
    assert_eq!(
        q(&z, "other.svc.cluster.local.", RecordType::A),
        Answer::NxDomain
    );
    // Invariant 4.
    assert_eq!(
        q(&z, "example.org.", RecordType::A),
        Answer::NotAuthoritative
    );
    assert_eq!(
        q(&z, "9.9.9.9.in-addr.arpa.", RecordType::PTR),
        Answer::NotAuthoritative
    );
    assert_eq!(
        answers(&q(&z, "cluster.local.", RecordType::SOA)),
        ["ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5"]
    );
}

#[test]
fn names_are_case_insensitive() {
    let z = zone(&[headless()], &[two_endpoints()], &[]);
    assert_eq!(
        answers(&q(&z, "W-Host-0.W.NS.svc.Cluster.Local.", RecordType::A)),
        ["10.1.0.2"]
    );
}

#[test]
fn slices_merge_and_stray_slices_are_ignored() {
    let second = slice(
        "metadata: {name: w-def, namespace: ns, labels: {kubernetes.io/service-name: w}}
addressType: IPv4
endpoints: [{addresses: [10.1.0.2], hostname: w-host-0}, {addresses: [10.1.0.5], hostname: w-host-5}]
",
    );
    let stray = slice(
        "metadata: {name: x, namespace: other, labels: {kubernetes.io/service-name: w}}
addressType: IPv4
endpoints: [{addresses: [10.1.0.7]}]
",
    );
    let z = zone(&[headless()], &[two_endpoints(), second, stray], &[]);
    // Unset `ready` counts as ready (invariant 1); duplicates collapse.
    assert_eq!(
        answers(&q(&z, "w.ns.svc.cluster.local.", RecordType::A)),
        ["10.1.0.2", "10.1.0.3", "10.1.0.5"]
    );
    assert_eq!(
        q(&z, "w.other.svc.cluster.local.", RecordType::A),
        Answer::NxDomain
    );
}

#[test]
fn headless_service_without_endpoints_exists() {
    let z = zone(&[headless()], &[], &[]);
    assert_eq!(
        q(&z, "w.ns.svc.cluster.local.", RecordType::A),
        Answer::NoData
    );
}

#[test]
fn invalid_names_add_nothing() {
    // Invariant 5: a hostname with a dot is not one label.
    let bad = slice(
        "metadata: {name: w-bad, namespace: ns, labels: {kubernetes.io/service-name: w}}
addressType: IPv4
endpoints: [{addresses: [not-an-ip]}, {addresses: [10.1.0.8], hostname: 'a..b'}]
",
    );
    let z = zone(&[headless()], &[bad], &[]);
    assert_eq!(
        q(&z, "w.ns.svc.cluster.local.", RecordType::A),
        Answer::NoData
    );
}
