"""Model-version affinity, as a table: which bonus each kind of node gets."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core import ClusterState, PodRequest
from scheduler.policies.affinity import AffinityParams, affinity_score, at_cap, replica_counts
from tests.builders import node, pod

NOW = 10_000.0
NAMES = ["same", "other", "warm", "cold", "none", "capped", "other+warm", "same+warm"]


def llama(name: str, version: str = "v2") -> PodRequest:
    return pod(name, namespace="ns", model="llama", model_version=version, gpu_milli=100)


@pytest.fixture
def state() -> ClusterState:
    s = ClusterState(node(n, gpu_count=4) for n in NAMES)

    def put(name: str, at: str, version: str = "v2") -> None:
        s.place(pod(name, namespace="ns", model="llama", model_version=version,
                    gpu_milli=100), at, (0,))

    put("a", "same")
    put("b", "other", "v1")
    put("c", "warm")
    s.remove_pod("ns/c", now=NOW - 600)  # left 10 minutes ago
    put("d", "cold")
    s.remove_pod("ns/d", now=NOW - 7200)  # left two hours ago
    put("e1", "capped")
    put("e2", "capped")
    put("f", "other+warm", "v1")
    put("g", "other+warm")
    s.remove_pod("ns/g", now=NOW - 60)
    put("h", "same+warm")
    put("i", "same+warm")
    s.remove_pod("ns/i", now=NOW - 60)
    # Other models never count.
    s.place(pod("z", namespace="ns", model="mistral", model_version="v2", gpu_milli=100),
            "none", (1,))
    return s


ROWS = np.arange(len(NAMES), dtype=np.int64)


@pytest.mark.parametrize(("params", "expected"), [
    (AffinityParams(),
     {"same": 1.0, "other": 0.5, "warm": 0.6, "cold": 0.0, "none": 0.0, "capped": 1.0,
      "other+warm": 0.6, "same+warm": 1.0}),
    (AffinityParams(max_replicas_per_node=2),
     {"same": 1.0, "other": 0.5, "warm": 0.6, "cold": 0.0, "none": 0.0, "capped": -1.0,
      "other+warm": 0.6, "same+warm": 1.0}),
    (AffinityParams(same_version=0.9, other_version=0.7, warm=0.2, warm_window_s=3 * 3600),
     {"same": 0.9, "other": 0.7, "warm": 0.2, "cold": 0.2, "none": 0.0, "capped": 0.9,
      "other+warm": 0.7, "same+warm": 0.9}),
    (AffinityParams(warm_window_s=0),
     {"same": 1.0, "other": 0.5, "warm": 0.0, "cold": 0.0, "none": 0.0, "capped": 1.0,
      "other+warm": 0.5, "same+warm": 1.0}),
    (AffinityParams(max_replicas_per_node=1),
     {"same": -1.0, "other": 0.5, "warm": 0.6, "cold": 0.0, "none": 0.0, "capped": -1.0,
      "other+warm": 0.6, "same+warm": -1.0}),
])
def test_bonus_per_kind_of_node(state: ClusterState, params: AffinityParams,
                                expected: dict[str, float]) -> None:
    got = affinity_score(state, llama("new"), ROWS, params, NOW)
    assert dict(zip(NAMES, got.tolist(), strict=True)) == pytest.approx(expected)


def test_pod_without_model_gets_nothing(state: ClusterState) -> None:
    assert not affinity_score(state, pod("plain"), ROWS, AffinityParams(), NOW).any()


def test_cap_and_counts(state: ClusterState) -> None:
    request = llama("new")
    assert replica_counts(state, ("llama", "v2"), ROWS).tolist() == [1, 0, 0, 0, 0, 2, 0, 1]
    capped = at_cap(state, request, ROWS, AffinityParams(max_replicas_per_node=2))
    assert [n for n, c in zip(NAMES, capped, strict=True) if c] == ["capped"]
    assert not at_cap(state, request, ROWS, AffinityParams()).any()


def test_rows_subset_and_order(state: ClusterState) -> None:
    rows = np.array([5, 0, 4], np.int64)
    got = affinity_score(state, llama("new"), rows, AffinityParams(), NOW)
    assert got.tolist() == [1.0, 1.0, 0.0]


@pytest.mark.parametrize(("params", "field"), [
    (AffinityParams(same_version=2.0), "same_version"),
    (AffinityParams(warm=-0.1), "warm"),
    (AffinityParams(warm_window_s=-1), "warm_window_s"),
    (AffinityParams(max_replicas_per_node=-1), "max_replicas_per_node"),
])
def test_problems_name_the_field(params: AffinityParams, field: str) -> None:
    assert [f for f, _ in params.problems()] == [field]
    assert AffinityParams().problems() == []
