"""Device IDs as the kubelet sees them, for whole GPUs and for shares.

Whole GPUs (``nvidia.com/gpu``): one device per GPU, its ID the GPU's UUID, as NVIDIA's plugin
does. Shares (``gpufrag.io/gpu-milli``): the kubelet counts a resource in devices, and the
share resource is in milli-GPU, so each GPU is advertised as 1000 virtual devices
``<uuid>::000`` .. ``<uuid>::999`` (the granularity is fixed by the resource's unit: a pod asking
``gpufrag.io/gpu-milli: 300`` gets 300 devices). The IDs are the kubelet's bookkeeping; which
GPU a container really gets is the one the extender recorded (:mod:`node.deviceplugin.matching`;
a whole-GPU pod with no record gets the ones the kubelet chose) and GetPreferredAllocation steers
the kubelet to the devices of that GPU, so its accounting and health match what the containers
use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from node.deviceplugin.api import HEALTHY, MAX_DEVICE_ID_LENGTH, UNHEALTHY, pb
from node.deviceplugin.config import Kind
from node.gpus import Gpu
from scheduler.core.types import MILLI_PER_GPU

SHARE_SEPARATOR = "::"


def share_id(uuid: str, slot: int) -> str:
    return f"{uuid}{SHARE_SEPARATOR}{slot:03d}"


def gpu_of(device_id: str) -> str:
    """The GPU UUID a device ID belongs to (itself for a whole GPU)."""
    uuid, sep, _ = device_id.rpartition(SHARE_SEPARATOR)
    return uuid if sep else device_id


def device_ids(kind: Kind, gpu: Gpu) -> tuple[str, ...]:
    if kind is Kind.WHOLE:
        return (gpu.uuid,)
    return tuple(share_id(gpu.uuid, slot) for slot in range(MILLI_PER_GPU))


def check_ids(gpus: Sequence[Gpu]) -> None:
    """Refuse UUIDs the API cannot carry (longer than 63 characters once suffixed)."""
    for gpu in gpus:
        longest = share_id(gpu.uuid, MILLI_PER_GPU - 1)
        if len(longest) > MAX_DEVICE_ID_LENGTH:
            raise ValueError(f"GPU {gpu.index} UUID {gpu.uuid!r} makes device IDs longer than "
                             f"{MAX_DEVICE_ID_LENGTH} characters")


class DeviceList:
    """The ListAndWatch answer for one resource, rebuilt only when health changes."""

    def __init__(self, kind: Kind, gpus: Sequence[Gpu]) -> None:
        self.kind = kind
        self._ids = {gpu.uuid: device_ids(kind, gpu) for gpu in gpus}
        self._all = frozenset(i for ids in self._ids.values() for i in ids)
        self._cache: tuple[tuple[tuple[str, bool], ...], pb.ListAndWatchResponse] | None = None

    def problem(self, ids: Sequence[str]) -> str | None:
        """Why ``ids`` (from an Allocate or PreStartContainer call) cannot be this list's: an
        ID never advertised, or one named twice; None when they are fine."""
        unknown = [i for i in ids if i not in self._all]
        if unknown:
            shown = ", ".join(repr(i[:80]) for i in unknown[:3])
            return (f"{len(unknown)} device ID(s) this plugin never advertised ({shown}"
                    f"{' ...' if len(unknown) > 3 else ''})")
        if len(set(ids)) != len(ids):
            return "a device ID is named more than once"
        return None

    def response(self, health: Mapping[str, bool]) -> pb.ListAndWatchResponse:
        key = tuple(sorted(health.items()))
        if self._cache is None or self._cache[0] != key:
            devices = [pb.Device(ID=device_id, health=HEALTHY if health.get(uuid) else UNHEALTHY)
                       for uuid, ids in self._ids.items() for device_id in ids]
            self._cache = (key, pb.ListAndWatchResponse(devices=devices))
        return self._cache[1]


def preferred(available: Iterable[str], must_include: Iterable[str], size: int,
              target_gpus: Sequence[str]) -> list[str]:
    """``size`` device IDs from ``available``: ``must_include`` first, then devices of
    ``target_gpus`` (in that order), then any others, each group in ID order (so a share's
    slots are taken from the low end and the kubelet's view stays compact)."""
    chosen: list[str] = []
    seen: set[str] = set()

    def take(ids: Iterable[str]) -> bool:
        for device_id in ids:
            if len(chosen) >= size:
                return True
            if device_id not in seen:
                seen.add(device_id)
                chosen.append(device_id)
        return len(chosen) >= size

    pool = sorted(set(available))
    if take(must_include):
        return chosen
    by_gpu: dict[str, list[str]] = {}
    for device_id in pool:
        by_gpu.setdefault(gpu_of(device_id), []).append(device_id)
    for uuid in target_gpus:
        if take(by_gpu.get(uuid, ())):
            return chosen
    take(pool)
    return chosen
