"""The right-sizing webhook registered with the real API server.

The webhook runs in this process on 127.0.0.1, registered for the test's namespace
(tests/webhooks.py). Deployments carry a recommendation
(as the defrag controller publishes it) and a mode; the controller-manager creates their pods,
and the API server sends each creation through the webhook.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import orjson
import pytest

from defrag.admission.server import AdmissionServer
from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from gpufrag.conventions import DEFAULT_NAMES as NAMES
from tests.webhooks import recommendation, registered_webhook

ASKED_MILLI = 500
GPU_MIB = 81920
PEAK_MIB = 8192  # -> 100 milli of an 80 GiB GPU with no headroom
NOW = time.time()


@pytest.fixture
def webhook(control_plane: ControlPlane, namespace: str, tmp_path: Path
            ) -> Iterator[AdmissionServer]:
    with registered_webhook(control_plane, namespace, tmp_path / "pki") as server:
        yield server


def _recommendation() -> str:
    return recommendation(PEAK_MIB, GPU_MIB, hours=1, now=NOW)


def _deployment(name: str, mode: str | None) -> dict[str, Any]:
    annotations = {NAMES.annotation_gpu_recommendation: _recommendation()}
    if mode is not None:
        annotations[NAMES.annotation_rightsizing_mode] = mode
    share = {NAMES.gpu_milli: str(ASKED_MILLI)}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {
                     "containers": [{"name": "main", "image": "pause",
                                     "resources": {"requests": share, "limits": share}}]}}}}


def _pods(core: Any, namespace: str, app: str, *, exclude: set[str] = frozenset(),
          timeout_s: float = 60) -> list[Any]:
    def live() -> list[Any] | None:
        return [p for p in core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
                if p.metadata.name not in exclude and p.metadata.deletion_timestamp is None
                ] or None
    return wait_until(live, timeout_s=timeout_s, what=f"a pod of {app}")


def _milli(pod: Any) -> tuple[str, str]:
    resources = pod.spec.containers[0].resources
    return resources.requests[NAMES.gpu_milli], resources.limits[NAMES.gpu_milli]


def test_webhook_rewrites_auto_pods_and_replacements_and_leaves_off_and_recommend_alone(
        control_plane: ControlPlane, namespace: str, webhook: AdmissionServer) -> None:
    apps = kubernetes.client.AppsV1Api(control_plane.api_client())
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    for name, mode in (("auto", "auto"), ("off", "off"), ("recommend", "recommend"),
                       ("default", None)):
        apps.create_namespaced_deployment(namespace, _deployment(name, mode))

    (auto,) = _pods(core, namespace, "auto")
    assert _milli(auto) == ("100", "100")
    record = orjson.loads(auto.metadata.annotations[NAMES.annotation_rightsizing_change])
    assert (record["from"], record["to"]) == (ASKED_MILLI, 100)
    assert record["workload"] == f"Deployment/{namespace}/auto"

    for app in ("off", "recommend", "default"):
        (pod,) = _pods(core, namespace, app)
        assert _milli(pod) == (str(ASKED_MILLI), str(ASKED_MILLI)), app
        assert NAMES.annotation_rightsizing_change not in (pod.metadata.annotations or {}), app

    # A replacement (what a defrag eviction leads to) is right-sized too.
    core.delete_namespaced_pod(auto.metadata.name, namespace, grace_period_seconds=0)
    (replacement,) = _pods(core, namespace, "auto", exclude={auto.metadata.name})
    assert _milli(replacement) == ("100", "100")

    skipped = webhook.metrics.registry.get_sample_value
    assert skipped("gpufrag_admission_skips_total", {"reason": "mode_off"}) == 1
    assert skipped("gpufrag_admission_skips_total", {"reason": "mode_recommend"}) == 2
    assert skipped("gpufrag_admission_reviews_total", {"result": "mutated"}) == 2


def _whole_gpu_deployment(name: str, mode: str, history_h: int) -> dict[str, Any]:
    doc = _deployment(name, mode)
    annotations = doc["metadata"]["annotations"]
    annotations[NAMES.annotation_gpu_recommendation] = recommendation(
        PEAK_MIB, GPU_MIB, hours=history_h, now=NOW)
    whole = {NAMES.gpu: "1"}  # as users write it: the API server copies it into requests
    doc["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": whole}
    return doc


def test_whole_gpu_pods_become_shares_in_auto_mode_after_a_day_of_history(
        control_plane: ControlPlane, namespace: str, webhook: AdmissionServer) -> None:
    apps = kubernetes.client.AppsV1Api(control_plane.api_client())
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    for name, mode, hours in (("whole-auto", "auto", 24), ("whole-young", "auto", 6),
                              ("whole-recommend", "recommend", 24)):
        apps.create_namespaced_deployment(namespace, _whole_gpu_deployment(name, mode, hours))

    (shared,) = _pods(core, namespace, "whole-auto")
    resources = shared.spec.containers[0].resources
    assert NAMES.gpu not in resources.requests and NAMES.gpu not in resources.limits
    assert _milli(shared) == ("100", "100")  # 8,192 MiB of an 80 GiB GPU
    record = orjson.loads(shared.metadata.annotations[NAMES.annotation_rightsizing_change])
    assert record["replaced"] == {NAMES.gpu: "1"} and record["memory_mib"] == PEAK_MIB
    for app in ("whole-young", "whole-recommend"):
        (pod,) = _pods(core, namespace, app)
        resources = pod.spec.containers[0].resources
        assert (resources.requests[NAMES.gpu], resources.limits[NAMES.gpu]) == ("1", "1"), app
        assert NAMES.gpu_milli not in resources.limits, app
    skipped = webhook.metrics.registry.get_sample_value
    assert skipped("gpufrag_admission_skips_total", {"reason": "whole_gpu_kept"}) == 1
