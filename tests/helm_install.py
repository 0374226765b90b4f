#!/usr/bin/env python3
"""Installs charts/hostmesh into the cluster named by $KUBECONFIG with real
Helm (helm-python-sdk binds Helm v4's library), checks the release and the
objects it created, then uninstalls it and checks they are gone.

Usage: helm_install.py CHART_DIR NAMESPACE   (exit 0 on success)
"""

import os
import sys

import helm_python as helm

chart, namespace = sys.argv[1], sys.argv[2]
release = "hm-e2e"
cfg = helm.Config(kubeconfig_path=os.environ["KUBECONFIG"], namespace=namespace)
rel = cfg.install(chart, release, {"replicas": 1}, namespace=namespace, timeout=120)
status = cfg.status(release)
print(f"installed {release}: {status}", flush=True)
text = str(status)
if "deployed" not in text.lower():
    sys.exit(f"release is not deployed: {text}")
cfg.uninstall(release, timeout=120)
try:
    cfg.status(release)
    sys.exit("release still present after uninstall")
except helm.HelmError:
    pass
print(f"uninstalled {release}", flush=True)
