//! Watch semantics through kube-rs: a Controller with watcher + reflector
//! sees every change exactly once, history replay from a resourceVersion,
//! 410 Gone, bookmarks, timeouts, selector transitions and streaming lists.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use hostmesh_devcluster::apiserver::ApiServerConfig;
use hostmesh_testkit::cluster::{api_server, api_server_with};
use hostmesh_testkit::eventually;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, reflector, watcher};
use serde_json::json;

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": {"n": "0"},
    }))
    .expect("configmap")
}

/// Not the `kube-root-ca.crt` every namespace holds.
fn ours(c: &ConfigMap) -> bool {
    c.metadata.name.as_deref() != Some("kube-root-ca.crt")
}

#[tokio::test]
async fn watcher_sees_every_change_exactly_once_in_order() {
    let (server, client) = api_server().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let seen: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let (reader, writer) = reflector::store();
    let stream = reflector(writer, watcher(api.clone(), watcher::Config::default()));
    let seen2 = seen.clone();
    let task = tokio::spawn(async move {
        let mut s = std::pin::pin!(stream);
        while let Ok(Some(ev)) = s.try_next().await {
            if let watcher::Event::Apply(o) | watcher::Event::Delete(o) = ev {
                let rv = o
                    .metadata
                    .resource_version
                    .as_deref()
                    .unwrap_or("0")
                    .parse()
                    .unwrap_or(0);
                seen2
                    .lock()
                    .expect("lock")
                    .push((o.metadata.name.unwrap_or_default(), rv));
            }
        }
    });
    reader.wait_until_ready().await.expect("ready");
    let mut expected = Vec::new();
    for i in 0..5 {
        let c = api
            .create(&PostParams::default(), &cm(&format!("c{i}"), json!({})))
            .await
            .expect("create");
        expected.push((
            format!("c{i}"),
            c.metadata
                .resource_version
                .expect("rv")
                .parse::<u64>()
                .expect("num"),
        ));
    }
    for round in 1..=3 {
        for i in 0..5 {
            let p = Patch::Merge(json!({"data": {"n": round.to_string()}}));
            let c = api
                .patch(&format!("c{i}"), &PatchParams::default(), &p)
                .await
                .expect("patch");
            expected.push((
                format!("c{i}"),
                c.metadata
                    .resource_version
                    .expect("rv")
                    .parse()
                    .expect("num"),
            ));
        }
    }
    let d = api
        .delete("c0", &DeleteParams::default())
        .await
        .expect("delete");
    let drv: u64 = d
        .left()
        .and_then(|o| o.metadata.resource_version)
        .expect("rv")
        .parse()
        .expect("num");
    expected.push(("c0".into(), drv));
    eventually("all events", || {
        seen.lock().expect("lock").len() >= expected.len()
    })
    .await;
    let got = seen.lock().expect("lock").clone();
    assert_eq!(got, expected, "each change once, in resourceVersion order");
    let state: Vec<_> = reader.state().into_iter().filter(|c| ours(c)).collect();
    assert_eq!(state.len(), 4);
    assert!(
        state
            .iter()
            .all(|c| c.data.as_ref().and_then(|d| d.get("n")).map(String::as_str) == Some("3"))
    );
    task.abort();
    server.shutdown().await;
}

#[tokio::test]
async fn controller_reconciles_each_object_and_converges() {
    let (server, client) = api_server().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let counts: Arc<Mutex<HashMap<String, usize>>> = Arc::default();

    // The reconciler stamps an annotation; a self-caused no-op write must
    // not cause an endless loop (the server suppresses unchanged writes).
    struct Ctx {
        api: Api<ConfigMap>,
        counts: Arc<Mutex<HashMap<String, usize>>>,
    }
    async fn reconcile(o: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
        let name = o.metadata.name.clone().unwrap_or_default();
        *ctx.counts
            .lock()
            .expect("lock")
            .entry(name.clone())
            .or_default() += 1;
        let p = Patch::Apply(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "annotations": {"seen": "yes"}}}),
        );
        ctx.api
            .patch(&name, &PatchParams::apply("test-controller"), &p)
            .await?;
        Ok(Action::await_change())
    }
    fn on_error(_: Arc<ConfigMap>, _: &kube::Error, _: Arc<Ctx>) -> Action {
        Action::requeue(Duration::from_millis(100))
    }
    let ctx = Arc::new(Ctx {
        api: api.clone(),
        counts: counts.clone(),
    });
    let ctrl = tokio::spawn(
        Controller::new(api.clone(), watcher::Config::default())
            .run(reconcile, on_error, ctx)
            .for_each(|_| async {}),
    );
    for i in 0..4 {
        api.create(&PostParams::default(), &cm(&format!("r{i}"), json!({})))
            .await
            .expect("create");
    }
    let api2 = api.clone();
    for _ in 0..400 {
        let l = api2.list(&ListParams::default()).await.expect("list");
        if l.items
            .iter()
            .filter(|c| ours(c) && c.annotations().get("seen").map(String::as_str) == Some("yes"))
            .count()
            == 4
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let l = api.list(&ListParams::default()).await.expect("list");
    assert_eq!(
        l.items
            .iter()
            .filter(|c| ours(c) && c.annotations().get("seen").map(String::as_str) == Some("yes"))
            .count(),
        4
    );
    // Quiescent: counts stop growing (each object reconciled a bounded
    // number of times: its creation and its own annotation write).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = counts.lock().expect("lock").clone();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = counts.lock().expect("lock").clone();
    assert_eq!(before, after, "no reconcile storm");
    assert!(after.values().all(|n| (1..=3).contains(n)), "{after:?}");
    ctrl.abort();
    server.shutdown().await;
}

use kube::ResourceExt as _;

#[tokio::test]
async fn watch_from_resource_version_replays_history_and_too_old_is_gone() {
    let (server, client) = api_server_with(ApiServerConfig {
        history_limit: 5,
        ..ApiServerConfig::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let first = api
        .create(&PostParams::default(), &cm("h", json!({})))
        .await
        .expect("create");
    let rv0 = first.metadata.resource_version.clone().expect("rv");
    api.patch(
        "h",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"n": "1"}})),
    )
    .await
    .expect("patch");
    // Replay: the modification after rv0 arrives.
    let mut w = api
        .watch(&WatchParams::default().timeout(5), &rv0)
        .await
        .expect("watch")
        .boxed();
    match w.try_next().await.expect("event") {
        Some(WatchEvent::Modified(o)) => assert_eq!(o.data.expect("data")["n"], "1"),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    drop(w);
    for i in 2..20 {
        api.patch(
            "h",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"n": i.to_string()}})),
        )
        .await
        .expect("patch");
    }
    let mut w = api
        .watch(&WatchParams::default().timeout(5), &rv0)
        .await
        .expect("watch")
        .boxed();
    match w.try_next().await.expect("event") {
        Some(WatchEvent::Error(e)) => assert_eq!(e.code, 410),
        other => panic!("expected 410 Gone, got {other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn watch_from_before_the_window_gets_410_too_old_in_the_stream() {
    let (server, client) = api_server_with(ApiServerConfig {
        watch_window: Duration::from_millis(200),
        ..ApiServerConfig::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let first = api
        .create(&PostParams::default(), &cm("w", json!({})))
        .await
        .expect("create");
    let rv0 = first.metadata.resource_version.clone().expect("rv");
    api.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"n": "1"}})),
    )
    .await
    .expect("patch");
    // Once the window has passed the events after rv0, a watch from rv0
    // is answered with one ERROR event: 410 Expired, "too old resource
    // version", as kube-apiserver's watch cache words it.
    let status = hostmesh_testkit::wait::eventually_async("410 for a watch from rv0", async || {
        let mut w = api
            .watch(&WatchParams::default().timeout(1), &rv0)
            .await
            .expect("watch")
            .boxed();
        match w.try_next().await.expect("stream") {
            Some(WatchEvent::Error(e)) => Some(e),
            _ => None,
        }
    })
    .await;
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
    assert!(
        status
            .message
            .starts_with(&format!("too old resource version: {rv0} (")),
        "{}",
        status.message
    );
    server.shutdown().await;
}

#[tokio::test]
async fn bookmarks_timeouts_and_selector_transitions() {
    let cfg = ApiServerConfig {
        bookmark_interval: Duration::from_millis(100),
        ..ApiServerConfig::default()
    };
    let (server, client) = api_server_with(cfg).await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let list = api.list(&ListParams::default()).await.expect("list");
    let rv = list.metadata.resource_version.expect("rv");

    let mut w = api
        .watch(&WatchParams::default().timeout(30), &rv)
        .await
        .expect("watch")
        .boxed();
    match w.try_next().await.expect("event") {
        Some(WatchEvent::Bookmark(b)) => assert_eq!(b.metadata.resource_version, rv),
        other => panic!("expected a bookmark, got {other:?}"),
    }
    drop(w);

    // timeoutSeconds ends the stream.
    let mut w = api
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .expect("watch")
        .boxed();
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(_)) = w.try_next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the watch ends after timeoutSeconds");

    // Relabeling out of the selector is a DELETED for that watcher.
    let mut w = api
        .watch(&WatchParams::default().labels("team=a").timeout(30), &rv)
        .await
        .expect("watch")
        .boxed();
    api.create(&PostParams::default(), &cm("s", json!({"team": "a"})))
        .await
        .expect("create");
    api.patch(
        "s",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "b"}}})),
    )
    .await
    .expect("relabel");
    api.patch(
        "s",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
    )
    .await
    .expect("back");
    let mut kinds = Vec::new();
    while kinds.len() < 3 {
        match w.try_next().await.expect("event") {
            Some(WatchEvent::Added(_)) => kinds.push("ADDED"),
            Some(WatchEvent::Modified(_)) => kinds.push("MODIFIED"),
            Some(WatchEvent::Deleted(_)) => kinds.push("DELETED"),
            Some(_) => {}
            None => break,
        }
    }
    assert_eq!(kinds, ["ADDED", "DELETED", "ADDED"]);
    server.shutdown().await;
}

#[tokio::test]
async fn streaming_list_sends_initial_events_then_end_bookmark() {
    let (server, client) = api_server().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    for i in 0..3 {
        api.create(&PostParams::default(), &cm(&format!("i{i}"), json!({})))
            .await
            .expect("create");
    }
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(api.clone(), watcher::Config::default().streaming_lists()),
    );
    let task = tokio::spawn(async move {
        let mut s = std::pin::pin!(stream);
        while let Ok(Some(_)) = s.try_next().await {}
    });
    tokio::time::timeout(Duration::from_secs(20), reader.wait_until_ready())
        .await
        .expect("ready in time")
        .expect("ready");
    let names: BTreeMap<String, ()> = reader
        .state()
        .iter()
        .filter(|c| ours(c))
        .map(|c| (c.name_any(), ()))
        .collect();
    assert_eq!(
        names.keys().cloned().collect::<Vec<_>>(),
        ["i0", "i1", "i2"]
    );
    task.abort();
    server.shutdown().await;
}

#[tokio::test]
async fn metadata_only_get_list_and_watch() {
    let (server, client) = api_server().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    api.create(&PostParams::default(), &cm("m", json!({"k": "v"})))
        .await
        .expect("create");
    let m = api.get_metadata("m").await.expect("get metadata");
    assert_eq!(
        m.types.as_ref().map(|t| t.kind.as_str()),
        Some("PartialObjectMetadata")
    );
    assert_eq!(
        m.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("k"))
            .map(String::as_str),
        Some("v")
    );
    let l = api
        .list_metadata(&ListParams::default())
        .await
        .expect("list metadata");
    let names: Vec<_> = l.items.iter().map(|o| o.name_any()).collect();
    assert_eq!(
        names,
        ["kube-root-ca.crt", "m"],
        "ours and the namespace's CA"
    );
    let (reader, writer) = reflector::store();
    let meta_api: Api<kube::core::PartialObjectMeta<ConfigMap>> = Api::default_namespaced(client);
    let stream = reflector(writer, watcher(meta_api, watcher::Config::default()));
    let task = tokio::spawn(async move {
        let mut s = std::pin::pin!(stream);
        while let Ok(Some(_)) = s.try_next().await {}
    });
    tokio::time::timeout(Duration::from_secs(20), reader.wait_until_ready())
        .await
        .expect("in time")
        .expect("ready");
    api.create(&PostParams::default(), &cm("m2", json!({})))
        .await
        .expect("create");
    eventually("metadata watcher sees m2", || {
        reader.state().iter().any(|o| o.name_any() == "m2")
    })
    .await;
    task.abort();
    server.shutdown().await;
}

#[tokio::test]
async fn metadata_only_answers_for_every_verb() {
    let (server, client) = api_server().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    const AS_META: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
    const AS_META_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
    let send = |method: &str, path: &str, ct: &str, accept: &str, body: &str| {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", ct)
            .header("accept", accept)
            .body(body.as_bytes().to_vec())
            .expect("request");
        let client = client.clone();
        async move {
            let text = client.request_text(req).await.expect("request");
            serde_json::from_str::<serde_json::Value>(&text).expect("json")
        }
    };
    let cms = "/api/v1/namespaces/default/configmaps";
    let json = "application/json";
    let created = send(
        "POST",
        cms,
        json,
        AS_META,
        r#"{"metadata": {"name": "pm", "labels": {"a": "1"}}, "data": {"k": "v"}}"#,
    )
    .await;
    assert_eq!(
        created["kind"], "PartialObjectMetadata",
        "create: {created}"
    );
    assert_eq!(created["apiVersion"], "meta.k8s.io/v1");
    assert!(created.get("data").is_none(), "no data: {created}");
    assert_eq!(created["metadata"]["labels"]["a"], "1");
    let replaced = send(
        "PUT",
        &format!("{cms}/pm"),
        json,
        AS_META,
        r#"{"metadata": {"name": "pm", "labels": {"a": "2"}}, "data": {"k": "w"}}"#,
    )
    .await;
    assert_eq!(
        replaced["kind"], "PartialObjectMetadata",
        "update: {replaced}"
    );
    // kube-rs's patch_metadata (a PATCH answered with metadata only).
    let patched = api
        .patch_metadata(
            "pm",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"b": "3"}}})),
        )
        .await
        .expect("patch metadata");
    assert_eq!(
        patched.types.as_ref().map(|t| t.kind.as_str()),
        Some("PartialObjectMetadata")
    );
    assert_eq!(
        patched
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("b"))
            .map(String::as_str),
        Some("3")
    );
    let deleted = send("DELETE", &format!("{cms}/pm"), json, AS_META, "").await;
    assert_eq!(
        deleted["kind"], "PartialObjectMetadata",
        "delete: {deleted}"
    );
    send(
        "POST",
        cms,
        json,
        AS_META,
        r#"{"metadata": {"name": "pm2", "labels": {"del": "y"}}}"#,
    )
    .await;
    let gone = send(
        "DELETE",
        &format!("{cms}?labelSelector=del%3Dy"),
        json,
        AS_META_LIST,
        "",
    )
    .await;
    assert_eq!(
        gone["kind"], "PartialObjectMetadataList",
        "delete collection: {gone}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn first_watch_of_a_quiet_resource_from_an_older_list_is_not_gone() {
    use k8s_openapi::api::core::v1::Secret;
    let (server, client) = api_server().await;
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    let rv = secrets
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    // Other resources move the global resourceVersion on.
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    for i in 0..3 {
        cms.create(&PostParams::default(), &cm(&format!("q{i}"), json!({})))
            .await
            .expect("create");
    }
    let mut w = secrets
        .watch(&WatchParams::default().timeout(2), &rv)
        .await
        .expect("watch")
        .boxed();
    while let Some(ev) = w.try_next().await.expect("stream") {
        assert!(!matches!(ev, WatchEvent::Error(_)), "unexpected {ev:?}");
    }
    server.shutdown().await;
}

/// As kube-apiserver's watch cache: once events have left a resource's
/// history, a watch is served only from just before the oldest event
/// still kept. A resourceVersion older than that is 410 Expired, `too old
/// resource version: <rv> (<oldest kept - 1>)`, even when every event
/// after it is still there (the embedded server used to deliver those).
#[tokio::test]
async fn a_watch_from_before_the_oldest_kept_event_is_gone_even_when_nothing_after_it_was_lost() {
    let (server, client) = api_server_with(ApiServerConfig {
        history_limit: 2,
        bookmark_interval: Duration::from_secs(3600),
        ..ApiServerConfig::default()
    })
    .await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::default_namespaced(client);
    cms.create(&PostParams::default(), &cm("x", json!({})))
        .await
        .expect("create");
    let seen = cms
        .patch(
            "x",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"n": "1"}})),
        )
        .await
        .expect("patch")
        .metadata
        .resource_version
        .expect("rv");
    // Other resources move the resourceVersion on.
    for i in 0..3 {
        let s: k8s_openapi::api::core::v1::Secret =
            serde_json::from_value(json!({"metadata": {"name": format!("s{i}")}})).expect("secret");
        secrets
            .create(&PostParams::default(), &s)
            .await
            .expect("secret");
    }
    // Two more ConfigMap events push the ones up to `seen` out of a
    // history of two.
    let mut last = String::new();
    for n in 2..4 {
        last = cms
            .patch(
                "x",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"n": n.to_string()}})),
            )
            .await
            .expect("patch")
            .metadata
            .resource_version
            .expect("rv");
    }
    let oldest_kept: u64 = last.parse::<u64>().expect("rv") - 1;
    let mut w = cms
        .watch(&WatchParams::default().timeout(5), &seen)
        .await
        .expect("watch")
        .boxed();
    match w.try_next().await.expect("stream") {
        Some(WatchEvent::Error(e)) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
            assert_eq!(
                e.message,
                format!("too old resource version: {seen} ({})", oldest_kept - 1)
            );
        }
        other => panic!("expected 410 Expired, got {other:?}"),
    }
    // From just before the oldest kept event the history still serves.
    let from = (oldest_kept - 1).to_string();
    let mut w = cms
        .watch(&WatchParams::default().timeout(5), &from)
        .await
        .expect("watch")
        .boxed();
    match w.try_next().await.expect("stream") {
        Some(WatchEvent::Modified(o)) => assert_eq!(o.data.expect("data")["n"], "2"),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    server.shutdown().await;
}

/// kube-rs' watcher, given 410 Gone when it resumes its watch, lists again
/// and converges on the objects as they are: one it never saw an event
/// for is in its store, one deleted meanwhile is not.
#[tokio::test]
async fn kube_rs_watcher_relists_after_410_and_converges() {
    let (server, client) = api_server_with(ApiServerConfig {
        history_limit: 3,
        // No bookmark moves the watcher's resourceVersion on: it resumes
        // from its list's, which the churn below pushes out of history.
        bookmark_interval: Duration::from_secs(3600),
        ..ApiServerConfig::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    api.create(&PostParams::default(), &cm("old", json!({"app": "w"})))
        .await
        .expect("create");
    let inits = Arc::new(Mutex::new(0usize));
    let (reader, writer) = reflector::store();
    let cfg = watcher::Config::default().labels("app=w").timeout(1);
    let stream = reflector(writer, watcher(api.clone(), cfg));
    let counter = inits.clone();
    let task = tokio::spawn(async move {
        let mut s = std::pin::pin!(stream);
        loop {
            match s.next().await {
                Some(Ok(watcher::Event::Init)) => *counter.lock().expect("lock") += 1,
                Some(_) => {}
                None => return,
            }
        }
    });
    let names = || {
        let mut n: Vec<String> = reader
            .state()
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        n.sort();
        n
    };
    eventually("the first listing", || names() == ["old"]).await;
    // While the watcher's watch is down (1 s timeout), churn on objects it
    // does not select pushes its resourceVersion out of the history; the
    // objects it selects change with it.
    for i in 0..6 {
        api.create(&PostParams::default(), &cm(&format!("churn{i}"), json!({})))
            .await
            .expect("churn");
    }
    api.delete("old", &DeleteParams::default())
        .await
        .expect("delete");
    api.create(&PostParams::default(), &cm("new", json!({"app": "w"})))
        .await
        .expect("create");
    for i in 0..6 {
        api.delete(&format!("churn{i}"), &DeleteParams::default())
            .await
            .expect("churn delete");
    }
    eventually("the watcher to relist and converge", || {
        names() == ["new"] && *inits.lock().expect("lock") >= 2
    })
    .await;
    task.abort();
    server.shutdown().await;
}
