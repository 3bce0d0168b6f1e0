"""The reference experiment's workload: tune demand to a multiple of capacity, then shuffle.

As in the FGD paper: pods are appended by uniform resampling of the trace until total GPU demand
reaches ``tune`` x cluster GPU capacity (a trace that already asks for more is trimmed by
removing random pods until it no longer does), and arrival order is a seeded shuffle.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from scheduler.core.types import PodRequest


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
        total = int(demand.sum())
        gpu_pods = np.flatnonzero(demand > 0)
        extra = 0
        while total < target and gpu_pods.size:
            i = int(rng.integers(len(pods)))
            src = pods[i]
            chosen.append(dataclasses.replace(src, name=f"{src.name}-r{extra}"))
            total += src.gpu_demand_milli
            extra += 1
    return [chosen[i] for i in rng.permutation(len(chosen))]
