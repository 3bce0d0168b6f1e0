"""Feasibility: the mask and the reasons agree, and reasons name the numbers."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core import ClusterState, explain, feasible_mask
from tests.builders import node, pod, state_with_free


@pytest.mark.parametrize(
    ("request_", "fits", "reason", "unresolvable"),
    [
        (dict(num_gpu=1, gpu_milli=300), True, "", False),
        (dict(num_gpu=1, gpu_milli=470), False,
         "needs 1 GPUs with >= 470 milli free, has 0", False),
        (dict(num_gpu=2, gpu_milli=1000), False, "needs 2 free GPUs, has 0", False),
        (dict(num_gpu=3, gpu_milli=1000), False, "needs 3 GPUs, node has 2", True),
        (dict(gpu_spec=frozenset({"V100M16", "V100M32"})), False,
         "GPU product T4 not in V100M16|V100M32", True),
        (dict(cpu_milli=70_000), False, "needs 70000 milli CPU, node has 64000 in all", True),
        (dict(cpu_milli=64_000, num_gpu=0, gpu_milli=0), False,
         "needs 64000 milli CPU, 63000 left", False),
        (dict(memory_mib=300_000), False, "needs 300000 MiB memory, node has 262144 in all", True),
    ],
)
def test_explain(request_: dict[str, object], fits: bool, reason: str, unresolvable: bool) -> None:
    state = state_with_free([400, 300])
    state.place(pod("cpu", cpu_milli=1_000, memory_mib=0, num_gpu=0, gpu_milli=0), 0, ())
    p = pod("x", **request_)
    verdict = explain(state, p, 0)
    assert (verdict.fits, verdict.reason, verdict.unresolvable) == (fits, reason, unresolvable)
    assert bool(feasible_mask(state, p, np.array([0]))[0]) == fits


def test_mask_matches_explain_on_many_nodes() -> None:
    state = ClusterState([node("a", gpu_count=1), node("b", gpu_count=4, gpu_product="V100M32"),
                          node("c", gpu_count=0)])
    p = pod(num_gpu=2, gpu_spec=frozenset({"V100M32"}))
    rows = state.active_rows()
    assert list(feasible_mask(state, p, rows)) == [explain(state, p, int(r)).fits for r in rows]
    assert list(feasible_mask(state, p, rows)) == [False, True, False]


def test_removed_node_never_fits() -> None:
    state = ClusterState([node("a")])
    state.remove_node("a")
    assert not feasible_mask(state, pod(), np.array([0]))[0]
    assert explain(state, pod(), 0).reason == "node a is not in the cluster state"
