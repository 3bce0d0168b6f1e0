"""Nodes triggered on idle memory that no move can help: the idle memory is not right-sizable.

A move gives idle memory back only through right-sizing: the replacement reserves less than
the pod did. A pod whose workload is in mode ``off`` or ``recommend`` (or has no supported
controller), or that holds several GPUs, is replaced exactly as it was, so moving it only
carries its idle memory to another node. A node triggered on idle memory whose idle memory
(reserved − peak over the window, on GPUs with a reading; :mod:`defrag.controller.measure`)
belongs only to such pods is therefore *not actionable*: the planner takes no pod from it (unless
it also holds back a pending pod), and the cycle names the workloads, so an operator knows which
ones to switch to ``auto``.

Pure: reads the snapshot (``Snapshot.sizable``, from :mod:`defrag.controller.rightsize`).
"""

from __future__ import annotations

from collections.abc import Iterable

from defrag.controller.model import Snapshot
from scheduler.core.types import MILLI_PER_GPU


def not_actionable(snapshot: Snapshot, rows: Iterable[int]) -> dict[int, tuple[str, ...]]:
    """Row -> the workloads holding its idle memory, for each of ``rows`` whose idle memory
    right-sizing cannot reclaim. Empty when right-sizing was not read (``sizable`` None)."""
    sizable = snapshot.sizable
    if sizable is None:
        return {}
    state, usage = snapshot.state, snapshot.usage
    out: dict[int, tuple[str, ...]] = {}
    for row in rows:
        memory = float(state.gpu_memory_mib[row])
        holders: set[str] = set()
        reclaimable = False
        for key in sorted(state.pods_on_node[row]):
            placement = state.pods[key]
            if not any(usage.known[row, g] for g in placement.gpus):
                continue
            reserved = placement.pod.gpu_milli / MILLI_PER_GPU * memory
            if reserved - usage.pod_peak(placement, row) <= 0:
                continue
            workload, may_change = sizable.get(key, (f"unsampled pod {key}", False))
            if may_change:
                reclaimable = True
                break
            holders.add(workload)
        if holders and not reclaimable:
            out[row] = tuple(sorted(holders))
    return out
