"""Eviction budgets: the daily budget (a rolling 24 hours of the controller's own evictions,
a share of the running GPU pods) and how the planner spends it."""

from __future__ import annotations

import dataclasses

import pytest

from defrag.controller.budget import (
    DAILY_REFUSAL,
    DAY_S,
    DailyBudget,
    EvictionBudget,
    evictions_within,
    running_gpu_pods,
    worst_day_ratio,
)
from defrag.controller.config import DefragConfig, Limits
from defrag.controller.convergence import DefragState
from gpufrag.errors import BadInput
from tests.defrag.controller.builders import config, gpu_node, share, snapshot
from tests.defrag.controller.test_planner import run, three_nodes


def test_running_gpu_pods_counts_running_gpu_pods_only() -> None:
    snap = three_nodes()  # a, b, c: three running GPU pods
    pods = dict(snap.pods)
    pods["ns/x"] = dataclasses.replace(pods["ns/a"], key="ns/x", running=False)
    pods["ns/y"] = dataclasses.replace(pods["ns/a"], key="ns/y", deleting=True)
    pods["ns/z"] = dataclasses.replace(pods["ns/a"], key="ns/z", request=share("z", 0, num_gpu=0))
    assert running_gpu_pods(pods.values()) == 3


def test_the_window_is_the_last_24_hours_up_to_now() -> None:
    log = ((0.0, 5), (DAY_S - 1, 2), (DAY_S, 3))
    assert evictions_within(log, DAY_S) == 5  # (0, 24 h]: the first cycle has left it
    assert evictions_within(log, DAY_S - 1) == 10  # a clock ahead: counted, to be safe
    assert evictions_within(log, 2 * DAY_S) == 0


def test_the_day_allows_the_share_of_running_gpu_pods_less_what_it_spent() -> None:
    budget = DailyBudget(pct=1.0, running=7_650, spent=70)
    assert (budget.allowed, budget.left) == (76, 6)
    assert DailyBudget(pct=1.0, running=99, spent=0).left == 0  # floor: never above the share
    assert DailyBudget(pct=1.0, running=7_650, spent=80).left == 0


def test_the_planner_stops_at_the_days_budget() -> None:
    # Three running GPU pods at 50%: one and a half a day; one spent already: none left.
    snap = three_nodes()
    assert run(snap, config(max_evictions_per_day_pct=50.0)).moves  # one allowed
    snap.evicted_last_day = 1
    result = run(snap, config(max_evictions_per_day_pct=50.0))
    assert result.moves == ()
    assert result.daily is not None and (result.daily.allowed, result.daily.left) == (1, 0)
    assert result.as_dict()["daily_budget"] == {"pct": 50.0, "running_gpu_pods": 3,
                                                "allowed": 1, "spent": 1, "left": 0}
    # No daily budget: the per-cycle limits only.
    assert run(snap, config()).moves and run(snap, config()).daily is None


def test_the_day_caps_one_cycle_too() -> None:
    budget = EvictionBudget(Limits(per_node=10, per_namespace=10, total=10), (),
                            DailyBudget(pct=1.0, running=200, spent=0))
    assert budget.cap == 2
    for _ in range(2):
        assert budget.refusal("n0", "ns", ()) is None
        budget.take("n0", "ns", ())
    assert budget.exhausted and budget.refusal("n1", "ns", ()) == DAILY_REFUSAL


def test_the_state_carries_the_days_evictions_between_runs() -> None:
    state = DefragState().after_cycle(1000.0, 3600.0, ["o1", "o2"], [],
                                      moves=[("n0", "n1"), ("n2", "n1")])
    later = state.after_cycle(1000.0 + DAY_S / 2, 3600.0, [], [], moves=[("n3", "n4")])
    assert later.evictions == ((1000.0, 2), (1000.0 + DAY_S / 2, 1))
    snap = three_nodes()
    later.carry_into(snap, 1000.0 + DAY_S - 1, config())
    assert snap.evicted_last_day == 3
    later.carry_into(snap, 1000.0 + DAY_S, config())
    assert snap.evicted_last_day == 1  # the first cycle's two left the window
    # A day after the last eviction nothing is kept.
    assert later.after_cycle(1000.0 + 2 * DAY_S, 3600.0, [], []).evictions == ()


def test_the_target_is_judged_on_the_budgets_own_figure() -> None:
    # (time, evictions that cycle, running GPU pods it read), an hour apart.
    cycles = [(3600.0 * i, 1, 100) for i in range(1, 25)]
    assert worst_day_ratio(cycles) == pytest.approx(0.24)
    # A rolling window: 2 late on day one and 2 early on day two are 4 within 24 hours.
    assert worst_day_ratio([(80_000.0, 2, 100), (90_000.0, 2, 100)]) == pytest.approx(0.04)
    assert worst_day_ratio([(1.0, 2, 100), (DAY_S + 1, 2, 100)]) == pytest.approx(0.02)
    assert worst_day_ratio([]) == 0.0
    # Judged where the controller evicts: pods leaving afterwards (100 -> 50 running) do not
    # turn a window that was within budget when its evictions were made into one over it.
    assert worst_day_ratio([(1.0, 1, 100), (3600.0, 0, 50)]) == pytest.approx(0.01)
    assert worst_day_ratio([(1.0, 1, 100), (3600.0, 1, 50)]) == pytest.approx(0.04)


@pytest.mark.parametrize("pct", [-1.0, 100.5])
def test_a_bad_daily_share_names_its_flag(pct: float) -> None:
    with pytest.raises(BadInput, match="--max-evictions-per-day-pct"):
        DefragConfig(max_evictions_per_day_pct=pct).validate()


def test_a_planned_cycle_never_exceeds_the_day_whatever_the_cycles_limit() -> None:
    nodes = [gpu_node(f"n{i}") for i in range(6)]
    placed = [(share(f"p{i}", 300), f"n{i}", (0,)) for i in range(6)]
    snap = snapshot(nodes, placed)
    result = run(snap, config(total=10, max_evictions_per_day_pct=50.0))
    assert 0 < len(result.moves) <= 3
