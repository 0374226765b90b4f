//! The World and ProcMesh controllers: [`world`] (host pods from a World),
//! [`procmesh`] (procs on those hosts), and what both share ([`shared`]).
//! [`run`] starts one pair per watched namespace beside the hub and routes
//! the hub's status triggers to the pair watching the object's namespace.
//! With `--serve-monarch-mesh` it also starts [`monarchmesh`] (Monarch's
//! `MonarchMesh` as a World) per watched namespace.

pub mod monarchmesh;
pub mod procmesh;
pub mod shared;
pub mod world;

use std::sync::Arc;

use futures::FutureExt as _;
use tokio::sync::mpsc;
use tracing::info;

pub use shared::ControllerContext;

use crate::{OperatorError, hub};

/// Runs both controllers (one pair per watched namespace) and the hub
/// until `shutdown` resolves.
pub async fn run(
    ctx: Arc<ControllerContext>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), OperatorError> {
    let shutdown = shutdown.shared();
    let (tw, rw) = mpsc::unbounded_channel();
    let (tm, rm) = mpsc::unbounded_channel();
    let hub = tokio::spawn(ctx.hub.clone().run(tw, tm, shutdown.clone()));
    let namespaces = ctx.args.namespaces();
    let (world_routes, world_rx) = routes(&namespaces);
    let (mesh_routes, mesh_rx) = routes(&namespaces);
    tokio::spawn(route(rw, world_routes));
    tokio::spawn(route(rm, mesh_routes));
    let mut runs = Vec::new();
    for ((ns, wrx), mrx) in namespaces.into_iter().zip(world_rx).zip(mesh_rx) {
        if ctx.args.serve_monarch_mesh {
            runs.push(monarchmesh::controller(ctx.clone(), ns.clone(), shutdown.clone()).boxed());
        }
        runs.push(world::controller(ctx.clone(), ns.clone(), wrx, shutdown.clone()).boxed());
        runs.push(procmesh::controller(ctx.clone(), ns, mrx, shutdown.clone()).boxed());
    }
    futures::future::join_all(runs).await;
    hub.abort();
    info!("controllers stopped");
    Ok(())
}

type Routes = Vec<(Option<String>, mpsc::UnboundedSender<hub::WorldKey>)>;

fn routes(namespaces: &[Option<String>]) -> (Routes, Vec<mpsc::UnboundedReceiver<hub::WorldKey>>) {
    namespaces
        .iter()
        .map(|ns| {
            let (tx, rx) = mpsc::unbounded_channel();
            ((ns.clone(), tx), rx)
        })
        .unzip()
}

/// Forwards hub triggers to the controller watching the object's namespace.
async fn route(mut rx: mpsc::UnboundedReceiver<hub::WorldKey>, routes: Routes) {
    while let Some(key) = rx.recv().await {
        let target = routes
            .iter()
            .find(|(ns, _)| ns.as_deref().is_none_or(|n| n == key.namespace));
        if let Some((_, tx)) = target {
            let _ = tx.send(key);
        }
    }
}
