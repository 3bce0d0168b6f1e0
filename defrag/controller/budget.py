"""Eviction budgets: per source node, per namespace, in total, and each PDB's headroom.

The planner asks :meth:`EvictionBudget.refusal` before it plans a move and calls
:meth:`EvictionBudget.take` when it keeps one, so a plan can never exceed a limit nor spend a
disruption a PodDisruptionBudget does not have. The API server enforces the PDBs again at
eviction time (the executor uses the Eviction API); this copy only keeps plans honest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from defrag.controller.config import Limits
from defrag.controller.model import Pdb


class EvictionBudget:
    def __init__(self, limits: Limits, pdbs: Iterable[Pdb] = ()) -> None:
        self.limits = limits
        self.by_node: Counter[str] = Counter()
        self.by_namespace: Counter[str] = Counter()
        self.total = 0
        self.pdb_left: dict[str, int] = {b.key: b.disruptions_allowed for b in pdbs}

    @property
    def exhausted(self) -> bool:
        return self.total >= self.limits.total

    def refusal(self, node: str, namespace: str, pdbs: Sequence[Pdb]) -> str | None:
        """Why one more eviction of a pod on ``node`` in ``namespace`` is not allowed, or None."""
        if self.total >= self.limits.total:
            return "--max-evictions-total reached"
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
