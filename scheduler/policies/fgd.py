"""fgd: Fragmentation Gradient Descent — place where fragmentation grows least.

For each candidate node, and for GPU shares each GPU that fits, FGD computes the node's
fragmentation F after the placement; the pod goes where ΔF = F(n′) − F(n) is smallest. The node
score is floor(100 · sigmoid(−ΔF / 1000)) (F in milli-GPU) as in the reference, so scores are
integers and ties go to the fixed node order; within a node, the GPU with the smallest exact ΔF
wins (lowest index on ties). Whole GPUs are interchangeable for F, so a k-GPU pod is evaluated
on its lowest-index fully free GPUs only.
"""

from __future__ import annotations

import numpy as np

from scheduler.core.fragmentation import TargetWorkload, fragmentation_of
from scheduler.core.gpus import NO_GPU
from scheduler.core.policy import Scores
from scheduler.core.state import ClusterState, IntArray
from scheduler.core.types import MILLI_PER_GPU, PodRequest


def _sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free logistic
    return out


class FgdPolicy:
    name = "fgd"
    node_local = True

    def __init__(self, workload: TargetWorkload) -> None:
        self.workload = workload

    def delta(self, state: ClusterState, pod: PodRequest,
              rows: IntArray) -> tuple[np.ndarray, IntArray]:
        """ΔF per candidate row and the GPU a share would take (``NO_GPU`` for others)."""
        allowed = self.workload.allowed(state)
        free = state.gpu_free[rows]
        cpu_after = state.cpu_left[rows] - pod.cpu_milli
        product = state.product[rows]
        if pod.is_share:
            k, width = free.shape
            # Row 0 of each block: the node as it is; row 1 + g: GPU g loses the pod's share.
            cand = np.repeat(free[:, None, :], width + 1, axis=1)  # k x (1 + width) x width
            idx = np.arange(width)
            cand[:, idx + 1, idx] -= pod.gpu_milli
            cpu = np.repeat(np.stack([state.cpu_left[rows], cpu_after], axis=1),
                            [1, width], axis=1)
            frag = fragmentation_of(
                cand.reshape(k * (width + 1), width), cpu.reshape(-1),
                np.repeat(product, width + 1), self.workload, allowed,
            ).reshape(k, width + 1)
            after = np.where(free >= pod.gpu_milli, frag[:, 1:], np.inf)
            share_gpu = after.argmin(axis=1).astype(np.int64)
            return after[np.arange(k), share_gpu] - frag[:, 0], share_gpu
        before = fragmentation_of(free, state.cpu_left[rows], product, self.workload, allowed)
        taken = free.copy()
        if pod.wants_gpu:
            # The first num_gpu fully free GPUs of each row (rows are feasible, so they exist).
            is_full = free == MILLI_PER_GPU
            take = is_full & (np.cumsum(is_full, axis=1) <= pod.num_gpu)
            taken = np.where(take, free - pod.gpu_milli, free)
        after = fragmentation_of(taken, cpu_after, product, self.workload, allowed)
        return after - before, np.full(rows.size, NO_GPU, np.int64)

    def score(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> Scores:
        delta, share_gpu = self.delta(state, pod, rows)
        return Scores(np.floor(100.0 * _sigmoid(-delta / 1000.0)), share_gpu)
