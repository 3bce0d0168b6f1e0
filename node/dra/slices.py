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

A GPU in MIG mode is cut into partitions instead (KEP-4815, partitionable devices): its eight
memory slices are a counter set, ``gpu-<index>-slices`` with counters ``memory-slice-0`` ..
``memory-slice-7`` of 1 each, and every legal (profile, start) placement of the MIG table
(:mod:`scheduler.core.mig`, the one home of MIG geometry) is a device
``gpu-<index>-mig-<profile>-<start>`` (:func:`scheduler.kube.claims.mig_device_name`) that
consumes the slices it covers. Two placements that share a slice cannot both be allocated, so
kube-scheduler's allocator can only hand out layouts NVIDIA's placement rules allow. The
memory slices alone are the whole geometry of the table: every placement is a run of them,
and no set of disjoint runs needs more than the GPU's seven compute slices (only a 1-slice 1g
starts at 0..6, none at 7). A partition has the attributes ``index``, ``uuid``,
``productName`` (its GPU's), ``migEnabled: true``, ``profile`` (``3g.40gb``) and ``migStart``,
and its profile's memory as capacity ``memory``; a DeviceClass per profile selects
``profile`` (docs/dra.md).

The v1 API splits such a pool over several slices, each with the pool's ``generation`` and
``resourceSliceCount``: a slice holds either ``devices`` or ``sharedCounters``, never both;
at most 8 counter sets per slice (:data:`MAX_COUNTER_SETS`); at most 64 devices in a slice
whose devices consume counters (:data:`MAX_DEVICES`). So a node's pool is

- ``<node>-<driver>``: the GPUs not in MIG mode, as above (left out when every GPU is in MIG
  mode and partitioned);
- ``<node>-<driver>-counters-<k>``: the counter sets, eight GPUs a slice;
- ``<node>-<driver>-mig-<k>``: the partitions, whole GPUs a slice (an A100's 18 placements
  make three GPUs a slice), in GPU index order, and each GPU's placements of one profile in
  :func:`scheduler.core.mig.start_order` (the top of the GPU first for small profiles), so
  first fit takes the lowest GPU and there the start that strands least. First fit follows
  that order within a slice only: the allocator walks a pool's slices in the order its
  informer lists them, so across partition slices (more than three MIG GPUs) the GPU first
  fit takes is not fixed.

A GPU in MIG mode whose product the MIG table does not cover stays one exclusive device with
``migEnabled: true`` and its memory as capacity (no partitions to offer for it).

An unhealthy GPU (:mod:`node.health`, the device plugin's health source) keeps its devices,
each with the device taint ``gpu.gpufrag.io/unhealthy`` of effect ``NoSchedule`` (KEP-5055,
DRADeviceTaints): kube-scheduler allocates it to no new claim that does not tolerate the
taint, and the claims already allocated keep it (``NoExecute`` would evict their pods; a
GPU that stopped answering NVML may still be serving them).

Field names follow ``k8s.io/api/resource/v1/types.go`` at v0.36.3 (the release devkit pins).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from node.gpus import Gpu
from scheduler.core.mig import SLICES, MigGpuModel, mig_model, start_order
from scheduler.core.types import MILLI_PER_GPU
from scheduler.kube.claims import CAPACITY_MEMORY, CAPACITY_MILLI, device_name, mig_device_name
from scheduler.kube.convert import memory_quantity

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures (consumable capacity is one)
MAX_COUNTER_SETS = 8  # ResourceSliceMaxCounterSets
TAINT_UNHEALTHY = "gpu.gpufrag.io/unhealthy"

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


def counter_set_name(index: int) -> str:
    """The counter set of GPU ``index``'s memory slices."""
    return f"gpu-{index}-slices"


def slice_counter(position: int) -> str:
    return f"memory-slice-{position}"


def partitions_of(gpu: Gpu, model: MigGpuModel) -> list[Obj]:
    """Every legal placement of ``model``'s profiles on ``gpu`` as a device (module
    docstring): profiles smallest first, each profile's starts in first-fit order."""
    devices = []
    for profile in model.profiles:
        for start in start_order(model, profile):
            devices.append({
                "name": mig_device_name(gpu.index, profile.name, start),
                "attributes": {
                    "index": {"int": gpu.index},
                    "uuid": {"string": gpu.uuid},
                    "productName": {"string": gpu.product},
                    "migEnabled": {"bool": True},
                    "profile": {"string": profile.name},
                    "migStart": {"int": start},
                },
                "capacity": {CAPACITY_MEMORY: {
                    "value": memory_quantity(profile.memory_mib, "bytes")}},
                "consumesCounters": [{
                    "counterSet": counter_set_name(gpu.index),
                    "counters": {slice_counter(s): {"value": "1"}
                                 for s in range(start, start + profile.slices)}}],
            })
    return devices


def counter_set(gpu: Gpu) -> Obj:
    return {"name": counter_set_name(gpu.index),
            "counters": {slice_counter(s): {"value": "1"} for s in range(SLICES)}}


def _chunks(items: Sequence[Obj], size: int) -> list[list[Obj]]:
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def _packed(groups: Sequence[list[Obj]], limit: int) -> list[list[Obj]]:
    """Groups (one GPU's partitions each) packed in order into slices of at most ``limit``
    devices, a group never split: a GPU's placements stay in one slice, in their order."""
    slices: list[list[Obj]] = []
    for group in groups:
        if slices and len(slices[-1]) + len(group) <= limit:
            slices[-1].extend(group)
        else:
            slices.append(list(group))
    return slices


def tainted(devices: list[Obj], unhealthy: bool) -> list[Obj]:
    """``devices`` (one GPU's), with the unhealthy taint when the GPU is (module docstring)."""
    if unhealthy:
        for device in devices:
            device["taints"] = [{"key": TAINT_UNHEALTHY, "effect": "NoSchedule"}]
    return devices


def build_slices(node_name: str, driver_name: str, gpus: Sequence[Gpu],
                 mig_enabled: Mapping[int, bool], *, generation: int = 1,
                 node_uid: str = "", unhealthy: Collection[int] = ()) -> list[Obj]:
    """Every ResourceSlice of the node's pool (module docstring), GPUs sorted by index
    whatever order they come in. ``node_uid``: the Node's UID, which makes the Node each
    slice's owner (garbage-collected with it); empty: no owner. ``unhealthy``: the indices
    of GPUs whose devices carry the unhealthy taint. Raises ValueError past the API's device
    limit."""
    ordered = sorted(gpus, key=lambda gpu: gpu.index)
    partitioned = [(gpu, model) for gpu in ordered if mig_enabled.get(gpu.index, False)
                   and (model := mig_model(gpu.product, gpu.memory_total_mib)) is not None]
    cut = {gpu.index for gpu, _ in partitioned}
    whole = [gpu for gpu in ordered if gpu.index not in cut]
    if len(whole) > MAX_DEVICES:
        raise ValueError(f"{len(whole)} GPUs; a slice with consumable capacity holds at most "
                         f"{MAX_DEVICES} devices")
    name = slice_name(node_name, driver_name)
    specs: list[tuple[str, Obj]] = []
    if whole or not partitioned:
        specs.append((name, {"devices": [
            device for gpu in whole for device in tainted(
                [gpu_device(gpu, mig_enabled=mig_enabled.get(gpu.index, False))],
                gpu.index in unhealthy)]}))
    for k, sets in enumerate(_chunks([counter_set(gpu) for gpu, _ in partitioned],
                                     MAX_COUNTER_SETS)):
        specs.append((f"{name}-counters-{k}", {"sharedCounters": sets}))
    for k, devices in enumerate(_packed([tainted(partitions_of(gpu, model),
                                                 gpu.index in unhealthy)
                                         for gpu, model in partitioned], MAX_DEVICES)):
        specs.append((f"{name}-mig-{k}", {"devices": devices}))
    def metadata(each: str) -> Obj:
        found: Obj = {"name": each}
        if node_uid:
            found["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node",
                                         "name": node_name, "uid": node_uid,
                                         "controller": True}]
        return found

    return [{
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": metadata(each),
        "spec": {
            "driver": driver_name,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation,
                     "resourceSliceCount": len(specs)},
            **content,
        },
    } for each, content in specs]


def device_uuids(slices: Sequence[Obj]) -> list[tuple[str, str]]:
    """(device name, its GPU's UUID) of every device in ``slices``, in order: what the
    driver publishes, read back from what :func:`build_slices` built (the ``uuid``
    attribute every device carries), so the health stream names exactly those devices."""
    return [(str(device["name"]), str(device["attributes"]["uuid"]["string"]))
            for obj in slices for device in obj["spec"].get("devices") or ()]


def build_slice(node_name: str, driver_name: str, gpus: Sequence[Gpu],
                mig_enabled: Mapping[int, bool], *, generation: int = 1,
                node_uid: str = "") -> Obj:
    """The pool's one slice, for a node that needs only one (no GPU cut into partitions);
    ValueError otherwise (use :func:`build_slices`)."""
    built = build_slices(node_name, driver_name, gpus, mig_enabled, generation=generation,
                         node_uid=node_uid)
    if len(built) != 1:
        raise ValueError(f"the pool has {len(built)} slices (GPUs in MIG mode are partitioned); "
                         "use build_slices")
    return built[0]
