"""One replay: pods arrive one at a time, each is placed once by the policy or counted failed.

The replay calls the same ``choose`` the extender calls, on the same ``ClusterState``, so what
the simulator predicts is what the live scheduler decides. After every pod it records allocated
GPU share, cluster fragmentation and the fragmentation ratio against arrived demand.

``device_mode`` says who picks the GPU inside the chosen node (:data:`DEVICE_MODES`): the
policy (the device plugin path, the default), DRA's first fit under the policy's node choice,
or DRA's first fit with the policy scoring each node for the GPU first fit will give there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler.core.fragmentation import TargetWorkload, fragmentation_of, node_fragmentation
from scheduler.core.gpus import DEVICE_MODES
from scheduler.core.placement import ScoreCache, choose
from scheduler.core.state import ClusterState
from scheduler.core.types import NodeSpec, PodRequest
from scheduler.policies import make_policy

FloatArray = npt.NDArray[np.float64]



def run_label(policy_name: str, device_mode: str) -> str:
    """How a run is named in tables and CSVs: the policy, plus the device mode unless it is
    the policy's own (so a default run reads as it always has)."""
    return policy_name if device_mode == "policy" else f"{policy_name}/{device_mode}"


@dataclass(frozen=True)
class ReplayResult:
    """Per-pod series (index i = after pod i arrived), all in percent of GPU capacity except
    ``frag_ratio`` (percent of free GPU share)."""

    policy: str
    seed: int
    capacity_milli: int
    arrived_pct: FloatArray
    allocation_pct: FloatArray
    frag_amount_pct: FloatArray
    frag_ratio_pct: FloatArray
    placed: int
    failed: int
    failed_gpu_milli: int

    @property
    def pods(self) -> int:
        return self.placed + self.failed


def tie_order(node_count: int, seed: int) -> npt.NDArray[np.int64]:
    """The fixed order that breaks ties for one seed (the reference simulator sorts node names
    carrying a seeded random prefix; a seeded permutation is the same thing)."""
    rank: npt.NDArray[np.int64] = np.random.default_rng(seed).permutation(node_count)
    return rank.astype(np.int64)


def replay(nodes: list[NodeSpec], pods: list[PodRequest], policy_name: str, seed: int,
           target: TargetWorkload, state: ClusterState | None = None, *,
           tie_rank: npt.NDArray[np.int64] | None = None, kss_compat: bool = False,
           decisions: list[str] | None = None, device_mode: str = "policy") -> ReplayResult:
    """Place ``pods`` in order on ``nodes`` (or on a given, possibly pre-loaded ``state``).

    ``tie_rank`` replaces the seed's tie order (the KSS-compatible replay passes KSS's);
    ``kss_compat`` builds the policy with the reference simulator's rules; ``decisions``, when
    given, receives each pod's node name ("" when it failed), in order. ``device_mode`` is a
    key of :data:`DEVICE_MODES`."""
    if device_mode not in DEVICE_MODES:
        raise ValueError(f"unknown device mode {device_mode!r}; choose from "
                         f"{', '.join(DEVICE_MODES)}")
    device_choice, scored_on = DEVICE_MODES[device_mode]
    if state is None:
        state = ClusterState(nodes)
    state.set_tie_order(tie_order(state.size, seed) if tie_rank is None else tie_rank)
    policy = make_policy(policy_name, workload=target, seed=seed, kss_compat=kss_compat,
                         device_choice=scored_on)
    cache = ScoreCache(policy) if policy.node_local else None
    rows = state.active_rows()
    capacity = state.total_gpu_milli
    frag = node_fragmentation(state, target, rows)
    allowed = target.allowed(state)
    frag_total = float(frag.sum())
    free_total = int(state.gpu_free_total(rows).sum())
    n = len(pods)
    arrived = np.empty(n)
    allocation = np.empty(n)
    frag_amount = np.empty(n)
    frag_ratio = np.empty(n)
    arrived_milli = 0
    placed = failed = failed_milli = 0
    for i, pod in enumerate(pods):
        arrived_milli += pod.gpu_demand_milli
        decision = choose(state, policy, pod, None, cache,  # every active row: incremental
                          device_choice)
        if decisions is not None:
            decisions.append("" if decision is None else decision.node)
        if decision is None:
            failed += 1
            failed_milli += pod.gpu_demand_milli
        else:
            state.place(pod, decision.row, decision.gpus, check=False)
            free_total -= pod.gpu_demand_milli
            # F of the one changed row, read through slices (views, no gather): it is active.
            at = slice(decision.row, decision.row + 1)
            new = float(fragmentation_of(state.gpu_free[at], state.cpu_left[at],
                                         state.product[at], target, allowed)[0])
            frag_total += new - frag[decision.row]
            frag[decision.row] = new
            placed += 1
        arrived[i] = arrived_milli
        allocation[i] = capacity - free_total
        frag_amount[i] = frag_total
        frag_ratio[i] = frag_total / free_total if free_total else 0.0
    scale = 100.0 / capacity if capacity else 0.0
    return ReplayResult(
        policy=run_label(policy_name, device_mode), seed=seed, capacity_milli=capacity,
        arrived_pct=arrived * scale, allocation_pct=allocation * scale,
        frag_amount_pct=frag_amount * scale, frag_ratio_pct=frag_ratio * 100.0,
        placed=placed, failed=failed, failed_gpu_milli=failed_milli,
    )


def bucket_by_arrival(arrived_pct: FloatArray, metric: FloatArray, columns: int,
                      initial: float = 0.0) -> FloatArray:
    """Column k = mean of ``metric`` over pods whose arrival brought arrived demand to
    round(k %) of capacity (the FGD authors' analysis layout). Columns no pod landed in carry
    the previous column's value forward (nothing arrived, so nothing changed)."""
    keys = np.clip(np.rint(arrived_pct).astype(np.int64), 0, columns - 1)
    sums = np.bincount(keys, weights=metric, minlength=columns)
    counts = np.bincount(keys, minlength=columns)
    out = np.empty(columns)
    last = initial
    for k in range(columns):
        if counts[k]:
            last = sums[k] / counts[k]
        out[k] = last
    return out
