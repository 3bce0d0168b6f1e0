"""Replay accounting, workload tuning and the arrival buckets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import TargetWorkload
from simulations.replay import bucket_by_arrival, replay, tie_order
from simulations.synthetic import synthetic_nodes, synthetic_pods
from simulations.workload import tune_workload
from tests.builders import node, pod


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["random", "bestfit", "fgd", "gpu-packing"]))
def test_accounting_balances(seed: int, policy: str) -> None:
    nodes = synthetic_nodes(12, seed)
    pods = tune_workload(synthetic_pods(60, seed), sum(n.gpu_count for n in nodes) * 1000, 1.3,
                         seed)
    result = replay(nodes, pods, policy, seed, TargetWorkload.from_pods(pods))
    assert result.placed + result.failed == len(pods)
    placed_demand = sum(p.gpu_demand_milli for p in pods) - result.failed_gpu_milli
    assert result.allocation_pct[-1] == pytest.approx(100 * placed_demand / result.capacity_milli)
    assert np.all(np.diff(result.arrived_pct) >= 0)
    assert np.all(np.diff(result.allocation_pct) >= 0)
    assert (result.frag_ratio_pct >= 0).all() and (result.frag_ratio_pct <= 100 + 1e-9).all()


def test_tune_tops_up_and_trims() -> None:
    pods = [pod(f"p{i}") for i in range(10)]  # 10 GPUs of demand
    grown = tune_workload(pods, capacity_milli=20_000, tune=1.3, seed=1)
    assert sum(p.gpu_demand_milli for p in grown) == 26_000
    assert len({p.name for p in grown}) == len(grown)
    trimmed = tune_workload(pods, capacity_milli=5_000, tune=1.3, seed=1)
    assert sum(p.gpu_demand_milli for p in trimmed) == 6_000
    assert tune_workload(pods, 20_000, 1.3, 1) == grown  # seeded
    with pytest.raises(ValueError, match="tune must be > 0"):
        tune_workload(pods, 1, 0, 1)


def test_pod_that_fits_nowhere_is_counted_failed() -> None:
    result = replay([node("a", gpu_count=1)], [pod("big", num_gpu=4, gpu_milli=1000), pod("ok")],
                    "fgd", 1, TargetWorkload.from_pods([pod()]))
    assert (result.placed, result.failed, result.failed_gpu_milli) == (1, 1, 4000)


def test_buckets_average_and_carry_forward() -> None:
    arrived = np.array([0.4, 0.6, 1.4, 3.0])  # rounds to 0, 1, 1, 3
    metric = np.array([10.0, 20.0, 40.0, 50.0])
    assert bucket_by_arrival(arrived, metric, 5).tolist() == [10, 30, 30, 50, 50]


def test_tie_order_is_a_seeded_permutation() -> None:
    assert sorted(tie_order(5, 3).tolist()) == [0, 1, 2, 3, 4]
    assert tie_order(5, 3).tolist() == tie_order(5, 3).tolist()


def test_device_modes_are_named_in_the_result_and_checked() -> None:
    # Every mode places all four (one node, room for all); a run is labelled by its mode
    # unless the policy picks the GPU, so a default run reads as it always has.
    nodes = [node("a", gpu_count=4)]
    pods = [pod("w", num_gpu=1, gpu_milli=1000), pod("s1", gpu_milli=300),
            pod("s2", gpu_milli=300), pod("s3", gpu_milli=500)]
    target = TargetWorkload.from_pods([pod(gpu_milli=500)])
    runs = {mode: replay(nodes, pods, "fgd", 1, target, device_mode=mode)
            for mode in ("policy", "first-fit", "first-fit-scored")}
    assert {m: r.policy for m, r in runs.items()} == {
        "policy": "fgd", "first-fit": "fgd/first-fit",
        "first-fit-scored": "fgd/first-fit-scored"}
    assert all(r.placed == 4 for r in runs.values())
    with pytest.raises(ValueError, match="unknown device mode"):
        replay(nodes, pods, "fgd", 1, target, device_mode="best-fit")



def test_first_fit_strands_what_fgd_would_not() -> None:
    # Typical task: 500 milli. A 500 share goes on GPU 0 (either way). A 200 share: FGD puts it
    # on idle GPU 1 (800 left, still fits a typical task: F stays 0); first fit puts it on GPU 0
    # (300 left, stranded: F = 300 of the node's 2,000 milli).
    nodes = [node("a", gpu_count=2)]
    pods = [pod("a", gpu_milli=500), pod("b", gpu_milli=200)]
    target = TargetWorkload.from_pods([pod(gpu_milli=500)])
    own = replay(nodes, pods, "fgd", 1, target)
    dra = replay(nodes, pods, "fgd", 1, target, device_mode="first-fit")
    assert own.frag_amount_pct[-1] == 0.0
    assert dra.frag_amount_pct[-1] == pytest.approx(15.0)
