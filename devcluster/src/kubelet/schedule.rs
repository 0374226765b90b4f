//! The scheduler's part a self-scheduling process kubelet plays: which
//! nodes an unscheduled pod fits, judged as kube-scheduler's filters judge
//! them (pure functions over the pod, the Nodes and the pods already
//! placed), and the `PodScheduled=False` condition it writes when none fits.
//!
//! Filters, in kube-scheduler's order and words:
//! 1. `spec.unschedulable` ("node(s) were unschedulable");
//! 2. `nodeSelector` and required node affinity (`nodeSelectorTerms`: any
//!    term, all of its `matchExpressions` and `matchFields`; operators In,
//!    NotIn, Exists, DoesNotExist, Gt, Lt) ("node(s) didn't match Pod's node
//!    affinity/selector");
//! 3. NoSchedule/NoExecute taints ("node(s) had untolerated taint");
//! 4. required pod affinity: every term needs a placed pod it selects on a
//!    node with the same `topologyKey` value, except that a pod whose own
//!    labels match a term that selects no placed pod anywhere may go
//!    anywhere with the key (the first pod of a group) ("node(s) didn't
//!    match pod affinity rules");
//! 5. required pod anti-affinity, the pod's own terms and those of placed
//!    pods against it ("node(s) didn't match pod anti-affinity rules").
//!
//! Terms select pods in the pod's namespace unless `namespaces` is given
//! (`namespaceSelector` is treated as "all namespaces" when set). Resource
//! requests are not filtered: a process kubelet runs whatever it is given.
//! Two kubelets may bind in the same instant and break an anti-affinity a
//! single scheduler would keep; the embedded cluster runs one by default.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, Pod, PodAffinityTerm, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::pods::tolerates;

/// A pod already bound to a node, as the filters see it.
#[derive(Clone, Debug)]
pub(crate) struct Placed {
    /// Its namespace.
    pub namespace: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// The labels of the node it is bound to.
    pub node_labels: BTreeMap<String, String>,
    /// Its own required anti-affinity terms (filter 5).
    pub anti: Vec<PodAffinityTerm>,
}

impl Placed {
    /// `pod` on a node labelled `node_labels`.
    pub(crate) fn of(pod: &Pod, node_labels: BTreeMap<String, String>) -> Placed {
        Placed {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            node_labels,
            anti: required_terms(pod, false),
        }
    }
}

const UNSCHEDULABLE: &str = "node(s) were unschedulable";
const NODE_AFFINITY: &str = "node(s) didn't match Pod's node affinity/selector";
const TAINT: &str = "node(s) had untolerated taint";
const POD_AFFINITY: &str = "node(s) didn't match pod affinity rules";
const POD_ANTI_AFFINITY: &str = "node(s) didn't match pod anti-affinity rules";

/// The labels of `node`.
pub(crate) fn node_labels(node: &Node) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

fn required_terms(pod: &Pod, affinity: bool) -> Vec<PodAffinityTerm> {
    let a = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
    let terms = if affinity {
        a.and_then(|a| a.pod_affinity.as_ref()).and_then(|p| {
            p.required_during_scheduling_ignored_during_execution
                .clone()
        })
    } else {
        a.and_then(|a| a.pod_anti_affinity.as_ref()).and_then(|p| {
            p.required_during_scheduling_ignored_during_execution
                .clone()
        })
    };
    terms.unwrap_or_default()
}

/// Whether `labels` satisfy `sel`; an empty selector selects every pod (as
/// in affinity terms).
fn selects(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let empty = sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && sel.match_expressions.as_ref().is_none_or(|e| e.is_empty());
    empty || crate::controllers::selector_matches(sel, labels)
}

/// Whether `term` (of a pod in namespace `own_ns`) selects `other`.
fn term_selects(
    term: &PodAffinityTerm,
    own_ns: &str,
    ns: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let in_scope = match (&term.namespaces, &term.namespace_selector) {
        (Some(list), _) if !list.is_empty() => list.iter().any(|n| n == ns),
        (_, Some(_)) => true,
        _ => ns == own_ns,
    };
    in_scope
        && term
            .label_selector
            .as_ref()
            .is_some_and(|sel| selects(sel, labels))
}

fn requirement_holds(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(number), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a > b)
        }
        "Lt" => {
            matches!((value.and_then(number), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

/// Filter 2 for one node.
fn node_affinity_ok(pod: &Pod, node: &Node) -> bool {
    let labels = node_labels(node);
    let Some(spec) = &pod.spec else { return false };
    if !spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    let Some(sel) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    else {
        return true;
    };
    let name = node.metadata.name.as_deref();
    sel.node_selector_terms.iter().any(|t| {
        let exprs = t.match_expressions.iter().flatten();
        let fields = t.match_fields.iter().flatten();
        let non_empty = t.match_expressions.as_ref().is_some_and(|e| !e.is_empty())
            || t.match_fields.as_ref().is_some_and(|f| !f.is_empty());
        non_empty
            && exprs
                .into_iter()
                .all(|r| requirement_holds(r, labels.get(&r.key).map(String::as_str)))
            && fields
                .into_iter()
                .all(|r| requirement_holds(r, (r.key == "metadata.name").then_some(name).flatten()))
    })
}

/// Filters 4 and 5 for a node labelled `labels`.
fn pod_affinity_verdict(
    pod: &Pod,
    labels: &BTreeMap<String, String>,
    placed: &[Placed],
) -> Result<(), &'static str> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let own = pod.metadata.labels.clone().unwrap_or_default();
    for term in required_terms(pod, true) {
        let Some(here) = labels.get(&term.topology_key) else {
            return Err(POD_AFFINITY);
        };
        let matching: Vec<&Placed> = placed
            .iter()
            .filter(|p| term_selects(&term, &ns, &p.namespace, &p.labels))
            .collect();
        let ok = if matching.is_empty() {
            term_selects(&term, &ns, &ns, &own)
        } else {
            matching
                .iter()
                .any(|p| p.node_labels.get(&term.topology_key) == Some(here))
        };
        if !ok {
            return Err(POD_AFFINITY);
        }
    }
    for term in required_terms(pod, false) {
        let Some(here) = labels.get(&term.topology_key) else {
            continue;
        };
        if placed.iter().any(|p| {
            term_selects(&term, &ns, &p.namespace, &p.labels)
                && p.node_labels.get(&term.topology_key) == Some(here)
        }) {
            return Err(POD_ANTI_AFFINITY);
        }
    }
    // Placed pods' anti-affinity against this one.
    for p in placed {
        for term in &p.anti {
            if let Some(here) = labels.get(&term.topology_key)
                && p.node_labels.get(&term.topology_key) == Some(here)
                && term_selects(term, &p.namespace, &ns, &own)
            {
                return Err(POD_ANTI_AFFINITY);
            }
        }
    }
    Ok(())
}

/// Why `pod` does not fit `node` (filters 1-5, the first that fails), or
/// `Ok` when it fits.
pub(crate) fn fit(pod: &Pod, node: &Node, placed: &[Placed]) -> Result<(), &'static str> {
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        return Err(UNSCHEDULABLE);
    }
    if !node_affinity_ok(pod, node) {
        return Err(NODE_AFFINITY);
    }
    let taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if !tolerates(pod, &taints) {
        return Err(TAINT);
    }
    pod_affinity_verdict(pod, &node_labels(node), placed)
}

/// The nodes `pod` fits, by name, or kube-scheduler's message for none:
/// `0/N nodes are available: 1 node(s) didn't match ..., 2 node(s) ...`.
pub(crate) fn feasible(
    pod: &Pod,
    nodes: &[Node],
    placed: &[Placed],
) -> Result<Vec<String>, String> {
    let mut fits = Vec::new();
    let mut why: BTreeMap<&'static str, usize> = BTreeMap::new();
    for n in nodes {
        match fit(pod, n, placed) {
            Ok(()) => fits.push(n.metadata.name.clone().unwrap_or_default()),
            Err(reason) => *why.entry(reason).or_default() += 1,
        }
    }
    if !fits.is_empty() {
        return Ok(fits);
    }
    let parts: Vec<String> = why
        .iter()
        .map(|(reason, count)| format!("{count} {reason}"))
        .collect();
    Err(format!(
        "0/{} nodes are available: {}.",
        nodes.len(),
        if parts.is_empty() {
            "no nodes".to_string()
        } else {
            parts.join(", ")
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        let mut l: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        l.insert("kubernetes.io/hostname".into(), name.into());
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some(l);
        n
    }

    fn pod(yaml: &str) -> Pod {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn placed(p: &Pod, n: &Node) -> Placed {
        Placed::of(p, node_labels(n))
    }

    const GROUP_A: &str = "metadata: {namespace: ns, labels: {g: a}}\n\
        spec:\n  containers: [{name: c}]\n  affinity:\n    podAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n\
        \x20     - {topologyKey: rack, labelSelector: {matchLabels: {g: a}}}\n";
    const EXCLUSIVE_A: &str = "metadata: {namespace: ns, labels: {g: a}}\n\
        spec:\n  containers: [{name: c}]\n  affinity:\n    podAntiAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n\
        \x20     - {topologyKey: rack, labelSelector: {matchExpressions: [{key: g, operator: NotIn, values: [a]}]}}\n";

    #[test]
    fn the_first_pod_of_a_group_goes_anywhere_then_the_group_follows_it() {
        let (r1, r2) = (node("n1", &[("rack", "r1")]), node("n2", &[("rack", "r2")]));
        let first = pod(GROUP_A);
        assert_eq!(
            feasible(&first, &[r1.clone(), r2.clone()], &[]),
            Ok(vec!["n1".into(), "n2".into()])
        );
        let on_r2 = vec![placed(&first, &r2)];
        assert_eq!(
            feasible(&first, &[r1.clone(), r2.clone()], &on_r2),
            Ok(vec!["n2".into()])
        );
        // A node without the key never fits a pod affinity term.
        let bare = node("n3", &[]);
        assert_eq!(
            feasible(&first, &[bare], &[]),
            Err("0/1 nodes are available: 1 node(s) didn't match pod affinity rules.".into())
        );
    }

    #[test]
    fn exclusive_placement_keeps_other_groups_out_both_ways() {
        let (r1, r2) = (node("n1", &[("rack", "r1")]), node("n2", &[("rack", "r2")]));
        let a = pod(EXCLUSIVE_A);
        let b = pod("metadata: {namespace: ns, labels: {g: b}}\nspec: {containers: [{name: c}]}");
        let placed_b = vec![placed(&b, &r1)];
        assert_eq!(
            feasible(&a, &[r1.clone(), r2.clone()], &placed_b),
            Ok(vec!["n2".into()])
        );
        // The placed pod's own anti-affinity keeps a newcomer out.
        let placed_a = vec![placed(&a, &r1)];
        assert_eq!(
            feasible(&b, &[r1.clone(), r2.clone()], &placed_a),
            Ok(vec!["n2".into()])
        );
        // Another namespace is out of the term's scope.
        let other =
            pod("metadata: {namespace: other, labels: {g: b}}\nspec: {containers: [{name: c}]}");
        assert_eq!(feasible(&other, &[r1], &placed_a), Ok(vec!["n1".into()]));
    }

    #[test]
    fn node_affinity_selector_and_taints_count_per_reason() {
        let gpu = node("n1", &[("gpu", "a100"), ("cores", "64")]);
        let mut cordoned = node("n2", &[("gpu", "a100")]);
        cordoned.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            unschedulable: Some(true),
            ..Default::default()
        });
        let cpu = node("n3", &[]);
        let p = pod(
            "spec:\n  containers: [{name: c}]\n  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n\
            \x20       nodeSelectorTerms:\n        - matchExpressions: [{key: gpu, operator: In, values: [a100, h100]}, {key: cores, operator: Gt, values: ['32']}]\n",
        );
        assert_eq!(
            feasible(&p, &[gpu.clone(), cordoned.clone(), cpu.clone()], &[]),
            Ok(vec!["n1".into()])
        );
        let msg = feasible(&p, &[cordoned, cpu], &[]).unwrap_err();
        assert_eq!(
            msg,
            "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) were unschedulable."
        );
        let by_name = pod(
            "spec:\n  containers: [{name: c}]\n  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n\
            \x20       nodeSelectorTerms:\n        - matchFields: [{key: metadata.name, operator: In, values: [n1]}]\n",
        );
        assert!(fit(&by_name, &gpu, &[]).is_ok());
        let mut tainted = node("n4", &[]);
        tainted.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(vec![Taint {
                key: "nvidia.com/gpu".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert_eq!(
            fit(&pod("spec: {containers: [{name: c}]}"), &tainted, &[]),
            Err(TAINT)
        );
    }
}
