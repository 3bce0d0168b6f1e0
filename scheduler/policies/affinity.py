"""Model-version affinity: prefer nodes that already hold (or recently held) the pod's model.

A replica placed where the same model version already runs (or ran a few minutes ago) skips
most of its cold start: the image is pulled and the weights are in the page cache. This is not a
placement policy on its own — it says nothing about fragmentation — but a bonus in 0..1 per node
(a penalty at the per-node replica cap) that the extender blends with the selected policy's
score.

Per candidate node, for a pod labelled with model m at version v (``PodRequest.model`` /
``model_version``), the bonus is the best that applies of:

- ``same_version``  — the node runs a replica of (m, v);
- ``other_version`` — the node runs a replica of m at another version (shared base layers);
- ``warm``          — a replica of (m, v) left the node within ``warm_window_s`` seconds
  (``ClusterState.remove_pod(now=...)`` records when).

A node already holding ``max_replicas_per_node`` replicas of (m, v) gets the same-version bonus
as a penalty instead (``-same_version``): spreading replicas of one version limits the blast
radius of a node failure, and merely withholding the bonus would leave such a node as good as
any other, so a packing policy would keep stacking replicas on it. With the penalty the pod
goes there only when the policy prefers that node by more than the affinity weight (soft, like
a ``ScheduleAnyway`` spread constraint); with ``cap_is_hard`` the extender's filter rejects it
outright. Pods without a model label get 0 everywhere.

Pure numpy over ``ClusterState.replicas`` / ``model_last_seen``: no Kubernetes, no web.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from scheduler.core.fragmentation import FloatArray
from scheduler.core.state import BoolArray, ClusterState, IntArray, ModelKey
from scheduler.core.types import PodRequest


@dataclass(frozen=True, slots=True)
class AffinityParams:
    """Bonus sizes (0..1), the warm window (seconds) and the per-node replica cap (0 = none)."""

    same_version: float = 1.0
    other_version: float = 0.5
    warm: float = 0.6
    warm_window_s: float = 1800.0
    max_replicas_per_node: int = 0
    cap_is_hard: bool = False

    def problems(self) -> list[tuple[str, str]]:
        """(field, what is wrong) for each invalid setting; empty when all are valid."""
        found: list[tuple[str, str]] = []
        for name in ("same_version", "other_version", "warm"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                found.append((name, f"must be in 0..1, got {value}"))
        if self.warm_window_s < 0:
            found.append(("warm_window_s", f"must be >= 0 seconds, got {self.warm_window_s}"))
        if self.max_replicas_per_node < 0:
            found.append(("max_replicas_per_node",
                          f"must be >= 0 (0 = no cap), got {self.max_replicas_per_node}"))
        return found


def _per_row(counts: Mapping[int, float], size: int, rows: IntArray,
             fill: float = 0.0) -> FloatArray:
    """A row -> value mapping (a few entries) as a dense column, read at ``rows``."""
    column = np.full(size, fill, np.float64)
    if counts:
        keys = np.fromiter(counts.keys(), np.int64, len(counts))
        column[keys] = np.fromiter(counts.values(), np.float64, len(counts))
    picked: FloatArray = column[rows]
    return picked


def replica_counts(state: ClusterState, key: ModelKey, rows: IntArray) -> FloatArray:
    """How many replicas of (model, version) each row in ``rows`` runs."""
    return _per_row(state.replicas.get(key, {}), state.size, rows)


def at_cap(state: ClusterState, pod: PodRequest, rows: IntArray,
           params: AffinityParams) -> BoolArray:
    """Rows that already run ``max_replicas_per_node`` replicas of the pod's model version."""
    if not pod.model or params.max_replicas_per_node <= 0:
        return np.zeros(rows.size, np.bool_)
    same = replica_counts(state, (pod.model, pod.model_version), rows)
    full: BoolArray = same >= params.max_replicas_per_node
    return full


def affinity_score(state: ClusterState, pod: PodRequest, rows: IntArray,
                   params: AffinityParams, now: float) -> FloatArray:
    """The bonus in 0..1 for each row in ``rows``, or the penalty ``-same_version`` on rows
    at the per-node cap (see the module docstring)."""
    if not pod.model:
        return np.zeros(rows.size, np.float64)
    key = (pod.model, pod.model_version)
    same = replica_counts(state, key, rows)
    other = np.zeros(rows.size, np.float64)
    for (model, version), counts in state.replicas.items():
        if model == pod.model and version != pod.model_version and counts:
            other += _per_row(counts, state.size, rows)
    left_at = state.model_last_seen.get(key, {})
    warm = np.zeros(rows.size, np.bool_)
    if left_at and params.warm_window_s > 0:
        # Rows no replica ever left hold -inf: never warm.
        left = _per_row(left_at, state.size, rows, fill=-np.inf)
        warm = now - left <= params.warm_window_s
    bonus = np.maximum(np.where(other > 0, params.other_version, 0.0),
                       np.where(warm, params.warm, 0.0))
    bonus = np.where(same > 0, params.same_version, bonus)
    if params.max_replicas_per_node > 0:
        bonus = np.where(same >= params.max_replicas_per_node, -params.same_version, bonus)
    score: FloatArray = bonus
    return score


__all__ = ["AffinityParams", "affinity_score", "at_cap", "replica_counts"]


def blended_key(state: ClusterState, pod: PodRequest, rows: IntArray, policy_scores: FloatArray,
                params: AffinityParams, now: float, *, policy_weight: float,
                affinity_weight: float) -> FloatArray:
    """The ranking key of ``rows`` (higher is better) for a pod, blending the policy's scores
    with model-version affinity: the policy's scores min-max normalised to 0..1 times
    ``policy_weight``, plus ``affinity_weight`` times the bonus. Where no row earns a bonus
    (no model label, weight 0, no replica or warm node) the policy's own scores rank alone.

    One home for the blend: the extender's prioritize and the event-driven what-if both rank
    with it, so a simulated placement is the one the extender would make."""
    if affinity_weight <= 0 or not pod.model:
        return policy_scores
    bonus = affinity_score(state, pod, rows, params, now)
    if not bonus.any():
        return policy_scores
    lo, hi = float(policy_scores.min()), float(policy_scores.max())
    norm = (policy_scores - lo) / (hi - lo) if hi > lo else np.ones(policy_scores.shape)
    key: FloatArray = policy_weight * norm + affinity_weight * bonus
    return key
