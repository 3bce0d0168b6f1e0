"""The waste loop over days (``gpufrag whatif --defrag --days N``) on tiny synthetic traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpufrag.cli import main
from scheduler.core.types import MILLI_PER_GPU, NodeSpec, PodRequest
from simulations.rightsizing import MemoryTrace, tiled
from simulations.timed import TimedPod
from simulations.waste_loop import (
    ARRIVE,
    AT_RECOMMENDATION,
    BASELINE,
    BOUND,
    DAY_S,
    DEPART,
    IDLE_HOLDERS,
    LOOP,
    RESTART,
    ArmResult,
    FlapWatch,
    LoopResult,
    LoopSettings,
    Sample,
    rollout_events,
    run_loop,
    table,
    targets,
)


def flat_trace(fraction: float) -> MemoryTrace:
    """One container using ``fraction`` of what its pod asks, all day."""
    t = np.arange(0.0, DAY_S, 600.0)
    return MemoryTrace((t,), (np.full(t.size, fraction),), source="flat")


def whole_gpu_pods(count: int) -> list[TimedPod]:
    return [TimedPod(PodRequest(f"p{i}", cpu_milli=1000, num_gpu=1, gpu_milli=MILLI_PER_GPU),
                     0.0, None) for i in range(count)]


@pytest.fixture(scope="module")
def flat() -> LoopResult:
    """8 long-lived whole-GPU pods using a fifth of their GPU, 3 days, rollouts daily."""
    nodes = [NodeSpec(f"n{i}", 64_000, 256_000, 4, "A10", 24 * 1024) for i in range(4)]
    return run_loop(nodes, whole_gpu_pods(8), flat_trace(0.2),
                    LoopSettings(days=3, rollout_days=1, seed=1))


def test_baseline_keeps_what_pods_ask_and_never_evicts(flat: LoopResult) -> None:
    base = flat.arms[BASELINE]
    assert base.evictions == 0 and base.oom_kills == 0
    assert all(s.given_back_gpus == 0 for s in base.samples)
    assert base.mean("idle_ratio", 3) == pytest.approx(0.8, abs=0.01)


def test_bound_holds_every_pod_at_its_recommendation_without_evicting(flat: LoopResult) -> None:
    bound = flat.arms[BOUND]
    assert bound.evictions == 0
    # After a day of hourly peaks every whole GPU is a share near the fifth it uses.
    last = bound.samples[-1]
    assert last.running_gpu_pods == 8
    assert last.given_back_gpus > 8 * 0.6
    assert bound.mean("idle_ratio", 3) < 0.3
    # Before the recommender has a day of history nothing changes.
    assert bound.samples[0].given_back_gpus == 0


def test_loop_right_sizes_at_restarts_between_baseline_and_bound(flat: LoopResult) -> None:
    loop, base, bound = flat.arms[LOOP], flat.arms[BASELINE], flat.arms[BOUND]
    assert loop.samples[-1].given_back_gpus > 0  # the daily rollouts were admitted smaller
    assert (bound.mean("idle_ratio", 3) - 1e-9 <= loop.mean("idle_ratio", 3)
            < base.mean("idle_ratio", 3))
    assert loop.over_share.over == 0  # flat use never exceeds a share set from it


def test_idle_holders_account_for_the_idle_memory_at_the_end(flat: LoopResult) -> None:
    """Each right-sizing arm's idle memory at the end, split by why it is still there, adds
    up to its idle ratio; the baseline right-sizes nothing and has no split."""
    assert flat.arms[BASELINE].idle_held_by == {}
    for name in (LOOP, BOUND):
        arm = flat.arms[name]
        assert set(arm.idle_held_by) == set(IDLE_HOLDERS)
        assert sum(arm.idle_held_by.values()) == pytest.approx(arm.samples[-1].idle_ratio,
                                                                abs=0.02)
    # The bound resizes every pod in place: what idle memory it keeps is headroom.
    bound = flat.arms[BOUND].idle_held_by
    assert bound[AT_RECOMMENDATION] == max(bound.values()) > 0


def test_targets_and_table_name_every_arm(flat: LoopResult) -> None:
    names = [t.name for t in targets(flat)]
    assert "idle ratio vs the bound" in names and "pods beyond their share > 1 cycle" in names
    assert "nodes defrag made flap" in names
    text = table(flat)
    for arm in (BASELINE, LOOP, BOUND):
        assert arm in text


def test_rollouts_restart_every_period_with_a_phase_for_running_pods() -> None:
    pods = [TimedPod(PodRequest("old", num_gpu=1, gpu_milli=500), 0.0, None),
            TimedPod(PodRequest("new", num_gpu=1, gpu_milli=500), 3600.0, 3 * DAY_S),
            TimedPod(PodRequest("short", num_gpu=1, gpu_milli=500), 100.0, 200.0)]
    events, started = rollout_events(pods, 5 * DAY_S, 2 * DAY_S, seed=0)
    assert [e[0] for e in events] == sorted(e[0] for e in events)
    old = [e for e in events if e[3] == "old" and e[1] == RESTART]
    assert 0 <= old[0][0] < 2 * DAY_S and started["old"] == old[0][0] - 2 * DAY_S
    assert [e[0] - old[0][0] for e in old] == [0.0, 2 * DAY_S, 4 * DAY_S][:len(old)]
    new = [(e[0], e[1]) for e in events if e[3] == "new"]
    assert new == [(3600.0, ARRIVE), (3600.0 + 2 * DAY_S, RESTART), (3 * DAY_S, DEPART)]
    assert [e[1] for e in events if e[3] == "short"] == [ARRIVE, DEPART]


def test_a_trigger_swinging_on_its_own_oscillates_but_is_not_defrag_flapping() -> None:
    watch = FlapWatch(recent_s=7200.0)
    for hour, on in ((1, {"a"}), (2, set()), (3, {"a"})):
        watch.triggers(hour * 3600.0, on)
    assert watch.oscillated == {"a"} and watch.flapped == set()


def test_a_landing_that_turns_a_trigger_on_again_within_a_day_is_flapping() -> None:
    watch = FlapWatch(recent_s=7200.0)
    watch.triggers(3600.0, {"a"})
    watch.triggers(7200.0, set())
    watch.moved(10800.0, "b", "a")  # lands on "a", which turns on at this cycle's end
    watch.triggers(10800.0, {"a"})
    assert watch.flapped == {"a"}
    late = FlapWatch(recent_s=7200.0)  # a landing long before the turn on is not its cause
    late.triggers(3600.0, {"a"})
    late.moved(7200.0, "b", "a")
    late.triggers(7200.0, set())
    late.triggers(20 * 3600.0, {"a"})
    assert late.oscillated == {"a"} and late.flapped == set()


@pytest.mark.parametrize(("ratio_without", "flaps"), [(0.10, True), (0.30, False)])
def test_a_landing_is_blamed_only_if_the_node_would_have_stayed_off_without_it(
        ratio_without: float, flaps: bool) -> None:
    # "a" went off, a pod landed on it, and it turns on again at the next cycle. Without the
    # landed pod it would read 10%: the landing turned it on (flapping). Without it, it would
    # read 30%: its own pods turned it on (it oscillated; the landing is not the cause).
    asked: list[tuple[str, frozenset[str]]] = []

    def without(node: str, pods: frozenset[str]) -> float:
        asked.append((node, pods))
        return ratio_without

    watch = FlapWatch(recent_s=7200.0, threshold=0.25)
    watch.triggers(3600.0, {"a"})
    watch.triggers(7200.0, set())
    watch.moved(7200.0, "b", "a", "ns/p")
    watch.triggers(10800.0, {"a"}, without)
    assert asked == [("a", frozenset({"ns/p"}))]
    assert watch.oscillated == {"a"} and watch.flapped == ({"a"} if flaps else set())


@pytest.mark.parametrize(("second_s", "flaps"), [(DAY_S - 3600.0, True), (DAY_S + 3600.0, False)])
def test_a_node_both_source_and_target_within_a_day_flaps(second_s: float, flaps: bool) -> None:
    watch = FlapWatch(recent_s=7200.0)
    watch.moved(0.0, "a", "b")
    watch.moved(second_s, "c", "a")  # pods taken off "a", then put back on it
    assert watch.flapped == ({"a"} if flaps else set())


def sample(free: int, pending_whole: int) -> Sample:
    return Sample(t_s=DAY_S, idle_ratio=0.0, trigger_on=0, free_whole_gpus=free,
                  pending_gpu_pods=1 if pending_whole else 0, pending_whole_gpus=pending_whole,
                  running_gpu_pods=10, evictions=0, budget_running=10, given_back_gpus=0.0)


def test_evictions_a_day_are_judged_as_the_controllers_daily_budget_counts_them() -> None:
    """Over the 24 hours up to each cycle, against the running GPU pods that cycle's budget
    read (defrag.controller.budget): not by calendar day, not by the day's mean."""
    def at(t_s: float, evicted: int, running: int) -> Sample:
        return Sample(t_s=t_s, idle_ratio=0.0, trigger_on=0, free_whole_gpus=0,
                      pending_gpu_pods=0, pending_whole_gpus=0, running_gpu_pods=running,
                      evictions=evicted, budget_running=running, given_back_gpus=0.0)

    arm = ArmResult(LOOP, 2, samples=[at(DAY_S - 3600.0, 1, 100), at(DAY_S, 0, 100),
                                      at(DAY_S + 3600.0, 1, 100)])
    assert arm.max_day_eviction_ratio() == pytest.approx(0.02)  # two within 24 hours


def test_spare_whole_gpus_compares_arms_at_equal_work() -> None:
    """An arm that leaves an 8-GPU pod pending has its 8 free GPUs spoken for."""
    spread = ArmResult("spread", 2, samples=[sample(free=10, pending_whole=8)])
    packed = ArmResult("packed", 2, samples=[sample(free=4, pending_whole=0)])
    assert spread.mean("free_whole_gpus", 1) > packed.mean("free_whole_gpus", 1)
    assert (spread.spare_whole_gpus(1), packed.spare_whole_gpus(1)) == (2.0, 4.0)


def test_tiled_repeats_each_container_back_to_back() -> None:
    trace = MemoryTrace((np.array([0.0, 60.0, 120.0]),), (np.array([0.1, 0.2, 0.3]),))
    long = tiled(trace, 500.0)
    assert long.at(0, 180.0) == pytest.approx(0.1)  # the second lap starts one step after
    assert long.at(0, 300.0) == pytest.approx(0.3)
    assert long.t_s[0][-1] >= 500.0 - 180.0


def test_cli_days_writes_three_arms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["whatif", "--defrag", "--days", "1", "--synthetic-nodes", "12",
                 "--load", "0.5", "--out", str(out), "--no-plots"])
    assert code == 0
    assert "the last day (mean)" in capsys.readouterr().out
    summary = json.loads((out / "waste_loop.json").read_text())
    assert set(summary["arms"]) == {BASELINE, LOOP, BOUND}
    assert len(summary["arms"][LOOP]["samples"]) == 24


def test_cli_days_refuses_a_bad_rollout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", "--defrag", "--days", "1", "--rollout-days", "0"]) == 2
    assert "--rollout-days" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value"), [("--evictions-per-day-pct", "101"),
                                             ("--node-cooldown-s", "-5")])
def test_cli_days_refuses_a_bad_budget_or_node_cooldown(
        flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", "--defrag", "--days", "1", flag, value]) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err
