"""The what-if's writer: the executor reserves each replacement's landing before its eviction
(its own ``_reserve_all``, all or nothing); the writer holds what the extender would hold, so a
pod the scheduler places in the window cannot take it; without reservations it can."""

from __future__ import annotations

import math

import numpy as np
import pytest

from defrag.controller.executor import CycleReport, Executor, reservation_for
from defrag.controller.metrics import CycleMetrics
from defrag.controller.model import Snapshot
from defrag.controller.planner import Plan, plan
from scheduler.kube.reservations import PLACEMENT_NAMESPACE, ReservationBook
from scheduler.policies import make_policy
from simulations.defrag_whatif import SilentLog, place_pending
from simulations.reservations import WhatIfActions
from simulations.rightsizing import Rightsizing, synthetic_memory_trace
from tests.builders import workload
from tests.defrag.controller.builders import config, gpu_node, positions, share, snapshot

WORKLOAD = workload((1000, 1, 1000, 0.5), (1000, 1, 600, 0.5))
POLICY = make_policy("fgd", workload=WORKLOAD)
Held = dict[str, tuple[str, tuple[int, ...]]]


def held(snap: Snapshot) -> Held:
    return {k: (p.node, p.gpus) for k, p in snap.state.pods.items()
            if k.startswith(f"{PLACEMENT_NAMESPACE}/")}


def writer(snap: Snapshot, reserving: bool = True) -> tuple[WhatIfActions, list[Held]]:
    """The what-if's writer; the second value records what was held each time the scheduler
    retried the pending pods (the window between an eviction and its bind)."""
    sizing = Rightsizing(synthetic_memory_trace(0, containers=1))
    in_window: list[Held] = []

    def retry() -> int:
        in_window.append(held(snap))
        return place_pending(snap, POLICY, None, sizing, 0.0)

    return WhatIfActions(snap, POLICY, None, retry, reserving=reserving,
                         log=SilentLog()), in_window


def run(actions: WhatIfActions, the_plan: Plan) -> CycleReport:
    return Executor(actions, config(), CycleMetrics(dry_run=True), clock=lambda: 0.0,
                    log=SilentLog()).run(the_plan, actions.snapshot, WORKLOAD)


def one_cycle(reserving: bool) -> tuple[WhatIfActions, Held, list[str], list[Held]]:
    # a (600) alone on n0; n1 has 600 free; q (600) arrives while a is being moved.
    snap = snapshot([gpu_node("n0", gpus=1), gpu_node("n1", gpus=1)],
                    [(share("a", 600), "n0", (0,)), (share("b", 400), "n1", (0,))],
                    pending=[share("q", 600)])
    the_plan = plan(snap, POLICY, WORKLOAD, config())
    assert [(m.pod, m.target) for m in the_plan.moves] == [("ns/a", "n1")]
    actions, in_window = writer(snap, reserving)
    report = run(actions, the_plan)
    assert report.committed and report.error is None
    assert held(snap) == {} and actions.held == {}  # every reservation released
    return actions, positions(snap), [r.outcome for r in report.results], in_window


def test_the_reserved_spot_is_kept_for_the_replacement() -> None:
    actions, where, outcomes, in_window = one_cycle(reserving=True)
    # While q was being placed, a's replacement capacity was held on n1 (a's reservation).
    assert [list(h.values()) for h in in_window] == [[("n1", (0,))]]
    assert actions.reserved == 1
    assert outcomes == ["landed"]
    assert where["ns/a"][0] == "n1" and where["ns/q"][0] == "n0"
    assert actions.placed_in_window == 1 and actions.landed_elsewhere == 0


def test_without_a_reservation_the_pod_in_the_window_takes_the_spot() -> None:
    actions, where, outcomes, in_window = one_cycle(reserving=False)
    assert in_window == [{}] and actions.reserved == 0
    assert outcomes == ["landed elsewhere"]
    assert where["ns/q"][0] == "n1" and where["ns/a"][0] == "n0"
    assert actions.landed_elsewhere == 1


def two_moves() -> tuple[Snapshot, Plan]:
    # a and c (600 each) alone on n0 and n2; n1 and n3 each have 600 free.
    snap = snapshot([gpu_node(n, gpus=1) for n in ("n0", "n1", "n2", "n3")],
                    [(share("a", 600), "n0", (0,)), (share("b", 400), "n1", (0,)),
                     (share("c", 600), "n2", (0,)), (share("d", 400), "n3", (0,))])
    the_plan = plan(snap, POLICY, WORKLOAD, config())
    assert len(the_plan.moves) == 2
    return snap, the_plan


def test_a_plan_is_committed_only_when_every_reservation_fits() -> None:
    snap, the_plan = two_moves()
    # Something took the second target's room after the plan was made: its reservation
    # cannot be held, the first one is let go again and nothing is evicted.
    last = the_plan.moves[-1]
    snap.state.place(share("late", 300), last.target, last.target_gpus)
    before = positions(snap)
    actions, in_window = writer(snap)
    report = run(actions, the_plan)
    assert not report.committed
    assert report.results == [] and report.evicted == 0 and in_window == []
    assert report.error is not None and "nothing was evicted" in report.error
    assert f"GPU 0 on {last.target} cannot hold 600 milli" in report.error
    assert actions.reserved == 1 and actions.held == {} and held(snap) == {}
    assert positions(snap) == before


def test_every_reservation_fits_and_every_replacement_lands_in_its_own() -> None:
    snap, the_plan = two_moves()
    actions, in_window = writer(snap)
    report = run(actions, the_plan)
    assert report.committed and [r.outcome for r in report.results] == ["landed", "landed"]
    # Both were held before the first eviction; the first move's was used at its bind.
    assert [sorted(h.values()) for h in in_window] == [
        sorted((m.target, m.target_gpus) for m in the_plan.moves),
        [(the_plan.moves[1].target, the_plan.moves[1].target_gpus)]]
    assert actions.reserved == 2 and held(snap) == {}


def test_the_what_if_holds_exactly_what_the_extender_holds() -> None:
    """The GPU share only (kube-scheduler keeps CPU and memory for nobody): the same
    placement the extender's ReservationBook puts in its ClusterState."""
    snap, the_plan = two_moves()
    twin, _ = two_moves()
    actions, _ = writer(snap)
    book = ReservationBook(twin.state, {}, clock=lambda: 0.0)
    for move in the_plan.moves:
        reservation = reservation_for(move, frozenset(), math.inf)
        actions.reserve(reservation)
        book.upsert(reservation)
        assert snap.state.pods[reservation.key] == twin.state.pods[reservation.key]
    assert held(snap) == held(twin) and len(held(snap)) == 2
    for name in ("gpu_free", "cpu_left", "mem_left"):
        np.testing.assert_array_equal(getattr(snap.state, name), getattr(twin.state, name))


@pytest.mark.parametrize("reserving", [True, False])
def test_the_usage_model_stays_consistent_through_holds_and_releases(reserving: bool) -> None:
    actions, where, _, _ = one_cycle(reserving)
    usage, state = actions.snapshot.usage, actions.snapshot.state
    kept = usage.used_mib.copy()
    usage.recompute(state)  # from the pods alone
    np.testing.assert_allclose(kept, usage.used_mib)
    assert where["ns/b"] == ("n1", (0,))
