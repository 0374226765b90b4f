//! The legacy `v1` Endpoints object of a Service with a selector, written
//! by the EndpointSlice controller's reconcile from the same slices (as
//! kube-controller-manager's endpoints controller keeps it for older
//! clients).
//!
//! Invariants:
//! 1. One Endpoints named after the Service; one subset per slice with
//!    endpoints (equal port sets merged); ready endpoints in `addresses`,
//!    the others in `notReadyAddresses`; terminating endpoints that are
//!    not ready are left out (Kubernetes keeps terminating pods out of
//!    Endpoints unless `publishNotReadyAddresses`).
//! 2. It carries a controller ownerReference to the Service (kube's own
//!    has none and is deleted by its controller; here the garbage
//!    collector removes it), and only an Endpoints with that reference is
//!    replaced or deleted: a selectorless Service's hand-written one is
//!    never touched.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Service,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};

use super::replicaset::{controller_ref, controller_uid};
use super::{ControllerError, Ctx};

/// The Endpoints `svc` should have given its desired `slices`; `None`
/// when it should have none (no selector).
pub fn desired_endpoints(svc: &Service, slices: &[EndpointSlice]) -> Option<Endpoints> {
    if slices.is_empty() {
        return None;
    }
    let mut labels = svc.metadata.labels.clone().unwrap_or_default();
    if svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
        labels.insert("service.kubernetes.io/headless".into(), String::new());
    }
    // Port set (as JSON) -> subset.
    let mut subsets: BTreeMap<String, EndpointSubset> = BTreeMap::new();
    for slice in slices {
        let ports: Vec<EndpointPort> = slice
            .ports
            .iter()
            .flatten()
            .map(|p| EndpointPort {
                name: p.name.clone().filter(|n| !n.is_empty()),
                port: p.port.unwrap_or_default(),
                protocol: p.protocol.clone(),
                app_protocol: p.app_protocol.clone(),
            })
            .collect();
        let key = serde_json::to_string(&ports).unwrap_or_default();
        for ep in &slice.endpoints {
            let c = ep.conditions.clone().unwrap_or_default();
            let ready = c.ready != Some(false);
            if c.terminating == Some(true) && !ready {
                continue;
            }
            let subset = subsets
                .entry(key.clone())
                .or_insert_with(|| EndpointSubset {
                    ports: Some(ports.clone()),
                    ..EndpointSubset::default()
                });
            let list = if ready {
                subset.addresses.get_or_insert_default()
            } else {
                subset.not_ready_addresses.get_or_insert_default()
            };
            for ip in &ep.addresses {
                if list.iter().any(|a| a.ip == *ip) {
                    continue;
                }
                list.push(EndpointAddress {
                    ip: ip.clone(),
                    hostname: ep.hostname.clone(),
                    node_name: ep.node_name.clone(),
                    target_ref: ep.target_ref.clone(),
                });
            }
        }
    }
    let subsets: Vec<EndpointSubset> = subsets.into_values().collect();
    Some(Endpoints {
        metadata: ObjectMeta {
            name: Some(svc.name_any()),
            namespace: svc.namespace(),
            labels: Some(labels),
            owner_references: Some(vec![controller_ref(svc)]),
            ..ObjectMeta::default()
        },
        subsets: (!subsets.is_empty()).then_some(subsets),
    })
}

/// Creates, replaces or deletes the Service's Endpoints (invariant 2).
/// Returns whether it wrote.
pub(super) async fn sync(
    ctx: &Ctx,
    svc: &Service,
    want: Option<Endpoints>,
) -> Result<bool, ControllerError> {
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let api: Api<Endpoints> = Api::namespaced(ctx.client.clone(), &ns);
    let have = api.get_opt(&name).await?;
    let ours = |e: &Endpoints| controller_uid(&e.metadata) == svc.metadata.uid.as_deref();
    match (have, want) {
        (None, None) => Ok(false),
        (Some(have), None) => {
            if !ours(&have) {
                return Ok(false);
            }
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
                Err(e) => Err(e.into()),
            }
        }
        (None, Some(want)) => {
            api.create(&PostParams::default(), &want).await?;
            Ok(true)
        }
        (Some(have), Some(mut want)) => {
            if !ours(&have) {
                return Err(ControllerError::Invalid(format!(
                    "service {ns}/{name}: Endpoints {name} exists and is not owned by the Service: delete it so the controller can manage it"
                )));
            }
            if have.subsets.clone().unwrap_or_default() == want.subsets.clone().unwrap_or_default()
                && have.metadata.labels == want.metadata.labels
            {
                return Ok(false);
            }
            want.metadata.resource_version = have.metadata.resource_version;
            api.replace(&name, &PostParams::default(), &want).await?;
            Ok(true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsets_split_ready_and_not_ready_and_drop_terminating() {
        let svc: Service = serde_saphyr::from_str(
            "metadata: {name: w, namespace: ns, uid: s1}\nspec: {clusterIP: None, selector: {app: w}}",
        )
        .unwrap();
        let slice: EndpointSlice = serde_saphyr::from_str(
            "metadata: {name: w-1, namespace: ns}
addressType: IPv4
ports: [{name: rpc, port: 7000, protocol: TCP}]
endpoints:
- {addresses: [10.0.0.1], hostname: a, conditions: {ready: true, serving: true, terminating: false}}
- {addresses: [10.0.0.2], conditions: {ready: false, serving: false, terminating: false}}
- {addresses: [10.0.0.3], conditions: {ready: false, serving: true, terminating: true}}
",
        )
        .unwrap();
        let ep = desired_endpoints(&svc, &[slice.clone(), slice]).unwrap();
        assert_eq!(ep.metadata.name.as_deref(), Some("w"));
        assert_eq!(ep.metadata.owner_references.unwrap()[0].uid, "s1");
        let subsets = ep.subsets.unwrap();
        assert_eq!(subsets.len(), 1, "equal port sets merge");
        let s = &subsets[0];
        let ips = |l: &Option<Vec<EndpointAddress>>| {
            l.iter().flatten().map(|a| a.ip.clone()).collect::<Vec<_>>()
        };
        assert_eq!(ips(&s.addresses), ["10.0.0.1"], "duplicates collapse");
        assert_eq!(ips(&s.not_ready_addresses), ["10.0.0.2"]);
        assert_eq!(
            s.addresses.as_ref().unwrap()[0].hostname.as_deref(),
            Some("a")
        );
        assert_eq!(s.ports.as_ref().unwrap()[0].port, 7000);
        assert!(desired_endpoints(&svc, &[]).is_none());
    }
}
