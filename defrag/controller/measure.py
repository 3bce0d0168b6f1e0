"""Measure what the defrag trigger and the plan's score read: GPU memory reserved and not
touched over a window ("allocated but unused"), and FGD fragmentation, per GPU and per node.
Pure numpy over a ``ClusterState``.

Allocated (reserved) memory of a GPU is its allocated share times its memory:
``(1000 - free_milli) / 1000 x gpu_memory_mib`` (the memory from the node label
``nvidia.com/gpu.memory`` or, failing that, the agent's ``memory_total_mib``). Used memory comes
from the node agent's annotation (or DCGM through Prometheus) and is kept per pod, so that it
travels with a pod when the planner (or the what-if) moves it: what the pod uses now, and the
most it used over the window (the agent's ``peak_mib``; the recommender's window).

The idle ratio of a node (DESIGN.md) is ``Σ_gpu max(allocated − peak use, 0) / Σ_gpu
allocated`` over the GPUs with a fresh reading: memory reserved and not touched over the
window, which is what the 25% trigger reads. A pod's use swinging below its peak is not idle:
no move and no right-sizing could give it back, so it is reported apart, as **burst headroom**
(``Σ max(peak − current use, 0)``), and never triggers. A node with no fresh reading has no
idle ratio (NaN) and never triggers on idle memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler.core.fragmentation import TargetWorkload, node_fragmentation
from scheduler.core.state import BoolArray, ClusterState, pod_key
from scheduler.core.types import MILLI_PER_GPU, Placement

FloatArray = npt.NDArray[np.float64]
GpuKey = tuple[int, int]  # (node row, GPU index)
MIB_PER_GIB = 1024.0


class UsageTable:
    """GPU memory in use, now and at its peak over the window, per GPU and per pod (MiB),
    aligned with a ``ClusterState``'s rows.

    ``used_mib[row, gpu]`` = memory of the pods on that GPU now + ``other_mib`` (processes
    outside any pod, driver reservations); ``peak_mib[row, gpu]`` the same with each pod's
    peak over the window. A pod's figures are memory per GPU it holds. A pod with no figure of
    its own is counted as using all it reserved, and one with no peak as peaking at what it
    uses now, so no idle memory is ever invented for it. ``known`` marks GPUs with a fresh
    reading; only those enter the idle ratio.
    """

    def __init__(self, state: ClusterState) -> None:
        shape = (state.cpu_cap.shape[0], state.gpu_width)
        self.used_mib: FloatArray = np.zeros(shape)
        self.peak_mib: FloatArray = np.zeros(shape)
        self.other_mib: FloatArray = np.zeros(shape)
        self.known: BoolArray = np.zeros(shape, np.bool_)
        self.pod_used_mib: dict[str, float] = {}
        self.pod_peak_mib: dict[str, float] = {}
        self._gpu_memory = state.gpu_memory_mib

    @classmethod
    def from_readings(cls, state: ClusterState, gpu_used_mib: Mapping[GpuKey, float],
                      pod_used_mib: Mapping[str, float],
                      pod_peak_mib: Mapping[str, float] | None = None, *,
                      gpu_peak_mib: Mapping[GpuKey, float] | None = None) -> UsageTable:
        """Build from fresh readings: ``gpu_used_mib`` per (row, GPU) with a reading, the
        per-GPU figures of the pods that have one, and their peaks over the window
        (``pod_peak_mib``). On a GPU with a reading, pods without a figure share what the
        listed pods do not explain, in proportion to their shares; where the GPU's own peak
        over the window is known (``gpu_peak_mib``: DCGM's), they share its unexplained peak
        the same way."""
        table = cls(state)
        on_gpu: dict[GpuKey, list[Placement]] = {}
        for placement in state.pods.values():
            row = state.index[placement.node]
            for g in placement.gpus:
                on_gpu.setdefault((row, g), []).append(placement)
        for (row, g), used in gpu_used_mib.items():
            if not 0 <= row < state.size or not 0 <= g < int(state.gpu_count[row]):
                continue
            table.known[row, g] = True
            pods = on_gpu.get((row, g), [])
            explained = sum(pod_used_mib[pod_key(p.pod)] for p in pods
                            if pod_key(p.pod) in pod_used_mib)
            unexplained = [p for p in pods if pod_key(p.pod) not in pod_used_mib]
            rest = max(used - explained, 0.0)
            peak = (gpu_peak_mib or {}).get((row, g))
            if unexplained:
                total_milli = sum(p.pod.gpu_milli for p in unexplained)
                peak_rest = None if peak is None else max(peak - explained, rest)
                for p in unexplained:
                    share = rest * p.pod.gpu_milli / total_milli
                    key = pod_key(p.pod)
                    # A pod on several GPUs gets the mean of its GPUs' shares.
                    table.pod_used_mib[key] = (table.pod_used_mib.get(key, 0.0)
                                               + share / len(p.gpus))
                    if peak_rest is not None:
                        table.pod_peak_mib[key] = (
                            table.pod_peak_mib.get(key, 0.0)
                            + peak_rest * p.pod.gpu_milli / total_milli / len(p.gpus))
            else:
                table.other_mib[row, g] = rest
        for key, used in pod_used_mib.items():
            if key in state.pods:
                table.pod_used_mib[key] = float(used)
        for key, peak in (pod_peak_mib or {}).items():
            if key in state.pods:
                table.pod_peak_mib[key] = float(peak)
        table.recompute(state)
        return table

    def recompute(self, state: ClusterState) -> None:
        """Rebuild ``used_mib`` and ``peak_mib`` from the pods and ``other_mib`` (after a
        bulk change)."""
        self.used_mib[:] = self.other_mib
        self.peak_mib[:] = self.other_mib
        for placement in state.pods.values():
            row = state.index[placement.node]
            used, peak = self.pod_used(placement, row), self.pod_peak(placement, row)
            for g in placement.gpus:
                self.used_mib[row, g] += used
                self.peak_mib[row, g] += peak

    def pod_used(self, placement: Placement, row: int) -> float:
        """Memory per GPU that ``placement``'s pod uses (its reservation on ``row`` if unknown)."""
        figure = self.pod_used_mib.get(pod_key(placement.pod))
        if figure is not None:
            return figure
        return placement.pod.gpu_milli / MILLI_PER_GPU * float(self._gpu_memory[row])

    def pod_peak(self, placement: Placement, row: int) -> float:
        """The most memory per GPU ``placement``'s pod used over the window (never below what
        it uses now; what it uses now when no peak is known)."""
        used = self.pod_used(placement, row)
        peak = self.pod_peak_mib.get(pod_key(placement.pod))
        return used if peak is None else max(peak, used)

    def add(self, placement: Placement, row: int, used_mib: float | None,
            peak_mib: float | None = None) -> None:
        """Account a newly placed pod using ``used_mib`` per GPU (None: what it reserves),
        ``peak_mib`` at most over the window (None: what it uses now)."""
        key = pod_key(placement.pod)
        if used_mib is not None:
            self.pod_used_mib[key] = float(used_mib)
        if peak_mib is not None:
            self.pod_peak_mib[key] = float(peak_mib)
        for g in placement.gpus:
            self.used_mib[row, g] += self.pod_used(placement, row)
            self.peak_mib[row, g] += self.pod_peak(placement, row)

    def forget(self, key: str) -> None:
        """Drop a gone pod's figures (call after :meth:`move` took its memory off)."""
        self.pod_used_mib.pop(key, None)
        self.pod_peak_mib.pop(key, None)

    def move(self, placement: Placement, source_row: int, target_row: int,
             target_gpus: tuple[int, ...], *, fresh: bool = False) -> None:
        """Account ``placement``'s memory on ``target_row``/``target_gpus`` instead of where it
        is. Call before ``ClusterState`` is updated (``placement`` is the old one). ``fresh``:
        it lands as a new pod (an evicted pod's replacement), whose peak over the window
        starts from what it uses now, as the agent's window restarts with the pod."""
        for g in placement.gpus:
            self.used_mib[source_row, g] -= self.pod_used(placement, source_row)
            self.peak_mib[source_row, g] -= self.pod_peak(placement, source_row)
        if fresh:
            self.pod_peak_mib.pop(pod_key(placement.pod), None)
        for g in target_gpus:
            self.used_mib[target_row, g] += self.pod_used(placement, target_row)
            self.peak_mib[target_row, g] += self.pod_peak(placement, target_row)


@dataclass(frozen=True)
class Summary:
    """Cluster-wide figures, before or after a cycle (printed, pushed, written by the what-if)."""

    idle_ratio: float  # Σ idle / Σ allocated over GPUs with a fresh reading
    idle_gib: float  # reserved and not touched over the window
    burst_headroom_gib: float  # Σ (peak − current use): reported, never a trigger
    frag_ratio: float  # FGD fragmentation over free GPU share
    frag_gpus: float  # FGD fragmentation in GPUs
    free_whole_gpus: int
    free_gpu_nodes: int  # GPU nodes with every GPU free
    allocated_gpus: float
    nodes_with_usage: int

    def as_dict(self) -> dict[str, float | int]:
        return {
            "idle_ratio": round(self.idle_ratio, 6),
            "idle_gib": round(self.idle_gib, 3),
            "burst_headroom_gib": round(self.burst_headroom_gib, 3),
            "frag_ratio": round(self.frag_ratio, 6),
            "frag_gpus": round(self.frag_gpus, 3),
            "free_whole_gpus": self.free_whole_gpus,
            "free_gpu_nodes": self.free_gpu_nodes,
            "allocated_gpus": round(self.allocated_gpus, 3),
            "nodes_with_usage": self.nodes_with_usage,
        }


def comparison_rows(before: Summary, after: Summary, *, gib: str = ".1f",
                    gpus: str = ".2f") -> list[tuple[str, str, str]]:
    """(label, before, after) text for the figures a cycle is judged by, shared by the cycle
    summary and the what-if table; ``gib`` and ``gpus`` are the format specs of the GiB and
    GPU-count figures (a whole what-if cluster reads better with fewer digits)."""
    b, a = before, after
    return [
        ("idle ratio", f"{b.idle_ratio:.1%}", f"{a.idle_ratio:.1%}"),
        ("idle GiB", format(b.idle_gib, gib), format(a.idle_gib, gib)),
        ("burst headroom GiB", format(b.burst_headroom_gib, gib),
         format(a.burst_headroom_gib, gib)),
        ("fragmentation ratio", f"{b.frag_ratio:.1%}", f"{a.frag_ratio:.1%}"),
        ("fragmentation (GPUs)", format(b.frag_gpus, gpus), format(a.frag_gpus, gpus)),
        ("free whole GPUs", str(b.free_whole_gpus), str(a.free_whole_gpus)),
        ("free GPU nodes", str(b.free_gpu_nodes), str(a.free_gpu_nodes)),
    ]


@dataclass(frozen=True)
class Measurement:
    """Per node (index = ClusterState row): idle memory and fragmentation, plus the cluster
    summary."""

    idle_ratio: FloatArray  # NaN where the node has no fresh reading of an allocated GPU
    idle_mib: FloatArray
    allocated_mib: FloatArray  # over GPUs with a fresh reading
    frag_milli: FloatArray
    summary: Summary


def gpu_exists(state: ClusterState) -> BoolArray:
    """[row, gpu] -> the GPU exists on an active node."""
    n = state.size
    mask: BoolArray = ((np.arange(state.gpu_width)[None, :] < state.gpu_count[:n, None])
                       & state.active[:n, None])
    return mask


def node_idle_ratio(state: ClusterState, usage: UsageTable, row: int,
                    change: Mapping[int, tuple[float, float]] | None = None) -> float:
    """``row``'s idle ratio, the figure its trigger reads, with ``change[gpu]`` = (allocated
    MiB, peak MiB) added on that GPU: a pod landing there (positive) or taken away (negative).
    What a move would leave (the planner's landing check) or what a node would read without
    some of its pods (the what-if's flap attribution); 0 with nothing allocated."""
    memory = float(state.gpu_memory_mib[row])
    change = change or {}
    idle = allocated = 0.0
    for g in range(int(state.gpu_count[row])):
        if not usage.known[row, g]:
            continue
        alloc = (MILLI_PER_GPU - float(state.gpu_free[row, g])) / MILLI_PER_GPU * memory
        peak = float(usage.peak_mib[row, g])
        extra_alloc, extra_peak = change.get(g, (0.0, 0.0))
        alloc, peak = alloc + extra_alloc, peak + extra_peak
        idle += max(alloc - peak, 0.0)
        allocated += alloc
    return idle / allocated if allocated > 1e-9 else 0.0


def measure(state: ClusterState, usage: UsageTable, workload: TargetWorkload) -> Measurement:
    """Idle memory and fragmentation of every node of ``state``."""
    n = state.size
    exists = gpu_exists(state)
    free = state.gpu_free[:n]
    allocated_milli = np.where(exists, MILLI_PER_GPU - free, 0)
    allocated_mib = allocated_milli / MILLI_PER_GPU * state.gpu_memory_mib[:n, None]
    known = usage.known[:n] & exists
    peak, now = usage.peak_mib[:n], usage.used_mib[:n]
    idle = np.where(known, np.maximum(allocated_mib - peak, 0.0), 0.0)
    node_idle = idle.sum(axis=1)
    headroom = float(np.where(known, np.maximum(peak - now, 0.0), 0.0).sum())
    node_allocated = np.where(known, allocated_mib, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(node_allocated > 0, node_idle / node_allocated, np.nan)
    frag = node_fragmentation(state, workload)
    free_total = int(np.where(exists, free, 0).sum())
    whole_free = exists & (free == MILLI_PER_GPU)
    gpu_nodes = state.active[:n] & (state.gpu_count[:n] > 0)
    total_allocated = float(node_allocated.sum())
    summary = Summary(
        idle_ratio=float(node_idle.sum()) / total_allocated if total_allocated else 0.0,
        idle_gib=float(node_idle.sum()) / MIB_PER_GIB,
        burst_headroom_gib=headroom / MIB_PER_GIB,
        frag_ratio=float(frag.sum()) / free_total if free_total else 0.0,
        frag_gpus=float(frag.sum()) / MILLI_PER_GPU,
        free_whole_gpus=int(whole_free.sum()),
        free_gpu_nodes=int((gpu_nodes & (whole_free.sum(axis=1) == state.gpu_count[:n])).sum()),
        allocated_gpus=float(allocated_milli.sum()) / MILLI_PER_GPU,
        nodes_with_usage=int(known.any(axis=1).sum()),
    )
    return Measurement(idle_ratio=ratio, idle_mib=node_idle, allocated_mib=node_allocated,
                       frag_milli=frag, summary=summary)

