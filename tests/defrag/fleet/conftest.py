"""A small cluster as a snapshot file: read by the reader ``gpufrag inspect`` uses live."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from defrag.fleet.summary import iso
from gpufrag import conventions as cv
from gpufrag.gpu_usage import GpuUsage, NodeGpuUsage, PodGpuUsage
from scheduler.kube.snapshot import write_snapshot
from tests.defrag.controller.builders import k8s_node, k8s_pod

NOW = 1_767_225_600.0
T4_MIB = 16_384


def _usage(node: str, gpus: list[tuple[int, int, list[tuple[str, str, int]]]]) -> dict[str, str]:
    reading = NodeGpuUsage(node=node, timestamp=NOW, interval_s=15.0, gpus=tuple(
        GpuUsage(index=i, uuid=f"GPU-{node}-{i}", product="Tesla-T4", memory_used_mib=used,
                 memory_total_mib=T4_MIB, utilization_pct=10,
                 pods=tuple(PodGpuUsage(ns, name, f"uid-{name}", mib) for ns, name, mib in pods))
        for i, used, pods in gpus))
    return {cv.ANNOTATION_GPU_USAGE: reading.to_json()}


def _started(pod: dict[str, Any], seconds_ago: float) -> dict[str, Any]:
    pod["status"]["startTime"] = iso(NOW - seconds_ago)
    return pod


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    """n0: GPU 0 held by web (500 milli, right-sized from 800 two hours ago) and api (300),
    GPU 1 by a whole-GPU pod; n1: no reading, nothing on it; one GPU pod pending."""
    change = orjson.dumps({"container": "main", "resource": cv.RESOURCE_GPU_MILLI,
                           "from": 800, "to": 500}).decode()
    nodes = [k8s_node("n0", annotations=_usage("n0", [
                 (0, 5000, [("ns", "web", 1000), ("ns", "api", 4000)]),
                 (1, 16_000, [("other", "big", 16_000)])])),
             k8s_node("n1")]
    pods = [_started(k8s_pod("web", node="n0", milli=500, indices="0",
                             annotations={cv.ANNOTATION_RIGHTSIZING_CHANGE: change}), 7200),
            _started(k8s_pod("api", node="n0", milli=300, indices="0"), 60),
            k8s_pod("big", namespace="other", node="n0", gpus=1, indices="1"),
            k8s_pod("waiting", milli=200, scheduler_name=cv.SCHEDULER_NAME)]
    path = tmp_path / "cluster.json"
    write_snapshot(path, nodes, pods)
    return path
