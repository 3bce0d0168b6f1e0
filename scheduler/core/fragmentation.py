"""GPU fragmentation as FGD defines it (Weng et al., USENIX ATC '23).

Fragmentation is measured against a *target workload*: the task specs that make up the typical
workload, with their popularities. For one spec m, the fragment of node n is all of n's free GPU
share if m cannot run on n (too little CPU, product not allowed, not enough GPUs with enough free
share, or m needs no GPU), and otherwise the free share on GPUs too small for m. A node's
fragmentation F(n) is the popularity-weighted sum over specs; the cluster's is the sum over nodes.

All functions work on many rows at once: FGD evaluates every (node, GPU) candidate for a pod, so
this is the innermost loop of the extender and the simulator.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from scheduler.core import fragkernel
from scheduler.core.state import BoolArray, ClusterState, IntArray
from scheduler.core.types import MILLI_PER_GPU, PodRequest

FloatArray = npt.NDArray[np.float64]

DEFAULT_COVERAGE = 0.95

SpecKey = tuple[int, int, int, frozenset[str]]  # (cpu_milli, num_gpu, gpu_milli, gpu_spec)


@dataclass(frozen=True)
class TargetWorkload:
    """Task specs with popularities summing to 1; built once, read on every score."""

    cpu_milli: IntArray
    num_gpu: IntArray
    gpu_milli: IntArray
    gpu_spec: tuple[frozenset[str], ...]
    popularity: FloatArray
    # Derived once: the distinct per-GPU thresholds and each spec's threshold column.
    _thresholds: IntArray = field(init=False, repr=False)
    _threshold_of: IntArray = field(init=False, repr=False)
    _needed_gpus: IntArray = field(init=False, repr=False)
    _constrained: bool = field(init=False, repr=False)
    # The kernel's spec arguments in its order, packed once (read on every call).
    _kernel_specs: tuple[IntArray, IntArray, IntArray, IntArray, IntArray, FloatArray] = field(
        init=False, repr=False, compare=False)
    _allowed_cache: dict[tuple[str, ...], BoolArray] = field(
        init=False, repr=False, default_factory=dict, compare=False
    )

    def __post_init__(self) -> None:
        m = len(self.gpu_spec)
        for name in ("cpu_milli", "num_gpu", "gpu_milli", "popularity"):
            if getattr(self, name).shape != (m,):
                raise ValueError(f"TargetWorkload.{name} must have {m} entries")
        if m == 0:
            raise ValueError("TargetWorkload needs at least one task spec")
        if np.any(self.popularity < 0) or not np.isclose(self.popularity.sum(), 1.0):
            raise ValueError("TargetWorkload.popularity must be >= 0 and sum to 1")
        thresholds, threshold_of = np.unique(self.gpu_milli, return_inverse=True)
        object.__setattr__(self, "_thresholds", thresholds.astype(np.int64))
        object.__setattr__(self, "_threshold_of", threshold_of.astype(np.int64))
        # CPU-only specs can never run "on the GPUs": make their GPU need unsatisfiable.
        needed = np.where(self.num_gpu > 0, self.num_gpu, np.iinfo(np.int64).max)
        object.__setattr__(self, "_needed_gpus", needed.astype(np.int64))
        object.__setattr__(self, "_constrained", any(self.gpu_spec))
        object.__setattr__(self, "_kernel_specs", (
            self._thresholds, self._threshold_of, self.cpu_milli, self.num_gpu, self.gpu_milli,
            self.popularity))

    @classmethod
    def from_specs(cls, counts: Iterable[tuple[SpecKey, float]]) -> TargetWorkload:
        items = list(counts)
        total = sum(w for _, w in items)
        if total <= 0:
            raise ValueError("TargetWorkload needs specs with positive weight")
        return cls(
            cpu_milli=np.array([k[0] for k, _ in items], np.int64),
            num_gpu=np.array([k[1] for k, _ in items], np.int64),
            gpu_milli=np.array([k[2] for k, _ in items], np.int64),
            gpu_spec=tuple(k[3] for k, _ in items),
            popularity=np.array([w / total for _, w in items], np.float64),
        )

    @classmethod
    def from_pods(cls, pods: Iterable[PodRequest],
                  coverage: float = DEFAULT_COVERAGE) -> TargetWorkload:
        """The most popular specs of ``pods`` that together cover >= ``coverage`` of them."""
        if not 0 < coverage <= 1:
            raise ValueError(f"coverage must be in (0, 1], got {coverage}")
        # A GPU-memory share is a different milli share on each GPU size; one that asks no
        # milli at all has no node-independent spec and is left out of the target.
        counts = Counter((p.cpu_milli, p.num_gpu, p.gpu_milli, p.gpu_spec) for p in pods
                         if not (p.gpu_memory_mib and not p.gpu_milli))
        total = sum(counts.values())
        if total == 0:
            raise ValueError("TargetWorkload.from_pods needs at least one pod")
        kept: list[tuple[SpecKey, float]] = []
        covered = 0
        # Deterministic order: by count, then by spec, so equal inputs give equal workloads.
        for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], _sort_key(kv[0]))):
            kept.append((key, float(n)))
            covered += n
            if covered >= coverage * total:
                break
        return cls.from_specs(kept)

    def allowed(self, state: ClusterState) -> BoolArray:
        """[spec, product code] -> whether the spec accepts that product."""
        key = tuple(state.products)
        mask = self._allowed_cache.get(key)
        if mask is None:
            mask = np.array(
                [[(not spec) or (p in spec) for p in state.products] for spec in self.gpu_spec],
                np.bool_,
            ).reshape(len(self.gpu_spec), len(state.products))
            self._allowed_cache[key] = mask
        return mask


def _sort_key(key: SpecKey) -> tuple[int, int, int, tuple[str, ...]]:
    return (key[0], key[1], key[2], tuple(sorted(key[3])))


def fragmentation_of(free: IntArray, cpu_left: IntArray, product: IntArray,
                     workload: TargetWorkload, allowed: BoolArray) -> FloatArray:
    """F for arbitrary rows: ``free`` is rows x GPUs (absent GPUs hold 0 free).

    The one definition every component uses; it is computed in the FGD authors' simulator's
    floating-point order (:func:`fragmentation_in_spec_order`), by the compiled kernel of
    :mod:`scheduler.core.fragkernel` when numba is installed (bit-equal, several times faster
    on the few rows a score call passes) and by the numpy form otherwise.
    """
    kernel = fragkernel.compiled()
    if kernel is None:
        return fragmentation_in_spec_order(free, cpu_left, product, workload, allowed)
    out = np.empty(free.shape[0], np.float64)
    kernel(np.ascontiguousarray(free, np.int64), np.ascontiguousarray(cpu_left, np.int64),
           np.ascontiguousarray(product, np.int64), *workload._kernel_specs, allowed,
           workload._constrained, out)
    return out


def fragmentation_after_share(free: IntArray, cpu_left: IntArray, product: IntArray,
                              workload: TargetWorkload, allowed: BoolArray, milli: int,
                              cpu_milli: int) -> tuple[FloatArray, FloatArray]:
    """F of each row as it is (k) and after a share of ``milli`` on each of its GPUs with
    ``cpu_milli`` of CPU (k x GPUs; every GPU, fitting or not: callers mask those that do not
    fit). FGD's candidates for a share, in one call of the C engine when it is in use."""
    k, width = free.shape
    fused = fragkernel.compiled_before_after()
    if fused is not None:
        out = np.empty((k, width + 1), np.float64)
        fused(np.ascontiguousarray(free, np.int64), np.ascontiguousarray(cpu_left, np.int64),
              np.ascontiguousarray(product, np.int64), *workload._kernel_specs, allowed,
              workload._constrained, milli, cpu_milli, -1, MILLI_PER_GPU, out)
        return out[:, 0], out[:, 1:]
    # Row 0 of each block: the node as it is; row 1 + g: GPU g loses the pod's share.
    cand = np.repeat(free[:, None, :], width + 1, axis=1)  # k x (1 + width) x width
    idx = np.arange(width)
    cand[:, idx + 1, idx] -= milli
    cpu = np.repeat(np.stack([cpu_left, cpu_left - cpu_milli], axis=1), [1, width], axis=1)
    frag = fragmentation_of(cand.reshape(k * (width + 1), width), cpu.reshape(-1),
                            np.repeat(product, width + 1), workload, allowed,
                            ).reshape(k, width + 1)
    return frag[:, 0], frag[:, 1:]


def fragmentation_after_whole(free: IntArray, cpu_left: IntArray, product: IntArray,
                              workload: TargetWorkload, allowed: BoolArray, num_gpu: int,
                              milli: int, cpu_milli: int) -> tuple[FloatArray, FloatArray]:
    """F of each row as it is and after a pod taking ``milli`` off each of ``num_gpu`` whole
    GPUs (the row's lowest-index fully free ones: whole GPUs are interchangeable for F; 0 for
    a pod without GPUs) and ``cpu_milli`` of CPU, in one call of the C engine when in use."""
    k = free.shape[0]
    fused = fragkernel.compiled_before_after()
    if fused is not None:
        out = np.empty((k, 2), np.float64)
        fused(np.ascontiguousarray(free, np.int64), np.ascontiguousarray(cpu_left, np.int64),
              np.ascontiguousarray(product, np.int64), *workload._kernel_specs, allowed,
              workload._constrained, milli, cpu_milli, num_gpu, MILLI_PER_GPU, out)
        return out[:, 0], out[:, 1]
    taken = free
    if num_gpu:
        is_full = free == MILLI_PER_GPU
        take = is_full & (np.cumsum(is_full, axis=1) <= num_gpu)
        taken = np.where(take, free - milli, free)
    frag = fragmentation_of(np.concatenate((free, taken)),
                            np.concatenate((cpu_left, cpu_left - cpu_milli)),
                            np.concatenate((product, product)), workload, allowed)
    return frag[:k], frag[k:]


def warm_up() -> None:
    """Compile the fragmentation kernel now, for the argument types every caller passes.

    Compiling takes 1-2 s of one core (more in a CPU-limited container), and numba compiles on
    the first call, whatever the input. Scoring the cluster once is not enough to get it done
    ahead of time: a state with no free GPU share yet (the device plugin has not registered
    the node's GPUs) is answered without the kernel, and the first filter after the GPUs
    appear then compiles it, past kube-scheduler's ``httpTimeout``. One synthetic row of the
    same dtypes and layouts (:func:`fragmentation_of` makes every array contiguous ``int64``)
    compiles exactly the signature later calls use, whatever the state holds."""
    workload = TargetWorkload.from_specs([((0, 1, 1000, frozenset()), 1.0)])
    fragmentation_of(np.zeros((1, 1), np.int64), np.zeros(1, np.int64),
                     np.zeros(1, np.int64), workload, np.ones((1, 1), np.bool_))


def fragmentation_in_spec_order(free: IntArray, cpu_left: IntArray, product: IntArray,
                                workload: TargetWorkload, allowed: BoolArray) -> FloatArray:
    """F for arbitrary rows in numpy, summed in the FGD authors' simulator's order.

    Spec by spec, in the workload's order, each node's free share is split into seven
    categories (lack both, lack GPU, satisfied, lack CPU, CPU-only satisfied, CPU-only lacking
    CPU, no access), ``p_m x milli`` is added to its category's running sum, and F is the sum
    of the categories but "satisfied", in that order. Another summation order differs by a few
    ulps, which flips a truncated score now and then (49 against 50), so gpufrag keeps this
    one everywhere: the KSS-compatible replay needs its bits, and one order means the compiled
    kernel and this form agree bit for bit. ``cumsum`` is a strictly sequential sum.
    """
    total = free.sum(axis=1)
    totalf = total.astype(np.float64)
    milli = workload.gpu_milli
    fits = free[:, None, :] >= milli[None, :, None]  # rows x M x GPUs
    fit_count = fits.sum(axis=2)
    frag_milli = total[:, None] - (fits * free[:, None, :]).sum(axis=2)  # free on GPUs too small
    cpu_ok = cpu_left[:, None] >= workload.cpu_milli[None, :]
    access = allowed[:, product].T if workload._constrained else np.ones_like(cpu_ok)
    cpu_only = (milli == 0)[None, :]
    host = fit_count >= workload.num_gpu[None, :]
    p = workload.popularity[None, :]
    whole = p * totalf[:, None]
    gpu = ~cpu_only & access

    def summed(mask: BoolArray, amount: FloatArray) -> FloatArray:
        out: FloatArray = np.where(mask, amount, 0.0).cumsum(axis=1)[:, -1]
        return out

    lack_both = summed(gpu & ~host & ~cpu_ok, whole)
    # A category's running sum takes the spec's amount whichever of the two shapes it has;
    # lack GPU gathers the unusable share of satisfied specs and all of it for unhostable ones.
    lack_gpu = summed(gpu & cpu_ok, np.where(host, p * frag_milli, whole))
    lack_cpu = summed(gpu & host & ~cpu_ok, whole)
    cpu_fits = summed(cpu_only & cpu_ok, whole)
    cpu_lacks = summed(cpu_only & ~cpu_ok, whole)
    no_access = summed(~cpu_only & ~access, whole)
    frag: FloatArray = lack_both + lack_gpu + lack_cpu + cpu_fits + cpu_lacks + no_access
    return frag


def node_fragmentation(state: ClusterState, workload: TargetWorkload,
                       rows: IntArray | None = None) -> FloatArray:
    """F(n) in milli-GPU for each row (all rows in use when ``rows`` is None)."""
    if rows is None:
        rows = np.arange(state.size, dtype=np.int64)
    frag = fragmentation_of(state.gpu_free[rows], state.cpu_left[rows], state.product[rows],
                            workload, workload.allowed(state))
    active: FloatArray = np.where(state.active[rows], frag, 0.0)
    return active


def cluster_fragmentation(state: ClusterState, workload: TargetWorkload) -> float:
    """Σ_n F(n) over active nodes, in milli-GPU."""
    return float(node_fragmentation(state, workload).sum())


def fragmentation_ratio(state: ClusterState, workload: TargetWorkload) -> float:
    """Cluster fragmentation over total free GPU share (0 when nothing is free)."""
    free = int(state.gpu_free_total(state.active_rows()).sum())
    return cluster_fragmentation(state, workload) / free if free else 0.0
