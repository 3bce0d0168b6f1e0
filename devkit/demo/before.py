"""The "before" placement: what a spreading scheduler does with GPU pods (pure)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from devkit.demo.scenario import MILLI_PER_GPU, NodeShape
from gpufrag.errors import BadInput


@dataclass(frozen=True, slots=True)
class LegacyPod:
    """A pod to place the spreading way: ``whole`` GPUs, or a ``milli`` share of one GPU."""

    key: str
    whole: int = 0
    milli: int = 0
    products: tuple[str, ...] = ()


def spread_placement(nodes: Sequence[tuple[str, NodeShape]], pods: Sequence[LegacyPod],
                     rng: random.Random) -> dict[str, tuple[str, tuple[int, ...]]]:
    """key -> (node, GPUs): each pod on the feasible node with the largest free GPU fraction
    (kube-scheduler's LeastAllocated), a share on that node's emptiest GPU, whole GPUs on the
    lowest-index idle ones; ties by a seeded node order. Raises BadInput when a pod fits nowhere.

    This is the fragmenting baseline: every replica opens a fresh GPU while one is left.
    """
    free = {name: [MILLI_PER_GPU] * shape.gpus for name, shape in nodes}
    order = [name for name, _ in nodes]
    rank = {name: i for i, name in enumerate(rng.sample(order, len(order)))}
    placed: dict[str, tuple[str, tuple[int, ...]]] = {}
    for pod in pods:
        best: tuple[tuple[float, int], str, tuple[int, ...]] | None = None
        for name, shape in nodes:
            if pod.products and shape.product not in pod.products:
                continue
            gpus = _fit(free[name], pod)
            if gpus is None:
                continue
            key = (-sum(free[name]) / (MILLI_PER_GPU * shape.gpus), rank[name])
            if best is None or key < best[0]:
                best = (key, name, gpus)
        if best is None:
            raise BadInput(f"{pod.key} fits on no node; use more nodes (--nodes)", field="nodes")
        _, name, gpus = best
        for g in gpus:
            free[name][g] -= MILLI_PER_GPU if pod.whole else pod.milli
        placed[pod.key] = (name, gpus)
    return placed


def _fit(free: Sequence[int], pod: LegacyPod) -> tuple[int, ...] | None:
    if pod.whole:
        idle = [g for g, f in enumerate(free) if f == MILLI_PER_GPU]
        return tuple(idle[:pod.whole]) if len(idle) >= pod.whole else None
    fitting = [g for g, f in enumerate(free) if f >= pod.milli]
    if not fitting:
        return None
    return (max(fitting, key=lambda g: (free[g], -g)),)
