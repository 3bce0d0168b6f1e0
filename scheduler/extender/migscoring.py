"""Filter and prioritize for pods asking MIG instances (``nvidia.com/mig-<profile>``).

Static MIG, NVIDIA's device plugin with the ``mixed`` strategy: a pod gets an instance of
exactly the profile it asks, and the plugin picks which one. The nodes' instances and their
use come from :class:`scheduler.kube.mignodes.MigBook` (the agent's reading when fresh, else
the allocatable counts and the pods placed there).

- **Filter.** A node passes when it has, for every profile asked, at least as many free
  instances (allocatable minus in use) as asked. Failures are reasons, not errors: "not a MIG
  node", "no nvidia.com/mig-3g.40gb instance here" (unresolvable: no eviction makes one) and
  "no free nvidia.com/mig-3g.40gb instance (2 of 2 in use)" (an eviction could free one).
  GPU reservations (:mod:`scheduler.kube.reservations`) hold GPUs and shares of the
  ``ClusterState``, never MIG instances, so they do not enter here.
- **Score.** FGD over MIG (:func:`scheduler.core.mig.best_instances`): on each node, the
  least growth of F over its free instances of the profile, F counting the slices of the
  instances in use as taken, so a node's score says how usable its leftover positions stay
  if the layout advisor cuts them again. The policy key is −ΔF, exact (milli-GPU), blended
  with model-version affinity and scaled to 0..10 by the same :class:`Scorer` methods as
  every other pod. The device plugin picks the instance, so a node's score is for the best
  instance it offers.
- **Workload.** The profiles asked by the pods seen (bound and pending), by popularity; before
  any is seen, each node's family with its profiles equally popular
  (:func:`scheduler.core.mig.default_workload`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from gpufrag.errors import BadInput
from node.agent.usage import STALE_AFTER_INTERVALS, parse
from scheduler.core.mig import (
    MigGpuModel,
    MigInstance,
    MigWorkload,
    best_instances,
    default_workload,
)
from scheduler.core.state import ClusterState, IntArray, pod_key
from scheduler.core.types import PodRequest
from scheduler.extender.scoring import (
    UNKNOWN,
    UNKNOWN_NODE_REASON,
    FilterVerdicts,
    Priorities,
    Render,
    Scorer,
    cap_reason,
)
from scheduler.kube.mignodes import AgentMig, MigBook, MigLayout, mig_resource
from scheduler.policies.affinity import at_cap

NOT_MIG_NODE = ("not a MIG node (it advertises no nvidia.com/mig-<profile> instance: MIG off, "
                "or not the device plugin's mixed strategy)")


def mig_workload(counts: Mapping[str, int]) -> MigWorkload | None:
    """The MIG target workload from the instances the pods seen ask, by profile (None: no pod
    asks one yet; each family's default applies)."""
    asked = [(p, n) for p, n in sorted(counts.items()) if n > 0]
    return MigWorkload.from_counts(asked) if asked else None


def shortfall(layout: MigLayout, ask: Mapping[str, int]) -> tuple[str, bool] | None:
    """Why ``ask`` does not fit ``layout`` now (and whether no eviction could change that),
    or None when it fits."""
    for profile in sorted(ask):
        have = layout.spec.allocatable.get(profile, 0)
        if not have:
            offered = ", ".join(sorted(layout.spec.allocatable)) or "none"
            config = f", mig.config {layout.spec.config}" if layout.spec.config else ""
            return (f"no {mig_resource(profile)} instance on this node (it offers "
                    f"{offered}{config})", True)
        if layout.free.get(profile, 0) < ask[profile]:
            used = layout.in_use.get(profile, 0)
            return (f"no free {mig_resource(profile)} instance ({used} of {have} in use"
                    f"{f', {ask[profile]} asked' if ask[profile] > 1 else ''})", False)
    return None


class MigScorer:
    """Filter, rank and decide for MIG pods; built with the extender's :class:`Scorer` (for
    affinity and the 0..10 scaling) and the MIG target workload. Call with the cache's lock
    held."""

    def __init__(self, book: MigBook, scorer: Scorer, workload: MigWorkload | None) -> None:
        self.book = book
        self.scorer = scorer
        self.workload = workload
        self._defaults: dict[str, MigWorkload] = {}

    def workload_for(self, model: MigGpuModel) -> MigWorkload:
        if self.workload is not None:
            return self.workload
        found = self._defaults.get(model.family)
        if found is None:
            found = self._defaults[model.family] = default_workload(model)
        return found

    def _layouts(self, state: ClusterState, pod: PodRequest, rows: IntArray,
                 now: float) -> list[MigLayout | None]:
        key = pod_key(pod)  # the pod's own assumption (a decided filter) counts nowhere
        return [None if row == UNKNOWN else self.book.layout(state, state.names[row], now, key)
                for row in rows.tolist()]

    def filter(self, state: ClusterState, pod: PodRequest, ask: Mapping[str, int],
               rows: IntArray, now: float, render: Render) -> FilterVerdicts:
        passed = np.zeros(rows.size, np.bool_)
        failed: list[int] = []
        reasons: list[str] = []
        unresolvable: list[bool] = []
        capped = self._capped(state, pod, rows)
        for i, (row, layout) in enumerate(zip(rows.tolist(), self._layouts(state, pod, rows, now),
                                              strict=True)):
            if row == UNKNOWN:
                why: tuple[str, bool] | None = (UNKNOWN_NODE_REASON, False)
            elif layout is None:
                why = (NOT_MIG_NODE, True)
            else:
                why = shortfall(layout, ask)
                if why is None and capped[i]:
                    why = (cap_reason(state, pod, row,
                                      self.scorer.affinity.max_replicas_per_node), False)
            if why is None:
                passed[i] = True
                continue
            failed.append(i)
            reasons.append(why[0])
            unresolvable.append(why[1])
        return FilterVerdicts(rows, passed, np.array(failed, np.int64), reasons,
                              np.array(unresolvable, np.bool_),
                              [render(r) for r in reasons])

    def _capped(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> Any:
        if not (self.scorer.affinity.cap_is_hard and pod.model):
            return np.zeros(rows.size, np.bool_)
        safe = np.where(rows != UNKNOWN, rows, 0)
        return at_cap(state, pod, safe, self.scorer.affinity)

    def ranked(self, state: ClusterState, pod: PodRequest, ask: Mapping[str, int],
               rows: IntArray, now: float) -> tuple[IntArray, Any]:
        """The rows ``ask`` fits and their blended key (higher is better)."""
        candidates: list[int] = []
        keys: list[float] = []
        for row, layout in zip(rows.tolist(), self._layouts(state, pod, rows, now), strict=True):
            if layout is None or shortfall(layout, ask) is not None:
                continue
            model = layout.spec.model
            fit = None if model is None else best_instances(
                model, layout.instances, ask, self.workload_for(model))
            candidates.append(row)
            # No model (a product the MIG table lacks) or no placed free instance (the
            # packing found no position for it): counted, and neutral.
            keys.append(-fit.delta_milli if fit is not None else 0.0)
        return self.scorer.blend(state, pod, np.array(candidates, np.int64),
                                 np.array(keys, np.float64), now)

    def prioritize(self, state: ClusterState, pod: PodRequest, ask: Mapping[str, int],
                   rows: IntArray, now: float, hinted: frozenset[str] = frozenset(),
                   ) -> Priorities:
        candidates, key = self.ranked(state, pod, ask, rows, now)
        return self.scorer.priorities(state, rows, candidates, key, hinted)

    def decide(self, state: ClusterState, pod: PodRequest, ask: Mapping[str, int],
               rows: IntArray, now: float, hinted: frozenset[str] = frozenset(),
               count: int = 1) -> IntArray:
        candidates, key = self.ranked(state, pod, ask, rows, now)
        return self.scorer.best_rows(state, candidates, key, hinted, count)




def agent_mig(text: str) -> AgentMig | None:
    """The MIG instances of the agent's usage annotation (:mod:`node.agent.usage`, the one
    schema), fresh until the agent would have published again
    (``STALE_AFTER_INTERVALS`` intervals); None when it lists no MIG GPU or does not read
    (the labels decide then). The instance's GPU is NVML's index, whole GPUs included."""
    try:
        usage = parse(text)
    except BadInput:
        return None
    instances = tuple(MigInstance(gpu.index, i.profile, i.start, i.in_use)
                      for gpu in usage.gpus for i in gpu.mig)
    if not instances:
        return None
    return AgentMig(instances, usage.timestamp + STALE_AFTER_INTERVALS * usage.interval_s)


__all__ = ["NOT_MIG_NODE", "MigScorer", "agent_mig", "mig_workload", "shortfall"]
