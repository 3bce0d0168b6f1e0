"""The right-sizing recommender: samples -> history -> recommendation -> annotation and back."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from defrag.rightsizing.recommender import (
    ANY_VERSION,
    Mode,
    PodSample,
    RightsizingConfig,
    WorkloadHistory,
    lookup,
    milli_for,
    parse,
    parse_mode,
    percentile,
    pod_samples,
    recommend,
    replacement_milli,
    update,
)
from gpufrag.errors import BadInput
from gpufrag.gpu_usage import GpuUsage, NodeGpuUsage, PodGpuUsage

HOUR = 3600.0
NOW = 1_767_225_600.0
CONFIG = RightsizingConfig(percentile=0.95, headroom_fraction=0.1, headroom_mib=100,
                           min_mib=256, interval_s=HOUR, window_s=24 * HOUR)


def sample(mib: int, *, at: float = NOW, gpu_mib: int = 81920, uid: str = "u1") -> PodSample:
    return PodSample("ns", f"pod-{uid}", uid, mib, gpu_mib, at)


def test_pod_samples_take_each_pods_largest_per_gpu_use_and_smallest_gpu() -> None:
    pod = PodGpuUsage("ns", "p", "u1", 1000)
    usage = NodeGpuUsage("n", NOW, 15.0, (
        GpuUsage(0, "GPU-a", "A100", 1000, 81920, 10, (pod,)),
        GpuUsage(1, "GPU-b", "A10", 3000, 24576, 10, (PodGpuUsage("ns", "p", "u1", 3000),)),
    ))
    (only,) = pod_samples(usage)
    assert (only.memory_used_mib, only.gpu_memory_mib, only.timestamp) == (3000, 24576, NOW)


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([5], 0.95, 5), ([1, 2, 3, 4], 0.5, 2), (list(range(1, 101)), 0.95, 95),
    (list(range(1, 101)), 1.0, 100), ([9, 1, 5], 0.99, 9),
])
def test_percentile_is_nearest_rank(values: list[int], q: float, expected: int) -> None:
    assert percentile(values, q) == expected


def test_one_peak_per_interval_and_the_window_drops_old_intervals() -> None:
    history = WorkloadHistory().add(
        [sample(1000, at=NOW - 30 * HOUR), sample(2000, at=NOW - 10),
         sample(2500, at=NOW - 20, uid="u2"), sample(1200, at=NOW - 2 * HOUR)], NOW, CONFIG)
    assert [(p.peak_mib, p.samples) for p in history.intervals] == [(1200, 1), (2500, 2)]


def test_recommendation_is_percentile_plus_headroom_bounded() -> None:
    history = WorkloadHistory().add(
        [sample(1000 + i, at=NOW - i * HOUR) for i in range(20)], NOW, CONFIG)
    rec = recommend(history, CONFIG, NOW)
    assert rec is not None
    # p95 of 20 peaks (1000..1019) by nearest rank is the 19th: 1018.
    assert rec.percentile_mib == 1018
    assert rec.memory_mib == 1018 + 102 + 100
    assert rec.peak_mib == 1019
    assert rec.milli == milli_for(rec.memory_mib, 81920) == 15
    assert (rec.intervals, rec.samples) == (20, 20)


@pytest.mark.parametrize(("config", "used", "expected_mib"), [
    (RightsizingConfig(min_mib=4096), 100, 4096),
    (RightsizingConfig(max_mib=2000), 10000, 2000),
    (RightsizingConfig(), 81000, 24576),  # never above the GPU itself
])
def test_bounds(config: RightsizingConfig, used: int, expected_mib: int) -> None:
    history = WorkloadHistory().add([sample(used, gpu_mib=24576)], NOW, config)
    rec = recommend(history, config, NOW)
    assert rec is not None and rec.memory_mib == expected_mib


def test_no_samples_in_the_window_means_no_recommendation() -> None:
    history = WorkloadHistory().add([sample(1000, at=NOW - 48 * HOUR)], NOW, CONFIG)
    assert recommend(history, CONFIG, NOW) is None


def test_update_round_trips_and_continues_the_history() -> None:
    text, recs = update(None, {"v1": [sample(1000, at=NOW - HOUR)]}, NOW - HOUR, CONFIG)
    text, recs = update(text, {"v1": [sample(3000)], ANY_VERSION: [sample(500)]}, NOW, CONFIG)
    parsed = parse(text)
    assert parsed == recs
    assert parsed["v1"].peak_mib == 3000 and parsed["v1"].intervals == 2
    assert lookup(parsed, "v1") is parsed["v1"]
    assert lookup(parsed, "v9") is parsed[ANY_VERSION]
    assert lookup(parsed, None) is parsed[ANY_VERSION]


def test_an_unreadable_annotation_is_started_afresh() -> None:
    _, recs = update("{not json", {"v1": [sample(1000)]}, NOW, CONFIG)
    assert recs["v1"].samples == 1


@pytest.mark.parametrize(("text", "field"), [
    ('{"version": 2, "recommendations": {}}', "version"),
    ('{"version": 1, "recommendations": []}', "recommendations"),
    ('{"version": 1, "recommendations": {"v": {"memory_mib": -1}}}',
     "recommendations.v.memory_mib"),
])
def test_parse_names_the_bad_field(text: str, field: str) -> None:
    with pytest.raises(BadInput) as e:
        parse(text)
    assert e.value.field == field


@pytest.mark.parametrize(("text", "mode"), [(None, Mode.RECOMMEND), ("auto", Mode.AUTO),
                                            (" Off ", Mode.OFF), ("recommend", Mode.RECOMMEND)])
def test_modes(text: str | None, mode: Mode) -> None:
    assert parse_mode(text) is mode


def test_a_bad_mode_is_bad_input() -> None:
    with pytest.raises(BadInput, match="auto"):
        parse_mode("yes")


@pytest.mark.parametrize(("field", "config"), [
    ("percentile", RightsizingConfig(percentile=0.0)),
    ("max_mib", RightsizingConfig(min_mib=500, max_mib=100)),
    ("window_s", RightsizingConfig(window_s=10, interval_s=60)),
    ("headroom_mib", RightsizingConfig(headroom_mib=-1)),
    ("whole_gpu_min_intervals", RightsizingConfig(whole_gpu_min_intervals=0)),
    ("oom_bump_fraction", RightsizingConfig(oom_bump_fraction=-0.1)),
    ("oom_cooloff_s", RightsizingConfig(oom_cooloff_s=float("nan"))),
])
def test_config_validation_names_the_field(field: str, config: RightsizingConfig) -> None:
    with pytest.raises(BadInput) as e:
        config.validated()
    assert e.value.field == f"rightsizing.{field}"


def test_an_overrun_raises_the_recommendation_by_a_fifth_and_holds_new_pods_as_asked() -> None:
    config = dataclasses.replace(CONFIG, oom_cooloff_s=6 * HOUR)  # the window is a day
    text, recs = update(None, {"*": [sample(4000)]}, NOW, config)
    assert recs["*"].memory_mib == 4500  # 4,000 + 10% + 100
    # A replica used 6,000 MiB past its share: at least 6,000 x 1.2 from now on, and new pods
    # are admitted as their template asks for the cool-off.
    text, recs = update(text, {"*": [sample(6000, at=NOW + 60)]}, NOW + 60, config,
                        {"*": 6000})
    raised = recs["*"]
    assert (raised.raised_mib, raised.hold_until) == (7200, NOW + 60 + 6 * HOUR)
    assert raised.memory_mib >= 7200 and "raised to at least 7200 MiB" in raised.why()
    assert replacement_milli(raised, 1, 500, NOW + 120) is None  # held: as asked
    assert parse(text)["*"] == raised  # the guard survives between cycles
    # After the cool-off the raised floor still holds (for the window), then it lapses.
    later = NOW + 60 + 6 * HOUR + 1
    _, recs = update(text, {"*": [sample(1000, at=later)]}, later, config)
    assert not recs["*"].held(later) and recs["*"].memory_mib == 7200
    assert replacement_milli(recs["*"], 1, 500, later) == milli_for(7200, 81920)
    gone = NOW + config.window_s + 2 * HOUR  # the 6,000 MiB hour has left the window too
    _, recs = update(text, {"*": [sample(1000, at=gone)]}, gone, config)
    assert recs["*"].raised_mib == 0 and recs["*"].memory_mib == 1200


@pytest.mark.parametrize(("name", "value"), [("raised_mib", -1), ("raised_at", "soon"),
                                             ("hold_until", -5.0), ("whole_gpu", "yes")])
def test_the_guards_fields_are_checked_when_read(name: str, value: object) -> None:
    text, _ = update(None, {"*": [sample(4000)]}, NOW, CONFIG)
    doc = orjson.loads(text)
    doc["recommendations"]["*"][name] = value
    with pytest.raises(BadInput) as e:
        parse(orjson.dumps(doc).decode())
    assert e.value.field == f"recommendations.*.{name}"


def test_folding_in_time_order_or_out_of_it_gives_one_history() -> None:
    """Readings folded cycle by cycle (the merge at the tail) and the same readings folded
    newest first, one at a time, give the same peaks, counts and window."""
    readings = [sample(100 + (i * 37) % 400, at=NOW + i * 700.0) for i in range(200)]
    in_order = WorkloadHistory()
    for i in range(0, len(readings), 7):
        chunk = readings[i:i + 7]
        in_order = in_order.add(chunk, chunk[-1].timestamp, CONFIG)
    backwards = WorkloadHistory()
    for reading in reversed(readings):
        backwards = backwards.add([reading], readings[-1].timestamp, CONFIG)
    assert in_order == backwards
    assert 24 <= len(in_order.intervals) <= 25  # a day's window of hourly peaks (a partial one)
