//! The EndpointSlice controller against the embedded API server: pods
//! (objects whose status the test writes) selected by a Service become
//! endpoints with their readiness, hostname and resolved named port; a
//! pod going away, or not ready, shows in the slice and in the legacy
//! Endpoints; deleting the Service removes its slices; a Service without a
//! selector keeps its hand-written slices and Endpoints.

mod endpoints_common;

use endpoints_common::Env;
use hostmesh_devcluster::controllers::endpointslice::{MANAGED_BY, MANAGED_BY_LABEL};
use hostmesh_testkit::eventually_ok;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams};

/// `(address, hostname, ready, serving, terminating)` of every endpoint of
/// `svc`'s managed slices, sorted, with each slice's `(name, port)` list.
async fn endpoints(
    env: &Env,
    svc: &str,
) -> Result<
    (
        Vec<(String, Option<String>, bool, bool, bool)>,
        Vec<Vec<(String, i32)>>,
    ),
    String,
> {
    let api: Api<EndpointSlice> = Api::namespaced(env.client.clone(), "default");
    let slices = api
        .list(&ListParams::default().labels(&format!(
            "kubernetes.io/service-name={svc},{MANAGED_BY_LABEL}={MANAGED_BY}"
        )))
        .await
        .map_err(|e| e.to_string())?
        .items;
    let mut eps = Vec::new();
    let mut ports = Vec::new();
    for s in &slices {
        ports.push(
            s.ports
                .iter()
                .flatten()
                .map(|p| {
                    (
                        p.name.clone().unwrap_or_default(),
                        p.port.unwrap_or_default(),
                    )
                })
                .collect(),
        );
        for e in &s.endpoints {
            let c = e.conditions.clone().unwrap_or_default();
            eps.push((
                e.addresses.join(","),
                e.hostname.clone(),
                c.ready == Some(true),
                c.serving == Some(true),
                c.terminating == Some(true),
            ));
        }
    }
    eps.sort();
    Ok((eps, ports))
}

/// The ready and not-ready addresses of the Endpoints object `name`.
async fn legacy(env: &Env, name: &str) -> Result<(Vec<String>, Vec<String>), String> {
    let api: Api<Endpoints> = Api::namespaced(env.client.clone(), "default");
    let ep = api.get(name).await.map_err(|e| e.to_string())?;
    let mut ready = Vec::new();
    let mut not_ready = Vec::new();
    for s in ep.subsets.iter().flatten() {
        ready.extend(s.addresses.iter().flatten().map(|a| a.ip.clone()));
        not_ready.extend(s.not_ready_addresses.iter().flatten().map(|a| a.ip.clone()));
    }
    ready.sort();
    not_ready.sort();
    Ok((ready, not_ready))
}

#[tokio::test(flavor = "multi_thread")]
async fn slices_follow_pods_readiness_hostnames_and_named_ports() {
    let env = Env::start().await;
    let svc = env
        .create::<Service>(
            "metadata: {name: w}\nspec: {clusterIP: None, selector: {app: w}, ports: [{name: rpc, port: 80, targetPort: rpc}]}",
        )
        .await;
    env.pod("w-0", "w", Some("w"), "10.244.1.2").await;
    env.pod("w-1", "w", Some("other"), "10.244.1.3").await;
    env.pod("x-0", "x", Some("w"), "10.244.1.9").await; // not selected
    let want_both = vec![
        (
            "10.244.1.2".to_string(),
            Some("w-0".to_string()),
            true,
            true,
            false,
        ),
        ("10.244.1.3".to_string(), None, true, true, false),
    ];
    let (_, ports) = eventually_ok("both pods as ready endpoints", async || {
        let got = endpoints(&env, "w").await?;
        if got.0 == want_both {
            Ok(got)
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    // The named targetPort resolved to the container port.
    assert_eq!(ports, vec![vec![("rpc".to_string(), 26600)]]);
    let slice_owner = {
        let api: Api<EndpointSlice> = Api::namespaced(env.client.clone(), "default");
        let s = api
            .list(&ListParams::default().labels("kubernetes.io/service-name=w"))
            .await
            .unwrap()
            .items;
        s[0].metadata.owner_references.clone().unwrap()[0]
            .uid
            .clone()
    };
    assert_eq!(Some(slice_owner), svc.metadata.uid);

    // The legacy Endpoints object says the same.
    eventually_ok("Endpoints w with both addresses", async || {
        let (ready, not_ready) = legacy(&env, "w").await?;
        if ready == ["10.244.1.2", "10.244.1.3"] && not_ready.is_empty() {
            Ok(())
        } else {
            Err(format!("{ready:?} {not_ready:?}"))
        }
    })
    .await;

    // Not ready: still listed, ready and serving false.
    env.set_status("w-1", "10.244.1.3", false).await;
    eventually_ok("w-1 not ready", async || {
        let got = endpoints(&env, "w").await?.0;
        if got.get(1).is_some_and(|e| !e.2 && !e.3) {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;

    eventually_ok("Endpoints w with w-1 not ready", async || {
        let (ready, not_ready) = legacy(&env, "w").await?;
        if ready == ["10.244.1.2"] && not_ready == ["10.244.1.3"] {
            Ok(())
        } else {
            Err(format!("{ready:?} {not_ready:?}"))
        }
    })
    .await;

    // Deleted (unbound, so at once): gone from the slice.
    env.pods()
        .delete("w-0", &DeleteParams::default())
        .await
        .unwrap();
    eventually_ok("w-0 gone", async || {
        let got = endpoints(&env, "w").await?.0;
        if got.len() == 1 && got[0].0 == "10.244.1.3" {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;

    // Deleting the Service removes its slices (ownerReference, GC).
    Api::<Service>::namespaced(env.client.clone(), "default")
        .delete("w", &DeleteParams::default())
        .await
        .unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(env.client.clone(), "default");
    eventually_ok("slices of w removed", async || {
        let n = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=w"))
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} slices left"))
        }
    })
    .await;
    if let Some(c) = env.controllers {
        c.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn services_without_selector_keep_their_own_slices() {
    let env = Env::start().await;
    env.create::<Service>("metadata: {name: manual}\nspec: {ports: [{port: 80}]}")
        .await;
    env.create::<EndpointSlice>(
        "metadata: {name: manual-1, labels: {kubernetes.io/service-name: manual}}\naddressType: IPv4\nendpoints: [{addresses: [10.244.2.2]}]",
    )
    .await;
    env.create::<Endpoints>(
        "metadata: {name: manual}\nsubsets: [{addresses: [{ip: 10.244.2.3}], ports: [{port: 80}]}]",
    )
    .await;
    // A selector Service reconciled after it shows the controller ran.
    env.create::<Service>("metadata: {name: sel}\nspec: {selector: {app: s}, ports: [{port: 80}]}")
        .await;
    eventually_ok("placeholder slice of sel", async || {
        let (eps, ports) = endpoints(&env, "sel").await?;
        if eps.is_empty() && ports.len() == 1 {
            Ok(())
        } else {
            Err(format!("{eps:?} {ports:?}"))
        }
    })
    .await;
    let slices: Api<EndpointSlice> = Api::namespaced(env.client.clone(), "default");
    let manual = slices.get("manual-1").await.expect("manual slice kept");
    assert_eq!(
        legacy(&env, "manual").await.unwrap(),
        (vec!["10.244.2.3".to_string()], vec![]),
        "a hand-written Endpoints is left alone"
    );
    assert_eq!(manual.endpoints[0].addresses, ["10.244.2.2"]);
    assert!(
        endpoints(&env, "manual").await.unwrap().1.is_empty(),
        "no managed slice for a Service without selector"
    );
}
