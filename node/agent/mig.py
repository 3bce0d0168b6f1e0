"""A GPU's MIG instances as the usage annotation lists them: named, placed, and who runs there.

NVML (:mod:`gpufrag.nvml`) reports a MIG device by numbers: its GPU instance's placement
(start and size in memory slices), its compute slices and its memory. Pods ask for instances
by the NVIDIA device plugin's profile names (``nvidia.com/mig-3g.40gb``), so the agent names
each one here, from the MIG table (:mod:`scheduler.core.mig`, the one home of MIG geometry):
the product's profile with that many compute and memory slices. For a product the table does
not cover, the name is built the way the device plugin builds it: the instance's memory in
eighths of the GPU's, rounded up, times the GPU's memory in whole GB (``1g.10gb`` on an 80 GB
GPU), so the annotation still says what the node advertises.

The annotation places every instance (its ``start``), and NVML gives the placement only to a
privileged user (``nvmlDeviceGetGpuInstanceById``): where it refused, the GPU is listed
without ``mig`` (:func:`placed`), its processes still attributed to pods, and the agent says
once why (docs/agent.md).

Per-instance utilisation is null: NVML's MIG calls have none (an A100 has none at all; an
H100's GPM would give one, and the agent does not read GPM).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpufrag.gpu_usage import MigInstanceUsage
from gpufrag.nvml import MIB, GpuReading, MigReading
from node.agent.cgroup import PodRef
from scheduler.core.mig import SLICES, mig_model

GIB = 1024 * MIB


def profile_name(gpu: GpuReading, instance: MigReading) -> str:
    """The device plugin's name of ``instance``'s profile on ``gpu`` (``3g.40gb``)."""
    eighths = math.ceil(SLICES * instance.profile_memory_mib * MIB / gpu.memory_total_bytes)
    model = mig_model(gpu.product, gpu.memory_total_mib)
    if model is not None:
        slices = eighths if instance.slices is None else instance.slices
        for profile in model.profiles:
            if (profile.compute, profile.slices) == (instance.compute_slices, slices):
                return profile.name
    memory_gb = round(eighths / SLICES * math.ceil(gpu.memory_total_bytes / GIB))
    return f"{instance.compute_slices}g.{memory_gb}gb"


def placed(gpu: GpuReading) -> bool:
    """Whether NVML gave every instance of ``gpu`` its placement (see the module docstring)."""
    return all(instance.start is not None for instance in gpu.mig)


def instance_usages(gpu: GpuReading,
                    pods_by_pid: Mapping[int, PodRef | None]) -> tuple[MigInstanceUsage, ...]:
    """Each MIG instance of ``gpu`` with the uids of the pods whose processes run on it
    (``pods_by_pid``: the GPU's processes already looked up, as the GPU's ``pods`` were); none
    when a placement is unknown."""
    found = []
    for instance in gpu.mig:
        if instance.start is None:
            return ()  # not placed(gpu): no instance is listed
        uids = {pod.uid for process in instance.processes
                if (pod := pods_by_pid.get(process.pid)) is not None}
        found.append(MigInstanceUsage(
            profile=profile_name(gpu, instance), start=instance.start, uuid=instance.uuid,
            memory_used_mib=instance.memory_used_mib,
            memory_total_mib=instance.memory_total_mib,
            utilization_pct=None, pods=tuple(sorted(uids))))
    return tuple(found)
