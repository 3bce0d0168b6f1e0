"""ClusterState bookkeeping: place, remove, nodes coming and going."""

from __future__ import annotations

import pytest

from scheduler.core import ClusterState
from scheduler.core.state import PlacementError
from tests.builders import node, pod


def test_place_and_remove_restore_the_row() -> None:
    state = ClusterState([node("a", gpu_count=2)])
    before = (state.cpu_left[0], state.mem_left[0], state.gpu_free[0].tolist())
    state.place(pod("s", gpu_milli=300, model="m", model_version="v1"), 0, (1,))
    assert state.gpu_free[0].tolist() == [1000, 700]
    assert state.gpu_max_free[0] == 1000 and state.gpu_full_count[0] == 1
    assert state.replicas[("m", "v1")][0] == 1
    state.remove_pod("s", now=123.0)
    assert (state.cpu_left[0], state.mem_left[0], state.gpu_free[0].tolist()) == before
    assert state.model_last_seen[("m", "v1")] == {0: 123.0}
    assert ("m", "v1") in state.replicas and not state.replicas[("m", "v1")]


@pytest.mark.parametrize(
    ("gpus", "request_", "message"),
    [((0,), dict(gpu_milli=300, cpu_milli=99_999), "exceeds CPU"),
     ((5,), dict(gpu_milli=300), "GPU 5"),
     ((0, 0), dict(num_gpu=2), "duplicate"),
     ((0,), dict(num_gpu=2), "needs 2 GPUs")],
)
def test_place_rejects_over_commit(gpus: tuple[int, ...], request_: dict[str, int],
                                   message: str) -> None:
    state = ClusterState([node("a", gpu_count=2, cpu_milli=8_000)])
    with pytest.raises(PlacementError, match=message):
        state.place(pod("x", **request_), 0, gpus)


def test_growth_keeps_rows_and_widens_gpus() -> None:
    state = ClusterState([node("a", gpu_count=1)])
    state.place(pod("p"), 0, (0,))
    for i in range(40):
        state.add_node(node(f"n{i}", gpu_count=8))
    assert state.gpu_width == 8 and state.size == 41
    assert state.gpu_free[0].tolist() == [0] + [0] * 7
    assert state.gpu_free[1].tolist() == [1000] * 8
    assert state.allocated_gpu_milli == 1000


def test_node_update_keeps_pods_and_readd_reuses_row() -> None:
    state = ClusterState([node("a", cpu_milli=8_000)])
    state.place(pod("p", cpu_milli=2_000), 0, (0,))
    state.add_node(node("a", cpu_milli=16_000))
    assert state.cpu_left[0] == 14_000
    dropped = state.remove_node("a")
    assert [p.pod.name for p in dropped] == ["p"] and not state.pods
    assert state.add_node(node("a")) == 0 and state.active[0]


def test_tie_rank_defaults_to_name_order_and_can_be_fixed() -> None:
    import numpy as np

    state = ClusterState([node("b"), node("a"), node("c")])
    assert state.tie_rank.tolist() == [1, 0, 2]
    state.set_tie_order(np.array([2, 1, 0]))
    assert state.tie_rank.tolist() == [2, 1, 0]
    with pytest.raises(ValueError, match="3 nodes"):
        state.set_tie_order(np.array([0]))
