"""gpu-clustering (Gandiva-like): keep pods of one GPU-count class together.

A GPU pod is tagged "share" or "k-gpu". base = 25 · (G − gpu_left)/G; a node holding only this
tag: base + 75; this tag among others: base + 50; no GPU pods yet: base + 25; only other tags:
base. Integer. CPU-only pods score 0.
"""

from __future__ import annotations

import numpy as np

from scheduler.core.gpus import tightest_gpu
from scheduler.core.policy import Scores
from scheduler.core.state import ClusterState, IntArray
from scheduler.core.types import PodRequest


class GpuClusteringPolicy:
    name = "gpu-clustering"
    node_local = True

    def score(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> Scores:
        share_gpu = tightest_gpu(state.gpu_free[rows], pod.gpu_milli)
        if not pod.wants_gpu:
            return Scores(np.zeros(rows.size), share_gpu)
        g = state.max_gpu_milli
        base = 25.0 * (g - state.gpu_free[rows].sum(axis=1)) / g
        tags = state.tag_counts[rows]
        this = tags[:, pod.clustering_tag] > 0
        others = (tags.sum(axis=1) - tags[:, pod.clustering_tag]) > 0
        bonus = np.select([this & ~others, this & others, ~this & ~others], [75.0, 50.0, 25.0], 0.0)
        return Scores(np.floor(base + bonus), share_gpu)
