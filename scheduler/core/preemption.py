"""Which of kube-scheduler's candidate victims on a node a pod really needs gone.

kube-scheduler's preemption picks victims by its own resource arithmetic, which does not see
GPU shares per GPU: it may evict pods from a GPU the preemptor cannot use, or more pods than
needed. Given its candidates on one node, :func:`fewest_victims` returns the smallest subset
whose removal lets the pod fit one GPU (or enough whole GPUs) as the core sees it, and among
subsets of that size the one leaving the node least fragmented (FGD's F(n) after the pod is
placed); None when no subset helps.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np

from scheduler.core.fragmentation import TargetWorkload, fragmentation_of
from scheduler.core.state import ClusterState
from scheduler.core.types import MILLI_PER_GPU, PodRequest

# Candidate sets up to this size are searched exhaustively (2^12 subsets at most); above it
# only the whole set is tried.
MAX_EXHAUSTIVE_VICTIMS = 12


def fewest_victims(state: ClusterState, workload: TargetWorkload, pod: PodRequest, row: int,
                   candidates: Sequence[str]) -> tuple[str, ...] | None:
    """The fewest of ``candidates`` (pod keys placed on ``row``) to evict so ``pod`` fits
    there, ties to the smallest fragmentation after placing it; None when none helps."""
    resolved = pod.on_gpu_memory(int(state.gpu_memory_mib[row]))
    if resolved is None or not state.active[row]:
        return None
    product = state.products[int(state.product[row])]
    if resolved.gpu_spec and product not in resolved.gpu_spec:
        return None
    count = int(state.gpu_count[row])
    if resolved.num_gpu > count:
        return None
    keys = [k for k in dict.fromkeys(candidates) if k in state.pods
            and state.pods[k].node == state.names[row]]
    release = []
    for key in keys:
        placed = state.pods[key]
        gpu = np.zeros(state.gpu_width, np.int64)
        for g in placed.gpus:
            gpu[g] += placed.pod.gpu_milli
        release.append((placed.pod.cpu_milli, placed.pod.memory_mib, gpu))
    free0 = state.gpu_free[row].copy()
    cpu0, mem0 = int(state.cpu_left[row]), int(state.mem_left[row])
    allowed = workload.allowed(state)

    def after(subset: tuple[int, ...]) -> float | None:
        free = free0.copy()
        cpu, mem = cpu0, mem0
        for i in subset:
            cpu += release[i][0]
            mem += release[i][1]
            free += release[i][2]
        if cpu < resolved.cpu_milli or mem < resolved.memory_mib:
            return None
        usable = free[:count]
        if resolved.is_share:
            fits = np.flatnonzero(usable >= resolved.gpu_milli)
            if fits.size == 0:
                return None
            free[fits[np.argmin(usable[fits])]] -= resolved.gpu_milli
        else:
            whole = np.flatnonzero(usable == MILLI_PER_GPU)
            if whole.size < resolved.num_gpu:
                return None
            free[whole[:resolved.num_gpu]] = 0
        frag = fragmentation_of(free[None, :], np.array([cpu - resolved.cpu_milli], np.int64),
                                state.product[row:row + 1], workload, allowed)
        return float(frag[0])

    sizes = range(len(keys) + 1) if len(keys) <= MAX_EXHAUSTIVE_VICTIMS else (len(keys),)
    for size in sizes:
        best: tuple[float, tuple[int, ...]] | None = None
        for subset in combinations(range(len(keys)), size):
            frag = after(subset)
            if frag is not None and (best is None or frag < best[0]):
                best = (frag, subset)
        if best is not None:
            return tuple(keys[i] for i in best[1])
    return None


__all__ = ["MAX_EXHAUSTIVE_VICTIMS", "fewest_victims"]
