"""The isolation check: pods whose measured GPU memory exceeds the share they were placed with.

A share (``gpufrag.io/gpu-milli``, or GPU memory MiB) is enforced by CUDA only under MPS
(``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, set by the device plugin with ``--mps``); otherwise it is
soft: a pod may allocate past it and its peers on the GPU run out of memory. The agent measures
every pod's memory per GPU through NVML anyway, so it says when a share is overrun, which none
of gpushare, HAMi or NVIDIA's time-slicing plugin report:

- a pod's memory on a GPU recorded for it (``gpufrag.io/gpu-indices``) is over when it exceeds
  its share (:func:`scheduler.kube.convert.share_memory_mib`: the memory it asked, or its milli
  share of that GPU's memory) by more than ``tolerance_mib``;
- a pod with recorded GPUs holding memory on a GPU *not* recorded for it is over with a share of
  0 (a container that reached a GPU the extender did not choose);
- whole-GPU pods and pods without recorded GPUs are not checked (nothing to hold them to).

Pure, like :mod:`node.agent.leakwatch`: the caller hands :meth:`ShareWatch.observe` each
reading with the time and the share lookup, and gets back what is over now (for the metric)
and the overruns to report as Events now. Reports are deduplicated and bounded: one per
overrun (``intervals`` consecutive readings over), again only after the pod has gone back under
and ``cooldown_s`` has passed since its last report, and at most ``max_events`` per reading (the
rest wait for the next one). State is kept only for pods on a GPU now, so it is bounded by the
node's pods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpufrag.gpu_usage import NodeGpuUsage
from node.agent.cgroup import PodRef, PodShare
from scheduler.kube.convert import share_memory_mib

DEFAULT_TOLERANCE_MIB = 0
DEFAULT_INTERVALS = 2
DEFAULT_COOLDOWN_S = 600.0
MAX_EVENTS_PER_READING = 10


@dataclass(frozen=True, slots=True)
class Overrun:
    """One pod over its share on one GPU, with the numbers for the Event message."""

    pod: PodRef
    gpu_index: int
    gpu_uuid: str
    used_mib: int
    share_mib: int
    share_text: str  # what the share is, in the pod's words
    chosen: bool  # False: the GPU was not recorded for the pod at all
    intervals: int

    def message(self) -> str:
        if not self.chosen:
            return (f"GPU {self.gpu_index} ({self.gpu_uuid}) was not chosen for this pod "
                    f"({self.share_text}), yet its processes hold {self.used_mib} MiB on it "
                    f"for {self.intervals} interval(s): a container reached a GPU the "
                    f"scheduler did not give it")
        return (f"GPU {self.gpu_index} ({self.gpu_uuid}): the pod's processes hold "
                f"{self.used_mib} MiB, more than its share of {self.share_mib} MiB "
                f"({self.share_text}) for {self.intervals} interval(s); without MPS the share is "
                f"not enforced, so pods sharing this GPU may run out of memory")


@dataclass(slots=True)
class _Track:
    streak: int = 0
    reported: bool = False
    last_report_at: float | None = None


def _share_text(share: PodShare, gpu_memory_total_mib: int) -> str:
    request = share.request
    if request.gpu_memory_mib:
        return f"{request.gpu_memory_mib} MiB of GPU memory requested"
    return f"{request.gpu_milli} milli-GPU of {gpu_memory_total_mib} MiB"


class ShareWatch:
    def __init__(self, *, tolerance_mib: int = DEFAULT_TOLERANCE_MIB,
                 intervals: int = DEFAULT_INTERVALS, cooldown_s: float = DEFAULT_COOLDOWN_S,
                 max_events: int = MAX_EVENTS_PER_READING) -> None:
        if tolerance_mib < 0:
            raise ValueError(f"tolerance_mib must be >= 0, got {tolerance_mib}")
        if intervals < 1:
            raise ValueError(f"intervals must be >= 1, got {intervals}")
        if cooldown_s < 0:
            raise ValueError(f"cooldown_s must be >= 0, got {cooldown_s}")
        if max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {max_events}")
        self.tolerance_mib = tolerance_mib
        self.intervals = intervals
        self.cooldown_s = cooldown_s
        self.max_events = max_events
        self._tracks: dict[tuple[str, int], _Track] = {}

    def __len__(self) -> int:
        """Pod-GPU pairs tracked (bounded by the pods on the node's GPUs)."""
        return len(self._tracks)

    def observe(self, usage: NodeGpuUsage, share_of: Callable[[str], PodShare | None],
                now: float) -> tuple[list[tuple[Overrun, bool]], list[Overrun]]:
        """One reading: (every checked pod-GPU pair with whether it is over now, the overruns
        to report now)."""
        checked: list[tuple[Overrun, bool]] = []
        due: list[Overrun] = []
        seen: set[tuple[str, int]] = set()
        for gpu in usage.gpus:
            for pod in gpu.pods:
                share = share_of(pod.uid)
                if share is None or share.gpus is None:
                    continue
                chosen = gpu.index in share.gpus
                if chosen:
                    share_mib = share_memory_mib(share.request, gpu.memory_total_mib)
                    if share_mib is None:  # whole GPUs: nothing below the GPU to hold it to
                        continue
                    text = _share_text(share, gpu.memory_total_mib)
                else:
                    share_mib, text = 0, f"its recorded GPUs are {share.gpus_text or 'none'}"
                key = (pod.uid, gpu.index)
                seen.add(key)
                track = self._tracks.setdefault(key, _Track())
                over = pod.memory_used_mib > share_mib + self.tolerance_mib
                if over:
                    track.streak += 1
                else:
                    track.streak = 0
                    track.reported = False
                overrun = Overrun(PodRef(pod.namespace, pod.name, pod.uid), gpu.index, gpu.uuid,
                                  pod.memory_used_mib, share_mib, text, chosen, track.streak)
                checked.append((overrun, over))
                cooled = (track.last_report_at is None
                          or now - track.last_report_at >= self.cooldown_s)
                if (over and track.streak >= self.intervals and not track.reported and cooled
                        and len(due) < self.max_events):
                    track.reported = True
                    track.last_report_at = now
                    due.append(overrun)
        for gone in self._tracks.keys() - seen:
            del self._tracks[gone]
        return checked, due
