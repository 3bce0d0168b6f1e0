"""From an allocated ResourceClaim to what this node's containers get (pure: dict -> data).

kube-scheduler writes the allocation (``status.allocation.devices.results``: one entry per
device, with ``request``, ``driver``, ``pool``, ``device`` and, for a device shared under
consumable capacity, ``consumedCapacity`` and ``shareID``); this driver never writes one. On
NodePrepareResources it reads the entries for its own driver and turns each request's devices
into one :class:`~node.gpus.ContainerGrant`, the same grant the device plugin gives:

- a request of several GPUs, or of one GPU consuming all of its ``milli``, gets whole GPUs;
- a request of one GPU consuming part of its ``milli`` is a compute share (its memory limit
  the milli share of the GPU's memory), and one consuming ``memory`` is a memory share.

A result that names another pool (another node's GPUs) or a device this node does not have is
refused with a message that quotes it: the claim was allocated against a slice that is not
this node's, and preparing it would hand the container the wrong GPU.

A MIG partition (``gpu-<index>-mig-<profile>-<start>``, KEP-4815) is read here as the
placement it names, checked against the MIG table for its GPU's product
(:mod:`scheduler.core.mig`); :mod:`node.dra.partitions` makes the instance and turns it
into a device of the grant (the MIG device's UUID instead of the GPU's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufrag.errors import BadInput
from node.gpus import ContainerGrant, DeviceNodes, Gpu, GrantSettings, container_grant
from scheduler.core.mig import MigProfile, mig_model
from scheduler.core.types import MILLI_PER_GPU
from scheduler.kube.claims import CAPACITY_MEMORY, claimed_gpus, claimed_partitions

Obj = Mapping[str, Any]


class ClaimProblem(ValueError):
    """The claim cannot be prepared here; the message says which field and why."""


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One device of this driver in a claim's allocation."""

    request: str
    pool: str
    device: str
    gpu: Gpu
    milli: int  # consumed of the GPU's milli (1000: all of it)
    memory_mib: int  # consumed of its memory (0: none named)
    share_id: str | None


@dataclass(frozen=True, slots=True)
class AllocatedPartition:
    """One MIG partition of this driver in a claim's allocation: a profile at a start slice
    of one of this node's GPUs (checked against the MIG table)."""

    request: str
    pool: str
    device: str
    gpu: Gpu
    profile: MigProfile
    start: int


@dataclass(frozen=True, slots=True)
class Allocation:
    """This driver's devices in a claim: whole GPUs and shares, and MIG partitions."""

    devices: tuple[AllocatedDevice, ...]
    partitions: tuple[AllocatedPartition, ...]


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """What NodePrepareResources answers for one claim and writes into its CDI spec."""

    devices: tuple[AllocatedDevice, ...]
    grants: Mapping[str, ContainerGrant]  # by request name


def allocated(claim: Obj, *, uid: str, driver: str, pool: str,
              gpus: Mapping[int, Gpu]) -> Allocation:
    """This driver's devices in ``claim``'s allocation; :class:`ClaimProblem` when the claim
    is not the one the kubelet named (``uid``), is not allocated, or names what is not here.

    The results are parsed by :func:`scheduler.kube.claims.claimed_gpus` and
    :func:`~scheduler.kube.claims.claimed_partitions`, the one parser the extender's cache
    reads too; this adds what only the node can check."""
    found_uid = (claim.get("metadata") or {}).get("uid")
    if found_uid != uid:
        raise ClaimProblem(f"metadata.uid is {found_uid!r}, the kubelet asked for {uid!r}: the "
                           f"claim was deleted and made again; the kubelet retries with the "
                           f"new one")
    try:
        claimed = claimed_gpus(claim, driver=driver)
        cut = claimed_partitions(claim, driver=driver)
    except BadInput as exc:
        raise ClaimProblem(str(exc)) from None
    if claimed is None:
        raise ClaimProblem("status.allocation is not set: the claim is not allocated yet")
    devices = []
    for found in claimed:
        where = f"status.allocation.devices.results[{found.result}]"
        gpu = _here(where, found.pool, pool, found.device, found.index, gpus)
        if found.memory_mib > gpu.memory_total_mib:
            raise ClaimProblem(f"{where}.consumedCapacity.{CAPACITY_MEMORY} is "
                               f"{found.memory_mib} MiB; GPU {found.index} has "
                               f"{gpu.memory_total_mib} MiB")
        devices.append(AllocatedDevice(found.request, pool, found.device, gpu, found.milli,
                                       found.memory_mib, found.share_id))
    partitions = []
    for part in cut:
        where = f"status.allocation.devices.results[{part.result}]"
        gpu = _here(where, part.pool, pool, part.device, part.partition.index, gpus)
        model = mig_model(gpu.product, gpu.memory_total_mib)
        profile = None if model is None else model.profile(part.partition.profile)
        if model is None or profile is None or part.partition.start not in profile.starts:
            raise ClaimProblem(f"{where}.device {part.device!r}: GPU {gpu.index} "
                               f"({gpu.product}) has no MIG profile "
                               f"{part.partition.profile} at slice {part.partition.start}")
        partitions.append(AllocatedPartition(part.request, pool, part.device, gpu, profile,
                                             part.partition.start))
    if not devices and not partitions:
        raise ClaimProblem(f"the allocation has no device of driver {driver!r}")
    return Allocation(tuple(devices), tuple(partitions))


def _here(where: str, found_pool: str, pool: str, device: str, index: int,
          gpus: Mapping[int, Gpu]) -> Gpu:
    """The GPU a result names, when it is in this node's pool and on this node."""
    if found_pool != pool:
        raise ClaimProblem(f"{where}.pool is {found_pool!r}, but this node's pool "
                           f"is {pool!r}: the claim was allocated on another node")
    gpu = gpus.get(index)
    if gpu is None:
        raise ClaimProblem(f"{where}.device {device!r} is not a GPU of this node "
                           f"(devices {', '.join(f'gpu-{i}' for i in sorted(gpus))})")
    return gpu


def prepare(devices: Sequence[AllocatedDevice], *, nodes: DeviceNodes,
            config: GrantSettings) -> PreparedClaim:
    """The grant of each request (module docstring)."""
    by_request: dict[str, list[AllocatedDevice]] = {}
    for device in devices:
        by_request.setdefault(device.request, []).append(device)
    grants = {}
    for request, taken in by_request.items():
        gpus = [device.gpu for device in taken]
        if len(taken) == 1:
            only = taken[0]
            milli = only.milli % MILLI_PER_GPU
            grant = container_grant(gpus, milli=milli, memory_mib=only.memory_mib, nodes=nodes,
                                    config=config)
        else:
            grant = container_grant(gpus, milli=0, memory_mib=0, nodes=nodes, config=config)
        grants[request] = grant
    return PreparedClaim(tuple(devices), grants)
