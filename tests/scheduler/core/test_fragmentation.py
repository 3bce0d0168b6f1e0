"""Fragmentation pinned on clusters small enough to check on paper."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core import (
    TargetWorkload,
    cluster_fragmentation,
    fragmentation_ratio,
    node_fragmentation,
)
from tests.builders import node, pod, state_with_free, workload

# A: one GPU with 500 free and 1000 CPU (p .5); B: a whole GPU (p .25); C: CPU-only (p .25).
ABC = workload((1000, 1, 500, 0.5), (0, 1, 1000, 0.25), (1000, 0, 0, 0.25))


def test_runnable_specs_count_only_gpus_too_small_for_them() -> None:
    state = state_with_free([1000, 300])
    # A runs (GPU0): 300 stranded; B runs (GPU0): 300; C needs no GPU: all 1300.
    assert node_fragmentation(state, ABC)[0] == pytest.approx(0.5 * 300 + 0.25 * 300 + 0.25 * 1300)


def test_spec_that_cannot_run_counts_all_free_share() -> None:
    state = state_with_free([1000, 300], cpu_milli=64_000)
    state.place(pod("cpu-hog", cpu_milli=63_500, num_gpu=0, gpu_milli=0), 0, ())
    # 500 CPU left < A's 1000: A cannot run, so all 1300 free is A's fragment.
    assert node_fragmentation(state, ABC)[0] == pytest.approx(0.5 * 1300 + 0.25 * 300 + 0.25 * 1300)


def test_not_enough_fitting_gpus_counts_all_free_share() -> None:
    two_gpu = workload((0, 2, 1000, 1.0))
    assert node_fragmentation(state_with_free([1000, 600]), two_gpu)[0] == pytest.approx(1600)
    assert node_fragmentation(state_with_free([1000, 1000]), two_gpu)[0] == pytest.approx(0)


def test_product_constraint() -> None:
    only_v100 = workload((0, 1, 500, 1.0), gpu_spec=(frozenset({"V100M16"}),))
    assert node_fragmentation(state_with_free([1000, 300]), only_v100)[0] == pytest.approx(1300)
    v100 = state_with_free([1000, 300], product="V100M16")
    assert node_fragmentation(v100, only_v100)[0] == pytest.approx(300)


def test_cluster_sum_and_ratio() -> None:
    state = state_with_free([1000, 300], [200])
    w = workload((0, 1, 500, 1.0))
    assert cluster_fragmentation(state, w) == pytest.approx(300 + 200)
    assert fragmentation_ratio(state, w) == pytest.approx(500 / 1500)


def test_ratio_of_a_full_cluster_is_zero() -> None:
    state = state_with_free([0])
    assert fragmentation_ratio(state, workload((0, 1, 500, 1.0))) == 0.0


def test_removed_node_counts_nothing() -> None:
    state = state_with_free([300], [300])
    state.remove_node("n1")
    assert list(node_fragmentation(state, workload((0, 1, 500, 1.0)))) == [300, 0]


def test_target_workload_from_pods_keeps_most_popular_specs() -> None:
    pods = [pod(f"a{i}", gpu_milli=500) for i in range(90)] + [pod(f"b{i}") for i in range(10)]
    assert TargetWorkload.from_pods(pods, coverage=0.9).gpu_spec == (frozenset(),)
    both = TargetWorkload.from_pods(pods, coverage=0.95)
    assert list(both.gpu_milli) == [500, 1000]
    assert list(both.popularity) == pytest.approx([0.9, 0.1])


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("popularity", np.array([0.5]), "sum to 1"), ("cpu_milli", np.array([1, 2]), "1 entries")],
)
def test_target_workload_validates(field: str, value: np.ndarray, message: str) -> None:
    fields = dict(cpu_milli=np.array([0]), num_gpu=np.array([1]), gpu_milli=np.array([500]),
                  gpu_spec=(frozenset(),), popularity=np.array([1.0]))
    fields[field] = value
    with pytest.raises(ValueError, match=message):
        TargetWorkload(**fields)  # type: ignore[arg-type]


def test_fragmentation_of_fresh_state_without_pods() -> None:
    state = state_with_free([1000, 1000])
    assert node_fragmentation(state, workload((0, 1, 500, 1.0)))[0] == 0
    assert node(gpu_count=0).gpu_count == 0
