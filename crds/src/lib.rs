//! hostmesh API types: the `World` and `ProcMesh` custom resources
//! (`hostmesh.dev/v1alpha1`), their schemas, pure validation, status types and
//! condition helpers; and Monarch's `MonarchMesh` ([`monarchmesh`]), served
//! only when asked. No I/O lives here.
//!
//! Invariants:
//! 1. Everything a schema can say (DNS-label names, sizes >= 1, upper bounds,
//!    required fields) is in the generated OpenAPI schema; everything else is
//!    checked by the pure functions in [`validate`], whose messages name the
//!    field and the fix.
//! 2. Per-rank state in status is stored as runs of equal state ([`runs`]),
//!    so its size is bounded by the number of distinct runs, not ranks.
//! 3. Conditions use the `metav1.Condition` shape; [`conditions::set`] keeps
//!    `lastTransitionTime` when a condition's status does not change.

pub mod cause;
pub mod conditions;
pub mod duration;
pub mod field;
pub mod incident;
pub mod monarch;
pub mod monarchmesh;
pub mod procmesh;
pub mod selector;
pub mod shm;
pub mod validate;
pub mod world;

pub use hostmesh_mesh::{Dim, Rank, Shape, runs, shape};
pub use procmesh::{ProcMesh, ProcMeshSpec, ProcMeshStatus};
pub use world::{World, WorldSpec, WorldStatus};

use kube::CustomResourceExt as _;

/// The API group of every hostmesh resource.
pub const GROUP: &str = "hostmesh.dev";
/// The API version of every hostmesh resource.
pub const VERSION: &str = "v1alpha1";

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A spec failed validation; each entry names the field and the fix.
    #[error("invalid spec: {}", validate::join(.0))]
    Invalid(Vec<validate::FieldError>),
    /// The CRD could not be serialized to YAML.
    #[error("cannot serialize CRD to YAML: {0}")]
    Yaml(String),
}

impl CrdError {
    /// A short label for metrics and Events.
    pub fn label(&self) -> &'static str {
        match self {
            CrdError::Invalid(_) => "invalid_spec",
            CrdError::Yaml(_) => "yaml",
        }
    }
}

/// Both CRDs (`World`, then `ProcMesh`) as one multi-document YAML text, as
/// printed by `hostmesh crds` and shipped in the Helm chart.
pub fn crd_yaml() -> Result<String, CrdError> {
    let mut out = String::new();
    for crd in [World::crd(), ProcMesh::crd()] {
        let doc = serde_saphyr::to_string(&crd).map_err(|e| CrdError::Yaml(e.to_string()))?;
        out.push_str("---\n");
        out.push_str(&doc);
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

/// Schema for fields kept as free-form objects (a full `PodTemplateSpec`
/// schema would make the CRD larger than `kubectl apply`'s annotation limit;
/// the controller validates the template by deserializing it).
pub(crate) fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_yaml_has_both_kinds_and_parses_back() {
        let text = crd_yaml().unwrap();
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["spec"]["names"]["kind"], "World");
        assert_eq!(docs[1]["spec"]["names"]["kind"], "ProcMesh");
        for d in &docs {
            assert_eq!(d["spec"]["scope"], "Namespaced");
            assert_eq!(d["spec"]["group"], GROUP);
            let v = &d["spec"]["versions"][0];
            assert_eq!(v["name"], VERSION);
            assert!(v["subresources"]["status"].is_object());
        }
        let cols: Vec<&str> = docs[0]["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(cols, ["READY", "PHASE", "RESTARTS", "AGE"]);
        let cols: Vec<&str> = docs[1]["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            cols,
            [
                "WORLD", "EXTENT", "RUNNING", "FAILED", "RESTARTS", "PHASE", "AGE"
            ]
        );
    }

    #[test]
    fn examples_parse_and_validate() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
            let mut worlds = std::collections::HashMap::new();
            for d in &docs {
                if d["kind"] == "World" {
                    let w: World = serde_json::from_value(d.clone()).unwrap();
                    let name = w.metadata.name.clone().unwrap();
                    validate::world(&name, &w.spec)
                        .unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
                    worlds.insert(name, w.spec);
                }
            }
            for d in &docs {
                if d["kind"] == "ProcMesh" {
                    let pm: ProcMesh = serde_json::from_value(d.clone()).unwrap();
                    let w = worlds.get(&pm.spec.world);
                    validate::proc_mesh(&pm.spec, w)
                        .unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
                    seen += 1;
                }
            }
        }
        assert!(seen >= 1, "examples/quickstart.yaml has a ProcMesh");
    }

    #[test]
    fn schema_carries_bounds_and_dns_pattern() {
        let crd = serde_json::to_value(World::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let dim = &spec["properties"]["shape"]["items"];
        assert_eq!(dim["properties"]["size"]["minimum"].as_f64(), Some(1.0));
        assert!(dim["properties"]["name"]["pattern"].is_string());
        assert_eq!(
            spec["properties"]["template"]["x-kubernetes-preserve-unknown-fields"],
            true
        );
        let req = spec["required"].as_array().unwrap();
        assert!(req.iter().any(|r| r == "template"));
    }
}
