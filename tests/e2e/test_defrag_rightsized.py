"""A right-sized move end to end: recommendation -> plan -> reservation -> webhook -> landing.

Two T4 nodes (16 GiB, one GPU each). ``anchor``, a bare 700-milli pod, sits on the sink and
leaves 300 milli there. Deployment ``llm`` (``gpufrag.io/rightsizing-mode: auto``) has one
500-milli replica on the source that uses 2 GiB of the 8 GiB it reserves (75 % idle memory). Its
replica does not fit the sink's 300 milli as it is; right-sized it does.

One ``gpufrag defrag`` cycle (with the extender binding and the right-sizing webhook registered
with the API server, from tests/e2e/test_admission.py) must: publish the recommendation on the
Deployment (2,048 MiB peak -> 2,612 MiB = 160 milli), plan the move as an idle cut with the new
share, reserve 160 milli on the sink's GPU, evict; the webhook admits the replacement with 160
milli, and the replacement lands on the reserved GPU. The idle memory read back falls.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from defrag.admission.server import AdmissionServer
from defrag.rightsizing.recommender import parse as parse_recommendation
from devkit.controlplane import ControlPlane
from devkit.extender import ExtenderProcess, gpufrag_scheduler_config
from devkit.procs import wait_until
from devkit.stack import delete_nodes, install_reservations_crd
from gpufrag import conventions as cv
from gpufrag.cli import main as gpufrag
from gpufrag.gpu_usage import GpuUsage, NodeGpuUsage, PodGpuUsage
from tests.e2e.test_admission import webhook as webhook  # the fixture
from tests.e2e.test_defrag import pod_spec, reservations

pytestmark = pytest.mark.e2e

T4, T4_MIB = "Tesla-T4", 16_384
SOURCE, SINK = "rsz-source", "rsz-sink"
USED_MIB = 2048
WAIT_S = 90.0


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[None]:
    install_reservations_crd(control_plane)
    control_plane.ensure_namespace(cv.HINTS_NAMESPACE)
    for name in (SOURCE, SINK):
        control_plane.create_gpu_node(name, 1, T4, T4_MIB, cpu_milli=16_000,
                                      memory_mib=64 * 1024)
    extender = ExtenderProcess(control_plane,
                               tmp_path_factory.mktemp("rightsized") / "extender.log")
    extender.start()
    control_plane.start_scheduler(cv.SCHEDULER_NAME, gpufrag_scheduler_config(extender.url))
    try:
        yield
    finally:
        control_plane.stop_scheduler(cv.SCHEDULER_NAME)
        extender.stop()
        delete_nodes(control_plane, [SOURCE, SINK])


def bound(core: Any, namespace: str, prefix: str) -> dict[str, Any]:
    """The one live, bound and Running pod whose name starts with ``prefix``."""
    def find() -> dict[str, Any] | None:
        api = kubernetes.client.ApiClient()
        pods = [api.sanitize_for_serialization(p)
                for p in core.list_namespaced_pod(namespace).items
                if p.metadata.name.startswith(prefix) and not p.metadata.deletion_timestamp]
        done = [p for p in pods if p["spec"].get("nodeName")
                and (p.get("status") or {}).get("phase") == "Running"]
        return done[0] if len(done) == 1 == len(pods) else None

    found: dict[str, Any] = wait_until(find, timeout_s=WAIT_S, what=f"{prefix} running")
    return found


def publish_usage(core: Any, pods: list[dict[str, Any]]) -> None:
    """Each node's usage annotation as the agent writes it: ``llm`` uses 2 GiB, the anchor
    11,000 MiB of its 11,468."""
    for node in (SOURCE, SINK):
        here = [p for p in pods if p["spec"]["nodeName"] == node]
        entries = tuple(PodGpuUsage(p["metadata"]["namespace"], p["metadata"]["name"],
                                    p["metadata"]["uid"],
                                    11_000 if p["metadata"]["name"] == "anchor" else USED_MIB)
                        for p in here)
        reading = NodeGpuUsage(node=node, timestamp=time.time(), interval_s=15.0, gpus=(
            GpuUsage(index=0, uuid=f"GPU-{node}", product=T4,
                     memory_used_mib=sum(e.memory_used_mib for e in entries),
                     memory_total_mib=T4_MIB, utilization_pct=20, pods=entries),))
        core.patch_node(node, {"metadata": {"annotations": {
            cv.ANNOTATION_GPU_USAGE: reading.to_json()}}})


def test_an_over_reserved_replica_is_replaced_right_sized_onto_its_reservation(
        control_plane: ControlPlane, stack: None, namespace: str, webhook: AdmissionServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    api = control_plane.api_client()
    core, apps = kubernetes.client.CoreV1Api(api), kubernetes.client.AppsV1Api(api)
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "anchor"},
        "spec": pod_spec(cv.SCHEDULER_NAME, 700, node=SINK)})
    anchor = bound(core, namespace, "anchor")
    labels = {"app": "llm"}
    apps.create_namespaced_deployment(namespace, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
            "name": "llm", "annotations": {cv.ANNOTATION_RIGHTSIZING_MODE: "auto"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels}, "spec": pod_spec(cv.SCHEDULER_NAME, 500)}}})
    first = bound(core, namespace, "llm")
    assert first["spec"]["nodeName"] == SOURCE  # 500 milli fits nowhere else
    publish_usage(core, [anchor, first])

    code = gpufrag(["defrag", "--kubeconfig", str(control_plane.kubeconfig_path),
                    "--namespaces", namespace, "--output", "json",
                    "--bind-timeout-s", str(int(WAIT_S))])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()
             if line.startswith("{")]
    plan = next(d for d in lines if d["kind"] == "plan")
    result = next(d for d in lines if d["kind"] == "result")
    assert code == 0, result

    # Published, and used in the same cycle: the move is an idle cut with the smaller share.
    text = apps.read_namespaced_deployment("llm", namespace).metadata.annotations[
        cv.ANNOTATION_GPU_RECOMMENDATION]
    rec = parse_recommendation(text)["*"]
    assert (rec.peak_mib, rec.memory_mib, rec.milli) == (USED_MIB, 2612, 160)
    assert result["rightsizing"]["rightsized"] == {f"{namespace}/{first['metadata']['name']}":
                                                   160}
    (move,) = plan["moves"]
    assert (move["source"], move["target"], move["target_gpus"]) == (SOURCE, SINK, [0])
    assert move["new_milli"] == 160 and "idle" in move["purposes"]
    assert [o["outcome"] for o in result["moves"]] == ["landed"]
    assert result["counts"]["reservations created"] == 1
    assert result["counts"]["reservations released"] == 1
    assert reservations(control_plane, namespace) == []

    # The webhook admitted the replacement with the recommendation; it runs on the sink.
    replacement = bound(core, namespace, "llm")
    assert replacement["metadata"]["uid"] != first["metadata"]["uid"]
    assert replacement["spec"]["nodeName"] == SINK
    resources = replacement["spec"]["containers"][0]["resources"]
    assert resources["requests"][cv.RESOURCE_GPU_MILLI] == "160"
    assert resources["limits"][cv.RESOURCE_GPU_MILLI] == "160"
    change = json.loads(replacement["metadata"]["annotations"][cv.ANNOTATION_RIGHTSIZING_CHANGE])
    assert (change["from"], change["to"]) == (500, 160)
    assert replacement["metadata"]["annotations"][cv.ANNOTATION_GPU_INDICES] == "0"
    # The bare anchor is untouched; the model's idle memory fell from 75 % on the source.
    assert bound(core, namespace, "anchor")["metadata"]["uid"] == anchor["metadata"]["uid"]
    assert result["after"]["idle_ratio"] < result["before"]["idle_ratio"]
    assert result["after"]["free_whole_gpus"] == result["before"]["free_whole_gpus"] + 1
