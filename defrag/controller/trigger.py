"""Which nodes a cycle works on, and why.

Two triggers (DESIGN.md, issue 5):

- **idle memory**: the node's idle ratio is above ``--threshold``: memory is reserved there but not
  used, so its small pods are worth packing elsewhere.
- **blocking**: a pending GPU pod fits nowhere now, but this node has enough free GPU share in
  total (and CPU, memory, an allowed product) that it *would* fit if the node's shares were
  consolidated — the stranded-capacity case: the cluster looks free and the pod still waits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from defrag.controller.measure import Measurement, gpu_exists
from defrag.controller.model import PodInfo
from scheduler.core.feasibility import allowed_products, feasible_mask
from scheduler.core.state import ClusterState

# A move frees room for one pending pod; listing a few per node is enough to choose from.
PODS_PER_ROW = 16


@dataclass(frozen=True)
class Triggers:
    """Triggered node rows, and the pending pods each blocking node holds back."""

    idle: frozenset[int] = frozenset()
    # Row -> pending pods it holds back (at most PODS_PER_ROW listed; ``blocked`` counts all).
    blocking: Mapping[int, tuple[PodInfo, ...]] = field(default_factory=dict)
    blocked: Mapping[int, int] = field(default_factory=dict)
    # Pending GPU pods that fit nowhere now (whether or not any node could be consolidated).
    unplaceable: tuple[PodInfo, ...] = ()

    @property
    def rows(self) -> frozenset[int]:
        return self.idle | frozenset(self.blocking)

    def reason(self, row: int, measurement: Measurement) -> str:
        parts = []
        if row in self.idle:
            parts.append(f"idle {measurement.idle_ratio[row]:.0%}")
        if row in self.blocking:
            n = self.blocked.get(row, len(self.blocking[row]))
            parts.append(f"blocks {n} pending pod{'s' if n != 1 else ''}")
        return ", ".join(parts)


def blocking_rows(state: ClusterState, pod: PodInfo) -> list[int]:
    """Rows where ``pod`` would fit if the node's free GPU share were on the fewest GPUs."""
    req = pod.request
    rows = state.active_rows()
    free = np.where(gpu_exists(state)[rows], state.gpu_free[rows], 0)
    ok = ((state.cpu_left[rows] >= req.cpu_milli) & (state.mem_left[rows] >= req.memory_mib)
          & (state.gpu_count[rows] >= req.num_gpu)
          & (free.sum(axis=1) >= req.gpu_demand_milli))
    if req.gpu_spec:
        ok &= allowed_products(state, req.gpu_spec)[state.product[rows]]
    return [int(r) for r in rows[ok]]


def find_triggers(state: ClusterState, measurement: Measurement, pending: Sequence[PodInfo],
                  threshold: float, *, latched: frozenset[int] = frozenset(),
                  threshold_off: float | None = None) -> Triggers:
    """The nodes over the idle threshold and the nodes that block pending GPU pods.

    Hysteresis: a ``latched`` row (triggered on idle memory when the last cycle ended) stays
    triggered while its idle ratio is above ``threshold_off`` (default: ``threshold``)."""
    ratio = np.nan_to_num(measurement.idle_ratio, nan=0.0)
    over = np.flatnonzero(ratio > threshold)
    off = threshold if threshold_off is None else threshold_off
    still = [r for r in latched if 0 <= r < ratio.shape[0] and ratio[r] > off]
    idle = frozenset(int(r) for r in [*over, *still] if state.active[r])
    rows = state.active_rows()
    by_shape: dict[tuple[int, int, int, int, frozenset[str], int], list[PodInfo]] = {}
    for pod in pending:
        if pod.request.wants_gpu:
            by_shape.setdefault(pod.request.shape, []).append(pod)
    blocking: dict[int, list[PodInfo]] = {}
    blocked: dict[int, int] = {}
    unplaceable: list[PodInfo] = []
    for group in by_shape.values():
        if feasible_mask(state, group[0].request, rows).any():
            continue  # it fits somewhere now: waiting, not blocked by fragmentation
        unplaceable.extend(group)
        for row in blocking_rows(state, group[0]):
            listed = blocking.setdefault(row, [])
            listed.extend(group[: PODS_PER_ROW - len(listed)])
            blocked[row] = blocked.get(row, 0) + len(group)
    order = {id(p): i for i, p in enumerate(pending)}
    unplaceable.sort(key=lambda p: order[id(p)])
    return Triggers(idle=idle, blocking={r: tuple(p) for r, p in blocking.items()},
                    blocked=blocked, unplaceable=tuple(unplaceable))
