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


def idle_rows(ratio: np.ndarray, active: np.ndarray, *, threshold: float, off: float,
              latched: frozenset[int], streaks: Mapping[int, int], on_cycles: int,
              off_cycles: int) -> frozenset[int]:
    """The rows triggered on idle memory, this measurement counted as one more cycle.

    A row not ``latched`` turns on once it has been above ``threshold`` for ``on_cycles``
    cycles in a row (``streaks``: the cycles before this one); a latched row turns off once it
    has been at or below ``off`` for ``off_cycles`` cycles in a row, and stays on above it."""
    on: set[int] = set()
    for r in np.flatnonzero(ratio > threshold):
        row = int(r)
        if active[row] and (row in latched or streaks.get(row, 0) + 1 >= on_cycles):
            on.add(row)
    for row in latched:
        if not (0 <= row < ratio.shape[0] and active[row]):
            continue
        if ratio[row] > off or streaks.get(row, 0) + 1 < off_cycles:
            on.add(row)
    return frozenset(on)


def next_streaks(ratio: np.ndarray, *, threshold: float, off: float,
                 latched_before: frozenset[int], latched_after: frozenset[int],
                 streaks: Mapping[int, int]) -> dict[int, int]:
    """The consecutive cycles to carry to the next one: for a row that is off, how many it
    has been above ``threshold``; for one that is on, how many it has been at or below
    ``off``. A row that changed state starts again from 0 (and is left out)."""
    out: dict[int, int] = {}
    for row in range(ratio.shape[0]):
        was, now = row in latched_before, row in latched_after
        if was != now:
            continue
        counting = ratio[row] <= off if now else ratio[row] > threshold
        if counting:
            out[row] = streaks.get(row, 0) + 1
    return out


def find_triggers(state: ClusterState, measurement: Measurement, pending: Sequence[PodInfo],
                  threshold: float, *, latched: frozenset[int] = frozenset(),
                  threshold_off: float | None = None, streaks: Mapping[int, int] | None = None,
                  on_cycles: int = 1, off_cycles: int = 1) -> Triggers:
    """The nodes triggered on idle memory (:func:`idle_rows`: hysteresis between
    ``threshold`` and ``threshold_off``, default ``threshold``, each for a number of cycles in
    a row) and the nodes that block pending GPU pods."""
    ratio = np.nan_to_num(measurement.idle_ratio, nan=0.0)
    off = threshold if threshold_off is None else threshold_off
    idle = idle_rows(ratio, state.active, threshold=threshold, off=off, latched=latched,
                     streaks=streaks or {}, on_cycles=on_cycles, off_cycles=off_cycles)
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
