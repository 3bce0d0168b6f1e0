"""The interface every placement policy implements.

A policy is a plain object with a name and one method: score the candidate nodes (all already
feasible) for a pod, and say which GPU a GPU share would take on each. Selection, tie-breaking
and GPU bookkeeping live in ``placement`` so policies stay small and comparable.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from scheduler.core.fragmentation import FloatArray
from scheduler.core.state import ClusterState, IntArray
from scheduler.core.types import PodRequest


class Scores(NamedTuple):
    """Per candidate row: the score (higher is better) and, for GPU shares, the GPU index
    (``NO_GPU`` otherwise, and then the default GPU rule applies)."""

    score: FloatArray
    share_gpu: IntArray


class Policy(Protocol):
    """A placement policy; mypy checks each implementation against this."""

    @property
    def name(self) -> str: ...

    @property
    def node_local(self) -> bool:
        """True when a node's score depends only on that node's row and the pod's shape, so
        scores may be cached per shape and recomputed only for rows that changed."""
        ...

    def score(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> Scores: ...
