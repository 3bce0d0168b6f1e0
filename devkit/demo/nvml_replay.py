"""Recorded NVML answers, replayed through the node agent when there is no GPU.

The answers are :class:`gpufrag.nvml_recorded.RecordedDevice` recordings, served by the shared
recorded NVML (:class:`gpufrag.nvml_recorded.RecordedNvml`), so the agent reads them through the
same adapter and the same fake as everywhere else.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from devkit.demo.scenario import NodeShape
from gpufrag.nvml import MIB, GpuReading
from gpufrag.nvml_recorded import RecordedDevice, RecordedProcess, RecordedSample


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
                  pid_of: Callable[[str], int]) -> list[RecordedDevice]:
    """The NVML readings of one node: each pod's process on each of its GPUs."""
    gpus = []
    for g in range(shape.gpus):
        processes = [RecordedProcess(pid_of(p.uid), p.used_mib_per_gpu * MIB)
                     for p in pods if g in p.gpus]
        used = sum(p.used_bytes or 0 for p in processes)
        gpus.append(RecordedDevice(
            uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{g}')}", name=shape.nvml_name,
            memory_total_bytes=shape.gpu_memory_mib * MIB,
            samples=[RecordedSample(utilization_pct=min(100, 30 * len(processes)),
                                    memory_used_bytes=used)],
            processes=processes))
    return gpus


def live_model_memory(readings: Sequence[GpuReading], pids: Mapping[str, int]) -> dict[str, int]:
    """Deployment -> the GPU memory its stand-in process uses now, summed over the GPUs NVML
    lists it on (stand-ins not on any GPU are left out)."""
    used: dict[int, int] = {}
    for reading in readings:
        for process in reading.processes:
            used[process.pid] = used.get(process.pid, 0) + process.memory_used_mib
    return {name: used[pid] for name, pid in pids.items() if pid in used}
