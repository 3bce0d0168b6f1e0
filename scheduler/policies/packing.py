"""gpu-packing: prefer partly used GPUs, then used nodes, then idle nodes.

Integer score, as the FGD authors' simulator:
- the node's GPUs are all free: max(33 − #free, #free) (smaller idle nodes first);
- a GPU share fits on a partly used GPU (tightest first): max(100 − ⌊⌊free%⌋/10⌋, 50), each
  step an integer division as there;
- otherwise the pod takes fully free GPUs on a used node: max(50 − #GPUs it takes, 33).
CPU-only pods score 0 everywhere (ties go to the fixed node order).
"""

from __future__ import annotations

import numpy as np

from scheduler.core.gpus import tightest_gpu
from scheduler.core.policy import Scores
from scheduler.core.state import ClusterState, IntArray
from scheduler.core.types import MILLI_PER_GPU, PodRequest


class GpuPackingPolicy:
    name = "gpu-packing"
    node_local = True

    def score(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> Scores:
        free = state.gpu_free[rows]
        share_gpu = tightest_gpu(free, pod.gpu_milli)
        if not pod.wants_gpu:
            return Scores(np.zeros(rows.size), share_gpu)
        full = (free == MILLI_PER_GPU).sum(axis=1)
        idle = full == state.gpu_count[rows]
        score = np.full(rows.size, float(max(50 - pod.num_gpu, 33)))
        if pod.is_share:
            chosen = free[np.arange(rows.size), np.maximum(share_gpu, 0)].astype(np.int64)
            partly = chosen < MILLI_PER_GPU
            # Integer steps, as the reference computes them: the free percentage truncated,
            # then its tenth truncated (250 milli free scores 98, not 97).
            free_pct = chosen * 100 // MILLI_PER_GPU
            score = np.where(partly, np.maximum(100 - free_pct // 10, 50).astype(np.float64),
                             score)
        score = np.where(idle, np.maximum(33 - full, full).astype(np.float64), score)
        return Scores(score, share_gpu)
