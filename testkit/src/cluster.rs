//! An embedded API server for a test, optionally with the hostmesh CRDs
//! installed and established.

use std::path::Path;

use hostmesh_crds::{ProcMesh, World};
use hostmesh_devcluster::apiserver::{ApiServer, ApiServerConfig, ApiServerHandle};
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
