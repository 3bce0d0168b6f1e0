"""Recorded NVML answers for the node agent on a fake node, and the /proc that names the pods.

The demo's nodes have no GPU and no processes, so for each node the demo writes the two inputs
the agent would read on a real one, as files a ``gpufrag agent`` subprocess reads:

- a JSON **recording** of the node's GPUs (the format of :mod:`gpufrag.nvml_recorded`), one
  process per pod on each of its GPUs with the scenario's memory figure, for
  ``--nvml-recording``; the agent serves it through the shared recorded NVML
  (:class:`gpufrag.nvml_recorded.RecordedNvml`), the same adapter and fake as everywhere else;
- a **proc root** (``--proc-root``) with a ``<pid>/cgroup`` file per recorded process naming
  its pod's cgroup as the kubelet's systemd driver does, so the agent's pid -> pod lookup
  (:mod:`node.agent.cgroup`) runs unchanged, pod UIDs to names through the API server.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def recording_json(devices: Sequence[RecordedDevice]) -> dict[str, Any]:
    """``devices`` as a recording file holds them: NVML's names and units (bytes, percent)."""
    def text(value: str | bytes) -> str:
        return value.decode() if isinstance(value, bytes) else value

    def processes(found: Sequence[RecordedProcess]) -> list[dict[str, Any]]:
        return [{"pid": p.pid, "used_bytes": p.used_bytes} for p in found]

    return {"devices": [{
        "name": text(d.name), "uuid": text(d.uuid), "memory_total": d.memory_total_bytes,
        "samples": [{"gpu": s.utilization_pct, "memory_used": s.memory_used_bytes}
                    for s in d.samples],
        "processes": processes(d.processes),
        "graphics_processes": processes(d.graphics_processes),
        **({"errors": d.errors} if d.errors else {}),
    } for d in devices]}


def write_recording(path: Path, devices: Sequence[RecordedDevice]) -> Path:
    """Write ``devices`` to ``path`` for ``gpufrag agent --nvml-recording`` (replaced whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recording_json(devices), indent=1) + "\n")
    return path


def live_model_memory(readings: Sequence[GpuReading], pids: Mapping[str, int]) -> dict[str, int]:
    """Deployment -> the GPU memory its stand-in process uses now, summed over the GPUs NVML
    lists it on (stand-ins not on any GPU are left out)."""
    used: dict[int, int] = {}
    for reading in readings:
        for process in reading.processes:
            used[process.pid] = used.get(process.pid, 0) + process.memory_used_mib
    return {name: used[pid] for name, pid in pids.items() if pid in used}
