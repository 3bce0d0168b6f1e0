"""Recorded NVML answers, replayed through the node agent when there is no GPU."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from defrag.agent.nvml import GpuReading
from gpufrag.demo.scenario import NodeShape

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class _Memory:
    used: int
    total: int


@dataclass(frozen=True, slots=True)
class _Utilization:
    gpu: int


@dataclass(frozen=True, slots=True)
class _Process:
    pid: int
    usedGpuMemory: int | None  # NVML's name


@dataclass(frozen=True, slots=True)
class RecordedGpu:
    """One GPU as NVML reports it (bytes): identity, memory, utilisation, processes."""

    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    utilization_pct: int
    processes: tuple[tuple[int, int], ...] = ()  # (host pid, used bytes)


class ReplayNvml:
    """The pynvml calls the agent makes (:class:`defrag.agent.nvml.NvmlApi`), answered from
    recorded readings of one node — what the agent sees on a node without a real GPU here."""

    def __init__(self, gpus: Sequence[RecordedGpu]) -> None:
        self.gpus = list(gpus)

    @staticmethod
    def _gpu(handle: object) -> RecordedGpu:
        if not isinstance(handle, RecordedGpu):
            raise TypeError(f"not a handle of this NVML: {handle!r}")
        return handle

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: object) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> _Memory:
        gpu = self._gpu(handle)
        return _Memory(used=gpu.used_bytes, total=gpu.total_bytes)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> _Utilization:
        return _Utilization(self._gpu(handle).utilization_pct)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[_Process]:
        return [_Process(pid, used) for pid, used in self._gpu(handle).processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: object) -> list[_Process]:
        return []


@dataclass(frozen=True, slots=True)
class GpuPod:
    """A pod bound to a node, as the recorded readings need it."""

    uid: str
    gpus: tuple[int, ...]
    used_mib_per_gpu: int


class FakeProcRoot:
    """``<root>/<pid>/cgroup`` files naming each pod's cgroup the way the kubelet's systemd driver
    does, so the agent's pid -> pod lookup (``--proc-root``) runs unchanged."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._pids: dict[str, int] = {}

    def pid_of(self, uid: str) -> int:
        pid = self._pids.get(uid)
        if pid is None:
            pid = self._pids[uid] = 200_000 + len(self._pids)
            cgroup = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                      f"{uid.replace('-', '_')}.slice/cri-containerd-{uuid.uuid4().hex}.scope\n")
            (self.root / str(pid)).mkdir(parents=True, exist_ok=True)
            (self.root / str(pid) / "cgroup").write_text(cgroup)
        return pid


def recorded_gpus(node: str, shape: NodeShape, pods: Sequence[GpuPod],
                  pid_of: Callable[[str], int]) -> list[RecordedGpu]:
    """The NVML readings of one node: each pod's process on each of its GPUs."""
    gpus = []
    for g in range(shape.gpus):
        processes = tuple((pid_of(p.uid), p.used_mib_per_gpu * MIB)
                          for p in pods if g in p.gpus)
        used = sum(b for _, b in processes)
        gpus.append(RecordedGpu(
            uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{g}')}", name=shape.nvml_name,
            total_bytes=shape.gpu_memory_mib * MIB, used_bytes=used,
            utilization_pct=min(100, 30 * len(processes)), processes=processes))
    return gpus


def live_model_memory(readings: Sequence[GpuReading], pids: Mapping[str, int]) -> dict[str, int]:
    """Deployment -> the GPU memory its stand-in process uses now, summed over the GPUs NVML
    lists it on (stand-ins not on any GPU are left out)."""
    used: dict[int, int] = {}
    for reading in readings:
        for process in reading.processes:
            used[process.pid] = used.get(process.pid, 0) + process.memory_used_mib
    return {name: used[pid] for name, pid in pids.items() if pid in used}
