"""The reference experiment's workload: tune demand to a multiple of capacity, then shuffle.

As in the FGD paper: pods are appended by uniform resampling of the trace until total GPU demand
reaches ``tune`` x cluster GPU capacity (a trace that already asks for more is trimmed by
removing random pods until it no longer does), and arrival order is a seeded shuffle.

A resampled pod is named ``<name>-r<k>``, made unique against the trace's own names (a trace may
hold both ``a`` and ``a-r0``): the cluster state keys placements by name, so a clash would read
as the same pod placed twice. A trace whose GPU pods ask for very little could need millions of
resamples to reach its target; ``expected_arrivals`` lets the caller refuse that up front as bad
input, and ``tune_workload`` stops at twice ``MAX_ARRIVALS`` rather than fill memory.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from scheduler.core.types import PodRequest

# 1,000,000 arrivals: ~100x the reference experiment (8,152 openb pods tuned to 1.3x capacity).
MAX_ARRIVALS = 1_000_000


def expected_arrivals(pods: list[PodRequest], capacity_milli: int, tune: float) -> int:
    """About how many pods ``tune_workload`` returns: the trace, plus resamples of the trace's
    mean GPU demand until ``tune`` x capacity (at most the trace when it already asks for more)."""
    demand = sum(p.gpu_demand_milli for p in pods)
    target = tune * capacity_milli
    if demand == 0 or demand >= target:
        return len(pods)
    return len(pods) + math.ceil((target - demand) * len(pods) / demand)


def tune_workload(pods: list[PodRequest], capacity_milli: int, tune: float,
                  seed: int) -> list[PodRequest]:
    """Pods in arrival order with total GPU demand ~ ``tune`` x ``capacity_milli``."""
    if tune <= 0:
        raise ValueError(f"tune must be > 0, got {tune}")
    if not pods:
        return []
    rng = np.random.default_rng(seed)
    target = tune * capacity_milli
    demand = np.array([p.gpu_demand_milli for p in pods], np.int64)
    if demand.sum() > target:
        # Remove random pods until demand no longer exceeds the target.
        order = rng.permutation(len(pods))
        keep = np.ones(len(pods), np.bool_)
        total = int(demand.sum())
        for i in order:
            if total <= target:
                break
            if demand[i]:
                keep[i] = False
                total -= int(demand[i])
        chosen = [p for p, k in zip(pods, keep, strict=True) if k]
    else:
        chosen = list(pods)
        taken = {p.name for p in pods}
        total = int(demand.sum())
        gpu_pods = np.flatnonzero(demand > 0)
        extra = 0
        while total < target and gpu_pods.size:
            if len(chosen) >= 2 * MAX_ARRIVALS:
                raise ValueError(f"more than {2 * MAX_ARRIVALS} arrivals needed to reach tune "
                                 f"{tune}; check expected_arrivals first")
            i = int(rng.integers(len(pods)))
            src = pods[i]
            chosen.append(copy_named(src, f"r{extra}", taken))
            total += src.gpu_demand_milli
            extra += 1
    return [chosen[i] for i in rng.permutation(len(chosen))]


def copy_named(pod: PodRequest, suffix: str, taken: set[str]) -> PodRequest:
    """A copy of ``pod`` named ``<name>-<suffix>``, or ``<name>-<suffix>.<n>`` with the least
    n that is not in ``taken`` (a trace may already hold that name); the name is added to
    ``taken``. The replays key pods by name, so a copy must never collide with one."""
    name = f"{pod.name}-{suffix}"
    clash = 0
    while name in taken:
        clash += 1
        name = f"{pod.name}-{suffix}.{clash}"
    taken.add(name)
    return dataclasses.replace(pod, name=name)
