"""bestfit: the node left with the least normalised CPU + GPU after placement.

Score: 100 · (1 − ½(cpu_left − cpu_req)/C − ½(gpu_left − gpu_req)/G). The FGD authors'
simulator truncates it to an integer (``integer=True``, what the KSS-compatible replay uses),
which makes nodes within one point tie and go to the fixed node order. The default keeps the
exact value, so the node left with the least really wins; over 10 seeds of the openb replay the
two differ by under 0.1 pp of allocation.
"""

from __future__ import annotations

import numpy as np

from scheduler.core.gpus import tightest_gpu
from scheduler.core.policy import Scores
from scheduler.core.state import ClusterState, IntArray
from scheduler.core.types import PodRequest


class BestFitPolicy:
    name = "bestfit"
    node_local = True

    def __init__(self, *, integer: bool = False) -> None:
        self.integer = integer

    def score(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> Scores:
        c, g = state.max_cpu_milli, state.max_gpu_milli
        cpu_after = (state.cpu_left[rows] - pod.cpu_milli) / c
        gpu_after = (state.gpu_free[rows].sum(axis=1) - pod.gpu_demand_milli) / g
        share_gpu = tightest_gpu(state.gpu_free[rows], pod.gpu_milli)
        if self.integer:
            # The reference's order of operations: Σ (free - req) / max · weight, then
            # (1 - Σ) · 100, truncated.
            left = cpu_after * 0.5 + gpu_after * 0.5
            return Scores(np.trunc((1.0 - left) * 100.0), share_gpu)
        score = 100.0 * (1.0 - 0.5 * cpu_after - 0.5 * gpu_after)
        return Scores(score, share_gpu)
