//! An embedded API server for a test, optionally with the hostmesh CRDs
//! (and Monarch's `MonarchMesh` CRD, [`install_monarch_mesh_crd`])
//! installed and established, and a namespace of the test's own
//! ([`crd_server_with_namespace`]).

use std::path::Path;

use hostmesh_crds::{ProcMesh, World};
use hostmesh_devcluster::apiserver::{ApiServer, ApiServerConfig, ApiServerHandle};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, CustomResourceExt as _};

/// An API server started from `config`, and a client for it.
pub async fn api_server_with(config: ApiServerConfig) -> (ApiServerHandle, Client) {
    let server = ApiServer::start(config)
        .await
        .expect("the embedded API server starts");
    let client = server.client().expect("a client for the API server");
    (server, client)
}

/// An API server with the default configuration, and a client for it.
pub async fn api_server() -> (ApiServerHandle, Client) {
    api_server_with(ApiServerConfig::default()).await
}

/// An API server writing its kubeconfig to `kubeconfig` (for `kubectl`,
/// Helm or a child process to reach it), and a client for it.
pub async fn api_server_with_kubeconfig(kubeconfig: &Path) -> (ApiServerHandle, Client) {
    api_server_with(ApiServerConfig {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        ..ApiServerConfig::default()
    })
    .await
}

/// An API server writing its kubeconfig to `kubeconfig`, with the hostmesh
/// CRDs installed.
pub async fn server_with_crds(kubeconfig: &Path) -> ApiServerHandle {
    let (server, client) = api_server_with_kubeconfig(kubeconfig).await;
    install_crds(&client).await;
    server
}

/// An API server with the hostmesh CRDs installed and namespace `ns`
/// created, and a client for it: what a suite running the controllers in
/// process starts from.
pub async fn crd_server_with_namespace(ns: &str) -> (ApiServerHandle, Client) {
    let (server, client) = api_server().await;
    install_crds(&client).await;
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))
            .expect("a Namespace from its name");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {ns}: {e}"));
    (server, client)
}

/// Creates the World and ProcMesh CRDs and waits until both kinds serve.
pub async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [World::crd(), ProcMesh::crd()] {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("create a hostmesh CRD");
    }
    let worlds: Api<World> = Api::all(client.clone());
    let meshes: Api<ProcMesh> = Api::all(client.clone());
    crate::eventually_async("the hostmesh CRDs to serve", async || {
        let lp = ListParams::default();
        (worlds.list(&lp).await.is_ok() && meshes.list(&lp).await.is_ok()).then_some(())
    })
    .await;
}

/// Installs every CustomResourceDefinition in the YAML files of `dir` (a
/// project's published CRDs kept as test data: one or more documents per
/// file, other kinds skipped; one that already exists is kept) and waits
/// until each serves its storage version. Panics with the file's name when
/// one cannot be read or created.
pub async fn install_crd_dir(client: &Client, dir: &Path) {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut served = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("parse {}: {e}", file.display()));
        for doc in docs {
            if doc["kind"] != "CustomResourceDefinition" {
                continue;
            }
            let crd: CustomResourceDefinition = serde_json::from_value(doc)
                .unwrap_or_else(|e| panic!("{}: not a CRD: {e}", file.display()));
            let spec = &crd.spec;
            let version = spec
                .versions
                .iter()
                .find(|v| v.storage)
                .map(|v| v.name.clone())
                .unwrap_or_else(|| panic!("{}: no storage version", file.display()));
            served.push(ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(&spec.group, &version, &spec.names.kind),
                &spec.names.plural,
            ));
            match crds.create(&PostParams::default(), &crd).await {
                Ok(_) => {}
                // Already installed (a real cluster running the project).
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => panic!("create the CRD of {}: {e}", file.display()),
            }
        }
    }
    for ar in served {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        crate::eventually_async(&format!("{} to serve", ar.plural), async || {
            api.list(&ListParams::default()).await.ok().map(|_| ())
        })
        .await;
        // Discovery too, as controllers look kinds up there (a real API
        // server lists a new CRD's group a moment after it serves it).
        crate::eventually_async(&format!("{} in discovery", ar.plural), async || {
            let list = client
                .list_api_group_resources(&ar.api_version)
                .await
                .ok()?;
            list.resources
                .iter()
                .any(|r| r.name == ar.plural)
                .then_some(())
        })
        .await;
    }
}

/// Creates Monarch's `MonarchMesh` CRD (what `--serve-monarch-mesh` serves;
/// not part of [`install_crds`]) and waits until the kind serves.
pub async fn install_monarch_mesh_crd(client: &Client) {
    use hostmesh_crds::monarchmesh::{self, MonarchMesh};
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &monarchmesh::crd())
        .await
        .expect("create the MonarchMesh CRD");
    let meshes: Api<MonarchMesh> = Api::all(client.clone());
    crate::eventually_async("the MonarchMesh CRD to serve", async || {
        meshes.list(&ListParams::default()).await.ok().map(|_| ())
    })
    .await;
}
