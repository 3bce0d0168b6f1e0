"""Cycles that converge: cooldown per owner, trigger hysteresis, the settled summary."""

from __future__ import annotations

import numpy as np
import pytest

from defrag.controller.config import DefragConfig
from defrag.controller.convergence import DefragState, convergence, parse_state
from defrag.controller.measure import measure
from defrag.controller.planner import RECEIVED_RECENTLY
from defrag.controller.trigger import find_triggers, idle_rows, next_streaks
from gpufrag.errors import BadInput
from tests.defrag.controller.builders import config, gpu_node, share, snapshot
from tests.defrag.controller.test_planner import WORKLOAD, run, three_nodes


def test_state_round_trips_and_drops_expired_cooldowns() -> None:
    state = DefragState(moved={"old": 100.0, "recent": 900.0}, latched=frozenset({"n1"}))
    assert state.cooling(1000.0, 500.0) == frozenset({"recent"})
    after = state.after_cycle(1000.0, 500.0, ["new", ""], ["n2"])
    assert after.moved == {"recent": 900.0, "new": 1000.0}
    assert after.latched == frozenset({"n2"})
    assert parse_state(after.encode()) == after
    assert parse_state(None) == DefragState()


@pytest.mark.parametrize(("text", "field"), [
    ("not json", None), ("[]", "(root)"), ('{"version": 2}', "version"),
    ('{"version": 1, "moved": {"o": "x"}}', "moved.o"),
    ('{"version": 1, "latched": [1]}', "latched")])
def test_bad_state_is_bad_input_naming_the_field(text: str, field: str | None) -> None:
    with pytest.raises(BadInput) as e:
        parse_state(text)
    if field is not None:
        assert field in str(e.value)


def test_hysteresis_keeps_a_latched_node_on_until_the_lower_threshold() -> None:
    snap = snapshot([gpu_node("n0"), gpu_node("n1")],
                    [(share("a", 500), "n0", (0,)), (share("b", 500), "n1", (0,))],
                    used_fraction=0.78)  # idle ratio 22%
    m = measure(snap.state, snap.usage, WORKLOAD)
    assert find_triggers(snap.state, m, [], 0.25).idle == frozenset()
    latched = find_triggers(snap.state, m, [], 0.25, latched=frozenset({1}), threshold_off=0.2)
    assert latched.idle == frozenset({1})
    off = find_triggers(snap.state, m, [], 0.25, latched=frozenset({1}), threshold_off=0.23)
    assert off.idle == frozenset()


def test_a_node_turns_on_and_off_only_after_its_cycles_in_a_row() -> None:
    ratio = np.array([0.30, 0.30, 0.10, 0.20])
    active = np.ones(4, np.bool_)

    def on(latched: set[int], streaks: dict[int, int]) -> frozenset[int]:
        return idle_rows(ratio, active, threshold=0.25, off=0.15, latched=frozenset(latched),
                         streaks=streaks, on_cycles=2, off_cycles=2)

    # Rows 0 and 1 are above 0.25: row 0 for the second cycle in a row, row 1 for its first.
    assert on(set(), {0: 1}) == frozenset({0})
    # Latched rows 2 (0.10, at or below 0.15) and 3 (0.20, between the thresholds): row 3
    # stays on; row 2 stays on for its first cycle below, and is off at its second.
    assert on({2, 3}, {}) == frozenset({2, 3})
    assert on({2, 3}, {2: 1}) == frozenset({3})
    # What the next cycle counts from.
    after = next_streaks(ratio, threshold=0.25, off=0.15, latched_before=frozenset({2, 3}),
                         latched_after=frozenset({0, 2, 3}), streaks={0: 1, 1: 0})
    # Row 0 changed (it starts again), row 1 counts towards on, row 2 towards off, row 3
    # (between the thresholds) towards nothing.
    assert after == {1: 1, 2: 1}


def test_nodes_still_counting_towards_on_are_not_settled() -> None:
    waiting = convergence(triggered_idle=0, triggered_blocking=0, triggered=0, nodes=10,
                          planned=0, evicted=0, cooling=0, waiting=3)
    assert not waiting.settled and "3 node(s) above the threshold" in waiting.why


def test_the_plan_counts_cycles_before_a_node_turns_on() -> None:
    config_2 = config(trigger_on_cycles=2, trigger_off_cycles=2)
    snap = three_nodes()
    assert run(snap, config_2).moves == ()  # the first cycle above: counting, no move
    snap.streaks = {name: 1 for name in snap.state.names if name}
    assert run(snap, config_2).moves  # the second in a row: on


def test_state_keeps_the_streaks_and_reads_an_older_state_without_them() -> None:
    state = DefragState(latched=frozenset({"n1"}), streaks={"n1": 1, "n2": 1})
    assert parse_state(state.encode()) == state
    assert parse_state('{"version": 1, "moved": {}, "latched": ["n1"]}').streaks == {}
    with pytest.raises(BadInput, match="streaks.n1"):
        parse_state('{"version": 1, "streaks": {"n1": -1}}')


def test_off_threshold_defaults_below_the_threshold_and_is_validated() -> None:
    assert DefragConfig().off_threshold == pytest.approx(0.15)  # DESIGN.md's 15%
    assert DefragConfig(threshold=0.02).off_threshold == 0.0
    with pytest.raises(BadInput, match="--trigger-on-cycles"):
        DefragConfig(trigger_on_cycles=0).validate()
    with pytest.raises(BadInput, match="--threshold-off"):
        DefragConfig(threshold=0.25, threshold_off=0.3).validate()
    with pytest.raises(BadInput, match="--cooldown-s"):
        DefragConfig(cooldown_s=-1).validate()


def test_an_owner_in_cooldown_is_not_moved() -> None:
    snap = three_nodes()
    moved = run(snap).moves
    assert moved
    snap.cooling = frozenset(m.owner_uid for m in moved)
    again = run(snap, config())
    assert not {m.owner_uid for m in again.moves} & snap.cooling
    assert again.skipped["owner moved within --cooldown-s"] >= len(moved)


def test_convergence_summary() -> None:
    done = convergence(triggered_idle=0, triggered_blocking=0, triggered=0, nodes=10,
                       planned=0, evicted=0, cooling=0)
    assert done.settled and "no node" in done.why and "10 of 10 off" in done.line()
    stuck = convergence(triggered_idle=3, triggered_blocking=0, triggered=3, nodes=10,
                        planned=0, evicted=0, cooling=2)
    assert stuck.settled and "2 owner(s) cooling down" in stuck.why
    busy = convergence(triggered_idle=3, triggered_blocking=1, triggered=4, nodes=10,
                       planned=2, evicted=2, cooling=0)
    assert not busy.settled and busy.as_dict()["evicted"] == 2


def test_the_state_remembers_each_nodes_last_move_for_the_node_cooldown() -> None:
    state = DefragState(sources={"old": 0.0}, targets={"old": 0.0})
    after = state.after_cycle(90_000.0, 3600.0, ["o"], [], node_cooldown_s=86_400.0,
                              moves=[("n0", "n1")])
    assert (after.sources, after.targets) == ({"n0": 90_000.0}, {"n1": 90_000.0})
    assert parse_state(after.encode()) == after
    assert after.recent_sources(90_000.0 + 86_399.0, 86_400.0) == frozenset({"n0"})
    assert after.recent_targets(90_000.0 + 86_400.0, 86_400.0) == frozenset()
    # No node cooldown: nothing is kept.
    none = state.after_cycle(90_000.0, 3600.0, [], [], node_cooldown_s=0.0,
                             moves=[("n0", "n1")])
    assert (none.sources, none.targets) == ({}, {})
    # An older state without the keys reads as no node cooling.
    assert parse_state('{"version": 1}').sources == {}
    with pytest.raises(BadInput, match="targets.n1"):
        parse_state('{"version": 1, "targets": {"n1": "soon"}}')
    with pytest.raises(BadInput, match=r"evictions\[0\]"):
        parse_state('{"version": 1, "evictions": [[1.0, -2]]}')


def test_a_node_that_received_a_pod_within_the_node_cooldown_is_no_source() -> None:
    snap = three_nodes()  # a (n0) would move to n1
    DefragState(targets={"n0": 1000.0}).carry_into(snap, 1000.0 + 3600.0, config())
    assert snap.received_recently == frozenset({"n0"})
    result = run(snap)
    assert all(m.source != "n0" for m in result.moves)
    assert result.skipped[RECEIVED_RECENTLY] == 1
    # Once the node cooldown is over, it gives again.
    DefragState(targets={"n0": 1000.0}).carry_into(snap, 1000.0 + 86_400.0, config())
    assert [m.source for m in run(snap).moves] == ["n0"]


def test_a_node_that_gave_a_pod_within_the_node_cooldown_is_no_target() -> None:
    snap = three_nodes()
    assert [m.target for m in run(snap).moves] == ["n1"]
    DefragState(sources={"n1": 1000.0}).carry_into(snap, 1000.0 + 60.0, config())
    assert all(m.target != "n1" for m in run(snap).moves)
    # --node-cooldown-s 0 switches the rule off.
    DefragState(sources={"n1": 1000.0}).carry_into(snap, 1000.0 + 60.0,
                                                   config(node_cooldown_s=0.0))
    assert [m.target for m in run(snap).moves] == ["n1"]


@pytest.mark.parametrize("value", [-1.0, 7 * 86_400.0 + 1])
def test_a_bad_node_cooldown_names_its_flag(value: float) -> None:
    with pytest.raises(BadInput, match="--node-cooldown-s"):
        DefragConfig(node_cooldown_s=value).validate()
