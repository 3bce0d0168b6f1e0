"""The event-driven replay: the static replay as a special case, the scheduling queue, defrag,
serving, and what a run reports."""

from __future__ import annotations

import numpy as np
import pytest

from gpufrag.errors import BadInput
from scheduler.core import ClusterState, TargetWorkload
from simulations.events import EventConfig, EventReplay, backoff_s, knob_value, run_events
from simulations.genai import synthetic_serving_trace
from simulations.openb import load_nodes, load_pods
from simulations.replay import replay
from simulations.synthetic import synthetic_nodes, synthetic_pods
from simulations.timed import TimedPod, static_order, synthetic_timed
from simulations.workload import tune_workload
from tests.builders import node, pod
from tests.data import trace

QUIET = dict(departures=False, defrag_interval_min=0.0, serving=False)


def _assert_same_as_static(nodes: list, pods: list, policy: str, seed: int,
                           device_mode: str = "policy") -> None:
    target = TargetWorkload.from_pods(pods)
    arrivals = tune_workload(pods, sum(n.gpu_count for n in nodes) * 1000, 1.3, seed)
    static_state = ClusterState(nodes)
    static = replay(nodes, arrivals, policy, seed, target, state=static_state,
                    device_mode=device_mode)
    config = EventConfig(policy=policy, seed=seed, hours=len(arrivals) / 3600 + 1, **QUIET)
    timeline = run_events(nodes, static_order(arrivals), config, target=target,
                          record_arrivals=True, device_mode=device_mode)
    events = timeline.as_replay_result()
    for series in ("arrived_pct", "allocation_pct", "frag_amount_pct", "frag_ratio_pct"):
        assert np.array_equal(getattr(events, series), getattr(static, series)), series
    assert (events.placed, events.failed, events.failed_gpu_milli, events.capacity_milli) == (
        static.placed, static.failed, static.failed_gpu_milli, static.capacity_milli)
    assert timeline.placements == {k: (p.node, p.gpus) for k, p in static_state.pods.items()}


@pytest.mark.parametrize("policy", ["random", "dotprod", "gpu-clustering", "gpu-packing",
                                    "bestfit", "fgd"])
def test_without_departures_in_static_order_it_is_the_static_replay(policy: str) -> None:
    _assert_same_as_static(synthetic_nodes(40, seed=0), synthetic_pods(400, seed=0), policy, 7)


@pytest.mark.parametrize(("policy", "device_mode"), [
    ("fgd", "first-fit"), ("fgd", "first-fit-scored"), ("kube-default", "first-fit")])
def test_every_device_mode_is_the_static_replays_too(policy: str, device_mode: str) -> None:
    _assert_same_as_static(synthetic_nodes(40, seed=0), synthetic_pods(400, seed=0), policy, 7,
                           device_mode)


def test_an_unknown_device_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown device mode 'best-fit'"):
        EventReplay(synthetic_nodes(2, seed=0), [], EventConfig(**QUIET),  # type: ignore[arg-type]
                    device_mode="best-fit")


@pytest.mark.slow
def test_same_as_static_on_openb() -> None:
    nodes = load_nodes(trace("openb", "openb_node_list_gpu_node.csv"))
    pods = load_pods(trace("openb", "openb_pod_list_default.csv"),
                     {n.gpu_product for n in nodes if n.gpu_count})
    _assert_same_as_static(nodes, pods, "fgd", 42)


@pytest.mark.parametrize(("attempts", "delay"), [(1, 1), (2, 2), (3, 4), (4, 8), (5, 10),
                                                 (9, 10), (500, 10)])
def test_backoff_doubles_from_1s_to_10s(attempts: int, delay: float) -> None:
    assert backoff_s(attempts, 1.0, 10.0) == delay


def _run(nodes: list, timed: list[TimedPod], hours: float = 1.0,
         **knobs: object) -> EventReplay:
    config = EventConfig(**{**QUIET, "departures": True, "hours": hours, **knobs})  # type: ignore[arg-type]
    replay_ = EventReplay(nodes, timed, config, target=TargetWorkload.from_pods(
        [t.pod for t in timed]))
    replay_.result = replay_.run()  # type: ignore[attr-defined]
    return replay_


def test_unschedulable_pod_waits_for_room_and_backs_off() -> None:
    nodes = [node("n0", gpu_count=1)]
    timed = [TimedPod(pod("a"), 0.0, 100.0),    # holds the GPU for 100 s
             TimedPod(pod("b"), 5.0, 1000.0),   # waits: tried at 5, fails
             TimedPod(pod("c"), 100.0, 100.5)]  # takes the GPU a frees before b's retry
    r = _run(nodes, timed)
    # a leaves at 100: b is woken (backoff since its try at 5 is over) but c, arriving at the
    # same instant, is placed first; b fails again (2nd attempt) and, woken when c leaves at
    # 100.5, waits out its 2 s backoff: placed at 102.
    assert r.placed_at["a"] == 0 and r.placed_at["c"] == 100
    assert r.placed_at["b"] == pytest.approx(102.0)
    totals = r.result.totals  # type: ignore[attr-defined]
    assert totals["departures"] == 3  # b too: it runs its 995 s from 102
    assert totals["pending_pod_s"] == pytest.approx(97.0)
    assert totals["wait_p99_s"] == pytest.approx(np.percentile([0, 97, 0], 99))


def test_pod_runs_its_whole_life_after_waiting() -> None:
    nodes = [node("n0", gpu_count=1)]
    timed = [TimedPod(pod("a"), 0.0, 50.0), TimedPod(pod("b"), 10.0, 40.0)]
    r = _run(nodes, timed, hours=0.1)
    assert r.placed_at["b"] == 50.0
    assert "b" not in r.state.pods  # left at 50 + 30 = 80 s
    assert r.result.totals["departures"] == 2  # type: ignore[attr-defined]


def test_never_woken_pods_are_retried_every_5_minutes() -> None:
    nodes = [node("n0", gpu_count=1)]
    timed = [TimedPod(pod("a"), 0.0, None), TimedPod(pod("b"), 0.0, None)]
    r = _run(nodes, timed, hours=0.25)
    # a once; b at 0 and by the flush at 300, 600 and 900 s
    assert r.result.totals["attempts"] == 5  # type: ignore[attr-defined]
    assert r.result.totals["pending_at_end"] == 1  # type: ignore[attr-defined]


def test_defrag_cycles_run_on_their_cadence_within_budget() -> None:
    nodes = synthetic_nodes(30, seed=1)
    capacity = sum(n.gpu_count for n in nodes) * 1000
    timed = synthetic_timed(capacity, 3, 0.9, seed=2)
    config = EventConfig(hours=3, serving=False, defrag_interval_min=15, threshold=0.2,
                         max_evictions_total=3)
    totals = run_events(nodes, timed, config).totals
    assert totals["defrag_cycles"] == 12
    assert 0 < totals["evictions"] <= 3 * 12
    off = run_events(nodes, timed, EventConfig(hours=3, serving=False,
                                               defrag_interval_min=0)).totals
    assert off["defrag_cycles"] == 0 and off["evictions"] == 0


def test_serving_deployments_scale_and_pay_cold_starts() -> None:
    nodes = synthetic_nodes(60, seed=0)
    capacity = sum(n.gpu_count for n in nodes) * 1000
    timed = synthetic_timed(capacity, 6, 0.5, seed=0)
    trace = synthetic_serving_trace(0)
    config = EventConfig(hours=6, serving_models=3, serving_peak_rps=2000, sample_s=60)
    result = run_events(nodes, timed, config, serving_trace=trace)
    t = result.totals
    assert t["requests"] > 0 and 0 <= t["requests_over_slo"] <= t["requests"]
    assert t["scale_ups"] > 0 and t["cold_starts"] > 0
    assert t["cold_start_s"] >= 10 * t["cold_starts"]  # the slow group starts at 10 s
    assert t["warm_start_s"] < 10 * max(t["warm_starts"], 1)
    replicas = result.series("replicas")
    assert replicas.min() >= 3 * 2 and replicas.max() <= 3 * 20
    assert 0 < t["gpu_hours_used"] < t["gpu_hours_allocated"]
    # the clock: one sample a minute from 0 to the end
    assert result.series("t_s")[0] == 0 and result.series("t_s")[-1] == 6 * 3600
    assert len(result.samples) == 6 * 60 + 1


def test_prewarming_lowers_requests_over_the_slo() -> None:
    nodes = synthetic_nodes(60, seed=0)
    trace = synthetic_serving_trace(0)
    base = dict(hours=8, serving_models=2, serving_peak_rps=3000, defrag_interval_min=0)
    cold = run_events(nodes, [], EventConfig(**base), serving_trace=trace)  # type: ignore[arg-type]
    warm = run_events(nodes, [], EventConfig(**base, prewarm_s=600),  # type: ignore[arg-type]
                      serving_trace=trace)
    assert warm.totals["requests_over_slo"] < cold.totals["requests_over_slo"]


def test_warm_window_decides_warm_starts() -> None:
    nodes = [node("n0", gpu_count=2)]
    replay_ = EventReplay(nodes, [], EventConfig(warm_window_s=600, **QUIET),
                          serving_trace=synthetic_serving_trace(0))
    replica = replay_._replica_request("M0001", "r0")
    assert not replay_._warm(replica, 0)
    replay_.state.place(replica, 0, (0,))
    assert replay_._warm(replica, 0)
    replay_.now = 100.0
    replay_.state.remove_pod("serving/r0", now=100.0)
    replay_.now = 650.0
    assert replay_._warm(replica, 0)
    replay_.now = 701.0
    assert not replay_._warm(replica, 0)


@pytest.mark.parametrize(("knob", "value", "message"), [
    ("policy", "magic", "choose from"),
    ("hours", "0", r"must be in \(0"),
    ("backoff_initial_s", "20", "<= backoff_max_s"),
    ("threshold", "1.5", "not a ratio"),
    ("defrag_policy", "random", "'' or one of"),
    ("replica_gpu_milli", "0", "1..1000"),
])
def test_bad_knob_values_name_the_knob(knob: str, value: str, message: str) -> None:
    with pytest.raises(BadInput, match=message) as e:
        EventConfig(**{knob: knob_value(knob, value)}).validate()  # type: ignore[arg-type]
    assert knob in str(e.value) or e.value.field is not None


def test_knob_values_are_typed() -> None:
    assert knob_value("departures", "off") is False
    assert knob_value("seed", "3") == 3
    assert knob_value("threshold", "0.3") == 0.3
    with pytest.raises(BadInput, match="unknown knob 'speed'"):
        knob_value("speed", "1")
    with pytest.raises(BadInput, match="not a int"):
        knob_value("seed", "x")
    with pytest.raises(BadInput, match="not a float"):
        knob_value("threshold", "nan")
