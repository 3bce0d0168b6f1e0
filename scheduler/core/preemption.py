"""Which of kube-scheduler's candidate victims on a node a pod really needs gone.

kube-scheduler's preemption picks victims by its own resource arithmetic, which does not see
GPU shares per GPU: it may evict pods from a GPU the preemptor cannot use, or more pods than
needed. Given its candidates on one node, :func:`choose_victims` returns the smallest subset
whose removal lets the pod fit one GPU (or enough whole GPUs) as the core sees it, and among
subsets of that size the one leaving the node least fragmented (FGD's F(n) after the pod is
placed; ties to the first subset in ``itertools.combinations`` order); None when no subset
helps.

Two steps, so a caller holding a lock over the state holds it only for the first:
:func:`victim_inputs` copies what the search needs of one node (a few small arrays), and
:func:`choose_victims` searches on that copy alone. The search scores every subset of one size
in one call of the fragmentation kernel (a row per subset), not one call per subset: a preempt
over hundreds of nodes with a dozen candidates each was seconds of work, during which every
filter waited (kube-scheduler's ``httpTimeout`` is 2 s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from scheduler.core.fragmentation import TargetWorkload, fragmentation_of
from scheduler.core.state import BoolArray, ClusterState, IntArray
from scheduler.core.types import MILLI_PER_GPU, PodRequest

# Candidate sets up to this size are searched exhaustively (2^12 subsets at most); above it
# only the whole set is tried.
MAX_EXHAUSTIVE_VICTIMS = 12


@dataclass(frozen=True)
class VictimInputs:
    """One node as the search needs it: the pod as it would land there, the node's free
    resources, and what each candidate (``keys``, in order) would give back."""

    pod: PodRequest          # resolved for this node's GPU memory
    keys: tuple[str, ...]
    free: IntArray           # the node's free milli per GPU (its width: the state's)
    cpu_left: int
    mem_left: int
    gpu_count: int
    product: IntArray        # the node's product code, as a one-row array
    release_gpu: IntArray    # candidates x GPUs: milli each candidate frees on each GPU
    release_cpu: IntArray
    release_mem: IntArray
    workload: TargetWorkload
    allowed: BoolArray


def victim_inputs(state: ClusterState, workload: TargetWorkload, pod: PodRequest, row: int,
                  candidates: Sequence[str]) -> VictimInputs | None:
    """What :func:`choose_victims` needs of ``row``, copied out of ``state`` (call it with the
    state's lock held; it is cheap); None when the pod can never fit the node."""
    resolved = pod.on_gpu_memory(int(state.gpu_memory_mib[row]))
    if resolved is None or not state.active[row]:
        return None
    product = state.products[int(state.product[row])]
    if resolved.gpu_spec and product not in resolved.gpu_spec:
        return None
    count = int(state.gpu_count[row])
    if resolved.num_gpu > count:
        return None
    keys = tuple(k for k in dict.fromkeys(candidates) if k in state.pods
                 and state.pods[k].node == state.names[row])
    release_gpu = np.zeros((len(keys), state.gpu_width), np.int64)
    release_cpu = np.zeros(len(keys), np.int64)
    release_mem = np.zeros(len(keys), np.int64)
    for i, key in enumerate(keys):
        placed = state.pods[key]
        for g in placed.gpus:
            release_gpu[i, g] += placed.pod.gpu_milli
        release_cpu[i] = placed.pod.cpu_milli
        release_mem[i] = placed.pod.memory_mib
    return VictimInputs(resolved, keys, state.gpu_free[row].copy(), int(state.cpu_left[row]),
                        int(state.mem_left[row]), count, state.product[row:row + 1].copy(),
                        release_gpu, release_cpu, release_mem, workload,
                        workload.allowed(state))


def _best_of_size(inputs: VictimInputs, size: int) -> tuple[int, ...] | None:
    """The least fragmenting subset of ``size`` candidates that lets the pod fit, or None."""
    n = len(inputs.keys)
    subsets = (np.array(list(combinations(range(n), size)), np.int64) if size
               else np.zeros((1, 0), np.int64))  # the empty subset: evict nobody
    free = inputs.free[None, :] + inputs.release_gpu[subsets].sum(axis=1)
    cpu = inputs.cpu_left + inputs.release_cpu[subsets].sum(axis=1)
    mem = inputs.mem_left + inputs.release_mem[subsets].sum(axis=1)
    pod = inputs.pod
    usable = free[:, :inputs.gpu_count]
    ok = (cpu >= pod.cpu_milli) & (mem >= pod.memory_mib)
    rows = np.arange(len(subsets))
    if pod.is_share:
        fits = usable >= pod.gpu_milli
        ok &= fits.any(axis=1)
        # The tightest GPU that fits (the lowest index among equals), as the core places it.
        tightness = np.where(fits, usable, np.iinfo(np.int64).max)
        gpu = np.argmin(tightness, axis=1)
        free[rows[ok], gpu[ok]] -= pod.gpu_milli
    else:
        whole = usable == MILLI_PER_GPU
        ok &= whole.sum(axis=1) >= pod.num_gpu
        # The lowest-index fully free GPUs: those whose running count is within num_gpu.
        taken = whole & (np.cumsum(whole, axis=1) <= pod.num_gpu)
        free[:, :inputs.gpu_count][taken & ok[:, None]] = 0
    if not ok.any():
        return None
    feasible = rows[ok]
    frag = fragmentation_of(free[feasible], cpu[feasible] - pod.cpu_milli,
                            np.repeat(inputs.product, feasible.size), inputs.workload,
                            inputs.allowed)
    best = int(feasible[int(np.argmin(frag))])  # the first of the least: combinations order
    return tuple(int(i) for i in subsets[best])


def choose_victims(inputs: VictimInputs) -> tuple[str, ...] | None:
    """The fewest candidates to evict so the pod fits, ties to the smallest fragmentation
    after placing it; None when no subset helps. Reads ``inputs`` only (no lock needed)."""
    n = len(inputs.keys)
    sizes = range(n + 1) if n <= MAX_EXHAUSTIVE_VICTIMS else (n,)
    for size in sizes:
        found = _best_of_size(inputs, size)
        if found is not None:
            return tuple(inputs.keys[i] for i in found)
    return None


__all__ = ["MAX_EXHAUSTIVE_VICTIMS", "VictimInputs", "choose_victims", "victim_inputs"]
