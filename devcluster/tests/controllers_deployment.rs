//! The Deployment and ReplicaSet controllers against the real embedded API
//! server and process kubelet (real `sleep` processes on loopback): rollout
//! to Available, scale up and down, a template change rolling to a new
//! ReplicaSet (RollingUpdate and Recreate), `kubectl rollout status`, and
//! deletion cascading to every pod.

mod kubelet_common;

use hostmesh_devcluster::controllers;
use hostmesh_testkit::{eventually_async, eventually_ok};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kubelet_common::Cluster;

fn deployment_yaml(name: &str, replicas: i32, arg: &str, strategy: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  replicas: {replicas}\n  strategy: {strategy}\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec:\n      terminationGracePeriodSeconds: 2\n      containers:\n      - name: main\n        image: busybox\n        command: [sleep, \"{arg}\"]\n"
    )
}

/// Waits until the Deployment reports every replica updated and available
/// for its current generation, with the conditions Helm's kstatus reads.
async fn wait_complete(c: &Cluster, name: &str, replicas: i32) -> Deployment {
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    eventually_ok(
        &format!("deployment {name} complete with {replicas}"),
        async || {
            let d = api.get(name).await.map_err(|e| e.to_string())?;
            let s = d.status.clone().unwrap_or_default();
            let cond = |t: &str| {
                s.conditions
                    .iter()
                    .flatten()
                    .find(|c| c.type_ == t)
                    .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
            };
            let ok = s.observed_generation == d.metadata.generation
                && s.replicas == Some(replicas)
                && s.updated_replicas == Some(replicas)
                && s.ready_replicas == Some(replicas)
                && s.available_replicas == Some(replicas)
                && cond("Available").is_some_and(|c| c.0 == "True")
                && cond("Progressing") == Some(("True".into(), "NewReplicaSetAvailable".into()));
            if ok { Ok(d) } else { Err(format!("{s:?}")) }
        },
    )
    .await
}

/// Running, not terminating pods of deployment `name`, with their template hash.
async fn live_pods(c: &Cluster, name: &str) -> Vec<Pod> {
    c.pods()
        .list(&ListParams::default().labels(&format!("app={name}")))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

fn hash_of(p: &Pod) -> String {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("pod-template-hash").cloned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn deployment_rolls_scales_and_cascades() {
    let c = Cluster::start(230).await;
    let ctl = controllers::start(c.client.clone());
    let name = "web";
    c.create::<Deployment>(&deployment_yaml(
        name,
        2,
        "3600",
        "{type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}",
    ))
    .await;
    let d = wait_complete(&c, name, 2).await;
    let uid = d.metadata.uid.clone().unwrap();

    // One ReplicaSet, owned by the Deployment, named and labelled by the hash.
    let rs_api: Api<ReplicaSet> = Api::namespaced(c.client.clone(), "default");
    let rss = rs_api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(rss.len(), 1, "{rss:#?}");
    let rs = &rss[0];
    let hash = rs.metadata.labels.as_ref().unwrap()["pod-template-hash"].clone();
    assert_eq!(
        rs.metadata.name.as_deref(),
        Some(format!("{name}-{hash}").as_str())
    );
    let owner = &rs.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.uid.as_str(), owner.controller),
        (uid.as_str(), Some(true))
    );
    let pods = live_pods(&c, name).await;
    assert_eq!(pods.len(), 2);
    for p in &pods {
        assert_eq!(hash_of(p), hash);
        let o = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(o.uid, rs.metadata.uid.clone().unwrap());
        assert_eq!(kubelet_common::phase(p), "Running");
    }

    // kubectl understands the status.
    let kubeconfig = c.dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, c.api.as_ref().unwrap().kubeconfig_yaml()).unwrap();
    let out = std::process::Command::new("kubectl")
        .env("KUBECONFIG", &kubeconfig)
        .args([
            "rollout",
            "status",
            "deployment/web",
            "-n",
            "default",
            "--timeout=60s",
        ])
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("successfully rolled out"));

    // Scale up and down.
    let dapi: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    let scale = |n: i32| serde_json::json!({"spec": {"replicas": n}});
    dapi.patch(name, &PatchParams::default(), &Patch::Merge(scale(3)))
        .await
        .unwrap();
    wait_complete(&c, name, 3).await;
    let three = live_pods(&c, name).await;
    assert_eq!(three.len(), 3);
    // A deleted pod is replaced by a new one.
    let victim = three[0].metadata.name.clone().unwrap();
    c.pods()
        .delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    eventually_ok("the deleted pod replaced", async || {
        let pods = live_pods(&c, name).await;
        let replaced = pods.len() == 3
            && pods
                .iter()
                .all(|p| p.metadata.name.as_deref() != Some(victim.as_str()));
        if replaced {
            Ok(())
        } else {
            Err(format!("{} pods", pods.len()))
        }
    })
    .await;
    wait_complete(&c, name, 3).await;
    dapi.patch(name, &PatchParams::default(), &Patch::Merge(scale(1)))
        .await
        .unwrap();
    wait_complete(&c, name, 1).await;
    eventually_ok("one pod after scaling down", async || {
        let n = live_pods(&c, name).await.len();
        if n == 1 {
            Ok(())
        } else {
            Err(format!("{n} pods"))
        }
    })
    .await;

    // A template change rolls to a new ReplicaSet; the old one ends at 0.
    let roll = serde_json::json!({"spec": {"template": {"spec": {"containers": [
        {"name": "main", "image": "busybox", "command": ["sleep", "3601"]}]}}}});
    dapi.patch(name, &PatchParams::default(), &Patch::Strategic(roll))
        .await
        .unwrap();
    // maxSurge 1, maxUnavailable 0: never more than 2 live pods, and a
    // Ready pod at every moment, until only a new-template pod is left.
    eventually_async("the rollout to finish", async || {
        let pods = live_pods(&c, name).await;
        let ready = pods
            .iter()
            .filter(|p| kubelet_common::condition(p, "Ready").as_deref() == Some("True"))
            .count();
        assert!(pods.len() <= 2, "{} live pods: surge above 1", pods.len());
        assert!(ready >= 1, "no Ready pod during the rollout");
        (pods.len() == 1 && hash_of(&pods[0]) != hash && ready == 1).then_some(())
    })
    .await;
    wait_complete(&c, name, 1).await;
    let rss = rs_api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(rss.len(), 2, "{rss:#?}");
    let new = rss
        .iter()
        .find(|r| r.metadata.labels.as_ref().unwrap()["pod-template-hash"] != hash)
        .unwrap();
    let old = rss
        .iter()
        .find(|r| r.metadata.labels.as_ref().unwrap()["pod-template-hash"] == hash)
        .unwrap();
    assert_eq!(old.spec.as_ref().unwrap().replicas, Some(0));
    assert_eq!(
        new.metadata.annotations.as_ref().unwrap()["deployment.kubernetes.io/revision"],
        "2"
    );
    let new_hash = new.metadata.labels.as_ref().unwrap()["pod-template-hash"].clone();
    eventually_ok("only new-template pods", async || {
        let pods = live_pods(&c, name).await;
        if pods.len() == 1 && hash_of(&pods[0]) == new_hash {
            Ok(())
        } else {
            Err(format!("{} pods", pods.len()))
        }
    })
    .await;

    // Deleting the Deployment cascades to the ReplicaSets and pods.
    dapi.delete(name, &DeleteParams::default()).await.unwrap();
    eventually_ok("every pod and replicaset gone", async || {
        let pods = c
            .pods()
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        let rss = rs_api
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        if pods == 0 && rss == 0 {
            Ok(())
        } else {
            Err(format!("{pods} pods, {rss} replicasets"))
        }
    })
    .await;
    ctl.shutdown().await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn recreate_stops_old_pods_before_new_ones_start() {
    let c = Cluster::start(229).await;
    let ctl = controllers::start(c.client.clone());
    let name = "batch";
    c.create::<Deployment>(&deployment_yaml(name, 2, "3600", "{type: Recreate}"))
        .await;
    wait_complete(&c, name, 2).await;
    let old_hash = hash_of(&live_pods(&c, name).await[0]);
    let dapi: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    let roll = serde_json::json!({"spec": {"template": {"metadata": {"labels": {"app": name, "v": "2"}}}}});
    dapi.patch(name, &PatchParams::default(), &Patch::Merge(roll))
        .await
        .unwrap();
    // Never a new-template pod alongside an old one, even a terminating one.
    eventually_ok("the recreate to finish", async || {
        let pods = c
            .pods()
            .list(&ListParams::default().labels(&format!("app={name}")))
            .await
            .unwrap()
            .items;
        let old = pods.iter().filter(|p| hash_of(p) == old_hash).count();
        let new = pods.len() - old;
        assert!(old == 0 || new == 0, "{old} old and {new} new pods at once");
        if old == 0 && new == 2 {
            Ok(())
        } else {
            Err(format!("{old} old, {new} new"))
        }
    })
    .await;
    wait_complete(&c, name, 2).await;
    ctl.shutdown().await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_rollout_exceeds_its_progress_deadline() {
    let c = Cluster::start(228).await;
    let ctl = controllers::start(c.client.clone());
    let yaml = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: stuck}\nspec:\n  replicas: 1\n  progressDeadlineSeconds: 2\n  selector: {matchLabels: {app: stuck}}\n  template:\n    metadata: {labels: {app: stuck}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers:\n      - name: main\n        image: busybox\n        command: [sleep, \"3600\"]\n        readinessProbe: {exec: {command: [\"false\"]}, periodSeconds: 1}\n";
    c.create::<Deployment>(yaml).await;
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    eventually_ok("Progressing=False ProgressDeadlineExceeded", async || {
        let d = api.get("stuck").await.map_err(|e| e.to_string())?;
        let s = d.status.unwrap_or_default();
        let p = s
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Progressing")
            .cloned();
        let a = s
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Available")
            .cloned();
        let ok = p.as_ref().is_some_and(|p| {
            p.status == "False" && p.reason.as_deref() == Some("ProgressDeadlineExceeded")
        }) && a.is_some_and(|a| a.status == "False")
            && s.available_replicas == Some(0)
            && s.replicas == Some(1);
        if ok {
            Ok(())
        } else {
            Err(format!("{:?}", s.conditions))
        }
    })
    .await;
    // kubectl reports the failure instead of waiting forever.
    let kubeconfig = c.dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, c.api.as_ref().unwrap().kubeconfig_yaml()).unwrap();
    let out = std::process::Command::new("kubectl")
        .env("KUBECONFIG", &kubeconfig)
        .args([
            "rollout",
            "status",
            "deployment/stuck",
            "-n",
            "default",
            "--timeout=60s",
        ])
        .output()
        .expect("kubectl runs");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exceeded its progress deadline"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ctl.shutdown().await;
    c.stop().await;
}
