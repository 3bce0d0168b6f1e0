"""charts/gpufrag installed by helm on the real node, then ``helm test``: the chart's test hook pod
runs in the project's image, finds the gpufrag-scheduler pod that helm installed through the API
(as its own ServiceAccount) and gets 200 from the extender's /healthz and /readyz on its pod IP.
Then ``helm upgrade``: the CRD upgrade hook's Job runs kubectl (the plane's own, as an image) on
the node and brings an older GPUReservation CRD back to the chart's.

The release has a name and a namespace of its own (so its ClusterRoles and bindings are
release-scoped and nothing collides with what the other node tests apply), the node's images
(``images.*``, ``global.imagePullPolicy=Never``: the node never pulls), and only the scheduler:
the agent and the device plugin need GPUs and the NVIDIA runtime class, defrag and the example
are tested on their own. ``helm test`` failing when nothing answers is checked without a node,
by running the hook's own command (tests/e2e/test_helm.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from devkit.controlplane import ControlPlane
from devkit.imageref import split_image
from devkit.node import Node
from scheduler.kube import reservations as rsv
from tests.e2e.test_helm import CRD_HOOK, TEST_POD

CHART = Path(__file__).resolve().parents[3] / "charts" / "gpufrag"
RELEASE = "helm-node"
NAMESPACE = "gpufrag-helm-node"


def _image(ref: str) -> dict[str, str]:
    repository, tag, digest = split_image(ref)
    return {"repository": repository, "tag": tag, "digest": digest}


def test_helm_test_passes_against_a_release_on_the_node(
        node: Node, node_plane: ControlPlane, gpufrag_image: str, helm: Path,
        tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "images": {"gpufrag": _image(gpufrag_image),
                   "kubeScheduler": _image(node.import_kube_scheduler_image()),
                   "kubectl": _image(node.import_kubectl_image())},
        "global": {"imagePullPolicy": "Never"},
        **{part: {"enabled": False}
           for part in ("agent", "devicePlugin", "defrag", "servingExample")},
    }))
    # The release's namespace is helm's, made by helm, as users install it.
    common = ["--kubeconfig", str(node_plane.kubeconfig_path), "--namespace", NAMESPACE]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(helm), *args, *common], capture_output=True, text=True,
                              timeout=400, check=False)

    try:
        installed = run("install", RELEASE, str(CHART), "--values", str(values),
                        "--create-namespace", "--wait", "--timeout", "300s")
        assert installed.returncode == 0, installed.stderr
        tested = run("test", RELEASE, "--timeout", "300s")
        assert tested.returncode == 0, f"{tested.stdout}\n{tested.stderr}"
        # One suite per hook object (the pod, its ServiceAccount, Role and RoleBinding).
        suites = tested.stdout.split("TEST SUITE:")[1:]
        assert len(suites) == 4, tested.stdout
        assert all(suite.split()[0] == TEST_POD for suite in suites), tested.stdout
        assert all("Phase:          Succeeded" in suite for suite in suites), tested.stdout

        # helm upgrade: the pre-upgrade hook's Job runs kubectl in a pod on the node and makes a
        # GPUReservation CRD that differs from the chart's (what an older chart installed) the
        # chart's again.
        crd = f"{rsv.PLURAL}.{rsv.GROUP}"
        node_plane.kubectl("patch", "crd", crd, "--type=merge", "-p",
                           '{"spec": {"names": {"shortNames": ["oldrsv"]}}}')
        upgraded = run("upgrade", RELEASE, str(CHART), "--values", str(values), "--wait",
                       "--timeout", "300s")
        assert upgraded.returncode == 0, upgraded.stderr
        names = node_plane.kubectl("get", "crd", crd, "-o", "jsonpath={.spec.names.shortNames}")
        assert names.stdout == '["gpursv"]'
        # The hook's objects are gone once it succeeded.
        left = node_plane.kubectl("get", "job,configmap,serviceaccount", "-n", NAMESPACE, "-o",
                                  "name").stdout
        assert CRD_HOOK not in left
    finally:
        run("uninstall", RELEASE, "--wait", "--timeout", "120s")
        node_plane.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
