#!/usr/bin/env python3
"""Installs or uninstalls charts/hostmesh in the cluster named by $KUBECONFIG
with real Helm (helm-python-sdk binds Helm v4's library), waiting the way
`helm --wait` does (kstatus watcher: the Deployment must be rolled out and
available), and checks the release.

Usage:
  helm_install.py install CHART_DIR NAMESPACE VALUES_JSON
  helm_install.py uninstall NAMESPACE
Exit 0 on success; prints "installed ..." / "uninstalled ...".
"""

import json
import os
import sys

import helm_python as helm

RELEASE = "hm-e2e"


def config(namespace):
    return helm.Config(kubeconfig_path=os.environ["KUBECONFIG"], namespace=namespace)


def install(chart, namespace, values):
    cfg = config(namespace)
    cfg.install(chart, RELEASE, values, namespace=namespace, timeout=120, wait="watcher")
    status = str(cfg.status(RELEASE))
    if "deployed" not in status.lower():
        sys.exit(f"release is not deployed: {status}")
    print(f"installed {RELEASE}: {status}", flush=True)


def uninstall(namespace):
    cfg = config(namespace)
    cfg.uninstall(RELEASE, timeout=120, wait="watcher")
    try:
        cfg.status(RELEASE)
        sys.exit("release still present after uninstall")
    except helm.HelmError:
        pass
    print(f"uninstalled {RELEASE}", flush=True)


def main(argv):
    if len(argv) == 5 and argv[1] == "install":
        install(argv[2], argv[3], json.loads(argv[4]))
    elif len(argv) == 3 and argv[1] == "uninstall":
        uninstall(argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
