"""This node's GPUs as one ``resource.k8s.io/v1`` ResourceSlice (pure: inventory -> dict).

The layout is the one docs/dra.md recommends, because it is the one in which kube-scheduler's
first-fit allocator takes the GPU the extender predicts (``device_choice=FIRST_FIT``): **one
pool per node (named after the node), one slice in it, one device per GPU in NVML index
order**. The allocator walks a slice's ``devices`` list in order, so the lowest-index GPU that
fits is the one it takes.

Each GPU is a device ``gpu-<index>`` with

- attributes (in the driver's domain): ``index`` (int), ``uuid`` and ``productName``
  (NVML's name, the product placement reads) and ``migEnabled`` (bool);
- capacity (KEP-5075, consumable capacity, ``allowMultipleAllocations: true``):
  ``milli`` = 1000 (the milli-GPU unit placement and the openb trace count in) with no request
  policy, so a request that does not name it consumes all 1000: a whole GPU; and ``memory`` =
  the GPU's memory with a request policy whose default is 0, so a compute share that names no
  memory consumes none. A memory share names both, its ``milli`` counted by placement's rule
  (:func:`scheduler.core.types.share_milli`, the larger of compute and memory's part), so the
  allocator and placement agree on how full each GPU is.

A GPU in MIG mode is published as one device with ``migEnabled: true``, no capacity to share
and ``allowMultipleAllocations`` unset (one claim at most); its MIG profiles as partitionable
devices (KEP-4815) are not built yet (docs/dra.md).

Field names follow ``k8s.io/api/resource/v1/types.go`` at v0.36.3 (the release devkit pins).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from node.gpus import Gpu
from scheduler.core.types import MILLI_PER_GPU
from scheduler.kube.claims import CAPACITY_MEMORY, CAPACITY_MILLI, device_name
from scheduler.kube.convert import memory_quantity

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures (consumable capacity is one)

Obj = dict[str, Any]


def slice_name(node_name: str, driver_name: str) -> str:
    """The slice's object name: one per node and driver, so a restart updates, never adds."""
    return f"{node_name}-{driver_name}"


def gpu_device(gpu: Gpu, *, mig_enabled: bool) -> Obj:
    """One device of the slice (module docstring)."""
    device: Obj = {
        "name": device_name(gpu.index),
        "attributes": {
            "index": {"int": gpu.index},
            "uuid": {"string": gpu.uuid},
            "productName": {"string": gpu.product},
            "migEnabled": {"bool": mig_enabled},
        },
    }
    memory = {"value": memory_quantity(gpu.memory_total_mib, "bytes")}
    if mig_enabled:
        device["capacity"] = {CAPACITY_MEMORY: memory}
        return device
    device["allowMultipleAllocations"] = True
    device["capacity"] = {
        CAPACITY_MILLI: {"value": str(MILLI_PER_GPU)},
        CAPACITY_MEMORY: {**memory, "requestPolicy": {"default": "0"}},
    }
    return device


def build_slice(node_name: str, driver_name: str, gpus: Sequence[Gpu],
                mig_enabled: Mapping[int, bool], *, generation: int = 1,
                node_uid: str = "") -> Obj:
    """The ResourceSlice for ``gpus`` (sorted by index here, whatever order they come in).
    ``node_uid``: the Node's UID, which makes the Node the slice's owner (garbage-collected
    with it); empty: no owner. Raises ValueError past the API's device limit."""
    ordered = sorted(gpus, key=lambda gpu: gpu.index)
    if len(ordered) > MAX_DEVICES:
        raise ValueError(f"{len(ordered)} GPUs; a slice with consumable capacity holds at most "
                         f"{MAX_DEVICES} devices")
    metadata: Obj = {"name": slice_name(node_name, driver_name)}
    if node_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name,
                                        "uid": node_uid, "controller": True}]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": driver_name,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": [gpu_device(gpu, mig_enabled=mig_enabled.get(gpu.index, False))
                        for gpu in ordered],
        },
    }
