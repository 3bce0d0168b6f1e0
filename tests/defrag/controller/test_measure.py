"""Idle memory and fragmentation per node, and the usage table that carries used memory."""

from __future__ import annotations

import math

import numpy as np
import pytest

from defrag.controller.measure import UsageTable, measure, node_idle_ratio
from defrag.controller.trigger import blocking_rows, find_triggers
from scheduler.core import ClusterState
from tests.builders import workload
from tests.defrag.controller.builders import gpu_node, share, snapshot

WORKLOAD = workload((1000, 1, 1000, 1.0))


def test_idle_ratio_per_node_and_cluster() -> None:
    # n0: GPU0 holds 500 milli of 16 GiB = 8 GiB, used 2 GiB -> 6 idle; GPU1 holds 1000 =
    # 16 GiB, used 16 GiB -> 0. Ratio 6/24. n1: nothing allocated -> no ratio.
    state = ClusterState([gpu_node("n0"), gpu_node("n1")])
    state.place(share("a", 500), "n0", (0,))
    state.place(share("b", 1000), "n0", (1,))
    usage = UsageTable.from_readings(state, {(0, 0): 2048.0, (0, 1): 16_384.0, (1, 0): 500.0},
                                     {})
    m = measure(state, usage, WORKLOAD)
    assert m.idle_ratio[0] == pytest.approx(6 / 24)
    assert math.isnan(m.idle_ratio[1])
    assert m.summary.idle_gib == pytest.approx(6.0)
    assert m.summary.idle_ratio == pytest.approx(6 / 24)
    assert m.summary.free_whole_gpus == 2 and m.summary.free_gpu_nodes == 1
    assert m.summary.nodes_with_usage == 2
    # Whole-GPU spec: n0's 500 free milli are a fragment; n1 is all usable.
    assert m.frag_milli.tolist() == [500.0, 0.0]


def test_a_node_idle_ratio_with_a_pod_added_or_taken_away() -> None:
    # n0 as above: 6 of 24 GiB idle. Taking a away (8 GiB held, 2 GiB used) leaves b alone:
    # 0 idle. Adding 8 GiB held and 8 used on GPU0 keeps 6 GiB idle of 32.
    state = ClusterState([gpu_node("n0")])
    state.place(share("a", 500), "n0", (0,))
    state.place(share("b", 1000), "n0", (1,))
    usage = UsageTable.from_readings(state, {(0, 0): 2048.0, (0, 1): 16_384.0},
                                     {"ns/a": 2048.0, "ns/b": 16_384.0})
    assert node_idle_ratio(state, usage, 0) == pytest.approx(
        float(measure(state, usage, WORKLOAD).idle_ratio[0]))
    assert node_idle_ratio(state, usage, 0, {0: (-8192.0, -2048.0)}) == pytest.approx(0.0)
    assert node_idle_ratio(state, usage, 0, {0: (8192.0, 8192.0)}) == pytest.approx(6 / 32)
    assert node_idle_ratio(state, usage, 0, {0: (-8192.0, -2048.0),
                                             1: (-16_384.0, -16_384.0)}) == 0.0


def test_a_replacement_lands_with_its_window_restarted() -> None:
    """An evicted pod's replacement is a new pod: on its target its peak is what it uses now
    (the planner's landing check reads it so), not the old pod's peak over the window; a
    plain move keeps the peak."""
    state = ClusterState([gpu_node("n0"), gpu_node("n1")])
    placed = state.place(share("a", 1000), "n0", (0,))
    for fresh, peak in ((False, 12_288.0), (True, 4096.0)):
        usage = UsageTable.from_readings(state, {(0, 0): 4096.0}, {"ns/a": 4096.0},
                                         {"ns/a": 12_288.0})
        usage.move(placed, 0, 1, (1,), fresh=fresh)
        assert (usage.peak_mib[0, 0], usage.peak_mib[1, 1]) == (0.0, peak)
        assert usage.used_mib[1, 1] == 4096.0


def test_idle_memory_is_what_was_not_touched_over_the_window() -> None:
    # One pod holding a whole 16 GiB GPU, using 4 GiB now and 12 GiB at its peak over the
    # window: 4 GiB idle (never touched), 8 GiB burst headroom (used, just not now).
    state = ClusterState([gpu_node("n0")])
    state.place(share("a", 1000), "n0", (0,))
    usage = UsageTable.from_readings(state, {(0, 0): 4096.0, (0, 1): 0.0}, {"ns/a": 4096.0},
                                     {"ns/a": 12_288.0})
    m = measure(state, usage, WORKLOAD)
    assert m.idle_ratio[0] == pytest.approx(4 / 16)
    assert m.summary.idle_gib == pytest.approx(4.0)
    assert m.summary.burst_headroom_gib == pytest.approx(8.0)
    # Without a peak the current figure is the peak: the instant figure, all of it idle.
    instant = UsageTable.from_readings(state, {(0, 0): 4096.0, (0, 1): 0.0}, {"ns/a": 4096.0})
    assert measure(state, instant, WORKLOAD).summary.idle_gib == pytest.approx(12.0)
    # A peak below the current figure (an old reading) never makes idle memory of current use.
    low = UsageTable.from_readings(state, {(0, 0): 4096.0, (0, 1): 0.0}, {"ns/a": 4096.0},
                                   {"ns/a": 1024.0})
    assert usage.pod_peak(state.pods["ns/a"], 0) == 12_288.0
    assert low.pod_peak(state.pods["ns/a"], 0) == 4096.0


def test_a_moved_pod_takes_its_peak_along() -> None:
    state = ClusterState([gpu_node("n0"), gpu_node("n1")])
    state.place(share("a", 500), "n0", (0,))
    usage = UsageTable.from_readings(state, {(0, 0): 1024.0, (1, 0): 0.0}, {"ns/a": 1024.0},
                                     {"ns/a": 6144.0})
    old = state.pods["ns/a"]
    usage.move(old, 0, 1, (0,))
    state.remove_pod("ns/a")
    state.place(old.pod, "n1", (0,))
    assert usage.peak_mib[0, 0] == 0.0 and usage.peak_mib[1, 0] == 6144.0
    usage.move(state.pods["ns/a"], 1, 1, ())
    usage.forget("ns/a")
    assert usage.peak_mib[1, 0] == 0.0 and "ns/a" not in usage.pod_peak_mib


def test_gpus_without_a_reading_do_not_count() -> None:
    state = ClusterState([gpu_node("n0")])
    state.place(share("a", 500), "n0", (0,))
    state.place(share("b", 500), "n0", (1,))
    usage = UsageTable.from_readings(state, {(0, 0): 0.0}, {})  # GPU1 unread
    m = measure(state, usage, WORKLOAD)
    assert m.idle_ratio[0] == pytest.approx(1.0) and m.allocated_mib[0] == 8192


def test_unexplained_memory_is_split_by_share_and_travels_with_pods() -> None:
    state = ClusterState([gpu_node("n0"), gpu_node("n1")])
    state.place(share("a", 600), "n0", (0,))
    state.place(share("b", 200), "n0", (0,))
    state.place(share("c", 300), "n0", (1,))
    usage = UsageTable.from_readings(
        state, {(0, 0): 8000.0, (0, 1): 3000.0, (1, 0): 100.0, (1, 1): 0.0},
        {"ns/c": 1000.0})
    # GPU0: a and b share 8000 as 3:1; GPU1: c says 1000, the other 2000 is not a pod's.
    assert usage.pod_used_mib == {"ns/a": 6000.0, "ns/b": 2000.0, "ns/c": 1000.0}
    assert usage.other_mib[0, 1] == 2000.0 and usage.other_mib[1, 0] == 100.0
    old = state.pods["ns/a"]
    usage.move(old, 0, 1, (1,))
    state.remove_pod("ns/a")
    state.place(old.pod, "n1", (1,))
    assert usage.used_mib[0, 0] == 2000.0 and usage.used_mib[1, 1] == 6000.0


def test_pod_without_a_figure_uses_what_it_reserves() -> None:
    state = ClusterState([gpu_node("n0")])
    placement = state.place(share("a", 250), "n0", (0,))
    usage = UsageTable(state)
    usage.add(placement, 0, None)
    assert usage.used_mib[0, 0] == pytest.approx(4096.0)


def test_idle_trigger_uses_the_threshold() -> None:
    snap = snapshot([gpu_node("n0"), gpu_node("n1")],
                    [(share("a", 500), "n0", (0,)), (share("b", 500), "n1", (0,))],
                    used_fraction=0.7)
    m = measure(snap.state, snap.usage, WORKLOAD)
    assert find_triggers(snap.state, m, [], 0.25).idle == frozenset({0, 1})
    assert find_triggers(snap.state, m, [], 0.35).rows == frozenset()


def test_blocking_trigger_needs_a_pending_pod_that_fits_nowhere() -> None:
    # n0 has 400 + 700 free: a 1-GPU pod fits nowhere now, but would after consolidating.
    snap = snapshot([gpu_node("n0"), gpu_node("n1", gpus=1)],
                    [(share("a", 600), "n0", (0,)), (share("b", 300), "n0", (1,)),
                     (share("c", 100), "n1", (0,))],
                    used_fraction=1.0, pending=[share("p", 1000), share("q", 200)])
    m = measure(snap.state, snap.usage, WORKLOAD)
    found = find_triggers(snap.state, m, snap.pending, 0.25)
    assert found.idle == frozenset()
    assert {r: [p.key for p in pods] for r, pods in found.blocking.items()} == {0: ["ns/p"]}
    assert [p.key for p in found.unplaceable] == ["ns/p"]  # q (200) fits now: not blocked
    assert found.reason(0, m) == "blocks 1 pending pod"
    assert blocking_rows(snap.state, snap.pending[0]) == [0]
    assert np.isnan(m.idle_ratio).sum() == 0
