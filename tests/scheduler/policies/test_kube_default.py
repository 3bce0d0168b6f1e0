"""kube-default: kube-scheduler's LeastAllocated + BalancedAllocation scores, checked by hand."""

from __future__ import annotations

import pytest

from scheduler.core import ClusterState, choose
from scheduler.policies import POLICY_NAMES, make_policy
from scheduler.policies.kube_default import KubeDefaultPolicy
from tests.builders import node, pod, state_with_free


def test_scores_of_an_idle_node_by_hand() -> None:
    state = ClusterState([node("n0")])  # 64,000 milli-CPU, 262,144 MiB
    scores = KubeDefaultPolicy().score(state, pod(cpu_milli=1_000, memory_mib=1_024),
                                       state.active_rows())
    # LeastAllocated: cpu 63,000 * 100 // 64,000 = 98, memory 261,120 * 100 // 262,144 = 99,
    # averaged: 197 // 2 = 98. Balanced: |1/64 - 1/256| / 2 = 0.00586 -> trunc(99.41) = 99.
    assert scores.score.tolist() == [197.0]


def test_a_pod_asking_nothing_is_scored_with_the_defaults_and_no_balance() -> None:
    state = ClusterState([node("n0", cpu_milli=1_000, memory_mib=1_000)])
    scores = KubeDefaultPolicy().score(state, pod(cpu_milli=0, memory_mib=0),
                                       state.active_rows())
    # cpu: 900 * 100 // 1000 = 90, memory: 800 * 100 // 1000 = 80 -> 85; balanced 0.
    assert scores.score.tolist() == [85.0]


def test_it_spreads_by_cpu_and_memory_and_does_not_see_gpus() -> None:
    # n0 holds a CPU-heavy pod; n1 and n2 hold only GPU shares (no CPU): they tie, whatever
    # their GPUs hold, and beat n0.
    state = state_with_free([1000, 1000], [200, 1000], [1000, 300])
    state.place(pod("busy", cpu_milli=32_000, num_gpu=0, gpu_milli=0), 0, ())
    policy = KubeDefaultPolicy()
    scores = policy.score(state, pod(), state.active_rows()).score.tolist()
    assert scores[1] == scores[2] > scores[0]
    decision = choose(state, policy, pod())
    assert decision is not None and decision.node == "n1"  # the tie goes to the node order


def test_it_is_a_named_baseline_outside_the_papers_six() -> None:
    assert "kube-default" not in POLICY_NAMES
    assert isinstance(make_policy("kube-default"), KubeDefaultPolicy)
    with pytest.raises(ValueError, match="kube-default"):
        make_policy("kube-defaults")
