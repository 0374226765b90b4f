//! Topology placement of host groups (`spec.scheduling.topology`), rendered
//! as pod affinity and, for a queued World, as Kueue topology-aware
//! scheduling requests on its pod set (docs/scheduling.md).
//!
//! Invariants (cited as "topology invariant N"):
//! 1. The group of host `rank` for dimension `d` is `rank / stride(d)`,
//!    where `stride(d)` is the product of the sizes after `d`: the hosts
//!    with equal coordinates up to and including `d` (ranks are row-major).
//! 2. Every host pod carries `hostmesh.dev/group-<d>: <world id>-<group>`
//!    (the id is 8 hex digits of the World's uid hash, so groups of two
//!    Worlds never match); affinity selects on that label only.
//! 3. Co-location is pod affinity to the own group on the key; `exclusive`
//!    adds anti-affinity to every other group of that label (any World),
//!    with the same required/preferred mode.
//! 4. A queued World's pod set asks Kueue for the first `Required` entry as
//!    slices: `podSetSliceRequiredTopology` = key, `podSetSliceSize` =
//!    stride, ordered by `hostmesh.dev/rank`; the same in the pod set
//!    template's `kueue.x-k8s.io/podset-*` annotations.

use hostmesh_crds::Rank;
use std::collections::BTreeMap;

use hostmesh_crds::World;
use hostmesh_crds::world::{TopologyMode, TopologySpec};
use k8s_openapi::api::core::v1::{
    Affinity, PodAffinity, PodAffinityTerm, PodAntiAffinity, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde_json::{Value, json};

use super::desired::LABEL_RANK;

/// Label key of a host's group for dimension `dim` (topology invariant 2).
pub fn group_label(dim: &str) -> String {
    format!("hostmesh.dev/group-{dim}")
}

fn entries(world: &World) -> &[TopologySpec] {
    world
        .spec
        .scheduling
        .as_ref()
        .map_or(&[], |s| s.topology.as_slice())
}

/// `stride(d)` of topology invariant 1 (`None`: not a dimension).
pub fn stride(world: &World, dim: &str) -> Option<Rank> {
    let shape = world.spec.full_shape();
    let dims = shape.dims();
    let i = dims.iter().position(|d| d.name == dim)?;
    Some(dims[i + 1..].iter().map(|d| d.size as Rank).product())
}

fn world_id(world: &World) -> String {
    let uid = world.metadata.uid.as_deref().unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, uid.as_bytes());
    digest.as_ref()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The group labels and the affinity of host `rank` (topology invariants
/// 1-3); empty when the World asks for no topology.
pub fn placement(world: &World, rank: Rank) -> (BTreeMap<String, String>, Option<Affinity>) {
    let mut labels = BTreeMap::new();
    let mut affinity = PodAffinity::default();
    let mut anti = PodAntiAffinity::default();
    let id = world_id(world);
    for t in entries(world) {
        let Some(s) = stride(world, &t.dimension) else {
            continue;
        };
        let key = group_label(&t.dimension);
        let value = format!("{id}-{}", rank / s.max(1));
        labels.insert(key.clone(), value.clone());
        let together = PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(key.clone(), value.clone())])),
                ..Default::default()
            }),
            topology_key: t.key.clone(),
            ..Default::default()
        };
        let apart = PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_expressions: Some(vec![
                    LabelSelectorRequirement {
                        key: key.clone(),
                        operator: "Exists".into(),
                        values: None,
                    },
                    LabelSelectorRequirement {
                        key: key.clone(),
                        operator: "NotIn".into(),
                        values: Some(vec![value.clone()]),
                    },
                ]),
                ..Default::default()
            }),
            topology_key: t.key.clone(),
            ..Default::default()
        };
        match t.mode {
            TopologyMode::Required => {
                affinity
                    .required_during_scheduling_ignored_during_execution
                    .get_or_insert_with(Vec::new)
                    .push(together);
                if t.exclusive {
                    anti.required_during_scheduling_ignored_during_execution
                        .get_or_insert_with(Vec::new)
                        .push(apart);
                }
            }
            TopologyMode::Preferred => {
                affinity
                    .preferred_during_scheduling_ignored_during_execution
                    .get_or_insert_with(Vec::new)
                    .push(WeightedPodAffinityTerm {
                        weight: 100,
                        pod_affinity_term: together,
                    });
                if t.exclusive {
                    anti.preferred_during_scheduling_ignored_during_execution
                        .get_or_insert_with(Vec::new)
                        .push(WeightedPodAffinityTerm {
                            weight: 100,
                            pod_affinity_term: apart,
                        });
                }
            }
        }
    }
    if labels.is_empty() {
        return (labels, None);
    }
    let anti = (anti != PodAntiAffinity::default()).then_some(anti);
    (
        labels,
        Some(Affinity {
            pod_affinity: Some(affinity),
            pod_anti_affinity: anti,
            node_affinity: None,
        }),
    )
}

/// Merges our affinity into a pod's (the template's terms are kept).
pub fn merge_affinity(into: &mut Option<Affinity>, ours: Affinity) {
    let a = into.get_or_insert_with(Affinity::default);
    if let Some(p) = ours.pod_affinity {
        let mine = a.pod_affinity.get_or_insert_with(PodAffinity::default);
        mine.required_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .extend(
                p.required_during_scheduling_ignored_during_execution
                    .unwrap_or_default(),
            );
        mine.preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .extend(
                p.preferred_during_scheduling_ignored_during_execution
                    .unwrap_or_default(),
            );
    }
    if let Some(p) = ours.pod_anti_affinity {
        let mine = a
            .pod_anti_affinity
            .get_or_insert_with(PodAntiAffinity::default);
        mine.required_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .extend(
                p.required_during_scheduling_ignored_during_execution
                    .unwrap_or_default(),
            );
        mine.preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .extend(
                p.preferred_during_scheduling_ignored_during_execution
                    .unwrap_or_default(),
            );
    }
}

/// Kueue's topology request and pod-set annotations for a queued World
/// (topology invariant 4), or `None`.
pub fn kueue_request(world: &World) -> Option<(Value, BTreeMap<String, String>)> {
    let t = entries(world)
        .iter()
        .find(|t| t.mode == TopologyMode::Required)?;
    let s = stride(world, &t.dimension)?;
    let request = json!({
        "unconstrained": true,
        "podIndexLabel": LABEL_RANK,
        "podSetSliceRequiredTopology": t.key,
        "podSetSliceSize": s,
    });
    let annotations = BTreeMap::from([
        (
            "kueue.x-k8s.io/podset-unconstrained-topology".to_string(),
            "true".to_string(),
        ),
        (
            "kueue.x-k8s.io/podset-slice-required-topology".to_string(),
            t.key.clone(),
        ),
        (
            "kueue.x-k8s.io/podset-slice-size".to_string(),
            s.to_string(),
        ),
    ]);
    Some((request, annotations))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RACK: &str = "topology.kubernetes.io/rack";

    /// A `replica=2,host=4` World with topology entry `entry`.
    fn world(entry: &str) -> World {
        let mut w: World = serde_saphyr::from_str(&format!(
            "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {{name: t, namespace: ml}}\nspec:\n  shape: [{{name: replica, size: 2}}, {{name: host, size: 4}}]\n  scheduling: {{topology: [{entry}]}}\n  template: {{spec: {{containers: [{{name: host, image: x}}]}}}}\n"
        ))
        .unwrap();
        w.metadata.uid = Some("uid-1".into());
        w
    }

    fn group_of(labels: &BTreeMap<String, String>) -> String {
        labels["hostmesh.dev/group-replica"].clone()
    }

    /// Topology invariants 1-3, required: the 4 hosts of each replica share
    /// a rack (affinity to their own group), no anti-affinity.
    #[test]
    fn replica_2_host_4_required_colocates_each_replica() {
        let w = world(&format!("{{dimension: replica, key: {RACK}}}"));
        let groups: Vec<String> = (0..8).map(|r| group_of(&placement(&w, r).0)).collect();
        assert_eq!(
            groups[0..4]
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            1
        );
        assert_eq!(
            groups[4..8]
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            1
        );
        assert_ne!(groups[0], groups[4]);
        let (_, a) = placement(&w, 5);
        let a = a.unwrap();
        assert!(a.pod_anti_affinity.is_none());
        let terms = a
            .pod_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap();
        assert_eq!(terms.len(), 1);
        assert_eq!(terms[0].topology_key, RACK);
        assert_eq!(
            terms[0]
                .label_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()["hostmesh.dev/group-replica"],
            groups[5]
        );
    }

    /// Topology invariant 3, exclusive: anti-affinity to every other group.
    #[test]
    fn replica_2_host_4_exclusive_keeps_other_replicas_out_of_the_rack() {
        let w = world(&format!(
            "{{dimension: replica, key: {RACK}, exclusive: true}}"
        ));
        let (labels, a) = placement(&w, 2);
        let anti = a
            .unwrap()
            .pod_anti_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap();
        assert_eq!(anti.len(), 1);
        assert_eq!(anti[0].topology_key, RACK);
        let exprs = anti[0]
            .label_selector
            .as_ref()
            .unwrap()
            .match_expressions
            .as_ref()
            .unwrap();
        assert_eq!(
            (exprs[0].key.as_str(), exprs[0].operator.as_str()),
            ("hostmesh.dev/group-replica", "Exists")
        );
        assert_eq!(
            (
                exprs[1].operator.as_str(),
                exprs[1].values.as_ref().unwrap()[0].as_str()
            ),
            ("NotIn", group_of(&labels).as_str())
        );
    }

    #[test]
    fn preferred_uses_weighted_terms_and_kueue_gets_required_slices() {
        let w = world(&format!(
            "{{dimension: replica, key: {RACK}, mode: Preferred, exclusive: true}}"
        ));
        let a = placement(&w, 0).1.unwrap();
        assert!(
            a.pod_affinity
                .as_ref()
                .unwrap()
                .required_during_scheduling_ignored_during_execution
                .is_none()
        );
        assert_eq!(
            a.pod_affinity
                .unwrap()
                .preferred_during_scheduling_ignored_during_execution
                .unwrap()[0]
                .weight,
            100
        );
        assert!(
            a.pod_anti_affinity
                .unwrap()
                .preferred_during_scheduling_ignored_during_execution
                .is_some()
        );
        assert!(kueue_request(&w).is_none(), "Kueue has no preferred slices");

        let w = world(&format!("{{dimension: replica, key: {RACK}}}"));
        let (req, ann) = kueue_request(&w).unwrap();
        assert_eq!(req["podSetSliceRequiredTopology"], RACK);
        assert_eq!(req["podSetSliceSize"], 4);
        assert_eq!(req["podIndexLabel"], "hostmesh.dev/rank");
        assert_eq!(ann["kueue.x-k8s.io/podset-slice-size"], "4");
        assert_eq!(ann["kueue.x-k8s.io/podset-slice-required-topology"], RACK);
        // A World with no topology renders nothing.
        let plain: World = serde_saphyr::from_str("apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {name: p}\nspec: {hosts: 2, template: {}}\n").unwrap();
        assert_eq!(placement(&plain, 0), (BTreeMap::new(), None));
    }

    /// Another World's groups never match ours (topology invariant 2).
    #[test]
    fn two_worlds_have_distinct_groups() {
        let a = world(&format!("{{dimension: host, key: {RACK}}}"));
        let mut b = a.clone();
        b.metadata.uid = Some("uid-2".into());
        assert_ne!(placement(&a, 0).0, placement(&b, 0).0);
        assert_eq!(stride(&a, "host"), Some(1));
        assert_eq!(stride(&a, "replica"), Some(4));
    }
}
