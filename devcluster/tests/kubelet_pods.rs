//! Pods run as local processes: init containers then containers, emptyDir,
//! secret and configMap volumes at their mount paths (private mount
//! namespaces), env from the downward API, secrets and config maps, `$(VAR)`
//! expansion, the image table, exit codes and restart counts.

mod kubelet_common;

use hostmesh_devcluster::kubelet::ImageEntry;
use hostmesh_testkit::eventually_async;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kubelet_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_container_output_is_read_by_the_main_container() {
    let c = Cluster::start(231).await;
    c.create_pod(
        r#"
metadata: {name: init-demo}
spec:
  restartPolicy: Never
  volumes: [{name: work, emptyDir: {}}]
  initContainers:
  - name: writer
    image: busybox
    command: [sh, -c, 'echo "from init in $(POD_NAME)" > /hostmesh-kubelet-test/work/msg']
    env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
    volumeMounts: [{name: work, mountPath: /hostmesh-kubelet-test/work}]
  containers:
  - name: reader
    image: busybox
    command: [cat, /hostmesh-kubelet-test/work/msg]
    volumeMounts: [{name: work, mountPath: /hostmesh-kubelet-test/work, readOnly: true}]
"#,
    )
    .await;
    let pod = c
        .wait_pod("init-demo", "phase Succeeded", |p| phase(p) == "Succeeded")
        .await;
    assert_eq!(condition(&pod, "Initialized").as_deref(), Some("True"));
    let init = container(&pod, "writer").unwrap();
    let term = init.state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(
        (term.exit_code, term.reason.as_deref()),
        (0, Some("Completed"))
    );
    let logs = c
        .kubelet()
        .logs("default", "init-demo", "reader", None)
        .unwrap();
    assert_eq!(logs, "from init in init-demo\n");
    assert!(
        !std::path::Path::new("/hostmesh-kubelet-test/work/msg").exists(),
        "the emptyDir mount leaked into the host mount namespace"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_and_volumes_come_from_fieldrefs_secrets_and_configmaps() {
    let c = Cluster::start(232).await;
    c.create::<Secret>("metadata: {name: agent}\nstringData: {token: s3cret}\n")
        .await;
    c.create::<ConfigMap>(
        "metadata: {name: settings}\ndata: {mode: fast, level: '7', app.conf: 'x=1'}\n",
    )
    .await;
    c.create_pod(
        r#"
metadata: {name: env-demo, labels: {app: demo}}
spec:
  restartPolicy: Never
  volumes:
  - {name: secret, secret: {secretName: agent}}
  - {name: conf, configMap: {name: settings, items: [{key: app.conf, path: etc/app.conf, mode: 0o600}]}}
  containers:
  - name: main
    image: busybox
    workingDir: /var/run/hostmesh/secret
    command: [sh, -c]
    args:
    - |
      echo "ip=$POD_IP name=$POD_NAME ns=$POD_NS node=$NODE app=$APP"
      echo "token=$TOKEN mode=$MODE cfg_level=$CFG_level url=$URL"
      echo 'arg=$(POD_NAME) escaped=$$(POD_NAME)'
      echo "file=$(cat token) pwd=$(pwd)"
      echo "conf=$(cat /hostmesh-kubelet-test/etc/etc/app.conf) mode=$(stat -c %a /hostmesh-kubelet-test/etc/etc/app.conf)"
      touch /var/run/hostmesh/secret/x 2>/dev/null && echo writable || echo readonly
      echo "api=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"
    env:
    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: POD_NS, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
    - {name: APP, valueFrom: {fieldRef: {fieldPath: "metadata.labels['app']"}}}
    - {name: TOKEN, valueFrom: {secretKeyRef: {name: agent, key: token}}}
    - {name: MODE, valueFrom: {configMapKeyRef: {name: settings, key: mode}}}
    - {name: URL, value: "http://$(POD_IP):26600"}
    envFrom: [{configMapRef: {name: settings}, prefix: CFG_}]
    volumeMounts:
    - {name: secret, mountPath: /var/run/hostmesh/secret, readOnly: true}
    - {name: conf, mountPath: /hostmesh-kubelet-test/etc}
"#,
    )
    .await;
    let pod = c
        .wait_pod("env-demo", "phase Succeeded", |p| phase(p) == "Succeeded")
        .await;
    let ip = pod.status.as_ref().unwrap().pod_ip.clone().unwrap();
    let cidr = c.pod_cidr().await;
    assert!(
        cidr.contains(ip.parse().unwrap()),
        "pod IP {ip} is not from the node's podCIDR {cidr}"
    );
    let logs = c
        .kubelet()
        .logs("default", "env-demo", "main", None)
        .unwrap();
    let expected = format!(
        "ip={ip} name=env-demo ns=default node={node} app=demo\n\
         token=s3cret mode=fast cfg_level=7 url=http://{ip}:26600\n\
         arg=env-demo escaped=$(POD_NAME)\n\
         file=s3cret pwd={run}/hostmesh/secret\n\
         conf=x=1 mode=600\n\
         readonly\n\
         api=10.96.0.1:443\n",
        node = c.node,
        // /var/run is often a symlink to /run.
        run = std::fs::canonicalize("/var/run").unwrap().display(),
    );
    assert_eq!(logs, expected);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_credentials_reach_the_api_server_as_the_service_account() {
    // What kube-rs' in-cluster config reads: the service host and port from
    // the environment, the token, CA and namespace from the volume the API
    // server's admission added; curl checks the certificate against the CA.
    let c = Cluster::start(250).await;
    c.create_pod(
        r#"
metadata: {name: in-cluster}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox
    command: [sh, -c]
    args:
    - |
      d=/var/run/secrets/kubernetes.io/serviceaccount
      api=https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
      auth="Authorization: Bearer $(cat $d/token)"
      echo "ns=$(cat $d/namespace) api=$api"
      touch $d/x 2>/dev/null && echo writable || echo readonly
      curl -sS --cacert $d/ca.crt -H "$auth" -H 'Content-Type: application/json' -X POST \
        -d '{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}' \
        $api/apis/authentication.k8s.io/v1/selfsubjectreviews
      echo
      curl -sS --cacert $d/ca.crt -H "$auth" $api/api/v1/namespaces/$(cat $d/namespace)/pods
"#,
    )
    .await;
    c.wait_pod("in-cluster", "phase Succeeded", |p| phase(p) == "Succeeded")
        .await;
    let logs = c
        .kubelet()
        .logs("default", "in-cluster", "main", None)
        .unwrap();
    let mut lines = logs.lines();
    assert_eq!(
        lines.next(),
        Some("ns=default api=https://10.96.0.1:443"),
        "{logs}"
    );
    assert_eq!(lines.next(), Some("readonly"), "{logs}");
    let me: serde_json::Value =
        serde_json::from_str(lines.next().unwrap_or("")).expect("whoami JSON");
    assert_eq!(
        me["status"]["userInfo"]["username"], "system:serviceaccount:default:default",
        "{logs}"
    );
    let denied: serde_json::Value =
        serde_json::from_str(lines.next().unwrap_or("")).expect("Status JSON");
    assert_eq!(denied["code"], 403, "{logs}");
    assert_eq!(
        denied["message"],
        r#"pods is forbidden: User "system:serviceaccount:default:default" cannot list resource "pods" in API group "" in the namespace "default""#
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_secret_is_reported_until_it_exists() {
    let c = Cluster::start(233).await;
    c.create_pod(
        r#"
metadata: {name: waits-for-secret}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox
    command: [sh, -c, 'echo got $TOKEN']
    env: [{name: TOKEN, valueFrom: {secretKeyRef: {name: later, key: token}}}]
"#,
    )
    .await;
    let pod = c
        .wait_pod("waits-for-secret", "CreateContainerConfigError", |p| {
            container(p, "main")
                .and_then(|s| s.state.as_ref()?.waiting.as_ref()?.reason.clone())
                .as_deref()
                == Some("CreateContainerConfigError")
        })
        .await;
    let waiting = container(&pod, "main")
        .unwrap()
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    let message = waiting.message.unwrap_or_default();
    assert!(
        message.contains("spec.containers[0].env[0].valueFrom.secretKeyRef")
            && message.contains("later"),
        "{message}"
    );
    assert_eq!(phase(&pod), "Pending");
    c.create::<Secret>("metadata: {name: later}\nstringData: {token: abc}\n")
        .await;
    c.wait_pod("waits-for-secret", "phase Succeeded", |p| {
        phase(p) == "Succeeded"
    })
    .await;
    assert_eq!(
        c.kubelet()
            .logs("default", "waits-for-secret", "main", None)
            .unwrap(),
        "got abc\n"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_and_restart_counts_follow_the_restart_policy() {
    let c = Cluster::start(234).await;
    c.create_pod(
        "metadata: {name: never}\nspec:\n  restartPolicy: Never\n  containers:\n  - {name: main, image: busybox, command: [sh, -c, 'echo bye >&2; exit 3']}\n",
    )
    .await;
    c.create_pod(
        r#"
metadata: {name: on-failure}
spec:
  restartPolicy: OnFailure
  volumes: [{name: state, emptyDir: {}}]
  containers:
  - name: main
    image: busybox
    command: [sh, -c, 'n=$(cat /hostmesh-kubelet-test/state/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /hostmesh-kubelet-test/state/n; echo run $n; [ $n -ge 3 ] && exit 0; exit 1']
    volumeMounts: [{name: state, mountPath: /hostmesh-kubelet-test/state}]
"#,
    )
    .await;
    c.create_pod(
        "metadata: {name: always}\nspec:\n  containers:\n  - {name: main, image: busybox, command: [sh, -c, 'exit 0']}\n",
    )
    .await;
    c.create_pod(
        "metadata: {name: bad-init}\nspec:\n  restartPolicy: Never\n  initContainers:\n  - {name: setup, image: busybox, command: [sh, -c, 'exit 5']}\n  containers:\n  - {name: main, image: busybox, command: [sh, -c, 'echo must not run']}\n",
    )
    .await;

    let never = c
        .wait_pod("never", "phase Failed", |p| phase(p) == "Failed")
        .await;
    let s = container(&never, "main").unwrap();
    let t = s.state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(
        (t.exit_code, t.reason.as_deref(), s.restart_count),
        (3, Some("Error"), 0)
    );
    assert_eq!(
        c.kubelet().logs("default", "never", "main", None).unwrap(),
        "bye\n"
    );

    let bad = c
        .wait_pod("bad-init", "phase Failed", |p| phase(p) == "Failed")
        .await;
    let setup = container(&bad, "setup")
        .unwrap()
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(setup.exit_code, 5);
    assert_eq!(condition(&bad, "Initialized").as_deref(), Some("False"));
    let main = container(&bad, "main").unwrap().state.clone().unwrap();
    assert!(main.waiting.is_some(), "main must never start: {main:?}");

    let of = c
        .wait_pod("on-failure", "phase Succeeded", |p| phase(p) == "Succeeded")
        .await;
    let s = container(&of, "main").unwrap();
    assert_eq!(s.restart_count, 2);
    let last = s.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(last.exit_code, 1);
    assert_eq!(
        c.kubelet()
            .logs("default", "on-failure", "main", None)
            .unwrap(),
        "run 3\n"
    );
    assert_eq!(
        c.kubelet()
            .previous_logs("default", "on-failure", "main", None)
            .unwrap(),
        "run 2\n"
    );

    let always = c
        .wait_pod("always", "two restarts", |p| {
            container(p, "main").is_some_and(|s| s.restart_count >= 2)
        })
        .await;
    assert_eq!(phase(&always), "Running");
    let last = container(&always, "main")
        .unwrap()
        .last_state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(
        (last.exit_code, last.reason.as_deref()),
        (0, Some("Completed"))
    );

    // Restarts are recorded as Events, as `kubectl describe pod` shows them.
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(c.client.clone(), "default");
    eventually_async("a BackOff event for pod always", async || {
        let list = events.list(&Default::default()).await.unwrap();
        let backoff = list.items.iter().any(|e| {
            e.reason.as_deref() == Some("BackOff")
                && e.involved_object.name.as_deref() == Some("always")
                && e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("kubelet")
        });
        backoff.then_some(())
    })
    .await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_map_to_programs_through_the_table() {
    let c = Cluster::start_with(235, |cfg| {
        cfg.images.push(ImageEntry {
            image: "example.com/echo*".into(),
            program: "/bin/echo".into(),
            args: vec!["default".into(), "args".into()],
        });
    })
    .await;
    c.create_pod(
        "metadata: {name: mapped}\nspec:\n  restartPolicy: Never\n  containers:\n  - {name: a, image: 'example.com/echo:1'}\n  - {name: b, image: 'example.com/echo:2', args: [given, $(X)], env: [{name: X, value: x}]}\n",
    )
    .await;
    c.create_pod(
        "metadata: {name: unmapped}\nspec:\n  containers:\n  - {name: main, image: 'nginx:1.27'}\n",
    )
    .await;
    c.wait_pod("mapped", "phase Succeeded", |p| phase(p) == "Succeeded")
        .await;
    assert_eq!(
        c.kubelet().logs("default", "mapped", "a", None).unwrap(),
        "default args\n"
    );
    assert_eq!(
        c.kubelet().logs("default", "mapped", "b", None).unwrap(),
        "given x\n"
    );
    let pod = c
        .wait_pod("unmapped", "ErrImageNeverPull", |p| {
            container(p, "main")
                .and_then(|s| s.state.as_ref()?.waiting.as_ref()?.reason.clone())
                .as_deref()
                == Some("ErrImageNeverPull")
        })
        .await;
    let message = container(&pod, "main")
        .unwrap()
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap()
        .message
        .unwrap();
    assert!(
        message.contains("nginx:1.27") && message.contains("--image-table"),
        "{message}"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_run_as_the_security_context_user() {
    let c = Cluster::start(245).await;
    c.create_pod(
        r#"
metadata: {name: nobody}
spec:
  restartPolicy: Never
  securityContext: {runAsUser: 65534, runAsGroup: 65534, fsGroup: 2000}
  volumes: [{name: scratch, emptyDir: {}}]
  initContainers:
  - name: root-setup
    image: busybox
    securityContext: {runAsUser: 0}
    command: [sh, -c, 'id -u > /hostmesh-kubelet-test/scratch/setup-uid']
    volumeMounts: [{name: scratch, mountPath: /hostmesh-kubelet-test/scratch}]
  containers:
  - name: main
    image: busybox
    command: [sh, -c, 'echo "$(id -u):$(id -g):$(id -G) setup=$(cat setup-uid)"; echo hi > mine && echo wrote']
    workingDir: /hostmesh-kubelet-test/scratch
    volumeMounts: [{name: scratch, mountPath: /hostmesh-kubelet-test/scratch}]
"#,
    )
    .await;
    c.wait_pod("nobody", "phase Succeeded", |p| phase(p) == "Succeeded")
        .await;
    assert_eq!(
        c.kubelet().logs("default", "nobody", "main", None).unwrap(),
        "65534:65534:65534 2000 setup=0\nwrote\n"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_paths_mount_one_file_or_directory_of_a_volume() {
    let c = Cluster::start(249).await;
    c.create::<ConfigMap>("metadata: {name: files}\ndata: {app.conf: 'x=2', other: 'no'}\n")
        .await;
    c.create_pod(
        r#"
metadata: {name: subpaths}
spec:
  restartPolicy: Never
  volumes:
  - {name: conf, configMap: {name: files}}
  - {name: data, emptyDir: {}}
  initContainers:
  - name: seed
    image: busybox
    command: [sh, -c, 'mkdir -p /hostmesh-kubelet-test/all/part && echo seeded > /hostmesh-kubelet-test/all/part/f']
    volumeMounts: [{name: data, mountPath: /hostmesh-kubelet-test/all}]
  containers:
  - name: main
    image: busybox
    command: [sh, -c, 'cat /hostmesh-kubelet-test/sub/app.conf; echo; cat /hostmesh-kubelet-test/part/f; ls /hostmesh-kubelet-test/sub']
    volumeMounts:
    - {name: conf, mountPath: /hostmesh-kubelet-test/sub/app.conf, subPath: app.conf}
    - {name: data, mountPath: /hostmesh-kubelet-test/part, subPath: part}
"#,
    )
    .await;
    c.wait_pod("subpaths", "phase Succeeded", |p| phase(p) == "Succeeded")
        .await;
    assert_eq!(
        c.kubelet()
            .logs("default", "subpaths", "main", None)
            .unwrap(),
        "x=2\nseeded\napp.conf\n"
    );
    c.stop().await;
}
