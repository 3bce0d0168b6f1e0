"""Which GPUs on a node a pod takes: the device choice, one home for every component.

The reference rule for every policy but random and FGD: a GPU share goes on the tightest GPU
that still fits (least free share >= the request, lowest index on ties); whole-GPU pods take the
lowest-index fully free GPUs. Whole GPUs are interchangeable for fragmentation, so FGD uses the
same rule for them and only chooses among GPUs for shares.

Under Dynamic Resource Allocation the GPU inside the chosen node is not the policy's to pick:
kube-scheduler's structured allocator walks the node's devices in ResourceSlice order and takes
the first one whose remaining consumable capacity fits (for k whole GPUs, the first k fully free
ones), with no scoring among them (docs/dra.md). :data:`FIRST_FIT` models that rule, so the
what-if can measure what FGD keeps when the allocator, not FGD, picks the GPU; the device order
is taken to be the GPU index order, the order a driver that lists its GPUs by index publishes.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from scheduler.core.state import ClusterState, IntArray
from scheduler.core.types import MILLI_PER_GPU, PodRequest

NO_GPU = -1
_NO_FIT = np.iinfo(np.int64).max

DeviceChoice = Literal["policy", "first-fit"]
#: The policy's GPU: what the extender hands the device plugin today.
POLICY_CHOICE: DeviceChoice = "policy"
#: DRA's structured allocator: the first GPU in device order whose free share fits.
FIRST_FIT: DeviceChoice = "first-fit"
DEVICE_CHOICES: tuple[DeviceChoice, ...] = (POLICY_CHOICE, FIRST_FIT)

#: Device modes, by name: (who picks the GPU on the chosen node, which GPU the policy scores a
#: node for). ``first-fit-scored`` is DRA's: the allocator picks by first fit, and the policy
#: weighs each node for the GPU first fit gives there. The what-if's modes and the extender's
#: DRA mode (docs/dra.md) are these.
DEVICE_MODES: dict[str, tuple[DeviceChoice, DeviceChoice]] = {
    "policy": (POLICY_CHOICE, POLICY_CHOICE),
    "first-fit": (FIRST_FIT, POLICY_CHOICE),
    "first-fit-scored": (FIRST_FIT, FIRST_FIT),
}
#: The mode of pods that get their GPUs through DRA claims in the extender.
DRA_DEVICE_MODE = "first-fit-scored"


def tightest_gpu(free: IntArray, milli: int) -> IntArray:
    """Per row of ``free`` (rows x GPUs), the index of the tightest GPU with >= ``milli`` free,
    or ``NO_GPU`` where none fits."""
    masked = np.where(free >= milli, free, _NO_FIT)
    best = masked.argmin(axis=1)
    fits = masked[np.arange(free.shape[0]), best] != _NO_FIT
    return np.where(fits, best, NO_GPU).astype(np.int64)


def first_fit_gpu(free: IntArray, milli: int) -> IntArray:
    """Per row of ``free`` (rows x GPUs), the lowest index with >= ``milli`` free (DRA's
    allocator on a node whose slice lists GPUs by index), or ``NO_GPU`` where none fits.
    Absent GPU columns hold 0 free, so they never fit a share (``milli`` >= 1)."""
    fits = free >= milli
    first = fits.argmax(axis=1)
    return np.where(fits[np.arange(free.shape[0]), first], first, NO_GPU).astype(np.int64)


def lowest_free_gpus(free_row: IntArray, count: int) -> tuple[int, ...]:
    """The ``count`` lowest-index fully free GPUs of one node (fewer if it has fewer). Both
    device choices take whole GPUs this way: it is also DRA's first fit for k whole GPUs."""
    return tuple(int(g) for g in np.flatnonzero(free_row == MILLI_PER_GPU)[:count])


def gpus_for(state: ClusterState, pod: PodRequest, row: int, share_gpu: int,
             device_choice: DeviceChoice = POLICY_CHOICE) -> tuple[int, ...]:
    """The GPU indices a pod takes on ``row``; ``share_gpu`` is the policy's pick for shares,
    used when ``device_choice`` is the policy's (:data:`FIRST_FIT` ignores it)."""
    if not pod.wants_gpu:
        return ()
    resolved = pod.on_gpu_memory(int(state.gpu_memory_mib[row]))
    if resolved is None:
        return ()
    pod = resolved
    if pod.is_share:
        if device_choice == FIRST_FIT:
            return (int(first_fit_gpu(state.gpu_free[row : row + 1], pod.gpu_milli)[0]),)
        if share_gpu == NO_GPU:
            share_gpu = int(tightest_gpu(state.gpu_free[row : row + 1], pod.gpu_milli)[0])
        return (share_gpu,)
    return lowest_free_gpus(state.gpu_free[row], pod.num_gpu)
