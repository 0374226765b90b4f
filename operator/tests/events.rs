//! Events on the embedded API server: a repeated reason with a new message
//! is a new Event carrying that message; an exact repeat grows the series
//! of its Event instead.

use std::sync::Arc;

use hostmesh_operator::hub::sim::{SimConnector, connector};
use hostmesh_operator::{ControllerContext, OperatorArgs};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_message_for_a_repeated_reason_is_a_new_event() {
    let (_server, client) = hostmesh_testkit::cluster::api_server().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "subject"}})).unwrap();
    let cm = cms.create(&PostParams::default(), &cm).await.unwrap();
    let args = OperatorArgs {
        concurrency: 1,
        ..hostmesh_e2e::inproc::operator_args("default", "test")
    };
    let ctx = ControllerContext::new(
        client.clone(),
        args,
        connector(&Arc::new(SimConnector::default())),
    );
    for note in ["restart 1 of 2", "restart 2 of 2", "restart 2 of 2"] {
        ctx.event(&cm, true, "Restarting", note.to_string()).await;
    }
    let events: Api<Event> = Api::namespaced(client, "default");
    let mut got: Vec<(String, i32)> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("subject"))
        .map(|e| (e.note.unwrap_or_default(), e.series.map_or(1, |s| s.count)))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("restart 1 of 2".to_string(), 1),
            ("restart 2 of 2".to_string(), 2)
        ]
    );
}
