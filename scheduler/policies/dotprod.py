"""dotprod: prefer nodes whose normalised free (CPU, GPU) has the smallest dot product with the
pod's normalised request — a pod goes where what it asks for is scarce relative to what is left.

Score (as the FGD authors' simulator): int(100 · (1 − ((cpu_left/C)(cpu_req/C) +
(gpu_left/G)(gpu_req/G)) / 2)), C and G the largest node's CPU and GPU milli.
"""

from __future__ import annotations

import numpy as np

from scheduler.core.gpus import tightest_gpu
from scheduler.core.policy import Scores
from scheduler.core.state import ClusterState, IntArray
from scheduler.core.types import PodRequest


class DotProductPolicy:
    name = "dotprod"
    node_local = True

    def score(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> Scores:
        c, g = state.max_cpu_milli, state.max_gpu_milli
        cpu_left = state.cpu_left[rows] / c
        gpu_left = state.gpu_free[rows].sum(axis=1) / g
        dot = cpu_left * (pod.cpu_milli / c) + gpu_left * (pod.gpu_demand_milli / g)
        score = np.floor(100.0 * (1.0 - dot / 2.0))
        return Scores(score, tightest_gpu(state.gpu_free[rows], pod.gpu_milli))
