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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from node.dra.slices import CAPACITY_MEMORY, CAPACITY_MILLI, device_index
from node.gpus import ContainerGrant, DeviceNodes, Gpu, GrantSettings, container_grant
from scheduler.core.types import MILLI_PER_GPU
from scheduler.kube.quantity import QuantityError, parse_quantity

MIB = 1 << 20

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
class PreparedClaim:
    """What NodePrepareResources answers for one claim and writes into its CDI spec."""

    devices: tuple[AllocatedDevice, ...]
    grants: Mapping[str, ContainerGrant]  # by request name


def _consumed(result: Obj, name: str, where: str) -> Any:
    consumed = result.get("consumedCapacity")
    if consumed is None:
        return None
    if not isinstance(consumed, Mapping):
        raise ClaimProblem(f"{where}.consumedCapacity: {consumed!r} is not a map")
    return consumed.get(name)


def _amount(value: Any, where: str) -> int:
    """A consumed quantity as an integer in base units, rounded up."""
    try:
        return math.ceil(parse_quantity(value))
    except QuantityError as exc:
        raise ClaimProblem(f"{where}: {exc}") from None


def allocated_devices(claim: Obj, *, uid: str, driver: str, pool: str,
                      gpus: Mapping[int, Gpu]) -> tuple[AllocatedDevice, ...]:
    """This driver's devices in ``claim``'s allocation; :class:`ClaimProblem` when the claim
    is not the one the kubelet named (``uid``), is not allocated, or names what is not here."""
    found_uid = (claim.get("metadata") or {}).get("uid")
    if found_uid != uid:
        raise ClaimProblem(f"metadata.uid is {found_uid!r}, the kubelet asked for {uid!r}: the "
                           f"claim was deleted and made again; the kubelet retries with the "
                           f"new one")
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimProblem("status.allocation is not set: the claim is not allocated yet")
    results = (allocation.get("devices") or {}).get("results") or []
    if not isinstance(results, Sequence):
        raise ClaimProblem("status.allocation.devices.results is not a list")
    devices = []
    for i, result in enumerate(results):
        where = f"status.allocation.devices.results[{i}]"
        if not isinstance(result, Mapping):
            raise ClaimProblem(f"{where} is not an object")
        if result.get("driver") != driver:
            continue  # another driver's device in the same claim: that driver prepares it
        if result.get("pool") != pool:
            raise ClaimProblem(f"{where}.pool is {result.get('pool')!r}, but this node's pool "
                               f"is {pool!r}: the claim was allocated on another node")
        name = result.get("device")
        index = device_index(name) if isinstance(name, str) else None
        if not isinstance(name, str) or index is None or index not in gpus:
            raise ClaimProblem(f"{where}.device {name!r} is not a GPU of this node (devices "
                               f"{', '.join(f'gpu-{i}' for i in sorted(gpus))})")
        gpu = gpus[index]
        milli_value = _consumed(result, CAPACITY_MILLI, where)
        memory_value = _consumed(result, CAPACITY_MEMORY, where)
        milli = (MILLI_PER_GPU if milli_value is None
                 else _amount(milli_value, f"{where}.consumedCapacity.{CAPACITY_MILLI}"))
        memory_bytes = (0 if memory_value is None
                        else _amount(memory_value, f"{where}.consumedCapacity.{CAPACITY_MEMORY}"))
        if not 0 < milli <= MILLI_PER_GPU:
            raise ClaimProblem(f"{where}.consumedCapacity.{CAPACITY_MILLI} is {milli}; it must "
                               f"be 1..{MILLI_PER_GPU}")
        memory_mib = math.ceil(memory_bytes / MIB)
        if not 0 <= memory_mib <= gpu.memory_total_mib:
            raise ClaimProblem(f"{where}.consumedCapacity.{CAPACITY_MEMORY} is {memory_mib} "
                               f"MiB; GPU {index} has {gpu.memory_total_mib} MiB")
        request = result.get("request")
        if not isinstance(request, str) or not request:
            raise ClaimProblem(f"{where}.request is {request!r}; it must name the request")
        share_id = result.get("shareID")
        devices.append(AllocatedDevice(request, pool, name, gpu, milli, memory_mib,
                                       share_id if isinstance(share_id, str) else None))
    if not devices:
        raise ClaimProblem(f"the allocation has no device of driver {driver!r}")
    return tuple(devices)


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
