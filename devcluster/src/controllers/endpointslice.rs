//! The EndpointSlice controller: for each Service with a selector, keeps
//! `discovery.k8s.io/v1` EndpointSlices listing the selected pods, as
//! kube-controller-manager's does (the cluster DNS and anything else that
//! reads slices see the same objects on the embedded and a real cluster).
//!
//! Invariants:
//! 1. Only slices labelled `endpointslice.kubernetes.io/managed-by:
//!    endpointslice-controller.k8s.io` and `kubernetes.io/service-name:
//!    <svc>` are written or deleted; each carries a controller
//!    ownerReference to its Service, so deleting the Service removes them.
//! 2. A pod is listed when the Service's selector matches it, it has a pod
//!    IP and it is not Succeeded/Failed; terminating pods stay, with
//!    `terminating: true`. `ready` is the pod's Ready condition (false
//!    while terminating), or true for `publishNotReadyAddresses`;
//!    `serving` is the Ready condition.
//! 3. Endpoints are grouped by address family and resolved port set (a
//!    named targetPort resolves per pod, by container port name and
//!    protocol; a pod without it lacks that port), at most 100 per slice.
//!    Slice names are `<svc>-<hash of family and ports>[-<n>]`, so a
//!    reconcile is idempotent: an unchanged slice is not written again.
//! 4. A Service without a selector, or of type ExternalName, gets no
//!    managed slice (existing managed ones are deleted).
//! 5. A terminating Service is left to the garbage collector.
//! 6. The legacy Endpoints object follows the same slices (`endpoints.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use tracing::{debug, info};

use super::replicaset::controller_ref;
use super::{ControllerError, Ctx};

/// The label naming a slice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label naming a slice's manager.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// This controller's value of [`MANAGED_BY_LABEL`] (kube-controller-manager's).
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
/// Endpoints per slice (kube-controller-manager's default).
const MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// Reconciles the slices of one Service.
pub(super) async fn reconcile(svc: Arc<Service>, ctx: Arc<Ctx>) -> Result<Action, ControllerError> {
    if svc.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let slices_api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &ns);
    let desired = match selector(&svc) {
        Some(sel) => {
            let labels: Vec<String> = sel.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
            let pods = pods
                .list(&ListParams::default().labels(&labels.join(",")))
                .await?;
            desired_slices(&svc, &pods.items)
        }
        None => Vec::new(),
    };
    let written_endpoints = super::endpoints::sync(
        &ctx,
        &svc,
        super::endpoints::desired_endpoints(&svc, &desired),
    )
    .await?;
    let existing = slices_api
        .list(&ListParams::default().labels(&format!(
            "{SERVICE_NAME_LABEL}={name},{MANAGED_BY_LABEL}={MANAGED_BY}"
        )))
        .await?
        .items;
    let mut by_name: BTreeMap<String, EndpointSlice> =
        existing.into_iter().map(|s| (s.name_any(), s)).collect();
    let mut written = usize::from(written_endpoints);
    for mut want in desired {
        let slice_name = want.name_any();
        match by_name.remove(&slice_name) {
            Some(have) if same(&have, &want) => {}
            Some(have) => {
                want.metadata.resource_version = have.metadata.resource_version;
                slices_api
                    .replace(&slice_name, &PostParams::default(), &want)
                    .await?;
                written += 1;
            }
            None => match slices_api.create(&PostParams::default(), &want).await {
                Ok(_) => written += 1,
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    return Err(ControllerError::Invalid(format!(
                        "service {ns}/{name}: EndpointSlice {slice_name} exists but is not labelled {MANAGED_BY_LABEL}={MANAGED_BY}, {SERVICE_NAME_LABEL}={name}: delete it so this controller can manage it"
                    )));
                }
                Err(e) => return Err(e.into()),
            },
        }
    }
    for stale in by_name.keys() {
        match slices_api.delete(stale, &DeleteParams::default()).await {
            Ok(_) => written += 1,
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    if written > 0 {
        info!(service = %format!("{ns}/{name}"), written, "endpointslices updated");
    } else {
        debug!(service = %format!("{ns}/{name}"), "endpointslices up to date");
    }
    // Pods whose labels change away from the selector trigger no event for
    // this Service: a periodic resync picks them up.
    Ok(Action::requeue(Duration::from_secs(60)))
}

/// The Service's selector, when it manages endpoints (invariant 4).
fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    spec.selector.as_ref().filter(|s| !s.is_empty())
}

/// The Services of `store` whose selector matches `pod` (the pod watch's
/// mapper).
pub(super) fn services_selecting(store: &Store<Service>, pod: &Pod) -> Vec<ObjectRef<Service>> {
    let ns = pod.namespace();
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    store
        .state()
        .iter()
        .filter(|s| s.namespace() == ns)
        .filter(|s| selector(s).is_some_and(|sel| matches(sel, &labels)))
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}

fn matches(sel: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Whether `have` already says what `want` says (fields this controller
/// owns; absent and empty lists are the same).
fn same(have: &EndpointSlice, want: &EndpointSlice) -> bool {
    have.address_type == want.address_type
        && have.endpoints == want.endpoints
        && have.ports.clone().unwrap_or_default() == want.ports.clone().unwrap_or_default()
        && have.metadata.labels == want.metadata.labels
        && have.metadata.owner_references == want.metadata.owner_references
}

/// The slices `svc` should have, given the pods in its namespace (pure;
/// invariants 2 and 3).
pub fn desired_slices(svc: &Service, pods: &[Pod]) -> Vec<EndpointSlice> {
    let Some(sel) = selector(svc) else {
        return Vec::new();
    };
    let spec = svc.spec.clone().unwrap_or_default();
    let publish_not_ready = spec.publish_not_ready_addresses == Some(true);
    let families: Vec<&str> = match spec.ip_families.as_deref() {
        Some(f) if !f.is_empty() => f.iter().map(String::as_str).collect(),
        _ => vec!["IPv4"],
    };
    let svc_name = svc.name_any();
    // (family, ports) -> endpoints, in pod-name order.
    let mut groups: BTreeMap<(String, String), (Vec<EndpointPort>, Vec<Endpoint>)> =
        BTreeMap::new();
    let mut pods: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.namespace() == svc.namespace())
        .filter(|p| matches(sel, p.metadata.labels.as_ref().unwrap_or(&BTreeMap::new())))
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .collect();
    pods.sort_by_key(|p| p.name_any());
    for pod in pods {
        let ports: Vec<EndpointPort> = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|sp| endpoint_port(sp, pod))
            .collect();
        let ports_key = serde_json::to_string(&ports).unwrap_or_default();
        for ip in pod_ips(pod) {
            let family = if ip.contains(':') { "IPv6" } else { "IPv4" };
            if !families.contains(&family) {
                continue;
            }
            let ep = endpoint(svc, pod, ip, publish_not_ready);
            groups
                .entry((family.to_string(), ports_key.clone()))
                .or_insert_with(|| (ports.clone(), Vec::new()))
                .1
                .push(ep);
        }
    }
    if groups.is_empty() {
        // A placeholder, as kube-controller-manager keeps one.
        groups.insert(
            (families[0].to_string(), String::new()),
            (Vec::new(), Vec::new()),
        );
    }
    let mut out = Vec::new();
    for ((family, ports_key), (ports, endpoints)) in groups {
        let hash = fnv1a(&format!("{family}/{ports_key}"));
        let chunks: Vec<&[Endpoint]> = if endpoints.is_empty() {
            vec![&[]]
        } else {
            endpoints.chunks(MAX_ENDPOINTS_PER_SLICE).collect()
        };
        for (i, chunk) in chunks.into_iter().enumerate() {
            let name = if i == 0 {
                format!("{svc_name}-{hash:08x}")
            } else {
                format!("{svc_name}-{hash:08x}-{i}")
            };
            out.push(slice(svc, &name, &family, ports.clone(), chunk.to_vec()));
        }
    }
    out
}

fn slice(
    svc: &Service,
    name: &str,
    family: &str,
    ports: Vec<EndpointPort>,
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    let mut labels = svc.metadata.labels.clone().unwrap_or_default();
    labels.insert(SERVICE_NAME_LABEL.into(), svc.name_any());
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    if svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
        labels.insert("service.kubernetes.io/headless".into(), String::new());
    }
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: svc.namespace(),
            labels: Some(labels),
            owner_references: Some(vec![controller_ref(svc)]),
            ..ObjectMeta::default()
        },
        address_type: family.to_string(),
        endpoints,
        ports: Some(ports),
    }
}

fn pod_ips(pod: &Pod) -> Vec<String> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let mut ips: Vec<String> = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.clone())
        .filter(|ip| !ip.is_empty())
        .collect();
    if ips.is_empty()
        && let Some(ip) = status.pod_ip.clone().filter(|ip| !ip.is_empty())
    {
        ips.push(ip);
    }
    ips
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn endpoint(svc: &Service, pod: &Pod, ip: String, publish_not_ready: bool) -> Endpoint {
    let serving = is_ready(pod);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let ready = publish_not_ready || (serving && !terminating);
    let spec = pod.spec.as_ref();
    let hostname = spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .filter(|_| spec.and_then(|s| s.subdomain.as_deref()) == Some(svc.name_any().as_str()));
    Endpoint {
        addresses: vec![ip],
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        hostname,
        node_name: spec.and_then(|s| s.node_name.clone()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.namespace(),
            name: Some(pod.name_any()),
            uid: pod.metadata.uid.clone(),
            ..ObjectReference::default()
        }),
        ..Endpoint::default()
    }
}

/// The slice port for `sp` on `pod`, or `None` when a named targetPort is
/// not a container port of the pod (invariant 3).
fn endpoint_port(sp: &ServicePort, pod: &Pod) -> Option<EndpointPort> {
    let protocol = sp.protocol.clone().unwrap_or_else(|| "TCP".into());
    let port = match &sp.target_port {
        None => sp.port,
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(name)) => {
            pod.spec
                .as_ref()?
                .containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| {
                    p.name.as_deref() == Some(name.as_str())
                        && p.protocol.as_deref().unwrap_or("TCP") == protocol
                })?
                .container_port
        }
    };
    Some(EndpointPort {
        name: Some(sp.name.clone().unwrap_or_default()),
        port: Some(port),
        protocol: Some(protocol),
        app_protocol: sp.app_protocol.clone(),
    })
}

/// FNV-1a, 32 bits: a short stable hash for slice names.
fn fnv1a(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(yaml: &str) -> Service {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn pod(name: &str, ip: &str, ready: bool, extra: &str) -> Pod {
        serde_saphyr::from_str(&format!(
            "metadata: {{name: {name}, namespace: ns, uid: u-{name}, labels: {{app: w}}{extra}}}
spec:
  hostname: {name}
  subdomain: w
  nodeName: n1
  containers:
  - name: c
    ports: [{{name: rpc, containerPort: 7000}}, {{name: rpc, containerPort: 7001, protocol: UDP}}]
status:
  podIP: {ip}
  conditions: [{{type: Ready, status: '{}'}}]
",
            if ready { "True" } else { "False" }
        ))
        .unwrap()
    }

    fn headless() -> Service {
        svc(
            "metadata: {name: w, namespace: ns, uid: s1, labels: {team: a}}
spec:
  clusterIP: None
  selector: {app: w}
  ports:
  - {name: rpc, port: 80, targetPort: rpc}
  - {name: plain, port: 81, targetPort: 8081, protocol: UDP}
",
        )
    }

    #[test]
    fn pods_become_endpoints_with_conditions_hostname_and_resolved_ports() {
        let pods = [
            pod("w-0", "10.1.0.2", true, ""),
            pod("w-1", "10.1.0.3", false, ""),
            pod(
                "w-2",
                "10.1.0.4",
                true,
                ", deletionTimestamp: '2026-01-01T00:00:00Z'",
            ),
        ];
        let slices = desired_slices(&headless(), &pods);
        assert_eq!(slices.len(), 1);
        let s = &slices[0];
        let labels = s.metadata.labels.clone().unwrap();
        assert_eq!(labels[SERVICE_NAME_LABEL], "w");
        assert_eq!(labels[MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(labels["team"], "a");
        assert!(labels.contains_key("service.kubernetes.io/headless"));
        assert_eq!(s.metadata.owner_references.as_ref().unwrap()[0].uid, "s1");
        assert_eq!(s.address_type, "IPv4");
        let ports = s.ports.clone().unwrap();
        assert_eq!(
            ports
                .iter()
                .map(|p| (
                    p.name.clone().unwrap(),
                    p.port.unwrap(),
                    p.protocol.clone().unwrap()
                ))
                .collect::<Vec<_>>(),
            [
                ("rpc".into(), 7000, "TCP".into()),
                ("plain".into(), 8081, "UDP".into())
            ]
        );
        let conds: Vec<(Option<bool>, Option<bool>, Option<bool>)> = s
            .endpoints
            .iter()
            .map(|e| {
                let c = e.conditions.clone().unwrap();
                (c.ready, c.serving, c.terminating)
            })
            .collect();
        assert_eq!(
            conds,
            [
                (Some(true), Some(true), Some(false)),
                (Some(false), Some(false), Some(false)),
                (Some(false), Some(true), Some(true)),
            ]
        );
        let e0 = &s.endpoints[0];
        assert_eq!(e0.addresses, ["10.1.0.2"]);
        assert_eq!(e0.hostname.as_deref(), Some("w-0"));
        assert_eq!(e0.node_name.as_deref(), Some("n1"));
        let r = e0.target_ref.clone().unwrap();
        assert_eq!(
            (r.kind.unwrap(), r.name.unwrap(), r.uid.unwrap()),
            ("Pod".into(), "w-0".into(), "u-w-0".into())
        );
    }

    #[test]
    fn publish_not_ready_addresses_marks_every_endpoint_ready() {
        let mut s = headless();
        s.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
        let slices = desired_slices(&s, &[pod("w-1", "10.1.0.3", false, "")]);
        let c = slices[0].endpoints[0].conditions.clone().unwrap();
        assert_eq!((c.ready, c.serving), (Some(true), Some(false)));
    }

    #[test]
    fn hostname_only_when_subdomain_is_the_service() {
        let mut other = svc(
            "metadata: {name: other, namespace: ns}\nspec: {selector: {app: w}, ports: [{port: 80}]}",
        );
        other.metadata.uid = Some("s2".into());
        let slices = desired_slices(&other, &[pod("w-0", "10.1.0.2", true, "")]);
        assert_eq!(slices[0].endpoints[0].hostname, None);
        // No targetPort: the port itself.
        assert_eq!(slices[0].ports.clone().unwrap()[0].port, Some(80));
    }

    #[test]
    fn pods_without_the_named_port_go_to_their_own_slice() {
        let mut bare = pod("w-9", "10.1.0.9", true, "");
        bare.spec.as_mut().unwrap().containers[0].ports = None;
        let slices = desired_slices(&headless(), &[pod("w-0", "10.1.0.2", true, ""), bare]);
        assert_eq!(slices.len(), 2, "{slices:#?}");
        let names: Vec<String> = slices.iter().map(ResourceExt::name_any).collect();
        assert_ne!(names[0], names[1]);
        assert!(names.iter().all(|n| n.starts_with("w-")));
        let port_counts: Vec<usize> = slices
            .iter()
            .map(|s| s.ports.clone().unwrap().len())
            .collect();
        assert!(
            port_counts.contains(&1) && port_counts.contains(&2),
            "{port_counts:?}"
        );
    }

    #[test]
    fn no_pods_is_one_empty_placeholder_and_no_selector_is_none() {
        let slices = desired_slices(&headless(), &[]);
        assert_eq!(slices.len(), 1);
        assert!(slices[0].endpoints.is_empty());
        let manual = svc("metadata: {name: m, namespace: ns}\nspec: {ports: [{port: 80}]}");
        assert!(desired_slices(&manual, &[pod("w-0", "10.1.0.2", true, "")]).is_empty());
        let ext = svc(
            "metadata: {name: e, namespace: ns}\nspec: {type: ExternalName, externalName: x.org, selector: {app: w}}",
        );
        assert!(desired_slices(&ext, &[pod("w-0", "10.1.0.2", true, "")]).is_empty());
    }

    #[test]
    fn finished_pods_pods_without_ip_and_other_labels_are_left_out() {
        let mut done = pod("w-1", "10.1.0.3", true, "");
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let mut no_ip = pod("w-2", "10.1.0.4", true, "");
        no_ip.status.as_mut().unwrap().pod_ip = None;
        let mut other = pod("w-3", "10.1.0.5", true, "");
        other.metadata.labels = None;
        let slices = desired_slices(&headless(), &[done, no_ip, other]);
        assert!(slices.iter().all(|s| s.endpoints.is_empty()), "{slices:#?}");
    }

    #[test]
    fn large_services_are_chunked_with_stable_names() {
        let pods: Vec<Pod> = (0..250)
            .map(|i| {
                pod(
                    &format!("w-{i:03}"),
                    &format!("10.1.{}.{}", i / 200, i % 200 + 1),
                    true,
                    "",
                )
            })
            .collect();
        let a = desired_slices(&headless(), &pods);
        let b = desired_slices(&headless(), &pods);
        assert_eq!(a.len(), 3);
        assert_eq!(a.iter().map(|s| s.endpoints.len()).sum::<usize>(), 250);
        assert!(
            a.iter()
                .zip(&b)
                .all(|(x, y)| same(x, y) && x.metadata.name == y.metadata.name)
        );
    }
}
