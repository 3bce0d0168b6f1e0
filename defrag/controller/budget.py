"""Eviction budgets: per source node, per namespace, in total, each PDB's headroom, and a day's.

The planner asks :meth:`EvictionBudget.refusal` before it plans a move and calls
:meth:`EvictionBudget.take` when it keeps one, so a plan can never exceed a limit nor spend a
disruption a PodDisruptionBudget does not have. The API server enforces the PDBs again at
eviction time (the executor uses the Eviction API); this copy only keeps plans honest.

**The daily budget** (``--max-evictions-per-day-pct``): over any 24 hours, the controller's own
evictions are at most that share of the **running GPU pods** (:func:`running_gpu_pods`: pods
that ask for a GPU, Running and not terminating, as the cycle reads them). Each cycle may evict
``floor(pct / 100 x running GPU pods now)`` less the evictions of the last 24 hours; those are
kept in the defrag state annotation (:mod:`defrag.controller.convergence`) so the window spans
CronJob runs. The what-if's target is judged on the same figure
(:func:`worst_day_ratio`): at every cycle that evicts, the evictions of the 24 hours up to it
over the running GPU pods that cycle read, so a budget that holds is a target met by
construction, and a budget that leaks shows there.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from defrag.controller.config import Limits
from defrag.controller.model import Pdb, PodInfo

DAY_S = 86400.0
# (cycle end in unix seconds, evictions that cycle): the controller's evictions, newest last.
EvictionLog = tuple[tuple[float, int], ...]
DAILY_REFUSAL = "--max-evictions-per-day-pct reached"


def running_gpu_pods(pods: Iterable[PodInfo]) -> int:
    """The pods the daily budget is a share of: asking for a GPU, Running, not terminating."""
    return sum(1 for p in pods if p.request.wants_gpu and p.running and not p.deleting)


def evictions_within(log: Iterable[tuple[float, int]], now: float,
                     window_s: float = DAY_S) -> int:
    """The evictions ``log`` records in the ``window_s`` up to ``now`` (its end included). One
    stamped after ``now`` counts too: another run's clock may run ahead, and the budget errs
    on the side of evicting less."""
    return sum(n for t, n in log if now - t < window_s)


@dataclass(frozen=True, slots=True)
class DailyBudget:
    """One cycle's view of the rolling 24-hour budget."""

    pct: float  # --max-evictions-per-day-pct
    running: int  # running GPU pods this cycle read (running_gpu_pods)
    spent: int  # the controller's evictions in the 24 hours before this cycle

    @property
    def allowed(self) -> int:
        """Evictions any 24 hours may hold, at this cycle's count of running GPU pods."""
        return math.floor(self.pct / 100.0 * self.running + 1e-9)

    @property
    def left(self) -> int:
        return max(self.allowed - self.spent, 0)

    @classmethod
    def of(cls, pct: float, pods: Iterable[PodInfo], log: Iterable[tuple[float, int]],
           now: float) -> DailyBudget:
        return cls(pct, running_gpu_pods(pods), evictions_within(log, now))


def worst_day_ratio(cycles: Sequence[tuple[float, int, int]]) -> float:
    """At every cycle that evicted, the evictions of the 24 hours up to it (its own included)
    over the running GPU pods that cycle read; the most of these. ``cycles`` are (time,
    evictions that cycle, running GPU pods it read), in time order. This is the daily
    budget's own definition, applied to what was done: a share of what runs when the
    controller evicts. A window is judged at its evictions, not at a later cycle that evicts
    nothing: pods leaving afterwards shrink the running count, not what was evicted."""
    worst = 0.0
    log: list[tuple[float, int]] = []
    for t, evicted, running in cycles:
        log.append((t, evicted))
        if evicted:
            worst = max(worst, evictions_within(log, t) / max(running, 1))
    return worst


class EvictionBudget:
    def __init__(self, limits: Limits, pdbs: Iterable[Pdb] = (),
                 daily: DailyBudget | None = None) -> None:
        self.limits = limits
        self.by_node: Counter[str] = Counter()
        self.by_namespace: Counter[str] = Counter()
        self.total = 0
        self.pdb_left: dict[str, int] = {b.key: b.disruptions_allowed for b in pdbs}
        self.daily_left = daily.left if daily is not None else None

    @property
    def cap(self) -> int:
        """The most evictions this cycle may plan: the per-cycle total, or the day's left."""
        if self.daily_left is None:
            return self.limits.total
        return min(self.limits.total, self.daily_left)

    @property
    def exhausted(self) -> bool:
        return self.total >= self.cap

    def refusal(self, node: str, namespace: str, pdbs: Sequence[Pdb]) -> str | None:
        """Why one more eviction of a pod on ``node`` in ``namespace`` is not allowed, or None."""
        if self.total >= self.limits.total:
            return "--max-evictions-total reached"
        if self.daily_left is not None and self.total >= self.daily_left:
            return DAILY_REFUSAL
        if self.by_node[node] >= self.limits.per_node:
            return "--max-evictions-per-node reached"
        if self.by_namespace[namespace] >= self.limits.per_namespace:
            return "--max-evictions-per-namespace reached"
        if len(pdbs) > 1:
            # The Eviction API answers 500 for such pods; planning them would only fail later.
            return "covered by more than one PodDisruptionBudget"
        for pdb in pdbs:
            if self.pdb_left.get(pdb.key, 0) <= 0:
                return "PodDisruptionBudget allows no more disruptions"
        return None

    def take(self, node: str, namespace: str, pdbs: Sequence[Pdb]) -> None:
        """Spend one eviction; the caller checked :meth:`refusal` first."""
        self.total += 1
        self.by_node[node] += 1
        self.by_namespace[namespace] += 1
        for pdb in pdbs:
            self.pdb_left[pdb.key] = self.pdb_left.get(pdb.key, 0) - 1
