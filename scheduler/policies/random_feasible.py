"""random: a fresh uniformly random feasible node per pod, and a random fitting GPU on it.

The one baseline that is not node-local: every call draws anew, so it is never cached and it
ignores the fixed tie order (iid uniform scores almost never tie).
"""

from __future__ import annotations

import numpy as np

from scheduler.core.gpus import NO_GPU
from scheduler.core.policy import Scores
from scheduler.core.state import ClusterState, IntArray
from scheduler.core.types import PodRequest


class RandomPolicy:
    name = "random"
    node_local = False

    def __init__(self, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)

    def score(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> Scores:
        score = self._rng.random(rows.size)
        share_gpu = np.full(rows.size, NO_GPU, np.int64)
        if pod.is_share and rows.size:
            # A random fitting GPU on each candidate: the max of iid uniforms over fitting GPUs.
            draws = self._rng.random((rows.size, state.gpu_width))
            draws[state.gpu_free[rows] < pod.gpu_milli] = -1.0
            share_gpu = draws.argmax(axis=1).astype(np.int64)
        return Scores(score, share_gpu)
