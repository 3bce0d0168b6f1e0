"""What every verb judges a pod against: the one placement core they all sit behind.

:class:`Placement` holds the cluster cache (kept current by the watch or loaded from a
snapshot), the scorers over the current target workload (:mod:`scheduler.extender.scoring`
and :mod:`~scheduler.extender.migscoring`, which decide through :mod:`scheduler.core` and
the policies), the door every verb reads its pod through (:class:`PodReader`) and the lookup of
the request's node names. It decides nothing itself: each verb is a plugin of its own
(:mod:`scheduler.extender.verbs`), and :mod:`scheduler.extender.upkeep` swaps in the scorers
for a new target workload, under the cache's lock, the lock the verbs read them under.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

import numpy as np

from gpufrag.errors import BadInput
from scheduler.core.fragmentation import TargetWorkload, fragmentation_ratio
from scheduler.core.gpus import DEVICE_MODES, DRA_DEVICE_MODE
from scheduler.core.mig import MigWorkload
from scheduler.core.state import IntArray
from scheduler.extender.config import ExtenderConfig
from scheduler.extender.migscoring import MigScorer
from scheduler.extender.scoring import UNKNOWN, Scorer
from scheduler.extender.subject import PodReader, PodSubject
from scheduler.extender.wire import MAX_NAME_LISTS, NameChunks, NameSet, NodeJson, encode_reason
from scheduler.kube.cache import ClusterCache
from scheduler.policies import make_policy

Clock = Callable[[], float]


class Placement:
    """The shared state of one extender's verbs, starting from ``workload`` (the upkeep
    replaces it and its scorers as the pods seen change)."""

    def __init__(self, cache: ClusterCache, config: ExtenderConfig, clock: Clock,
                 workload: TargetWorkload) -> None:
        self.cache = cache
        self.config = config
        self.clock = clock
        self.pods = PodReader(cache, config.names)
        self.node_json = NodeJson()
        self.workload = workload
        self.scorer = self.scorer_for(workload)
        # DRA pods' scorer (dra.enabled; None when off): the node scored for the GPU DRA's
        # first fit gives there, and that GPU assumed (docs/dra.md, "What reads claims").
        self.dra_scorer: Scorer | None = (self.scorer_for(workload, DRA_DEVICE_MODE)
                                          if config.dra.enabled else None)
        # MIG pods' target workload: the profiles the pods seen ask (None: none yet).
        self.mig_workload: MigWorkload | None = None
        self.mig_scorer = MigScorer(cache.mig, self.scorer, None, encode_reason)
        # NodeNames set (the wire's key) -> (its rows, all of them known, state.index size).
        self._rows_by_list: dict[NameSet, tuple[IntArray, bool, int]] = {}

    def scorer_for(self, workload: TargetWorkload, device_mode: str = "policy") -> Scorer:
        """A scorer of the configured policy and blend over ``workload``, its GPUs chosen and
        scored as ``device_mode`` says (:data:`~scheduler.core.gpus.DEVICE_MODES`)."""
        device_choice, scored_on = DEVICE_MODES[device_mode]
        policy = make_policy(self.config.policy, workload=workload, seed=self.config.seed,
                             device_choice=scored_on)
        return Scorer(policy, policy_weight=self.config.weights.policy,
                      affinity_weight=self.config.weights.affinity,
                      affinity=self.config.affinity, render=encode_reason,
                      device_choice=device_choice)

    def set_workload(self, workload: TargetWorkload, scorer: Scorer,
                     dra_scorer: Scorer | None) -> None:
        """Swap in a new target workload and its scorers (call with the cache's lock held)."""
        self.workload, self.scorer, self.dra_scorer = workload, scorer, dra_scorer

    def scorer_of(self, pod: PodSubject) -> Scorer:
        """The scorer that judges ``pod``: the DRA one for a pod asking GPUs through DRA."""
        if pod.dra and self.dra_scorer is not None:
            return self.dra_scorer
        return self.scorer

    def fragmentation_ratio(self) -> float:
        with self.cache.lock:
            return fragmentation_ratio(self.cache.state, self.workload)

    def rows(self, names: Sequence[str], name_set: NameSet | None = None) -> IntArray:
        """State rows of ``names`` (``UNKNOWN`` where the state has no such node); call with
        the cache's lock held. ``name_set``: the wire's key for the list (see
        ``wire.NameLists``), under which the rows are kept — a name's row never changes once
        it has one, so they stay right until a name still unknown may have become known (a
        node was added)."""
        if name_set is not None:
            kept = self._rows_by_list.get(name_set)
            if kept is not None and (kept[1] or kept[2] == len(self.cache.state.index)):
                return kept[0]
        if isinstance(names, NameChunks):  # too long to hold whole: a chunk at a time
            return np.concatenate([np.zeros(0, np.int64), *(
                self._lookup(chunk, first) for first, chunk in names.chunks())])
        rows = self._lookup(names)
        if name_set is not None:
            if name_set not in self._rows_by_list and len(self._rows_by_list) >= MAX_NAME_LISTS:
                del self._rows_by_list[next(iter(self._rows_by_list))]
            all_known = not rows.size or bool(rows.min() != UNKNOWN)
            self._rows_by_list[name_set] = (rows, all_known, len(self.cache.state.index))
        return rows

    def _lookup(self, names: Sequence[str], first: int = 0) -> IntArray:
        """The common case — every name known — is one C-level lookup; names are checked
        only otherwise (``first``: the index of ``names[0]`` in the request's list)."""
        index = self.cache.state.index
        if not names:
            return np.zeros(0, np.int64)
        try:
            found = operator.itemgetter(*names)(index)
            return np.array(found if len(names) > 1 else (found,), np.int64)
        except (KeyError, TypeError):
            pass
        for i, name in enumerate(names):
            if not isinstance(name, str) or not name:
                raise BadInput(f"node names must be non-empty strings, got {name!r}",
                               field=f"NodeNames[{first + i}]")
        return np.array([index.get(n, UNKNOWN) for n in names], np.int64)


__all__ = ["Clock", "Placement"]
