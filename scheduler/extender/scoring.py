"""From the core's verdicts and scores to the extender's answers (no HTTP here).

Filter: the core's ``feasible_mask`` for every requested node at once, then ``explain`` for the
ones that fail, so each failed node carries the core's reason and whether it can ever fit.

Prioritize: the selected policy's score (through the core's ``rank_candidates`` and a
``ScoreCache``), blended with model-version affinity, mapped to kube-scheduler's 0..10:

- Pods without affinity (no model label, or no replica/warm node anywhere) are ranked by the
  policy's raw score, ties broken by the core's ``best_index`` (node-name order) — exactly the
  node the core's ``choose`` picks.
- Otherwise the policy score is min-max normalised over the candidates (the best gets 1) and
  blended: ``weights.policy · policy + weights.affinity · affinity``.
- The single best node gets 10; the others are scaled into 0..9, so a tie the core breaks by
  node order is never handed back to kube-scheduler as a tie (it would pick one at random).
- Nodes hinted by the defrag controller for the pod's owner get 10 and every other node <= 9.
- Nodes the pod does not fit (or that are unknown) get 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler.core.feasibility import explain, feasible_mask
from scheduler.core.fragmentation import FloatArray
from scheduler.core.gpus import POLICY_CHOICE, DeviceChoice
from scheduler.core.placement import Decision, ScoreCache, best_index, choose, rank_candidates
from scheduler.core.policy import Policy
from scheduler.core.state import BoolArray, ClusterState, IntArray
from scheduler.core.types import PodRequest
from scheduler.policies.affinity import AffinityParams, at_cap, blended_key, replica_counts

MAX_PRIORITY = 10  # kube-scheduler's MaxExtenderPriority
UNKNOWN = -1  # row of a node name the state does not know
# Distinct pod shapes a ScoreCache keeps before it starts afresh (each costs a few arrays of
# the state's size; real workloads have tens of shapes, garbage requests could have millions).
MAX_CACHED_SHAPES = 512

Render = Callable[[str], Any]

UNKNOWN_NODE_REASON = "node not yet known to the gpufrag extender (its watch is behind); retry"


@dataclass(frozen=True, slots=True)
class FilterVerdicts:
    """Per requested position: passes or not; for the failing ones (in request order) the
    reason and whether the node can never fit (kube-scheduler's "unresolvable"). A deciding
    filter passes only its choice and lists no failures (kube-scheduler drops nodes absent
    from both lists)."""

    rows: IntArray            # the state row of each requested node (``UNKNOWN`` if none)
    passed: BoolArray
    failed: IntArray          # positions in the request
    reasons: list[str]        # one per failed position
    unresolvable: BoolArray   # one per failed position
    rendered: list[Any]       # ``render(reason)`` per failed position (see ``Scorer``)
    decided: str = ""         # the node decided on and assumed (``filter.answer: decide``)


class _Verdicts:
    """The core's ``explain`` per row for one pod shape, kept until the row's version moves
    (like the core's ``ScoreCache``): a loaded cluster fails most nodes for a big pod, and
    explaining thousands of rows per request would dominate the filter's latency."""

    def __init__(self, size: int, render: Render) -> None:
        self.render = render
        self.seen = np.full(size, -1, np.int64)
        self.reason = np.full(size, "", object)
        self.rendered = np.full(size, None, object)
        self.unresolvable = np.zeros(size, np.bool_)

    def grow(self, size: int) -> None:
        if size > self.seen.shape[0]:
            extra = size - self.seen.shape[0]
            self.seen = np.concatenate([self.seen, np.full(extra, -1, np.int64)])
            self.reason = np.concatenate([self.reason, np.full(extra, "", object)])
            self.rendered = np.concatenate([self.rendered, np.full(extra, None, object)])
            self.unresolvable = np.concatenate([self.unresolvable, np.zeros(extra, np.bool_)])

    def refresh(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> None:
        stale = rows[self.seen[rows] != state.version[rows]]
        for row in np.unique(stale).tolist():
            verdict = explain(state, pod, row)
            reason = verdict.reason or "does not fit"  # mask and explain share rules
            self.reason[row] = reason
            self.rendered[row] = self.render(reason)
            self.unresolvable[row] = verdict.unresolvable
            self.seen[row] = state.version[row]


@dataclass(frozen=True, slots=True)
class Priorities:
    """Per requested node (request order): its 0..10 score; ``best`` is the top node's row."""

    rows: IntArray  # the state row of each requested node (``UNKNOWN`` if none)
    scores: npt.NDArray[np.int64]
    best: int  # -1 when the pod fits none of them


def cap_reason(state: ClusterState, pod: PodRequest, row: int, cap: int) -> str:
    count = int(replica_counts(state, (pod.model, pod.model_version),
                               np.array([row], np.int64))[0])
    version = f"{pod.model}:{pod.model_version}" if pod.model_version else pod.model
    return f"runs {count} replicas of model {version}; the per-node cap is {cap}"


def scale_priorities(key: FloatArray, best: int, top: BoolArray) -> npt.NDArray[np.int64]:
    """``MAX_PRIORITY`` for ``best`` (or, when any, for the ``top`` entries only), the rest
    min-max scaled into 0..``MAX_PRIORITY - 1``."""
    lo, hi = float(key.min()), float(key.max())
    if hi > lo:
        scaled = np.floor((MAX_PRIORITY - 1) * (key - lo) / (hi - lo))
    else:
        scaled = np.full(key.shape, MAX_PRIORITY - 1, np.float64)
    scores = np.clip(scaled, 0, MAX_PRIORITY - 1).astype(np.int64)
    if top.any():
        scores[top] = MAX_PRIORITY
    else:
        scores[best] = MAX_PRIORITY
    return scores


class Scorer:
    """One policy with its score cache, the blend weights and the affinity settings.

    Built once per target workload (the extender swaps in a new one when the workload is
    recomputed); every method must be called with the cluster cache's lock held. ``render``
    turns a filter reason into what the caller will send (the wire's pre-encoded JSON); it is
    cached with the reason, so a reason is rendered once per row and pod shape.
    """

    def __init__(self, policy: Policy, *, policy_weight: float, affinity_weight: float,
                 affinity: AffinityParams, render: Render = str,
                 device_choice: DeviceChoice = POLICY_CHOICE) -> None:
        self.policy = policy
        # Who picks the GPU on the chosen node (scheduler.core.gpus): the policy, or DRA's
        # first fit for pods whose GPUs come through claims.
        self.device_choice = device_choice
        self.render = render
        self.policy_weight = policy_weight
        self.affinity_weight = affinity_weight
        self.affinity = affinity
        self._cache: ScoreCache | None = ScoreCache(policy) if policy.node_local else None
        self._shapes: set[tuple[object, ...]] = set()
        self._verdicts: dict[tuple[object, ...], _Verdicts] = {}

    @property
    def cache(self) -> ScoreCache | None:
        return self._cache

    def _score_cache(self, pod: PodRequest) -> ScoreCache | None:
        if self._cache is not None and pod.shape not in self._shapes:
            if len(self._shapes) >= MAX_CACHED_SHAPES:
                self._cache = ScoreCache(self.policy)
                self._shapes.clear()
            self._shapes.add(pod.shape)
        return self._cache

    # ------------------------------------------------------------------ filter
    def _verdicts_for(self, state: ClusterState, pod: PodRequest) -> _Verdicts:
        verdicts = self._verdicts.get(pod.shape)
        if verdicts is None:
            if len(self._verdicts) >= MAX_CACHED_SHAPES:
                self._verdicts.clear()
            verdicts = self._verdicts[pod.shape] = _Verdicts(state.cpu_cap.shape[0],
                                                             self.render)
        verdicts.grow(state.cpu_cap.shape[0])
        return verdicts

    def filter(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> FilterVerdicts:
        """Which requested rows pass; the reasons of the ones that do not."""
        known = rows != UNKNOWN
        safe = np.where(known, rows, 0)
        passed: BoolArray = known & feasible_mask(state, pod, safe)
        capped = np.zeros(rows.size, np.bool_)
        if self.affinity.cap_is_hard and pod.model:
            capped = passed & at_cap(state, pod, safe, self.affinity)
            passed &= ~capped
        failed = np.flatnonzero(~passed)
        if failed.size == 0:
            return FilterVerdicts(rows, passed, failed, [], np.zeros(0, np.bool_), [])
        failed_rows = rows[failed]
        explained = known[failed] & ~capped[failed]
        verdicts = self._verdicts_for(state, pod)
        verdicts.refresh(state, pod, failed_rows[explained])
        at = np.where(explained, failed_rows, 0)
        reasons: list[str] = verdicts.reason[at].tolist()
        rendered: list[Any] = verdicts.rendered[at].tolist()
        unresolvable = explained & verdicts.unresolvable[at]
        for i in np.flatnonzero(~explained).tolist():
            row = int(failed_rows[i])
            reasons[i] = (UNKNOWN_NODE_REASON if row == UNKNOWN else
                          cap_reason(state, pod, row, self.affinity.max_replicas_per_node))
            rendered[i] = self.render(reasons[i])
        return FilterVerdicts(rows, passed, failed, reasons, unresolvable, rendered)

    # ------------------------------------------------------------------ prioritize
    def _ranked(self, state: ClusterState, pod: PodRequest, rows: IntArray,
                now: float) -> tuple[IntArray, FloatArray]:
        """The known rows the pod fits (the affinity cap applied when hard) and their blended
        key (higher is better); empty when it fits none."""
        known = rows[rows != UNKNOWN]
        candidates, scores = rank_candidates(state, self.policy, pod, known,
                                             self._score_cache(pod))
        return self.blend(state, pod, candidates, scores.score, now)

    def blend(self, state: ClusterState, pod: PodRequest, candidates: IntArray,
              policy_scores: FloatArray, now: float) -> tuple[IntArray, FloatArray]:
        """Candidates past the affinity cap (when hard) and their blended key: the policy's
        scores (higher is better) with model-version affinity. Every pod is ranked through it,
        MIG pods too (:mod:`scheduler.extender.migscoring` brings its own policy scores)."""
        if self.affinity.cap_is_hard and pod.model and candidates.size:
            keep = ~at_cap(state, pod, candidates, self.affinity)
            candidates, policy_scores = candidates[keep], policy_scores[keep]
        if candidates.size == 0:
            return candidates, np.zeros(0, np.float64)
        key = blended_key(state, pod, candidates, policy_scores, self.affinity, now,
                          policy_weight=self.policy_weight,
                          affinity_weight=self.affinity_weight)
        return candidates, key

    @staticmethod
    def _top(state: ClusterState, candidates: IntArray,
             hinted: frozenset[str]) -> BoolArray:
        if not hinted:
            return np.zeros(candidates.size, np.bool_)
        return np.fromiter((state.names[int(r)] in hinted for r in candidates), np.bool_,
                           candidates.size)

    def prioritize(self, state: ClusterState, pod: PodRequest, rows: IntArray, now: float,
                   hinted: frozenset[str] = frozenset()) -> Priorities:
        """0..10 per requested row (``UNKNOWN`` rows and rows the pod does not fit get 0)."""
        candidates, key = self._ranked(state, pod, rows, now)
        return self.priorities(state, rows, candidates, key, hinted)

    def priorities(self, state: ClusterState, rows: IntArray, candidates: IntArray,
                   key: FloatArray, hinted: frozenset[str] = frozenset()) -> Priorities:
        """0..10 per requested row from the ranked ``candidates`` and their blended ``key``."""
        out = np.zeros(rows.size, np.int64)
        if candidates.size == 0:
            return Priorities(rows, out, -1)
        best = best_index(state, candidates, key)
        top = self._top(state, candidates, hinted)
        per_row = np.zeros(state.size, np.int64)
        per_row[candidates] = scale_priorities(key, best, top)
        known = rows != UNKNOWN
        out[known] = per_row[rows[known]]
        best_row = int(candidates[int(np.flatnonzero(top)[0])] if top.any() else candidates[best])
        return Priorities(rows, out, best_row)

    def decide(self, state: ClusterState, pod: PodRequest, rows: IntArray, now: float,
               hinted: frozenset[str] = frozenset(), count: int = 1) -> IntArray:
        """The ``count`` best rows for the pod, best first: the one prioritize would rank
        first (hinted nodes, then the blended key, ties by the core's node order), then the
        runners-up in the same order. Empty when the pod fits none of ``rows``."""
        candidates, key = self._ranked(state, pod, rows, now)
        return self.best_rows(state, candidates, key, hinted, count)

    def best_rows(self, state: ClusterState, candidates: IntArray, key: FloatArray,
                  hinted: frozenset[str] = frozenset(), count: int = 1) -> IntArray:
        """The ``count`` best of the ranked ``candidates``, best first (see :meth:`decide`)."""
        if candidates.size == 0:
            return candidates
        top = self._top(state, candidates, hinted)
        if count == 1 and not top.any():
            return np.array([candidates[best_index(state, candidates, key)]], np.int64)
        order = np.lexsort((state.tie_rank[candidates], -key, ~top))
        best: IntArray = candidates[order[:count]]
        return best

    # ------------------------------------------------------------------ bind
    def place_on(self, state: ClusterState, pod: PodRequest, row: int) -> Decision | None:
        """The core's decision restricted to one node (its GPUs), None if it does not fit."""
        return choose(state, self.policy, pod, np.array([row], np.int64),
                      self._score_cache(pod), self.device_choice)


__all__ = ["MAX_PRIORITY", "UNKNOWN", "FilterVerdicts", "Priorities", "Scorer",
           "scale_priorities"]
