"""The prioritize verb: each node's score for a pod, 0..10, and the top node.

The policy's score blended with model-version affinity and the defrag controller's placement
hints (:mod:`scheduler.extender.scoring`; MIG pods: :mod:`scheduler.extender.migscoring`).
A node the filter decided on (and assumed) stays the top one. Pods the extender does not judge
(no GPU, or a request it can never place) score every node the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scheduler.extender.placement import Placement
from scheduler.extender.scoring import Priorities
from scheduler.extender.wire import NameSet
from scheduler.kube.convert import Obj, UnsupportedRequest


class PrioritizeVerb:
    def __init__(self, placement: Placement) -> None:
        self.placement = placement

    def __call__(self, pod_obj: Obj, names: Sequence[str],
                 name_set: NameSet | None = None) -> tuple[Priorities, str]:
        """Scores in request order and the top node's name ('' when none / a CPU-only pod)."""
        placement, cache = self.placement, self.placement.cache
        try:
            pod = placement.pods.read(pod_obj)
        except UnsupportedRequest:  # filtered out everywhere; neutral here
            with cache.lock:
                rows = placement.rows(names)
            return Priorities(rows, np.zeros(len(names), np.int64), -1), ""
        now = placement.clock()
        with cache.lock, cache.reservations.lifted_for_pod(pod.key, pod.owner, pod.uid):
            rows = placement.rows(names, name_set)
            placement.node_json.sync(cache.state.names)
            if not pod.wants_placing:  # neutral: every node the same
                return Priorities(rows, np.zeros(len(names), np.int64), -1), ""
            # A node the filter decided (and assumed) on stays the top one: the state now
            # holds the pod there, which would otherwise count against that very node.
            decided = cache.assumed_node(pod.key)
            hinted = (frozenset((decided,)) if decided else cache.hints.nodes_for(pod.owner, now))
            result = (placement.mig_scorer.prioritize(cache.state, pod.request, pod.mig, rows,
                                                      now, hinted)
                      if pod.mig else
                      placement.scorer_of(pod).prioritize(cache.state, pod.request, rows, now,
                                                          hinted))
            best = cache.state.names[result.best] if result.best >= 0 else ""
        return result, best


__all__ = ["PrioritizeVerb"]
