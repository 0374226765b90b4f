//! Applying YAML manifests the way `kubectl apply --server-side` does: parse
//! a multi-document file into objects, resolve each object's resource through
//! discovery, and server-side apply it with one field manager. Used by
//! `hostmesh up` and the end-to-end suite.

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};

/// What can go wrong reading or applying a manifest.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file is not YAML, or a document is not a Kubernetes object.
    #[error("{source_name}: document {index}: {reason}")]
    Parse {
        /// File name or other label for the input.
        source_name: String,
        /// 1-based document number.
        index: usize,
        /// Why it did not parse.
        reason: String,
    },
    /// The API server does not serve the object's kind.
    #[error(
        "{kind} {name}: the API server does not serve {api_version}/{kind} (is the CRD installed?): {source}"
    )]
    UnknownKind {
        /// Object kind.
        kind: String,
        /// Object apiVersion.
        api_version: String,
        /// Object name.
        name: String,
        /// The discovery error.
        #[source]
        source: Box<kube::Error>,
    },
    /// The API server refused the object.
    #[error("{kind} {name}")]
    Apply {
        /// Object kind.
        kind: String,
        /// Object name.
        name: String,
        /// The API error (an admission rejection names the field).
        #[source]
        source: Box<kube::Error>,
    },
}

/// Parses every non-empty document of a YAML stream into an object.
/// `source_name` labels errors.
pub fn parse(source_name: &str, yaml: &str) -> Result<Vec<DynamicObject>, ManifestError> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(yaml).map_err(|e| ManifestError::Parse {
            source_name: source_name.to_owned(),
            index: 0,
            reason: e.to_string(),
        })?;
    let mut objects = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        if doc.is_null() {
            continue;
        }
        let err = |reason: String| ManifestError::Parse {
            source_name: source_name.to_owned(),
            index: i + 1,
            reason,
        };
        let obj: DynamicObject = serde_json::from_value(doc).map_err(|e| err(e.to_string()))?;
        let Some(types) = obj.types.as_ref() else {
            return Err(err("missing apiVersion and kind".into()));
        };
        if types.api_version.is_empty() || types.kind.is_empty() {
            return Err(err("missing apiVersion or kind".into()));
        }
        if obj.metadata.name.as_deref().unwrap_or_default().is_empty() {
            return Err(err(format!(
                "{} has no metadata.name: give it a name",
                types.kind
            )));
        }
        objects.push(obj);
    }
    Ok(objects)
}

/// One applied object: where it lives and what it is.
#[derive(Clone, Debug)]
pub struct Applied {
    /// Resource the object belongs to.
    pub resource: ApiResource,
    /// Namespace (None for cluster-scoped objects).
    pub namespace: Option<String>,
    /// Object name.
    pub name: String,
    /// The object as the API server returned it.
    pub object: DynamicObject,
}

/// Server-side applies every object with field manager `manager`. Namespaced
/// objects without a namespace go to `default_namespace`.
pub async fn apply_all(
    client: &kube::Client,
    objects: &[DynamicObject],
    default_namespace: &str,
    manager: &str,
) -> Result<Vec<Applied>, ManifestError> {
    let mut applied = Vec::with_capacity(objects.len());
    for obj in objects {
        applied.push(apply_one(client, obj, default_namespace, manager).await?);
    }
    Ok(applied)
}

async fn apply_one(
    client: &kube::Client,
    obj: &DynamicObject,
    default_namespace: &str,
    manager: &str,
) -> Result<Applied, ManifestError> {
    let types = obj.types.clone().unwrap_or_default();
    let name = obj.metadata.name.clone().unwrap_or_default();
    let gvk = gvk_of(&types.api_version, &types.kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|source| ManifestError::UnknownKind {
            kind: types.kind.clone(),
            api_version: types.api_version.clone(),
            name: name.clone(),
            source: Box::new(source),
        })?;
    let namespace = namespace_for(&caps, obj, default_namespace);
    let api: Api<DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let params = PatchParams::apply(manager).force();
    let object = api
        .patch(&name, &params, &Patch::Apply(obj))
        .await
        .map_err(|source| ManifestError::Apply {
            kind: types.kind.clone(),
            name: name.clone(),
            source: Box::new(source),
        })?;
    Ok(Applied {
        resource,
        namespace,
        name,
        object,
    })
}

fn namespace_for(
    caps: &ApiCapabilities,
    obj: &DynamicObject,
    default_namespace: &str,
) -> Option<String> {
    match caps.scope {
        Scope::Cluster => None,
        Scope::Namespaced => Some(
            obj.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| default_namespace.to_owned()),
        ),
    }
}

fn gvk_of(api_version: &str, kind: &str) -> GroupVersionKind {
    match api_version.split_once('/') {
        Some((group, version)) => GroupVersionKind::gvk(group, version, kind),
        None => GroupVersionKind::gvk("", api_version, kind),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_multi_document_streams_and_skips_empty_documents() {
        let yaml = "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n---\napiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {name: w, namespace: x}\nspec: {}\n";
        let objs = parse("t.yaml", yaml).unwrap();
        assert_eq!(objs.len(), 2);
        assert_eq!(objs[1].metadata.namespace.as_deref(), Some("x"));
        let gvk = gvk_of("hostmesh.dev/v1alpha1", "World");
        assert_eq!(
            (gvk.group.as_str(), gvk.version.as_str()),
            ("hostmesh.dev", "v1alpha1")
        );
        assert_eq!(gvk_of("v1", "Pod").group, "");
    }

    #[test]
    fn a_document_without_a_name_is_an_error_that_says_so() {
        let err = parse("m.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {}\n").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("m.yaml") && msg.contains("metadata.name"),
            "{msg}"
        );
    }

    #[test]
    fn a_document_without_a_kind_is_an_error() {
        let err = parse("m.yaml", "metadata: {name: a}\n").unwrap_err();
        assert!(err.to_string().contains("document 1"), "{err}");
    }
}
