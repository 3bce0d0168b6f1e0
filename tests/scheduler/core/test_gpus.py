"""The device choice: the policy's GPU, or DRA's first fit (the allocator's device order)."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core import choose
from scheduler.core.gpus import (
    FIRST_FIT,
    NO_GPU,
    POLICY_CHOICE,
    first_fit_gpu,
    gpus_for,
    tightest_gpu,
)
from scheduler.policies.fgd import FgdPolicy
from tests.builders import node, pod, state_with_free, workload

HALF_GPU = workload((0, 1, 500, 1.0))


@pytest.mark.parametrize(("free", "milli", "first", "tightest"), [
    ([1000, 300, 600], 300, 0, 1),     # the first that fits, not the tightest
    ([200, 1000, 600], 500, 1, 2),     # skips a GPU too full for the share
    ([200, 100, 0], 500, NO_GPU, NO_GPU),  # none fits
    ([400, 400, 1000], 400, 0, 0),     # exact fits: the first
])
def test_first_fit_takes_the_lowest_index_that_fits(free: list[int], milli: int, first: int,
                                                    tightest: int) -> None:
    rows = np.array([free], np.int64)
    assert first_fit_gpu(rows, milli).tolist() == [first]
    assert tightest_gpu(rows, milli).tolist() == [tightest]


def test_first_fit_never_takes_a_gpu_the_node_does_not_have() -> None:
    # A 2-GPU node in a state 4 GPUs wide: columns 2 and 3 hold 0 free.
    state = state_with_free([300, 200], [1000, 1000, 1000, 1000])
    assert first_fit_gpu(state.gpu_free[:2], 500).tolist() == [NO_GPU, 0]


def test_gpus_for_a_share_under_each_choice() -> None:
    state = state_with_free([1000, 300, 600])
    share = pod(gpu_milli=300)
    # The policy's pick is honoured (the device plugin path), absent one the tightest fit.
    assert gpus_for(state, share, 0, 2, POLICY_CHOICE) == (2,)
    assert gpus_for(state, share, 0, NO_GPU, POLICY_CHOICE) == (1,)
    # DRA's first fit ignores the policy's pick.
    assert gpus_for(state, share, 0, 2, FIRST_FIT) == (0,)


def test_whole_gpus_are_the_first_free_ones_under_both_choices() -> None:
    state = state_with_free([300, 1000, 1000, 1000])
    for choice in (POLICY_CHOICE, FIRST_FIT):
        assert gpus_for(state, pod(num_gpu=2), 0, NO_GPU, choice) == (1, 2)


def test_a_memory_share_is_first_fit_as_the_milli_it_is_on_the_node() -> None:
    # 8 GiB of a 16 GiB GPU is 500 milli: GPU 0 (400 free) is skipped, GPU 1 taken.
    state = state_with_free([400, 1000, 600])
    state.add_node(node("n0", gpu_count=3, gpu_memory_mib=16_384))
    share = pod(gpu_milli=0, gpu_memory_mib=8_192)
    assert gpus_for(state, share, 0, NO_GPU, FIRST_FIT) == (1,)
    assert gpus_for(state, share, 0, NO_GPU, POLICY_CHOICE) == (2,)


def test_choose_keeps_the_node_and_lets_first_fit_pick_the_gpu() -> None:
    # FGD puts a 300 share on n0's 300 leftover (GPU 1); first fit there takes GPU 0.
    state = state_with_free([1000, 300], [1000, 1000])
    fgd = FgdPolicy(HALF_GPU)
    own = choose(state, fgd, pod(gpu_milli=300))
    dra = choose(state, fgd, pod(gpu_milli=300), device_choice=FIRST_FIT)
    assert own is not None and (own.node, own.gpus) == ("n0", (1,))
    assert dra is not None and (dra.node, dra.gpus) == ("n0", (0,))


def test_fgd_scored_for_first_fit_weighs_the_gpu_the_allocator_will_give() -> None:
    # n0's 300 leftover is GPU 1, behind an idle GPU 0: first fit takes GPU 0 and the leftover
    # stays stranded (dF 0). n1's leftover is GPU 0: first fit uses it up (dF -300). FGD's own
    # pick sees the two alike; scored for first fit, it prefers n1.
    state = state_with_free([1000, 300], [300, 1000])
    rows = state.active_rows()
    own = FgdPolicy(HALF_GPU)
    aware = FgdPolicy(HALF_GPU, device_choice=FIRST_FIT)
    delta_own, gpu_own = own.delta(state, pod(gpu_milli=300), rows)
    delta_aware, gpu_aware = aware.delta(state, pod(gpu_milli=300), rows)
    assert gpu_own.tolist() == [1, 0] and delta_own.tolist() == [-300.0, -300.0]
    assert gpu_aware.tolist() == [0, 0] and delta_aware.tolist() == [0.0, -300.0]
    decision = choose(state, aware, pod(gpu_milli=300), device_choice=FIRST_FIT)
    assert decision is not None and (decision.node, decision.gpus) == ("n1", (0,))


def test_fgd_scored_for_first_fit_in_the_reference_rules_too() -> None:
    state = state_with_free([1000, 300], [300, 1000])
    rows = state.active_rows()
    kss = FgdPolicy(HALF_GPU, kss_compat=True, device_choice=FIRST_FIT)
    scores = kss.score(state, pod(gpu_milli=300), rows)
    assert scores.share_gpu.tolist() == [0, 0]
    assert scores.score[1] > scores.score[0]
