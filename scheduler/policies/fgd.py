"""fgd: Fragmentation Gradient Descent — place where fragmentation grows least.

For each candidate node, and for GPU shares each GPU that fits, FGD computes the node's
fragmentation F after the placement; the pod goes where ΔF = F(n′) − F(n) is smallest. The node
score is floor(100 · sigmoid(−ΔF / 1000)) (F in milli-GPU) as in the reference, so scores are
integers and ties go to the fixed node order. Whole GPUs are interchangeable for F, so a k-GPU
pod is evaluated on its lowest-index fully free GPUs only.

Within a node, a share goes on one GPU. By default it is the GPU with the smallest *exact* ΔF
(lowest index on ties): the truncated score cannot tell apart GPUs whose ΔF differ by less than
a score step, and the exact value is the one FGD means to minimise. With ``kss_compat`` the
policy reproduces the FGD authors' simulator bit for bit instead: the first GPU with the highest
integer score and its sigmoid ``1 / (1 + exp(-x))`` (F is summed in that simulator's order in
both modes, see :func:`~scheduler.core.fragmentation.fragmentation_in_spec_order`). The two
rules move the 10-seed mean allocation by under 0.1 pp.

With ``device_choice=FIRST_FIT`` a share is scored on the GPU DRA's allocator will give it (the
first that fits, :func:`~scheduler.core.gpus.first_fit_gpu`) instead of FGD's own pick: where
the allocator chooses inside the node, FGD can still choose the node by the fragmentation that
GPU will really cause (docs/dra.md measures what that keeps).
"""

from __future__ import annotations

import numpy as np

from scheduler.core.fragmentation import (
    FloatArray,
    TargetWorkload,
    fragmentation_after_share,
    fragmentation_after_whole,
)
from scheduler.core.gpus import FIRST_FIT, NO_GPU, POLICY_CHOICE, DeviceChoice, first_fit_gpu
from scheduler.core.policy import Scores
from scheduler.core.state import ClusterState, IntArray
from scheduler.core.types import PodRequest


def _sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free logistic
    return out


def _sigmoid_kss(x: np.ndarray) -> np.ndarray:
    """The reference simulator's logistic, kept for bit-equal scores (it never overflows to a
    wrong value here: exp(-x) of a huge x gives inf and 1 / inf = 0)."""
    with np.errstate(over="ignore"):
        out: np.ndarray = 1.0 / (1.0 + np.exp(-x))
    return out


class FgdPolicy:
    name = "fgd"
    node_local = True

    def __init__(self, workload: TargetWorkload, *, kss_compat: bool = False,
                 device_choice: DeviceChoice = POLICY_CHOICE) -> None:
        self.workload = workload
        self.kss_compat = kss_compat
        self.device_choice = device_choice

    def _first_fit(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> IntArray | None:
        """The GPU a share is scored on when the allocator picks it (None: FGD picks)."""
        if self.device_choice != FIRST_FIT:
            return None
        return first_fit_gpu(state.gpu_free[rows], pod.gpu_milli)

    def _candidates(self, state: ClusterState, pod: PodRequest,
                    rows: IntArray) -> tuple[FloatArray, FloatArray]:
        """For a share: F of each row as it is (k) and after the share on each GPU (k x width)."""
        return fragmentation_after_share(
            state.gpu_free[rows], state.cpu_left[rows], state.product[rows], self.workload,
            self.workload.allowed(state), pod.gpu_milli, pod.cpu_milli)

    def _whole(self, state: ClusterState, pod: PodRequest,
               rows: IntArray) -> tuple[FloatArray, FloatArray]:
        """F before and after for a pod that takes whole GPUs (or none)."""
        return fragmentation_after_whole(
            state.gpu_free[rows], state.cpu_left[rows], state.product[rows], self.workload,
            self.workload.allowed(state), pod.num_gpu if pod.wants_gpu else 0, pod.gpu_milli,
            pod.cpu_milli)

    def delta(self, state: ClusterState, pod: PodRequest,
              rows: IntArray) -> tuple[np.ndarray, IntArray]:
        """ΔF per candidate row and the GPU a share would take (``NO_GPU`` for others)."""
        if pod.is_share:
            before, after_on = self._candidates(state, pod, rows)
            after = np.where(state.gpu_free[rows] >= pod.gpu_milli, after_on, np.inf)
            forced = self._first_fit(state, pod, rows)
            share_gpu = after.argmin(axis=1).astype(np.int64) if forced is None else forced
            return after[np.arange(rows.size), share_gpu] - before, share_gpu
        before, after = self._whole(state, pod, rows)
        return after - before, np.full(rows.size, NO_GPU, np.int64)

    def score(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> Scores:
        if self.kss_compat:
            return self._score_kss(state, pod, rows)
        delta, share_gpu = self.delta(state, pod, rows)
        return Scores(np.floor(100.0 * _sigmoid(-delta / 1000.0)), share_gpu)

    def _score_kss(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> Scores:
        """The reference simulator's integer scores; a share takes the first GPU whose integer
        score is highest."""
        if pod.is_share:
            before, after_on = self._candidates(state, pod, rows)
            per_gpu = np.floor(_sigmoid_kss((before[:, None] - after_on) / 1000.0) * 100.0)
            per_gpu = np.where(state.gpu_free[rows] >= pod.gpu_milli, per_gpu, -1.0)
            forced = self._first_fit(state, pod, rows)
            share_gpu = (per_gpu.argmax(axis=1).astype(np.int64)  # argmax: first of the best
                         if forced is None else forced)
            return Scores(per_gpu[np.arange(rows.size), share_gpu], share_gpu)
        before, after = self._whole(state, pod, rows)
        score = np.floor(_sigmoid_kss((before - after) / 1000.0) * 100.0)
        return Scores(score, np.full(rows.size, NO_GPU, np.int64))
