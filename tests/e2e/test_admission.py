"""The right-sizing webhook registered with the real API server.

The webhook runs in this process on 127.0.0.1 with a serving certificate signed by a CA made
here with openssl; a MutatingWebhookConfiguration (failurePolicy Ignore, scoped to the test's
namespace) points the API server at it with that CA bundle. Deployments carry a recommendation
(as the defrag controller publishes it) and a mode; the controller-manager creates their pods,
and the API server sends each creation through the webhook.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import orjson
import pytest

from defrag.admission.server import AdmissionServer
from defrag.rightsizing.recommender import PodSample, RightsizingConfig, update
from defrag.rightsizing.workloads import WorkloadClient
from devkit.controlplane import ControlPlane
from gpufrag.conventions import DEFAULT_NAMES as NAMES
from tests.defrag.admission.certs import make_serving_cert

ASKED_MILLI = 500
GPU_MIB = 81920
PEAK_MIB = 8192  # -> 100 milli of an 80 GiB GPU with no headroom
NOW = time.time()


@pytest.fixture
def webhook(control_plane: ControlPlane, namespace: str, tmp_path: Path
            ) -> Iterator[AdmissionServer]:
    ca, cert, key = make_serving_cert(tmp_path / "pki")
    client = WorkloadClient(control_plane.new_api_client(), timeout_s=2.0)
    server = AdmissionServer(("127.0.0.1", 0), resolve=client.resolve, names=NAMES,
                             cert_file=str(cert), key_file=str(key)).start()
    api = kubernetes.client.AdmissionregistrationV1Api(control_plane.api_client())
    name = f"gpufrag-rightsizing-{namespace}"
    api.create_mutating_webhook_configuration({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "rightsizing.gpufrag.io",
            "clientConfig": {"url": f"https://127.0.0.1:{server.port}/mutate",
                             "caBundle": base64.b64encode(ca.read_bytes()).decode()},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "failurePolicy": "Ignore", "sideEffects": "None", "timeoutSeconds": 5,
            "reinvocationPolicy": "Never", "admissionReviewVersions": ["v1"]}]})
    try:
        _wait_until_called(control_plane, namespace, server)
        yield server
    finally:
        api.delete_mutating_webhook_configuration(name)
        server.stop()


def _wait_until_called(control_plane: ControlPlane, namespace: str,
                       server: AdmissionServer) -> None:
    """The API server picks up a new webhook configuration within about a second: dry-run a
    bare pod until the webhook has seen one."""
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
             "spec": {"containers": [{"name": "c", "image": "pause"}]}}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        core.create_namespaced_pod(namespace, probe, dry_run="All")
        if server.metrics.registry.get_sample_value(
                "gpufrag_admission_skips_total", {"reason": "bare_pod"}):
            return
        time.sleep(0.2)
    pytest.fail("the API server never called the webhook")


def _recommendation() -> str:
    sample = PodSample(namespace="x", name="x", uid="x", memory_used_mib=PEAK_MIB,
                       gpu_memory_mib=GPU_MIB, timestamp=NOW)
    text, _ = update(None, {"*": [sample]}, NOW,
                     RightsizingConfig(headroom_fraction=0.0, headroom_mib=0, min_mib=0))
    return text


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
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pods = [p for p in core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
                if p.metadata.name not in exclude and p.metadata.deletion_timestamp is None]
        if pods:
            return pods
        time.sleep(0.2)
    pytest.fail(f"no pod of {app} appeared")


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
