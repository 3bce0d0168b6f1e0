"""``gpufrag defrag``'s MIG step end to end against the real control plane.

Three fake A100 80GB MIG nodes as NVIDIA's GPU operator publishes them with the ``mixed``
strategy (GPU feature discovery's labels, ``nvidia.com/mig-1g.10gb: 14`` allocatable, MIG
manager config ``all-1g.10gb``): one drained, one with a pod bound on one of its instances
(busy), one drained but holding a live GPUReservation. Two pods wait for 3g.40gb instances
(four in all) that no node offers. The busy and reserved nodes' 1g.10gb instances serve the
1g.10gb demand, so the advisor cuts the drained node for the 3g.40gb queue: two 3g.40gb per
GPU, ``gpufrag-2x3g.40gb``.

Checked: a dry run reports that relabel and changes no label; a real cycle sets it, with a
``MigLayoutChanged`` Event on the node, and leaves the busy and the reserved node alone; a
second cycle finds the label already says the advice and does nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import kubernetes
import pytest

from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from devkit.stack import install_reservations_crd
from gpufrag import conventions as cv
from gpufrag.cli import main as gpufrag
from scheduler.kube import reservations as rsv
from scheduler.kube.mignodes import mig_pod_to_k8s

pytestmark = pytest.mark.e2e

PRODUCT, MEMORY_MIB = "NVIDIA-A100-SXM4-80GB", 81_920
DRAINED, BUSY, RESERVED = "dfgmig-drained", "dfgmig-busy", "dfgmig-reserved"
NODES = (DRAINED, BUSY, RESERVED)
NVIDIA_DEFAULT = "all-1g.10gb"
ADVISED = "gpufrag-2x3g.40gb"
HOLD = "dfgmig-hold"
WAIT_S = 30.0


@dataclass
class MigCluster:
    plane: ControlPlane
    namespace: str
    core: Any

    def config_of(self, node: str) -> str:
        labels = self.core.read_node(node).metadata.labels or {}
        return str(labels.get(cv.LABEL_MIG_CONFIG, ""))

    def node_events(self, node: str) -> list[Any]:
        events = self.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={node}").items
        return [e for e in events if e.reason == "MigLayoutChanged"]


def mig_pod(namespace: str, name: str, profile: str, count: int, *,
            node: str = "") -> dict[str, Any]:
    """A pod asking ``count`` instances of ``profile``, bound to ``node`` or left pending (a
    scheduler nobody runs)."""
    body = mig_pod_to_k8s(name, {profile: count}, namespace=namespace, node=node,
                          scheduler_name="gpufrag-e2e-nobody")
    body["spec"]["terminationGracePeriodSeconds"] = 0
    return body


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> Iterator[MigCluster]:
    api = control_plane.api_client()
    core: Any = kubernetes.client.CoreV1Api(api)  # bodies passed as plain dicts
    install_reservations_crd(control_plane)
    namespace = control_plane.create_namespace(f"e2e-defrag-mig-{int(time.time()) % 100000}")
    control_plane.ensure_namespace(cv.HINTS_NAMESPACE)
    with suppress(kubernetes.client.ApiException):  # the manifests create it
        core.create_namespaced_config_map(cv.HINTS_NAMESPACE, {
            "metadata": {"name": cv.HINTS_CONFIGMAP}, "data": {}})
    custom = kubernetes.client.CustomObjectsApi(api)
    try:
        for name in NODES:
            control_plane.create_gpu_node(
                name, 2, PRODUCT, MEMORY_MIB, milli_resources=False,
                labels={"nvidia.com/mig.strategy": "mixed",
                        cv.LABEL_MIG_CONFIG: NVIDIA_DEFAULT})
            mig = {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "14"}
            core.patch_node_status(name, {"status": {"capacity": mig, "allocatable": mig}})
        core.create_namespaced_pod(namespace,
                                   mig_pod(namespace, "on-busy", "1g.10gb", 1, node=BUSY))
        for i in range(2):
            core.create_namespaced_pod(namespace, mig_pod(namespace, f"waiting-{i}", "3g.40gb", 2))
        hold = rsv.body(rsv.Reservation(
            HOLD, RESERVED, (0,), 1000, "dfgmig-owner", owner_kind="ReplicaSet",
            owner_name="dfgmig", namespace=namespace, expires=time.time() + 3600))
        del hold["metadata"]["labels"][rsv.MANAGED_BY_LABEL]  # not the cycle's to prune
        custom.create_namespaced_custom_object(rsv.GROUP, rsv.VERSION, cv.HINTS_NAMESPACE,
                                               rsv.PLURAL, hold)
        yield MigCluster(control_plane, namespace, core)
    finally:
        with suppress(kubernetes.client.ApiException):
            custom.delete_namespaced_custom_object(rsv.GROUP, rsv.VERSION, cv.HINTS_NAMESPACE,
                                                   rsv.PLURAL, HOLD)
        with suppress(kubernetes.client.ApiException):
            core.delete_namespace(namespace)
        for name in NODES:
            with suppress(kubernetes.client.ApiException):
                core.delete_node(name)


def run_defrag(cluster: MigCluster, *extra: str,
               capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    """One cycle; its exit code and the MIG step's JSON line."""
    code = gpufrag(["defrag", "--kubeconfig", str(cluster.plane.kubeconfig_path),
                    "--output", "json", "--max-mig-relabels", "2", *extra])
    out = capsys.readouterr().out
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    mig = next((d for d in lines if d.get("kind") == "mig"), None)
    assert mig is not None, f"no MIG step in the output:\n{out}"
    return code, mig


def ours(mig: dict[str, Any]) -> dict[str, Any]:
    """The MIG step's answer for this test's nodes only (the session may hold others)."""
    return {"relabels": [r for r in mig["relabels"] if r["node"] in NODES],
            "kept": {k["node"]: k["why"] for k in mig["kept"] if k["node"] in NODES}}


def test_a_dry_run_then_a_real_cycle(cluster: MigCluster,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """In this order (one test, so that no random order runs the real cycle first: the dry run
    needs the drained node still at NVIDIA's default layout)."""
    a_dry_run_reports_the_relabel_and_changes_no_label(cluster, capsys)
    a_real_cycle_sets_the_drained_nodes_label_and_leaves_the_others(cluster, capsys)


def a_dry_run_reports_the_relabel_and_changes_no_label(
        cluster: MigCluster, capsys: pytest.CaptureFixture[str]) -> None:
    code, mig = run_defrag(cluster, "--dry-run", capsys=capsys)
    assert code == 0 and mig["dry_run"] is True
    assert ours(mig) == {
        "relabels": [{"node": DRAINED, "from": NVIDIA_DEFAULT, "to": ADVISED}],
        "kept": {RESERVED: f"holds the GPU reservation {HOLD}"}}
    assert mig["demand"]["3g.40gb"] >= 4 and mig["busy"] >= 1
    assert [cluster.config_of(n) for n in NODES] == [NVIDIA_DEFAULT] * 3
    assert cluster.node_events(DRAINED) == []


def a_real_cycle_sets_the_drained_nodes_label_and_leaves_the_others(
        cluster: MigCluster, capsys: pytest.CaptureFixture[str]) -> None:
    code, mig = run_defrag(cluster, capsys=capsys)
    assert code == 0 and mig["dry_run"] is False
    assert ours(mig)["relabels"] == [{"node": DRAINED, "from": NVIDIA_DEFAULT, "to": ADVISED}]
    assert cluster.config_of(DRAINED) == ADVISED
    assert (cluster.config_of(BUSY), cluster.config_of(RESERVED)) == (NVIDIA_DEFAULT,) * 2
    (event,) = wait_until(lambda: cluster.node_events(DRAINED) or None, timeout_s=WAIT_S,
                          what="the MigLayoutChanged Event on the drained node")
    assert event.type == "Normal" and ADVISED in event.message
    # Nothing left to change: the next cycle keeps the label.
    code, again = run_defrag(cluster, capsys=capsys)
    assert code == 0 and ours(again)["relabels"] == []
    assert ours(again)["kept"][DRAINED] == f"already carries the advised 2x3g.40gb ({ADVISED})"
