//! The `default/kubernetes` Service every cluster has, with its Endpoints
//! and EndpointSlice pointing at this server, as kube-apiserver keeps them.
//!
//! Invariants:
//! 1. The Service has ClusterIP [`KUBERNETES_SERVICE_IP`] and port `https`
//!    443, targeting the server's port; no selector (nothing else manages
//!    its endpoints).
//! 2. On every start the endpoints name this server's current address and
//!    port; objects that already match are not rewritten.

use serde_json::{Value, json};

use super::meta;
use super::store::StoreState;
use super::tls::KUBERNETES_SERVICE_IP;

const NAME: &str = "kubernetes";
const NS: &str = "default";

/// Writes `obj` under `key` unless an object there already has the same
/// `fields` (its metadata is kept).
fn upsert(st: &mut StoreState, key: &str, mut obj: Value, fields: &[&str]) {
    if let Some(current) = st.get(key, NS, NAME) {
        if fields.iter().all(|f| current.get(*f) == obj.get(*f)) {
            return;
        }
        obj["metadata"] = current["metadata"].clone();
    }
    st.put(key, NS, NAME, obj);
}

/// Creates or refreshes the Service, Endpoints and EndpointSlice for a
/// server reachable at `host:port` (invariants 1 and 2).
pub(crate) fn ensure(st: &mut StoreState, host: &str, port: u16) {
    let metadata = || {
        json!({"name": NAME, "namespace": NS, "uid": meta::new_uid(), "creationTimestamp": meta::now(),
               "labels": {"component": "apiserver", "provider": "kubernetes"}})
    };
    let service = json!({
        "apiVersion": "v1", "kind": "Service", "metadata": metadata(),
        "spec": {
            "type": "ClusterIP",
            "clusterIP": KUBERNETES_SERVICE_IP, "clusterIPs": [KUBERNETES_SERVICE_IP],
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
            "sessionAffinity": "None", "internalTrafficPolicy": "Cluster",
            "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}],
        },
        "status": {"loadBalancer": {}},
    });
    upsert(st, "/services", service, &["spec"]);
    let endpoints = json!({
        "apiVersion": "v1", "kind": "Endpoints", "metadata": metadata(),
        "subsets": [{"addresses": [{"ip": host}], "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    });
    upsert(st, "/endpoints", endpoints, &["subsets"]);
    let mut slice_meta = metadata();
    slice_meta["labels"] = json!({
        "kubernetes.io/service-name": NAME,
        "endpointslice.kubernetes.io/managed-by": "kube-apiserver",
    });
    let family = if host.contains(':') { "IPv6" } else { "IPv4" };
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": slice_meta,
        "addressType": family,
        "endpoints": [{"addresses": [host], "conditions": {"ready": true, "serving": true, "terminating": false}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    });
    upsert(
        st,
        "discovery.k8s.io/endpointslices",
        slice,
        &["endpoints", "ports"],
    );
}
