//! What every reconcile shares: the client, the hub, the Event recorder and
//! the operator's settings.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use tracing::warn;

use crate::OperatorArgs;
use crate::hub::{AgentConnector, Hub};

/// Shared reconcile context.
pub struct ControllerContext {
    /// Prometheus metrics (`ctx.metrics.reconcile("world")` per run,
    /// `reconcile_error` in the error policy; see docs/operations.md).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Kubernetes client.
    pub client: Client,
    /// The supervision hub.
    pub hub: Arc<Hub>,
    /// Publishes Events, one per distinct message.
    pub recorder: crate::controllers::shared::recorder::NoteRecorder,
    /// Operator settings.
    pub args: OperatorArgs,
    /// Paces status writes per object.
    pub pacer: crate::controllers::shared::writes::StatusPacer,
    /// Worlds seen deleted, for the ProcMeshes they leave
    /// (`procmesh::orphans`).
    pub deleted_worlds: crate::controllers::procmesh::orphans::DeletedWorlds,
    /// The host pods the World controllers watch, by the namespace each
    /// watches (`None`: all): what a reconcile reads instead of listing.
    pub host_pods: HostPods,
    /// The NetworkPolicies this operator last applied, per World
    /// (`world::netpol` invariant 1).
    pub applied_policies: crate::controllers::world::netpol::Applied,
    /// The Monarch certificate Secrets this operator wrote or read
    /// (`world::monarch_tls` invariant 5).
    pub tls_leaves: crate::controllers::world::monarch_tls::Leaves,
}

/// The reflector stores of host pods (`managedFields` dropped), one per
/// World controller: a World's reconcile reads its pods from memory, where
/// listing them from the API server cost every reconcile a 1,000-pod list
/// parsed whole.
#[derive(Default)]
pub struct HostPods {
    stores: std::sync::RwLock<Vec<(Option<String>, Store<Pod>)>>,
}

impl HostPods {
    /// Adds the store of the controller watching `namespace` (`None`: all).
    pub fn register(&self, namespace: Option<String>, store: Store<Pod>) {
        let mut stores = self.stores.write().unwrap_or_else(|e| e.into_inner());
        stores.retain(|(ns, _)| *ns != namespace);
        stores.push((namespace, store));
    }

    /// The store that holds the pods of `namespace`, if a controller
    /// watches it.
    pub fn of(&self, namespace: &str) -> Option<Store<Pod>> {
        self.stores
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(ns, _)| ns.as_deref().is_none_or(|n| n == namespace))
            .map(|(_, s)| s.clone())
    }
}

impl ControllerContext {
    /// A context for `client` dialing agents through `connector`.
    pub fn new(
        client: Client,
        args: OperatorArgs,
        connector: Arc<dyn AgentConnector>,
    ) -> Arc<Self> {
        Self::with_metrics(
            client,
            args,
            connector,
            Arc::new(crate::metrics::Metrics::new()),
        )
    }

    /// Like [`ControllerContext::new`], recording into the process's `metrics` (what
    /// `/metrics` serves).
    pub fn with_metrics(
        client: Client,
        args: OperatorArgs,
        connector: Arc<dyn AgentConnector>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Arc<Self> {
        let reporter = Reporter {
            controller: "hostmesh-operator".into(),
            instance: Some(args.instance.clone()),
        };
        Arc::new(ControllerContext {
            metrics,
            recorder: crate::controllers::shared::recorder::NoteRecorder::new(
                client.clone(),
                reporter,
            ),
            client,
            hub: Hub::new(connector),
            args,
            pacer: crate::controllers::shared::writes::StatusPacer::new(
                crate::hub::COALESCE_INTERVAL,
            ),
            deleted_worlds: Default::default(),
            host_pods: HostPods::default(),
            applied_policies: Default::default(),
            tls_leaves: Default::default(),
        })
    }

    /// Publishes an Event on `obj`; failures are logged, never fatal. The
    /// note is cut to [`MAX_NOTE`] bytes, the API's limit.
    pub async fn event<K: kube::Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let ev = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            note: Some(hostmesh_crds::procmesh::bounded(&note, MAX_NOTE).into_owned()),
            action: reason.to_string(),
            secondary: None,
        };
        let reference = obj.object_ref(&());
        if let Err(e) = self.recorder.publish(&ev, &reference).await {
            warn!(reason, error = %e, "cannot publish Event");
        }
    }

    /// Publishes the Events a plan decided on `obj`, in order.
    pub async fn planned_events<K: kube::Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        events: &[super::events::PlannedEvent],
    ) {
        for ev in events {
            let warning = ev.severity == super::events::Severity::Warning;
            self.event(obj, warning, ev.reason, ev.note.clone()).await;
        }
    }
}

/// The longest Event note the API accepts (`events.k8s.io/v1`: 1 kB).
pub const MAX_NOTE: usize = 1024;

/// An object reference from namespace and name.
pub fn obj_ref<K: kube::Resource<DynamicType = ()>>(namespace: &str, name: &str) -> ObjectRef<K> {
    ObjectRef::new(name).within(namespace)
}

/// Adds finalizer `name` to `obj` with a merge patch guarded by its
/// resourceVersion (a stale object gets 409 and is retried), unless it is
/// there already or the object is being deleted. kube's `finalizer()` then
/// finds it present. (Its own add is a JSON patch whose `test` of an absent
/// path some API servers reject.)
pub async fn ensure_finalizer<K>(
    api: &kube::Api<K>,
    obj: Arc<K>,
    name: &str,
) -> Result<Arc<K>, crate::OperatorError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    use kube::ResourceExt as _;
    if obj.meta().deletion_timestamp.is_some() || obj.finalizers().iter().any(|f| f == name) {
        return Ok(obj);
    }
    let mut finalizers = obj.finalizers().to_vec();
    finalizers.push(name.to_string());
    let patch = serde_json::json!({
        "metadata": {"finalizers": finalizers, "resourceVersion": obj.resource_version()},
    });
    let pp = kube::api::PatchParams::default();
    let updated = api
        .patch(&obj.name_any(), &pp, &kube::api::Patch::Merge(&patch))
        .await?;
    Ok(Arc::new(updated))
}

/// The reconcile both controllers share around their own `apply` and
/// `cleanup`: time it under `kind`, make sure `finalizer` is on the object,
/// then run `apply` while it lives and `cleanup` once it is being deleted
/// (kube's finalizer helper removes the finalizer when `cleanup` succeeds).
pub async fn reconcile_finalized<K, A, FA, C, FC>(
    kind: &'static str,
    obj: Arc<K>,
    ctx: &ControllerContext,
    finalizer: &str,
    apply: A,
    cleanup: C,
) -> Result<kube::runtime::controller::Action, crate::OperatorError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    A: FnOnce(Arc<K>) -> FA,
    FA: std::future::Future<
            Output = Result<kube::runtime::controller::Action, crate::OperatorError>,
        >,
    C: FnOnce(Arc<K>) -> FC,
    FC: std::future::Future<
            Output = Result<kube::runtime::controller::Action, crate::OperatorError>,
        >,
{
    use kube::ResourceExt as _;
    use kube::runtime::finalizer::{Event as Finalizer, finalizer as run_finalizer};
    let _timer = ctx.metrics.reconcile(kind);
    let ns = obj
        .namespace()
        .ok_or(crate::OperatorError::MissingField("metadata.namespace"))?;
    let api: kube::Api<K> = kube::Api::namespaced(ctx.client.clone(), &ns);
    let obj = ensure_finalizer(&api, obj, finalizer).await?;
    run_finalizer(&api, finalizer, obj, |event| async move {
        match event {
            Finalizer::Apply(o) => apply(o).await,
            Finalizer::Cleanup(o) => cleanup(o).await,
        }
    })
    .await
    .map_err(|e| crate::OperatorError::Finalizer(Box::new(e)))
}

/// The error policy both controllers share: count the error under its
/// label, retry a transient one after 1 s quietly, log anything else and
/// retry after 5 s. `kind` names the controller in metrics and logs.
pub fn requeue_on_error<K: kube::Resource>(
    kind: &'static str,
    obj: &K,
    err: &crate::OperatorError,
    ctx: &ControllerContext,
) -> kube::runtime::controller::Action {
    use kube::ResourceExt as _;
    use kube::runtime::controller::Action;
    use std::time::Duration;
    ctx.metrics.reconcile_error(kind, err.root().label());
    if err.is_transient() {
        tracing::debug!(kind, name = %obj.name_any(), error = %err, "reconcile retried");
        return Action::requeue(Duration::from_secs(1));
    }
    warn!(kind, name = %obj.name_any(), error = %err, label = err.root().label(), "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}
