"""Which GPUs on a node a pod takes.

The reference rule for every policy but random and FGD: a GPU share goes on the tightest GPU
that still fits (least free share >= the request, lowest index on ties); whole-GPU pods take the
lowest-index fully free GPUs. Whole GPUs are interchangeable for fragmentation, so FGD uses the
same rule for them and only chooses among GPUs for shares.
"""

from __future__ import annotations

import numpy as np

from scheduler.core.state import ClusterState, IntArray
from scheduler.core.types import MILLI_PER_GPU, PodRequest

NO_GPU = -1
_NO_FIT = np.iinfo(np.int64).max


def tightest_gpu(free: IntArray, milli: int) -> IntArray:
    """Per row of ``free`` (rows x GPUs), the index of the tightest GPU with >= ``milli`` free,
    or ``NO_GPU`` where none fits."""
    masked = np.where(free >= milli, free, _NO_FIT)
    best = masked.argmin(axis=1)
    fits = masked[np.arange(free.shape[0]), best] != _NO_FIT
    return np.where(fits, best, NO_GPU).astype(np.int64)


def lowest_free_gpus(free_row: IntArray, count: int) -> tuple[int, ...]:
    """The ``count`` lowest-index fully free GPUs of one node (fewer if it has fewer)."""
    return tuple(int(g) for g in np.flatnonzero(free_row == MILLI_PER_GPU)[:count])


def gpus_for(state: ClusterState, pod: PodRequest, row: int, share_gpu: int) -> tuple[int, ...]:
    """The GPU indices a pod takes on ``row``; ``share_gpu`` is the policy's pick for shares."""
    if not pod.wants_gpu:
        return ()
    resolved = pod.on_gpu_memory(int(state.gpu_memory_mib[row]))
    if resolved is None:
        return ()
    pod = resolved
    if pod.is_share:
        if share_gpu == NO_GPU:
            share_gpu = int(tightest_gpu(state.gpu_free[row : row + 1], pod.gpu_milli)[0])
        return (share_gpu,)
    return lowest_free_gpus(state.gpu_free[row], pod.num_gpu)
