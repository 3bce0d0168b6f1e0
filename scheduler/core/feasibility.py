"""Does a pod fit a node, and if not, why.

Two entry points over one set of rules: ``feasible_mask`` answers for many nodes at once (the
hot path of every policy), ``explain`` answers for one node with a reason a person can act on,
and says whether the node could ever fit the pod (kube-scheduler's "unresolvable": no amount of
preemption or waiting helps when the capacity itself is too small).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.core.state import BoolArray, ClusterState, IntArray
from scheduler.core.types import MILLI_PER_GPU, PodRequest


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer for one node: fits, or does not with a reason (data, not an exception)."""

    fits: bool
    reason: str = ""
    unresolvable: bool = False


FITS = Verdict(True)


def allowed_products(state: ClusterState, spec: frozenset[str]) -> BoolArray:
    """Per product code of ``state``, whether ``spec`` accepts it (empty spec = any)."""
    if not spec:
        return np.ones(len(state.products), np.bool_)
    return np.array([p in spec for p in state.products], np.bool_)


def feasible_mask(state: ClusterState, pod: PodRequest, rows: IntArray) -> BoolArray:
    """For each node row in ``rows``, whether ``pod`` fits there now."""
    ok: BoolArray = (
        state.active[rows]
        & (state.cpu_left[rows] >= pod.cpu_milli)
        & (state.mem_left[rows] >= pod.memory_mib)
    )
    if pod.wants_gpu:
        # Shares use one GPU; several GPUs are always whole ones (PodRequest guarantees it).
        if pod.gpu_memory_mib:
            ok &= state.gpu_max_free[rows] >= milli_needed(state, pod, rows)
        elif pod.num_gpu == 1:
            ok &= state.gpu_max_free[rows] >= pod.gpu_milli
        else:
            ok &= state.gpu_full_count[rows] >= pod.num_gpu
        if pod.gpu_spec:
            ok &= allowed_products(state, pod.gpu_spec)[state.product[rows]]
    return ok


_NEVER = np.iinfo(np.int64).max


def milli_needed(state: ClusterState, pod: PodRequest, rows: IntArray) -> IntArray:
    """Per row, the milli-GPU share ``pod`` takes on one GPU there (a GPU-memory share
    converted with the node's GPU memory, see ``PodRequest.milli_on``); an impossible value
    where it cannot be placed at all (GPU memory unknown or too small)."""
    if not pod.gpu_memory_mib:
        return np.full(rows.size, pod.gpu_milli, np.int64)
    memory = state.gpu_memory_mib[rows]
    known = memory >= pod.gpu_memory_mib
    by_memory = -(-pod.gpu_memory_mib * MILLI_PER_GPU // np.maximum(memory, 1))
    need = np.maximum(np.maximum(by_memory, pod.gpu_milli), 1)
    return np.where(known, need, _NEVER).astype(np.int64)


def _spec_text(spec: frozenset[str]) -> str:
    return "|".join(sorted(spec))


def explain(state: ClusterState, pod: PodRequest, row: int) -> Verdict:
    """Why ``pod`` does or does not fit node ``row``; the first failing rule wins."""
    if not state.active[row]:
        return Verdict(False, f"node {state.names[row]} is not in the cluster state", False)
    product = state.products[int(state.product[row])]
    if pod.wants_gpu and pod.gpu_spec and product not in pod.gpu_spec:
        shown = product or "none"
        return Verdict(False, f"GPU product {shown} not in {_spec_text(pod.gpu_spec)}", True)
    gpus = int(state.gpu_count[row])
    if pod.num_gpu > gpus:
        return Verdict(False, f"needs {pod.num_gpu} GPUs, node has {gpus}", True)
    for what, need, left, cap, unit in (
        ("CPU", pod.cpu_milli, int(state.cpu_left[row]), int(state.cpu_cap[row]), "milli"),
        ("memory", pod.memory_mib, int(state.mem_left[row]), int(state.mem_cap[row]), "MiB"),
    ):
        if need > cap:
            return Verdict(False, f"needs {need} {unit} {what}, node has {cap} in all", True)
        if need > left:
            return Verdict(False, f"needs {need} {unit} {what}, {left} left")
    if pod.wants_gpu:
        milli = pod.milli_on(int(state.gpu_memory_mib[row]))
        if milli is None:
            memory = int(state.gpu_memory_mib[row])
            if memory <= 0:
                return Verdict(False, f"needs {pod.gpu_memory_mib} MiB of GPU memory, and the "
                               "node's GPU memory is unknown (no GPU memory label)", True)
            return Verdict(False, f"needs {pod.gpu_memory_mib} MiB of GPU memory, the node's "
                           f"GPUs have {memory} MiB", True)
        free = state.gpu_free[row, :gpus]
        fitting = int((free >= milli).sum())
        if fitting < pod.num_gpu:
            if milli >= MILLI_PER_GPU:
                text = f"needs {pod.num_gpu} free GPUs, has {fitting}"
            else:
                asked = (f" ({pod.gpu_memory_mib} MiB of GPU memory)" if pod.gpu_memory_mib
                         else "")
                text = (f"needs {pod.num_gpu} GPUs with >= {milli} milli free{asked}, "
                        f"has {fitting}")
            return Verdict(False, text)
    return FITS
