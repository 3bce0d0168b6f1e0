"""Builders for the device-plugin unit tests: pods as the API serves them, GPUs, a board.

In the spirit of descheduler's ``BuildTestPod``: every field has a default and keyword
overrides change only what a test is about.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from gpufrag.conventions import (
    ANNOTATION_GPU_INDICES,
    DEFAULT_NAMES,
    RESOURCE_GPU,
    RESOURCE_GPU_MILLI,
)
from node.deviceplugin.config import ANNOTATION_GPU_ALLOCATED, DevicePluginConfig
from node.deviceplugin.matching import PodAsk, pod_ask
from node.gpus import Gpu
from node.health import HealthBoard
from tests.records import signed_record

NODE = "gpu-node-1"
UUIDS = ("GPU-00000000-0000-4000-8000-000000000000", "GPU-11111111-1111-4111-8111-111111111111",
         "GPU-22222222-2222-4222-8222-222222222222", "GPU-33333333-3333-4333-8333-333333333333")


def build_gpus(count: int = 4, memory_total_mib: int = 81_920) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, UUIDS[i], "NVIDIA A100-SXM4-80GB", memory_total_mib)
                 for i in range(count))


def build_board(count: int = 4, *, unhealthy: Sequence[int] = ()) -> HealthBoard:
    board = HealthBoard(build_gpus(count))
    for index in unhealthy:
        board.set(UUIDS[index], False, f"GPU {index}: reading identity/memory failed: GPU lost")
    return board


def build_config(**overrides: Any) -> DevicePluginConfig:
    return DevicePluginConfig(node_name=NODE, **overrides).validate()


def build_pod(name: str, *, whole: int = 0, milli: int = 0, gpus: str | None = "0",
              created: str = "2026-01-01T00:00:00Z", phase: str = "Pending", node: str = NODE,
              containers: Mapping[str, int] | None = None,
              init: Mapping[str, int] | None = None,
              allocated: Mapping[str, Sequence[str]] | str | None = None,
              uid: str | None = None, namespace: str = "default",
              deleting: bool = False, signed: bool = True) -> dict[str, Any]:
    """A pod as the API serves it; ``containers``/``init`` map names to device counts of the
    resource (``whole`` GPUs, or ``milli``); the default is one container ``main``. A ``gpus``
    record is ``signed`` as the extender signs it at bind (tests/records.py) unless told."""
    resource = RESOURCE_GPU if whole or not milli else RESOURCE_GPU_MILLI
    if containers is None:
        containers = {"main": whole or milli}

    def spec(name: str, count: int) -> dict[str, Any]:
        limits = {resource: str(count)} if count else {}
        return {"name": name, "image": "x", "resources": {"limits": limits}}

    annotations: dict[str, str] = {}
    uid = uid or f"uid-{name}"
    if gpus is not None and signed:
        annotations.update(signed_record(uid, node, gpus))
    elif gpus is not None:
        annotations[ANNOTATION_GPU_INDICES] = gpus
    if allocated is not None:
        annotations[ANNOTATION_GPU_ALLOCATED] = (
            allocated if isinstance(allocated, str)
            else orjson.dumps({k: list(v) for k, v in allocated.items()}).decode())
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid,
                            "creationTimestamp": created, "annotations": annotations}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T01:00:00Z"
    return {"metadata": meta,
            "spec": {"nodeName": node,
                     "containers": [spec(n, c) for n, c in containers.items()],
                     "initContainers": [spec(n, c) for n, c in (init or {}).items()]},
            "status": {"phase": phase}}


def ask(obj: Mapping[str, Any]) -> PodAsk:
    found = pod_ask(obj, DEFAULT_NAMES, annotation_allocated=ANNOTATION_GPU_ALLOCATED)
    assert found is not None
    return found
