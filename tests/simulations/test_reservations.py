"""The what-if's writer: a reservation holds each replacement's landing before its eviction,
so a pod the scheduler places in the window cannot take it; without one it can."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from defrag.controller.executor import Executor
from defrag.controller.metrics import CycleMetrics
from defrag.controller.planner import plan
from scheduler.policies import make_policy
from simulations.defrag_whatif import SilentLog, place_pending
from simulations.reservations import RESERVATION_NAMESPACE, WhatIfActions
from simulations.rightsizing import Rightsizing, synthetic_memory_trace
from tests.builders import workload
from tests.defrag.controller.builders import config, gpu_node, positions, share, snapshot

WORKLOAD = workload((1000, 1, 1000, 0.5), (1000, 1, 600, 0.5))


def one_cycle(reserve: bool) -> tuple[WhatIfActions, dict[str, tuple[str, tuple[int, ...]]],
                                      list[str]]:
    # a (600) alone on n0; n1 has 600 free; q (600) arrives while a is being moved.
    snap = snapshot([gpu_node("n0", gpus=1), gpu_node("n1", gpus=1)],
                    [(share("a", 600), "n0", (0,)), (share("b", 400), "n1", (0,))],
                    pending=[share("q", 600)])
    policy = make_policy("fgd", workload=WORKLOAD)
    cfg = config()
    the_plan = plan(snap, policy, WORKLOAD, cfg)
    assert [(m.pod, m.target) for m in the_plan.moves] == [("ns/a", "n1")]
    sizing = Rightsizing(synthetic_memory_trace(0, containers=1))
    actions = WhatIfActions(snap, policy, None,
                            partial(place_pending, snap, policy, None, sizing, 0.0),
                            reserve=reserve, log=SilentLog())
    assert actions.hold_all(the_plan)
    if reserve:
        held = [k for k in snap.state.pods if k.startswith(RESERVATION_NAMESPACE)]
        assert len(held) == 1 and snap.state.pods[held[0]].node == "n1"
    report = Executor(actions, cfg, CycleMetrics(dry_run=True), clock=lambda: 0.0,
                      log=SilentLog()).run(the_plan, snap, WORKLOAD)
    actions.release_all()
    assert not any(k.startswith(RESERVATION_NAMESPACE) for k in snap.state.pods)
    return actions, positions(snap), [r.outcome for r in report.results]


def test_the_reserved_spot_is_kept_for_the_replacement() -> None:
    actions, where, outcomes = one_cycle(reserve=True)
    assert outcomes == ["landed"]
    assert where["ns/a"][0] == "n1" and where["ns/q"][0] == "n0"
    assert actions.placed_in_window == 1 and actions.landed_elsewhere == 0


def test_without_a_reservation_the_pod_in_the_window_takes_the_spot() -> None:
    actions, where, outcomes = one_cycle(reserve=False)
    assert outcomes == ["landed elsewhere"]
    assert where["ns/q"][0] == "n1" and where["ns/a"][0] == "n0"
    assert actions.landed_elsewhere == 1


def test_a_plan_is_committed_only_when_every_reservation_fits() -> None:
    snap = snapshot([gpu_node("n0", gpus=1), gpu_node("n1", gpus=1)],
                    [(share("a", 600), "n0", (0,)), (share("b", 400), "n1", (0,))])
    policy = make_policy("fgd", workload=WORKLOAD)
    the_plan = plan(snap, policy, WORKLOAD, config())
    # Something took n1's room after the plan was made: the reservation cannot be held.
    snap.state.place(share("late", 300), "n1", (0,))
    before = positions(snap)
    sizing = Rightsizing(synthetic_memory_trace(0, containers=1))
    actions = WhatIfActions(snap, policy, None,
                            partial(place_pending, snap, policy, None, sizing, 0.0))
    assert not actions.hold_all(the_plan)
    assert positions(snap) == before and actions.held == {}


@pytest.mark.parametrize("reserve", [True, False])
def test_the_usage_model_stays_consistent_through_holds_and_releases(reserve: bool) -> None:
    actions, where, _ = one_cycle(reserve)
    usage, state = actions.snapshot.usage, actions.snapshot.state
    kept = usage.used_mib.copy()
    usage.recompute(state)  # from the pods alone
    np.testing.assert_allclose(kept, usage.used_mib)
    assert where["ns/b"] == ("n1", (0,))
