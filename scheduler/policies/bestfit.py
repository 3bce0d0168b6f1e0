"""bestfit: the node left with the least normalised CPU + GPU after placement.

Score: 100 · (1 − ½(cpu_left − cpu_req)/C − ½(gpu_left − gpu_req)/G), not rounded.
"""

from __future__ import annotations

from scheduler.core.gpus import tightest_gpu
from scheduler.core.policy import Scores
from scheduler.core.state import ClusterState, IntArray
from scheduler.core.types import PodRequest


class BestFitPolicy:
    name = "bestfit"
    node_local = True

    def score(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> Scores:
        c, g = state.max_cpu_milli, state.max_gpu_milli
        cpu_after = (state.cpu_left[rows] - pod.cpu_milli) / c
        gpu_after = (state.gpu_free[rows].sum(axis=1) - pod.gpu_demand_milli) / g
        score = 100.0 * (1.0 - 0.5 * cpu_after - 0.5 * gpu_after)
        return Scores(score, tightest_gpu(state.gpu_free[rows], pod.gpu_milli))
