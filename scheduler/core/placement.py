"""From scores to one decision: filter, score, pick the best, break ties by a fixed order.

Ties go to the node ranked first in ``state.tie_rank`` (a seeded permutation in the simulator,
node-name order in the live extender), never to a fresh random draw: FGD's integer scores tie
often, and a fixed order keeps packing onto the same nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.core.feasibility import feasible_mask
from scheduler.core.gpus import NO_GPU, POLICY_CHOICE, DeviceChoice, gpus_for
from scheduler.core.policy import Policy, Scores
from scheduler.core.state import ClusterState, IntArray
from scheduler.core.types import PodRequest

ShapeKey = tuple[int, int, int, int, frozenset[str], int]
_NONE = -np.inf  # the key of a row the shape does not fit


class _ShapeView:
    """For one pod shape, over every row of the state: whether it fits, its score (``key``,
    -inf where it does not fit), the GPU a share takes, and the row version these are for."""

    def __init__(self, size: int) -> None:
        self.seen = np.full(size, -1, np.int64)
        self.feasible = np.zeros(size, np.bool_)
        self.key = np.full(size, _NONE)
        self.share_gpu = np.full(size, NO_GPU, np.int64)


@dataclass(frozen=True, slots=True)
class Decision:
    row: int
    node: str
    gpus: tuple[int, ...]
    score: float


class ScoreCache:
    """Scores per pod shape, recomputed only for rows whose ``version`` changed.

    Each placement changes one node, so a replay that scores thousands of pods of a few hundred
    shapes recomputes a handful of rows per pod instead of the whole cluster.
    """

    def __init__(self, policy: Policy) -> None:
        if not policy.node_local:
            raise ValueError(f"policy {policy.name} is not node-local; its scores cannot be cached")
        self.policy = policy
        self._entries: dict[ShapeKey, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._views: dict[ShapeKey, _ShapeView] = {}

    def score(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> Scores:
        entry = self._entries.get(pod.shape)
        size = state.cpu_cap.shape[0]
        if entry is None or entry[0].shape[0] < size:
            old = entry
            entry = (np.zeros(size), np.full(size, NO_GPU, np.int64), np.full(size, -1, np.int64))
            if old is not None:
                n = old[0].shape[0]
                entry[0][:n], entry[1][:n], entry[2][:n] = old
            self._entries[pod.shape] = entry
        score, gpu, seen = entry
        stale = rows[seen[rows] != state.version[rows]]
        if stale.size:
            fresh = self.policy.score(state, pod, stale)
            score[stale] = fresh.score
            gpu[stale] = fresh.share_gpu
            seen[stale] = state.version[stale]
        return Scores(score[rows], gpu[rows])

    def best_of_all(self, state: ClusterState, pod: PodRequest) -> tuple[int, float, int] | None:
        """(row, score, share GPU) of the best row of the whole state for ``pod`` (None: it fits
        nowhere): what :func:`choose` decides over every active row, kept per shape so that
        each call re-checks fit and score only on the rows changed since the shape's last call
        (a replay changes one row per pod; the full-width steps left are a version compare and
        the pick). Not for GPU-memory shares, which score per GPU memory size."""
        size = state.size
        view = self._views.get(pod.shape)
        if view is None or view.seen.shape[0] != size:
            view = self._views[pod.shape] = _ShapeView(size)
        version = state.version[:size]
        stale = np.flatnonzero(view.seen != version)
        if stale.size:
            view.seen[stale] = version[stale]
            fits = feasible_mask(state, pod, stale)
            view.feasible[stale] = fits
            view.key[stale] = _NONE
            fresh = stale[fits]
            if fresh.size:
                scores = self.policy.score(state, pod, fresh)
                view.key[fresh] = scores.score
                view.share_gpu[fresh] = scores.share_gpu
        top = view.key.max(initial=_NONE)
        if top == _NONE:  # nothing fits, or (no policy does this) every fitting row scored -inf
            tied = np.flatnonzero(view.feasible)
            if tied.size == 0:
                return None
        else:
            tied = np.flatnonzero(view.key == top)
        row = int(tied[0] if tied.size == 1 else tied[np.argmin(state.tie_rank[tied])])
        return row, float(top), int(view.share_gpu[row])


def rank_candidates(state: ClusterState, policy: Policy, pod: PodRequest, rows: IntArray,
                    cache: ScoreCache | None = None) -> tuple[IntArray, Scores]:
    """Feasible rows among ``rows`` and their scores (unsorted).

    A GPU-memory share is a different milli-GPU share on nodes with different GPU memory, so
    it is scored once per GPU memory size among the candidates, each time as the milli-GPU
    share it is there (policies only ever see milli-GPU)."""
    candidates = rows[feasible_mask(state, pod, rows)]
    if candidates.size == 0:
        return candidates, Scores(np.zeros(0), np.zeros(0, np.int64))
    score_of = cache.score if cache is not None else policy.score
    if not pod.gpu_memory_mib:
        return candidates, score_of(state, pod, candidates)
    score = np.zeros(candidates.size)
    share_gpu = np.full(candidates.size, NO_GPU, np.int64)
    memory = state.gpu_memory_mib[candidates]
    for size in np.unique(memory).tolist():
        at = np.flatnonzero(memory == size)
        resolved = pod.on_gpu_memory(int(size))
        assert resolved is not None  # feasible_mask kept only nodes it converts on
        part = score_of(state, resolved, candidates[at])
        score[at], share_gpu[at] = part.score, part.share_gpu
    return candidates, Scores(score, share_gpu)


def best_index(state: ClusterState, candidates: IntArray, score: np.ndarray) -> int:
    """Index into ``candidates`` of the top score, ties to the lowest tie rank."""
    top = score.max()
    tied = np.flatnonzero(score == top)
    if tied.size == 1:
        return int(tied[0])
    return int(tied[np.argmin(state.tie_rank[candidates[tied]])])


def choose(state: ClusterState, policy: Policy, pod: PodRequest, rows: IntArray | None = None,
           cache: ScoreCache | None = None,
           device_choice: DeviceChoice = POLICY_CHOICE) -> Decision | None:
    """Where ``pod`` goes under ``policy`` (None when it fits nowhere among ``rows``; every
    active row when ``rows`` is None, which a ``cache`` answers incrementally). The node is
    always the policy's; ``device_choice`` says who picks the GPU on it
    (:mod:`scheduler.core.gpus`: the policy, or DRA's first fit)."""
    if rows is None and cache is not None and not pod.gpu_memory_mib:
        found = cache.best_of_all(state, pod)
        if found is None:
            return None
        row, score, share_gpu = found
        return Decision(row=row, node=state.names[row],
                        gpus=gpus_for(state, pod, row, share_gpu, device_choice), score=score)
    if rows is None:
        rows = state.active_rows()
    candidates, scores = rank_candidates(state, policy, pod, rows, cache)
    if candidates.size == 0:
        return None
    i = best_index(state, candidates, scores.score)
    row = int(candidates[i])
    gpus = gpus_for(state, pod, row, int(scores.share_gpu[i]), device_choice)
    return Decision(row=row, node=state.names[row], gpus=gpus, score=float(scores.score[i]))
