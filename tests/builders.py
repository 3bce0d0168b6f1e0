"""Builders for nodes, pods, workloads and states with keyword overrides (descheduler's
BuildTestNode pattern): tests state only what matters to them."""

from __future__ import annotations

from typing import Any

import numpy as np

from scheduler.core import ClusterState, NodeSpec, PodRequest, TargetWorkload


def node(name: str = "n0", **overrides: Any) -> NodeSpec:
    fields: dict[str, Any] = dict(name=name, cpu_milli=64_000, memory_mib=262_144, gpu_count=2,
                                  gpu_product="T4")
    fields.update(overrides)
    return NodeSpec(**fields)


def pod(name: str = "p0", **overrides: Any) -> PodRequest:
    fields: dict[str, Any] = dict(name=name, cpu_milli=1_000, memory_mib=1_024, num_gpu=1,
                                  gpu_milli=1_000)
    fields.update(overrides)
    return PodRequest(**fields)


def workload(*specs: tuple[int, int, int, float],
             gpu_spec: tuple[frozenset[str], ...] | None = None) -> TargetWorkload:
    """specs: (cpu_milli, num_gpu, gpu_milli, popularity)."""
    return TargetWorkload(
        cpu_milli=np.array([s[0] for s in specs], np.int64),
        num_gpu=np.array([s[1] for s in specs], np.int64),
        gpu_milli=np.array([s[2] for s in specs], np.int64),
        gpu_spec=gpu_spec or tuple(frozenset() for _ in specs),
        popularity=np.array([s[3] for s in specs], np.float64),
    )


def state_with_free(*free_per_node: list[int], cpu_milli: int = 64_000,
                    product: str = "T4") -> ClusterState:
    """Nodes n0, n1, ... whose GPUs have the given free milli (via placed share pods)."""
    state = ClusterState(node(f"n{i}", gpu_count=len(free), cpu_milli=cpu_milli,
                              gpu_product=product) for i, free in enumerate(free_per_node))
    for i, free in enumerate(free_per_node):
        for g, f in enumerate(free):
            if f < 1000:
                state.place(pod(f"fill-{i}-{g}", cpu_milli=0, memory_mib=0,
                                gpu_milli=1000 - f), i, (g,))
    return state
