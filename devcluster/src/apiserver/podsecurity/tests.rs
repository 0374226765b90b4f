//! PodSecurity admission tests: every check against the real server's
//! messages, levels from labels, and warnings.

use serde_json::json;

use super::*;

/// A pod that meets `restricted`: non-root, seccomp RuntimeDefault on
/// the pod, every container dropping ALL without escalation.
fn compliant() -> Value {
    let sc = json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
    json!({
        "metadata": {"name": "p"},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "initContainers": [{"name": "i", "image": "x", "securityContext": sc}],
            "containers": [{"name": "c", "image": "x", "securityContext": sc}],
            "volumes": [
                {"name": "s", "secret": {"secretName": "s", "defaultMode": 288}},
                {"name": "e", "emptyDir": {}},
                {"name": "kube-api-access-abcde", "projected": {"sources": []}},
            ],
        },
    })
}

fn with(mut pod: Value, path: &str, v: Value) -> Value {
    let mut cur = &mut pod;
    for part in path.split('/') {
        cur = match part.parse::<usize>() {
            Ok(i) => &mut cur[i],
            Err(_) => &mut cur[part],
        };
    }
    *cur = v;
    pod
}

fn check(level: Level, pod: &Value) -> Vec<Violation> {
    evaluate(level, &pod["spec"], pod.pointer("/metadata/annotations"))
}

/// The rendered `reason (detail)` list for a pod at a level.
fn msg(level: Level, pod: &Value) -> String {
    render(&check(level, pod))
}

#[test]
fn a_compliant_pod_passes_every_level() {
    for level in [Level::Privileged, Level::Baseline, Level::Restricted] {
        assert_eq!(check(level, &compliant()), vec![], "{level:?}");
    }
}

#[test]
fn a_minimal_pod_passes_baseline_and_fails_restricted_as_the_real_server_says() {
    let pod =
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}});
    assert_eq!(msg(Level::Baseline, &pod), "");
    assert_eq!(
        msg(Level::Restricted, &pod),
        "allowPrivilegeEscalation != false (container \"c\" must set securityContext.allowPrivilegeEscalation=false), \
         unrestricted capabilities (container \"c\" must set securityContext.capabilities.drop=[\"ALL\"]), \
         runAsNonRoot != true (pod or container \"c\" must set securityContext.runAsNonRoot=true), \
         seccompProfile (pod or container \"c\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
    );
}

#[test]
fn host_namespaces_are_baseline_violations() {
    let pod = with(compliant(), "spec/hostNetwork", json!(true));
    let pod = with(pod, "spec/hostIPC", json!(true));
    assert_eq!(
        msg(Level::Baseline, &pod),
        "host namespaces (hostNetwork=true, hostIPC=true)"
    );
    assert_eq!(
        msg(Level::Restricted, &pod),
        "host namespaces (hostNetwork=true, hostIPC=true)"
    );
}

#[test]
fn privileged_containers_are_named() {
    let pod = with(
        compliant(),
        "spec/containers/0/securityContext/privileged",
        json!(true),
    );
    let pod = with(
        pod,
        "spec/initContainers/0/securityContext/privileged",
        json!(true),
    );
    assert_eq!(
        msg(Level::Baseline, &pod),
        "privileged (containers \"i\", \"c\" must not set securityContext.privileged=true)"
    );
}

#[test]
fn capabilities_beyond_the_default_set_fail_baseline_and_restricted_differently() {
    let pod = with(
        compliant(),
        "spec/containers/0/securityContext/capabilities/add",
        json!(["SYS_ADMIN", "CHOWN", "NET_BIND_SERVICE"]),
    );
    assert_eq!(
        msg(Level::Baseline, &pod),
        "non-default capabilities (container \"c\" must not include \"SYS_ADMIN\" in securityContext.capabilities.add)"
    );
    assert_eq!(
        msg(Level::Restricted, &pod),
        "unrestricted capabilities (container \"c\" must not include \"CHOWN\", \"SYS_ADMIN\" in securityContext.capabilities.add)"
    );
    let no_drop = with(
        compliant(),
        "spec/initContainers/0/securityContext/capabilities",
        json!({"drop": ["NET_RAW"]}),
    );
    assert_eq!(
        msg(Level::Restricted, &no_drop),
        "unrestricted capabilities (container \"i\" must set securityContext.capabilities.drop=[\"ALL\"])"
    );
}

#[test]
fn host_path_volumes_fail_baseline_and_restricted_volume_types() {
    let pod = with(
        compliant(),
        "spec/volumes/1",
        json!({"name": "h", "hostPath": {"path": "/"}}),
    );
    let pod = with(
        pod,
        "spec/volumes/0",
        json!({"name": "n", "nfs": {"server": "x", "path": "/"}}),
    );
    assert_eq!(
        msg(Level::Baseline, &pod),
        "hostPath volumes (volume \"h\")"
    );
    assert_eq!(
        msg(Level::Restricted, &pod),
        "restricted volume types (volumes \"n\", \"h\" use restricted volume types \"hostPath\", \"nfs\")"
    );
}

#[test]
fn host_ports_are_listed() {
    let pod = with(
        compliant(),
        "spec/containers/0/ports",
        json!([{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81}]),
    );
    assert_eq!(
        msg(Level::Baseline, &pod),
        "hostPort (container \"c\" uses hostPort 8080)"
    );
}

#[test]
fn app_armor_unconfined_by_field_or_annotation() {
    let pod = with(
        compliant(),
        "spec/containers/0/securityContext/appArmorProfile",
        json!({"type": "Unconfined"}),
    );
    assert_eq!(
        msg(Level::Baseline, &pod),
        "forbidden AppArmor profile (container \"c\" must not set AppArmor profile type to \"Unconfined\")"
    );
    let pod = with(
        compliant(),
        "metadata/annotations",
        json!({"container.apparmor.security.beta.kubernetes.io/c": "unconfined",
               "container.apparmor.security.beta.kubernetes.io/i": "runtime/default"}),
    );
    assert_eq!(
        msg(Level::Baseline, &pod),
        "forbidden AppArmor profile (container.apparmor.security.beta.kubernetes.io/c=\"unconfined\")"
    );
}

#[test]
fn se_linux_type_user_and_role() {
    let pod = with(
        compliant(),
        "spec/securityContext/seLinuxOptions",
        json!({"type": "spc_t", "user": "u"}),
    );
    let pod = with(
        pod,
        "spec/containers/0/securityContext/seLinuxOptions",
        json!({"role": "r", "type": "container_t"}),
    );
    assert_eq!(
        msg(Level::Baseline, &pod),
        "seLinuxOptions (pod and container \"c\" set forbidden securityContext.seLinuxOptions: type \"spc_t\"; user may not be set; role may not be set)"
    );
}

#[test]
fn proc_mount_unmasked() {
    let pod = with(
        compliant(),
        "spec/containers/0/securityContext/procMount",
        json!("Unmasked"),
    );
    assert_eq!(
        msg(Level::Baseline, &pod),
        "procMount (container \"c\" sets forbidden securityContext.procMount value \"Unmasked\")"
    );
}

#[test]
fn seccomp_unconfined_and_missing() {
    let pod = with(
        compliant(),
        "spec/containers/0/securityContext/seccompProfile",
        json!({"type": "Unconfined"}),
    );
    assert_eq!(
        msg(Level::Baseline, &pod),
        "seccompProfile (container \"c\" must not set securityContext.seccompProfile.type to \"Unconfined\")"
    );
    assert_eq!(
        msg(Level::Restricted, &pod),
        "seccompProfile (container \"c\" must not set securityContext.seccompProfile.type to \"Unconfined\")"
    );
    // Without the pod's profile, a container with its own passes and
    // one without fails.
    let pod = with(
        compliant(),
        "spec/securityContext/seccompProfile",
        Value::Null,
    );
    let pod = with(
        pod,
        "spec/containers/0/securityContext/seccompProfile",
        json!({"type": "Localhost", "localhostProfile": "p.json"}),
    );
    assert_eq!(
        msg(Level::Restricted, &pod),
        "seccompProfile (pod or container \"i\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
    );
}

#[test]
fn unsafe_sysctls() {
    let pod = with(
        compliant(),
        "spec/securityContext/sysctls",
        json!([{"name": "net.ipv4.tcp_syncookies", "value": "1"}, {"name": "kernel.msgmax", "value": "1"}]),
    );
    assert_eq!(
        msg(Level::Baseline, &pod),
        "forbidden sysctls (kernel.msgmax)"
    );
}

#[test]
fn privilege_escalation_must_be_false_in_restricted() {
    let pod = with(
        compliant(),
        "spec/containers/0/securityContext/allowPrivilegeEscalation",
        json!(true),
    );
    assert_eq!(msg(Level::Baseline, &pod), "");
    assert_eq!(
        msg(Level::Restricted, &pod),
        "allowPrivilegeEscalation != false (container \"c\" must set securityContext.allowPrivilegeEscalation=false)"
    );
}

#[test]
fn run_as_non_root_on_the_pod_or_every_container() {
    let pod = with(
        compliant(),
        "spec/securityContext/runAsNonRoot",
        Value::Null,
    );
    let pod = with(
        pod,
        "spec/containers/0/securityContext/runAsNonRoot",
        json!(true),
    );
    assert_eq!(
        msg(Level::Restricted, &pod),
        "runAsNonRoot != true (pod or container \"i\" must set securityContext.runAsNonRoot=true)"
    );
    let pod = with(
        compliant(),
        "spec/securityContext/runAsNonRoot",
        json!(false),
    );
    let pod = with(
        pod,
        "spec/containers/0/securityContext/runAsNonRoot",
        json!(false),
    );
    assert_eq!(
        msg(Level::Restricted, &pod),
        "runAsNonRoot != true (pod must not set securityContext.runAsNonRoot=false; \
         container \"c\" must not set securityContext.runAsNonRoot=false; \
         pod or container \"i\" must set securityContext.runAsNonRoot=true)"
    );
}

#[test]
fn run_as_user_zero() {
    let pod = with(compliant(), "spec/securityContext/runAsUser", json!(0));
    let pod = with(pod, "spec/containers/0/securityContext/runAsUser", json!(0));
    assert_eq!(
        msg(Level::Restricted, &pod),
        "runAsUser=0 (pod and container \"c\" must not set runAsUser=0)"
    );
    assert_eq!(msg(Level::Baseline, &pod), "");
}

#[test]
fn enforce_refuses_with_the_real_message_and_warn_admits_with_a_warning() {
    let ns = json!({"metadata": {"name": "a", "labels": {
        "pod-security.kubernetes.io/enforce": "baseline",
        "pod-security.kubernetes.io/enforce-version": "v1.30",
        "pod-security.kubernetes.io/warn": "restricted",
    }}});
    let policy = Policy::of_namespace(&ns);
    assert_eq!(policy.enforce, Some(Level::Baseline));
    assert_eq!(policy.warn, Some(Level::Restricted));
    let pod = with(compliant(), "spec/hostPID", json!(true));
    let err = policy.admit_pod(&pod).unwrap_err();
    assert_eq!(err.code, 403);
    assert_eq!(
        err.message,
        "pods \"p\" is forbidden: violates PodSecurity \"baseline:latest\": host namespaces (hostPID=true)"
    );
    let pod = with(compliant(), "spec/containers/0/securityContext", json!({}));
    let warnings = policy.admit_pod(&pod).unwrap();
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].starts_with("would violate PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false (container \"c\""),
        "{warnings:?}"
    );
    assert!(
        warning_header(&warnings[0])
            .starts_with("299 - \"would violate PodSecurity \\\"restricted:latest\\\": ")
    );
    assert_eq!(
        policy.admit_pod(&compliant()).unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn no_labels_privileged_and_unknown_levels() {
    let pod = with(compliant(), "spec/hostPID", json!(true));
    assert!(Policy::default().admit_pod(&pod).is_ok());
    let privileged = Policy::of_namespace(
        &json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}),
    );
    assert!(privileged.admit_pod(&pod).is_ok());
    // An unknown level fails closed.
    let bogus = Policy::of_namespace(
        &json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "strict"}}}),
    );
    assert_eq!(bogus.enforce, Some(Level::Restricted));
    // Garbage in the pod is not a panic.
    let garbage =
        json!({"spec": {"containers": "x", "volumes": [1, {"name": 2}], "securityContext": []}});
    assert!(bogus.admit_pod(&garbage).is_err());
}

#[test]
fn workload_templates_only_warn() {
    let policy = Policy {
        enforce: Some(Level::Restricted),
        warn: Some(Level::Baseline),
    };
    let deploy = json!({"spec": {"template": {"spec": {"hostNetwork": true, "containers": [{"name": "c"}]}}}});
    assert_eq!(
        policy.warn_template("deployments", &deploy),
        vec![
            "would violate PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true)"
                .to_string()
        ]
    );
    assert!(policy.warn_template("configmaps", &deploy).is_empty());
}
