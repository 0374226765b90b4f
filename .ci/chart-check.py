#!/usr/bin/env python3
"""Lints and renders charts/hostmesh with real Helm (helm-python-sdk binds
Helm v4's library) and checks the rendered objects against the chart's
promises: restricted pod security, least-privilege RBAC that matches the
operator's needs exactly, a comment on every RBAC rule in the template
source, and clear failures for bad values.

Usage: python3 .ci/chart-check.py [CHART_DIR]   (exit 0 when every check passes)
"""

import re
import sys
from pathlib import Path

try:
    import helm_python as helm
except ImportError:
    sys.exit("chart-check: helm_python is missing; install it with `pip install helm-python-sdk`")

ROOT = Path(__file__).resolve().parent.parent
CHART = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "charts" / "hostmesh"
RELEASE, NAMESPACE = "hm", "hostmesh-system"
KUBE_VERSION = "v1.33.0"

# What the operator needs on the objects it manages (docs/api.md "RBAC",
# docs/operations.md "RBAC"). The rendered manager rules must be exactly these: a new permission
# is a conscious change here and in the chart.
MANAGER_RULES = {
    ("hostmesh.dev", "worlds"): {"get", "list", "watch", "patch", "delete"},
    ("hostmesh.dev", "procmeshes"): {"get", "list", "watch", "patch", "delete"},
    ("hostmesh.dev", "worlds/status"): {"update"},
    ("hostmesh.dev", "procmeshes/status"): {"update"},
    ("hostmesh.dev", "worlds/finalizers"): {"update"},
    ("", "pods"): {"list", "watch", "create", "delete"},
    ("", "services"): {"create", "patch"},
    ("", "secrets"): {"get", "create", "update"},
    ("", "configmaps"): {"get", "create", "update"},
    ("events.k8s.io", "events"): {"create", "patch"},
    ("networking.k8s.io", "networkpolicies"): {"create", "patch"},
}
# With networkPolicy.enabled off (docs/operations.md "Network policy"): no
# policy is written, and the ones an earlier install made are listed and
# deleted once at start-up.
NETPOL_OFF_RULES = {("networking.k8s.io", "networkpolicies"): {"list", "delete"}}
# With kueue.enabled (docs/scheduling.md): Workloads join the manager rules,
# and a read-only ClusterRole gets the cluster-scoped Kueue configuration.
KUEUE_RULES = {
    ("kueue.x-k8s.io", "workloads"): {"get", "list", "watch", "create", "patch", "delete"},
    ("kueue.x-k8s.io", "workloads/status"): {"patch"},
}
GANG_RULES = {
    ("scheduling.x-k8s.io", "podgroups"): {"create", "patch"},
    ("scheduling.volcano.sh", "podgroups"): {"create", "patch"},
    ("scheduling.k8s.io", "podgroups"): {"create", "patch", "get", "list", "delete"},
    ("scheduling.k8s.io", "workloads"): {"create", "patch", "get", "delete"},
}
# With monarch.serveMonarchMesh (docs/monarch.md): the MonarchMesh controller
# reads MonarchMeshes, writes their status, owns Worlds and Services made for
# them, and creates those Worlds by server-side apply.
MONARCH_MESH_RULES = {
    ("monarch.pytorch.org", "monarchmeshes"): {"get", "list", "watch"},
    ("monarch.pytorch.org", "monarchmeshes/status"): {"update"},
    ("monarch.pytorch.org", "monarchmeshes/finalizers"): {"update"},
    ("hostmesh.dev", "worlds"): {"create"},
}
MONARCH_MESH_CRD = "monarchmeshes.monarch.pytorch.org"
KUEUE_CLUSTER_RULES = {
    ("kueue.x-k8s.io", "resourceflavors"): {"get"},
    ("kueue.x-k8s.io", "workloadpriorityclasses"): {"get"},
    ("scheduling.k8s.io", "priorityclasses"): {"get"},
}
LEASE_RULES = {("coordination.k8s.io", "leases"): {"create", "get", "update", "delete"}}
NEVER_VERBS = {"*", "escalate", "bind", "impersonate", "deletecollection"}
EXPECTED_CRDS = {"worlds.hostmesh.dev", "procmeshes.hostmesh.dev"}

VALUE_SETS = {
    "default": {},
    "namespaced-ha": {
        "replicas": 2,
        "watchNamespaces": ["team-a", "team-b"],
        "logLevel": "info,hostmesh_operator=debug",
        "logFormat": "text",
        "image": {"repository": "registry.example/hostmesh", "digest": "sha256:" + "a" * 64},
        "agentImage": "registry.example/hostmesh-agent:1.0",
        "leaderElection": {"enabled": True, "leaseName": "hm-lease", "leaseDuration": "30s"},
        "metrics": {"port": 9090, "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
        "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "serviceAccount": {"name": "hostmesh-op"},
    },
    "kueue-namespaced": {
        "watchNamespaces": ["team-a"],
        "kueue": {"enabled": True},
    },
    "kueue-cluster-wide": {
        "kueue": {"enabled": True},
        "gangScheduling": {"enabled": True},
    },
    "monarch-mesh-namespaced": {
        "watchNamespaces": ["team-a"],
        "monarch": {"serveMonarchMesh": True},
    },
    "monarch-mesh-cluster-wide": {
        "monarch": {"serveMonarchMesh": True},
        "kueue": {"enabled": True},
    },
    "no-network-policy": {
        "watchNamespaces": ["team-a"],
        "networkPolicy": {"enabled": False},
    },
    "single-no-election": {
        "leaderElection": {"enabled": False},
        "metrics": {"service": {"enabled": False}},
        "podDisruptionBudget": {"enabled": False},
    },
}

# Bad values and a fragment the error must contain (it names the field).
BAD_VALUES = [
    ({"logFormat": "yaml"}, "/logFormat"),
    ({"replicas": 2, "leaderElection": {"enabled": False}}, "leaderElection.enabled"),
    ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
    ({"leaderElection": {"leaseDuration": "soon"}}, "/leaderElection/leaseDuration"),
    ({"metrics": {"port": 70000}}, "/metrics/port"),
    ({"replica": 2}, "replica"),
    ({"monarch": {"serveMonarchMesh": "yes"}}, "/monarch/serveMonarchMesh"),
    ({"networkPolicy": {"enabled": "yes"}}, "/networkPolicy/enabled"),
]

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def documents(rendered):
    """Yields (template, object) for every YAML document of the render."""
    for name, text in sorted(rendered.items()):
        if not name.endswith((".yaml", ".yml")):
            continue
        for doc in re.split(r"(?m)^---\s*$", text):
            if doc.strip():
                obj = helm.values_from_yaml(doc)
                if obj:
                    yield name, obj


def check_pod_security(where, pod):
    psc = pod.get("securityContext") or {}
    check(psc.get("runAsNonRoot") is True, f"{where}: pod securityContext.runAsNonRoot must be true")
    check((psc.get("seccompProfile") or {}).get("type") == "RuntimeDefault",
          f"{where}: pod seccompProfile must be RuntimeDefault")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        check(not pod.get(key), f"{where}: {key} must not be set")
    for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
        cw = f"{where} container {c.get('name')}"
        sc = c.get("securityContext") or {}
        check(sc.get("allowPrivilegeEscalation") is False, f"{cw}: allowPrivilegeEscalation must be false")
        check(sc.get("readOnlyRootFilesystem") is True, f"{cw}: readOnlyRootFilesystem must be true")
        check("ALL" in ((sc.get("capabilities") or {}).get("drop") or []), f"{cw}: capabilities.drop must include ALL")
        check(not (sc.get("capabilities") or {}).get("add"), f"{cw}: must add no capabilities")
        check(not sc.get("privileged"), f"{cw}: must not be privileged")
        check(sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, f"{cw}: must run as non-root")
        check(bool((c.get("resources") or {}).get("requests")), f"{cw}: resources.requests must be set")
        for probe in ("livenessProbe", "readinessProbe"):
            check(probe in c, f"{cw}: {probe} missing")


def rules_to_perms(rules, where):
    perms = {}
    for rule in rules:
        for field in ("apiGroups", "resources", "verbs", "resourceNames"):
            check("*" not in (rule.get(field) or []), f"{where}: wildcard in {field}: {rule}")
        check(not rule.get("nonResourceURLs"), f"{where}: nonResourceURLs granted: {rule}")
        check(not (set(rule.get("verbs") or []) & NEVER_VERBS), f"{where}: forbidden verb in {rule}")
        for g in rule.get("apiGroups") or []:
            for r in rule.get("resources") or []:
                perms.setdefault((g, r), set()).update(rule.get("verbs") or [])
    return perms


def perm_diff(got, want):
    out = []
    for key in sorted(set(got) | set(want)):
        extra = sorted(got.get(key, set()) - want.get(key, set()))
        missing = sorted(want.get(key, set()) - got.get(key, set()))
        res = "/".join(k for k in key if k) if key[0] else key[1]
        if extra:
            out.append(f"{res}: extra {extra}")
        if missing:
            out.append(f"{res}: missing {missing}")
    return "; ".join(out)


def check_render(label, values):
    try:
        rendered = helm.Chart.load(str(CHART)).render(
            values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    except helm.HelmError as e:
        failures.append(f"[{label}] render failed: {e}")
        return
    objs = list(documents(rendered))
    merged = helm.Chart.load(str(CHART)).merge_values(values)
    by_kind = {}
    for _, o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
        check(o["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") == "hostmesh",
              f"[{label}] {o['kind']}/{o['metadata']['name']}: missing app.kubernetes.io/part-of label")

    deployments = by_kind.get("Deployment", [])
    if not check(len(deployments) == 1, f"[{label}] expected one Deployment, got {len(deployments)}"):
        return
    dep = deployments[0]
    pod = dep["spec"]["template"]["spec"]
    check_pod_security(f"[{label}] Deployment", pod)
    check(dep["spec"]["replicas"] == merged["replicas"], f"[{label}] replicas not applied")
    sa_name = pod.get("serviceAccountName")
    env = {e["name"]: e for e in pod["containers"][0].get("env", [])}
    check(env.get("HOSTMESH_LOG_FORMAT", {}).get("value") == merged["logFormat"], f"[{label}] logFormat not passed")
    check(env.get("HOSTMESH_LOG_LEVEL", {}).get("value") == merged["logLevel"], f"[{label}] logLevel not passed")
    check(env.get("HOSTMESH_WATCH_NAMESPACES", {}).get("value") == ",".join(merged["watchNamespaces"]),
          f"[{label}] watchNamespaces not passed")
    check(env.get("HOSTMESH_LEADER_ELECT", {}).get("value") == str(merged["leaderElection"]["enabled"]).lower(),
          f"[{label}] leaderElection.enabled not passed")
    check("fieldRef" in (env.get("POD_NAMESPACE", {}).get("valueFrom") or {}), f"[{label}] POD_NAMESPACE not from the downward API")
    # The leader names its Pod (name and UID) as the Lease's owner.
    for var, field in (("POD_NAME", "metadata.name"), ("POD_UID", "metadata.uid")):
        ref = ((env.get(var, {}).get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        check(ref == field, f"[{label}] {var} not from the downward API's {field}: {ref}")
    image = pod["containers"][0]["image"]
    if merged["image"].get("digest"):
        check(image.endswith("@" + merged["image"]["digest"]), f"[{label}] image digest not used: {image}")
    ports = {p["name"]: p["containerPort"] for p in pod["containers"][0].get("ports", [])}
    check(ports.get("http") == merged["metrics"]["port"], f"[{label}] metrics port not applied: {ports}")

    # ServiceAccount and bindings agree.
    if merged["serviceAccount"]["create"]:
        check(any(sa["metadata"]["name"] == sa_name for sa in by_kind.get("ServiceAccount", [])),
              f"[{label}] Deployment uses ServiceAccount {sa_name} that the chart does not create")
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        for b in by_kind.get(kind, []):
            subj = b["subjects"][0]
            check((subj["name"], subj["namespace"]) == (sa_name, NAMESPACE),
                  f"[{label}] {kind}/{b['metadata']['name']} binds {subj}, not the operator's ServiceAccount")

    # RBAC: exactly the operator's needs, in the narrowest scope.
    watch = merged["watchNamespaces"]
    kueue = merged["kueue"]["enabled"]
    netpol = merged["networkPolicy"]["enabled"]
    expected = {**MANAGER_RULES, **(KUEUE_RULES if kueue else {}),
                **(GANG_RULES if merged["gangScheduling"]["enabled"] else {}),
                **({} if netpol else NETPOL_OFF_RULES)}
    # The policies admit the operator's pods by their selector labels.
    check(env.get("HOSTMESH_NETWORK_POLICY", {}).get("value") == str(netpol).lower(),
          f"[{label}] networkPolicy.enabled not passed")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    selector = dep["spec"]["selector"]["matchLabels"]
    passed = env.get("HOSTMESH_OPERATOR_POD_LABELS", {}).get("value")
    if netpol:
        pairs = dict(p.split("=", 1) for p in (passed or "").split(",") if p)
        check(pairs == selector and all(pod_labels.get(k) == v for k, v in pairs.items()),
              f"[{label}] HOSTMESH_OPERATOR_POD_LABELS {passed!r} is not the operator pods' selector {selector}")
    else:
        check(passed is None, f"[{label}] HOSTMESH_OPERATOR_POD_LABELS passed with networkPolicy.enabled false")
    monarch_mesh = merged["monarch"]["serveMonarchMesh"]
    if monarch_mesh:
        for key, verbs in MONARCH_MESH_RULES.items():
            expected[key] = expected.get(key, set()) | verbs
    check(env.get("HOSTMESH_SERVE_MONARCH_MESH", {}).get("value") == str(monarch_mesh).lower(),
          f"[{label}] monarch.serveMonarchMesh not passed")
    crds = [o for o in by_kind.get("CustomResourceDefinition", [])]
    if monarch_mesh:
        if check([c["metadata"]["name"] for c in crds] == [MONARCH_MESH_CRD],
                 f"[{label}] monarch.serveMonarchMesh needs exactly the {MONARCH_MESH_CRD} CRD, got {crds and [c['metadata']['name'] for c in crds]}"):
            crd = crds[0]
            check(crd["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep",
                  f"[{label}] the MonarchMesh CRD must be kept on uninstall")
            check(crd["spec"]["versions"][0]["name"] == "v1alpha1" and crd["spec"]["group"] == "monarch.pytorch.org",
                  f"[{label}] the MonarchMesh CRD is not monarch.pytorch.org/v1alpha1")
    else:
        check(not crds, f"[{label}] a CRD rendered from templates/ with monarch.serveMonarchMesh false")
    kueue_roles = [r for r in by_kind.get("ClusterRole", []) if r["metadata"]["name"].endswith("-kueue-reader")]
    if kueue:
        if check(len(kueue_roles) == 1, f"[{label}] kueue.enabled needs one kueue-reader ClusterRole"):
            kperms = rules_to_perms(kueue_roles[0]["rules"], f"[{label}] kueue-reader")
            check(kperms == KUEUE_CLUSTER_RULES, f"[{label}] kueue-reader rules: {perm_diff(kperms, KUEUE_CLUSTER_RULES)}")
    else:
        check(not kueue_roles, f"[{label}] kueue-reader ClusterRole rendered with kueue.enabled false")
    cluster_roles = [r for r in by_kind.get("ClusterRole", []) if r not in kueue_roles]
    cluster_bindings = [b for b in by_kind.get("ClusterRoleBinding", []) if not b["metadata"]["name"].endswith("-kueue-reader")]
    roles = by_kind.get("Role", [])
    manager_roles = [r for r in roles if r["metadata"]["name"].endswith("-manager")]
    lease_roles = [r for r in roles if r["metadata"]["name"].endswith("-leader-election")]
    if watch:
        check(not cluster_roles and not cluster_bindings,
              f"[{label}] watchNamespaces set but a ClusterRole/Binding is rendered")
        check(sorted(r["metadata"]["namespace"] for r in manager_roles) == sorted(watch),
              f"[{label}] manager Roles not exactly in {watch}")
        manager_sets = [r["rules"] for r in manager_roles]
    else:
        check(len(cluster_roles) == 1 and not manager_roles,
              f"[{label}] cluster-wide mode needs exactly one ClusterRole and no manager Role")
        manager_sets = [r["rules"] for r in cluster_roles]
    for rules in manager_sets:
        perms = rules_to_perms(rules, f"[{label}] manager")
        check(perms == expected, f"[{label}] manager rules differ from the operator's needs: {perm_diff(perms, expected)}")
    if merged["leaderElection"]["enabled"]:
        if check(len(lease_roles) == 1, f"[{label}] expected one leader-election Role"):
            lr = lease_roles[0]
            check(lr["metadata"]["namespace"] == NAMESPACE, f"[{label}] lease Role not in the release namespace")
            lease_perms = rules_to_perms(lr["rules"], f"[{label}] lease")
            check(lease_perms == LEASE_RULES, f"[{label}] lease rules: {perm_diff(lease_perms, LEASE_RULES)}")
            named = [r for r in lr["rules"] if set(r["verbs"]) & {"get", "update", "delete"}]
            check(all(r.get("resourceNames") == [merged["leaderElection"]["leaseName"]] for r in named),
                  f"[{label}] lease get/update/delete not limited to the lease name")
    else:
        check(not lease_roles, f"[{label}] leader-election Role rendered with election off")

    # Metrics Service targets the container port by name.
    svcs = by_kind.get("Service", [])
    if merged["metrics"]["service"]["enabled"]:
        check(len(svcs) == 1 and svcs[0]["spec"]["ports"][0]["targetPort"] == "http",
              f"[{label}] metrics Service missing or not targeting port http")
    else:
        check(not svcs, f"[{label}] metrics Service rendered while disabled")
    check(bool(by_kind.get("PodDisruptionBudget")) == (merged["replicas"] > 1 and merged["podDisruptionBudget"]["enabled"]),
          f"[{label}] PodDisruptionBudget presence wrong")
    check(bool(rendered.get("hostmesh/templates/NOTES.txt", "").strip()), f"[{label}] NOTES.txt empty")


def check_lint(label, values):
    report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE, kube_version=KUBE_VERSION)
    check(not report["errors"], f"[{label}] helm lint errors: {report['errors']}")
    for m in report["messages"]:
        # 1 = info (e.g. "icon is recommended"); warnings and errors fail.
        check(m["severity"] < 2, f"[{label}] helm lint: {m['path']}: {m['error']}")


def check_rule_comments():
    """Every RBAC rule in the template source has a comment right above it."""
    chart = helm.Chart.load(str(CHART))
    for t in chart.templates:
        text = t["data"] if isinstance(t["data"], str) else bytes(t["data"]).decode()
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if re.match(r"^\s*- apiGroups:", line):
                prev = next((p for p in reversed(lines[:i]) if p.strip()), "")
                check(prev.strip().startswith("#"),
                      f"{t['name']}:{i + 1}: RBAC rule without a comment saying why it is needed")


def check_crds():
    chart = helm.Chart.load(str(CHART))
    names = set()
    for crd in chart.crds:
        data = crd["data"] if isinstance(crd["data"], str) else bytes(crd["data"]).decode()
        for doc in re.split(r"(?m)^---\s*$", data):
            obj = helm.values_from_yaml(doc) if doc.strip() else None
            if obj:
                names.add(obj["metadata"]["name"])
                check(obj.get("kind") == "CustomResourceDefinition", f"{crd['filename']}: not a CRD: {obj.get('kind')}")
    check(names == EXPECTED_CRDS, f"chart CRDs {sorted(names)} != {sorted(EXPECTED_CRDS)}")


def api_doc_rules():
    """The RBAC table of docs/api.md (what the controllers declare they use)."""
    path = ROOT / "docs" / "api.md"
    if not check(path.exists(), f"{path} is missing: it declares the controllers' RBAC"):
        return {}
    rules, in_table = {}, False
    for line in path.read_text().splitlines():
        if line.startswith("### RBAC"):
            in_table = True
            continue
        if in_table and line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if not in_table or len(cells) < 3 or cells[0] in ("API group", "---"):
            continue
        group = cells[0].strip("`").replace('""', "")
        verbs = {v.strip() for v in cells[2].split(",") if v.strip()}
        for res in re.findall(r"`([^`]+)`", cells[1]):
            rules.setdefault((group, res), set()).update(verbs)
    return rules


def check_rbac_matches_api_doc():
    declared = api_doc_rules()
    check(declared == MANAGER_RULES,
          f"docs/api.md RBAC and chart-check MANAGER_RULES differ: {perm_diff(declared, MANAGER_RULES)} "
          "(extra = only in docs/api.md); update the chart's rules, MANAGER_RULES and docs/operations.md together")


def check_bad_values():
    for values, fragment in BAD_VALUES:
        try:
            helm.Chart.load(str(CHART)).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
            failures.append(f"bad values {values} rendered without an error")
        except helm.HelmError as e:
            check(fragment in str(e), f"bad values {values}: error does not name {fragment!r}: {e}")


def check_versions():
    """One version everywhere: the chart's appVersion (the default image tag)
    is the crate version that `hostmesh --version` prints and that the
    operator's default agent image carries; the chart's default image
    repository is the one the operator defaults to and the image files'
    VERSION defaults name."""
    import tomllib
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    app_version = str(helm.values_from_yaml((CHART / "Chart.yaml").read_text()).get("appVersion"))
    check(app_version == cargo,
          f"Chart.yaml appVersion {app_version!r} != crate version {cargo!r} (Cargo.toml [workspace.package]); bump them together")
    values = helm.values_from_yaml((CHART / "values.yaml").read_text())
    repo = values["image"]["repository"]
    operator = (ROOT / "operator" / "src" / "lib.rs").read_text()
    check(f'concat!("{repo}:", env!("CARGO_PKG_VERSION"))' in operator,
          f"the operator's default agent image (operator/src/lib.rs) is not {repo}:<crate version>, the chart's default image")
    for name in ("Dockerfile", "image/Containerfile"):
        path = ROOT / name
        if check(path.exists(), f"{name} is missing"):
            m = re.search(r"(?m)^ARG VERSION=(\S+)$", path.read_text())
            check(m is not None and m.group(1) == cargo,
                  f"{name}: ARG VERSION default {m.group(1) if m else None!r} != crate version {cargo!r}")


def main():
    print(f"chart-check: Helm SDK {helm.helm_sdk_version()}, chart {CHART}", flush=True)
    check_versions()
    for label, values in VALUE_SETS.items():
        check_lint(label, values)
        check_render(label, values)
    check_rule_comments()
    check_rbac_matches_api_doc()
    check_crds()
    check_bad_values()
    if failures:
        print(f"chart-check: {len(failures)} problem(s):", file=sys.stderr)
        for f in failures:
            print(f"  - {f}", file=sys.stderr)
        return 1
    print(f"chart-check: ok ({len(VALUE_SETS)} value sets, {len(BAD_VALUES)} bad-value cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
