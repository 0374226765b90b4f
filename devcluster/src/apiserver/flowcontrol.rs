//! Owns the API Priority and Fairness configuration objects every cluster
//! has (`flowcontrol.apiserver.k8s.io/v1` FlowSchemas and
//! PriorityLevelConfigurations, the bootstrap configuration kube-apiserver
//! writes at start, mandatory and suggested). They are stored and listed
//! so clients that read them (`kubectl get flowschemas`) find what they
//! find on a real cluster; requests are not queued by them (no priority
//! and fairness here, see docs/apiserver.md).
//!
//! Invariant: at start, every bootstrap object that is missing is created
//! (annotated `apf.kubernetes.io/autoupdate-spec: "true"`); objects that
//! exist are left as they are.

use serde_json::{Value, json};

use super::meta;
use super::store::StoreState;

const FS_KEY: &str = "flowcontrol.apiserver.k8s.io/flowschemas";
const PL_KEY: &str = "flowcontrol.apiserver.k8s.io/prioritylevelconfigurations";

// The bootstrap configuration (`k8s.io/apiserver/pkg/apis/flowcontrol/bootstrap`),
// names and specs.
const PRIORITY_LEVELS: &str = r#"[
{"name":"catch-all","spec":{"type":"Limited","limited":{"nominalConcurrencyShares":5,"limitResponse":{"type":"Reject"},"lendablePercent":0}}},
{"name":"exempt","spec":{"type":"Exempt","exempt":{"nominalConcurrencyShares":0,"lendablePercent":0}}},
{"name":"global-default","spec":{"type":"Limited","limited":{"nominalConcurrencyShares":20,"limitResponse":{"type":"Queue","queuing":{"queues":128,"handSize":6,"queueLengthLimit":50}},"lendablePercent":50}}},
{"name":"leader-election","spec":{"type":"Limited","limited":{"nominalConcurrencyShares":10,"limitResponse":{"type":"Queue","queuing":{"queues":16,"handSize":4,"queueLengthLimit":50}},"lendablePercent":0}}},
{"name":"node-high","spec":{"type":"Limited","limited":{"nominalConcurrencyShares":40,"limitResponse":{"type":"Queue","queuing":{"queues":64,"handSize":6,"queueLengthLimit":50}},"lendablePercent":25}}},
{"name":"system","spec":{"type":"Limited","limited":{"nominalConcurrencyShares":30,"limitResponse":{"type":"Queue","queuing":{"queues":64,"handSize":6,"queueLengthLimit":50}},"lendablePercent":33}}},
{"name":"workload-high","spec":{"type":"Limited","limited":{"nominalConcurrencyShares":40,"limitResponse":{"type":"Queue","queuing":{"queues":128,"handSize":6,"queueLengthLimit":50}},"lendablePercent":50}}},
{"name":"workload-low","spec":{"type":"Limited","limited":{"nominalConcurrencyShares":100,"limitResponse":{"type":"Queue","queuing":{"queues":128,"handSize":6,"queueLengthLimit":50}},"lendablePercent":90}}}
]"#;
const FLOW_SCHEMAS: &str = r#"[
{"name":"catch-all","spec":{"priorityLevelConfiguration":{"name":"catch-all"},"matchingPrecedence":10000,"distinguisherMethod":{"type":"ByUser"},"rules":[{"subjects":[{"kind":"Group","group":{"name":"system:unauthenticated"}},{"kind":"Group","group":{"name":"system:authenticated"}}],"resourceRules":[{"verbs":["*"],"apiGroups":["*"],"resources":["*"],"clusterScope":true,"namespaces":["*"]}],"nonResourceRules":[{"verbs":["*"],"nonResourceURLs":["*"]}]}]}},
{"name":"endpoint-controller","spec":{"priorityLevelConfiguration":{"name":"workload-high"},"matchingPrecedence":150,"distinguisherMethod":{"type":"ByUser"},"rules":[{"subjects":[{"kind":"User","user":{"name":"system:kube-controller-manager"}},{"kind":"ServiceAccount","serviceAccount":{"namespace":"kube-system","name":"endpoint-controller"}},{"kind":"ServiceAccount","serviceAccount":{"namespace":"kube-system","name":"endpointslicemirroring-controller"}}],"resourceRules":[{"verbs":["get","create","update"],"apiGroups":[""],"resources":["endpoints"],"namespaces":["*"]}]}]}},
{"name":"exempt","spec":{"priorityLevelConfiguration":{"name":"exempt"},"matchingPrecedence":1,"rules":[{"subjects":[{"kind":"Group","group":{"name":"system:masters"}}],"resourceRules":[{"verbs":["*"],"apiGroups":["*"],"resources":["*"],"clusterScope":true,"namespaces":["*"]}],"nonResourceRules":[{"verbs":["*"],"nonResourceURLs":["*"]}]}]}},
{"name":"global-default","spec":{"priorityLevelConfiguration":{"name":"global-default"},"matchingPrecedence":9900,"distinguisherMethod":{"type":"ByUser"},"rules":[{"subjects":[{"kind":"Group","group":{"name":"system:unauthenticated"}},{"kind":"Group","group":{"name":"system:authenticated"}}],"resourceRules":[{"verbs":["*"],"apiGroups":["*"],"resources":["*"],"clusterScope":true,"namespaces":["*"]}],"nonResourceRules":[{"verbs":["*"],"nonResourceURLs":["*"]}]}]}},
{"name":"kube-controller-manager","spec":{"priorityLevelConfiguration":{"name":"workload-high"},"matchingPrecedence":800,"distinguisherMethod":{"type":"ByNamespace"},"rules":[{"subjects":[{"kind":"User","user":{"name":"system:kube-controller-manager"}}],"resourceRules":[{"verbs":["*"],"apiGroups":["*"],"resources":["*"],"clusterScope":true,"namespaces":["*"]}],"nonResourceRules":[{"verbs":["*"],"nonResourceURLs":["*"]}]}]}},
{"name":"kube-scheduler","spec":{"priorityLevelConfiguration":{"name":"workload-high"},"matchingPrecedence":800,"distinguisherMethod":{"type":"ByNamespace"},"rules":[{"subjects":[{"kind":"User","user":{"name":"system:kube-scheduler"}}],"resourceRules":[{"verbs":["*"],"apiGroups":["*"],"resources":["*"],"clusterScope":true,"namespaces":["*"]}],"nonResourceRules":[{"verbs":["*"],"nonResourceURLs":["*"]}]}]}},
{"name":"kube-system-service-accounts","spec":{"priorityLevelConfiguration":{"name":"workload-high"},"matchingPrecedence":900,"distinguisherMethod":{"type":"ByNamespace"},"rules":[{"subjects":[{"kind":"ServiceAccount","serviceAccount":{"namespace":"kube-system","name":"*"}}],"resourceRules":[{"verbs":["*"],"apiGroups":["*"],"resources":["*"],"clusterScope":true,"namespaces":["*"]}],"nonResourceRules":[{"verbs":["*"],"nonResourceURLs":["*"]}]}]}},
{"name":"probes","spec":{"priorityLevelConfiguration":{"name":"exempt"},"matchingPrecedence":2,"rules":[{"subjects":[{"kind":"Group","group":{"name":"system:unauthenticated"}},{"kind":"Group","group":{"name":"system:authenticated"}}],"nonResourceRules":[{"verbs":["get"],"nonResourceURLs":["/healthz","/readyz","/livez"]}]}]}},
{"name":"service-accounts","spec":{"priorityLevelConfiguration":{"name":"workload-low"},"matchingPrecedence":9000,"distinguisherMethod":{"type":"ByUser"},"rules":[{"subjects":[{"kind":"Group","group":{"name":"system:serviceaccounts"}}],"resourceRules":[{"verbs":["*"],"apiGroups":["*"],"resources":["*"],"clusterScope":true,"namespaces":["*"]}],"nonResourceRules":[{"verbs":["*"],"nonResourceURLs":["*"]}]}]}},
{"name":"system-leader-election","spec":{"priorityLevelConfiguration":{"name":"leader-election"},"matchingPrecedence":100,"distinguisherMethod":{"type":"ByUser"},"rules":[{"subjects":[{"kind":"User","user":{"name":"system:kube-controller-manager"}},{"kind":"User","user":{"name":"system:kube-scheduler"}},{"kind":"ServiceAccount","serviceAccount":{"namespace":"kube-system","name":"*"}}],"resourceRules":[{"verbs":["get","create","update"],"apiGroups":["coordination.k8s.io"],"resources":["leases"],"namespaces":["*"]}]}]}},
{"name":"system-node-high","spec":{"priorityLevelConfiguration":{"name":"node-high"},"matchingPrecedence":400,"distinguisherMethod":{"type":"ByUser"},"rules":[{"subjects":[{"kind":"Group","group":{"name":"system:nodes"}}],"resourceRules":[{"verbs":["*"],"apiGroups":[""],"resources":["nodes","nodes/status"],"clusterScope":true,"namespaces":["*"]},{"verbs":["*"],"apiGroups":["coordination.k8s.io"],"resources":["leases"],"namespaces":["*"]}]}]}},
{"name":"system-nodes","spec":{"priorityLevelConfiguration":{"name":"system"},"matchingPrecedence":500,"distinguisherMethod":{"type":"ByUser"},"rules":[{"subjects":[{"kind":"Group","group":{"name":"system:nodes"}}],"resourceRules":[{"verbs":["*"],"apiGroups":["*"],"resources":["*"],"clusterScope":true,"namespaces":["*"]}],"nonResourceRules":[{"verbs":["*"],"nonResourceURLs":["*"]}]}]}},
{"name":"workload-leader-election","spec":{"priorityLevelConfiguration":{"name":"leader-election"},"matchingPrecedence":200,"distinguisherMethod":{"type":"ByUser"},"rules":[{"subjects":[{"kind":"ServiceAccount","serviceAccount":{"namespace":"kube-system","name":"*"}}],"resourceRules":[{"verbs":["get","create","update"],"apiGroups":[""],"resources":["endpoints","configmaps"],"namespaces":["*"]},{"verbs":["get","create","update"],"apiGroups":["coordination.k8s.io"],"resources":["leases"],"namespaces":["*"]}]}]}}
]"#;

fn entries(text: &str) -> Vec<(String, Value)> {
    // The tables above are constants of this file: a parse failure is a
    // bug caught by the unit test.
    let list: Vec<Value> = serde_json::from_str(text).unwrap_or_default();
    list.into_iter()
        .filter_map(|e| Some((e.get("name")?.as_str()?.to_string(), e.get("spec")?.clone())))
        .collect()
}

fn object(kind: &str, name: &str, spec: Value, status: Value) -> Value {
    json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": kind,
        "metadata": {
            "name": name, "uid": meta::new_uid(), "generation": 1,
            "creationTimestamp": meta::now(),
            "annotations": {"apf.kubernetes.io/autoupdate-spec": "true"},
        },
        "spec": spec,
        "status": status,
    })
}

/// Creates the missing bootstrap objects (module invariant).
pub(crate) fn bootstrap(st: &mut StoreState) {
    let levels = entries(PRIORITY_LEVELS);
    for (name, spec) in &levels {
        if st.get(PL_KEY, "", name).is_none() {
            let obj = object("PriorityLevelConfiguration", name, spec.clone(), json!({}));
            st.put(PL_KEY, "", name, obj);
        }
    }
    for (name, spec) in entries(FLOW_SCHEMAS) {
        if st.get(FS_KEY, "", &name).is_some() {
            continue;
        }
        let level = spec
            .pointer("/priorityLevelConfiguration/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let found = st.get(PL_KEY, "", &level).is_some();
        let status = json!({"conditions": [{
            "type": "Dangling",
            "status": if found { "False" } else { "True" },
            "lastTransitionTime": meta::now(),
            "reason": if found { "Found" } else { "NotFound" },
            "message": if found {
                format!("This FlowSchema references the PriorityLevelConfiguration object named \"{level}\" and it exists")
            } else {
                format!("This FlowSchema references the PriorityLevelConfiguration object named \"{level}\" but there is no such object")
            },
        }]});
        let obj = object("FlowSchema", &name, spec, status);
        st.put(FS_KEY, "", &name, obj);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bootstrap_tables_parse_and_hold_the_mandatory_objects() {
        let levels = entries(PRIORITY_LEVELS);
        let schemas = entries(FLOW_SCHEMAS);
        for name in ["exempt", "catch-all"] {
            assert!(
                levels.iter().any(|(n, _)| n == name),
                "priority level {name}"
            );
            assert!(schemas.iter().any(|(n, _)| n == name), "flow schema {name}");
        }
        assert_eq!(levels.len(), 8);
        assert_eq!(schemas.len(), 13);
    }
}
