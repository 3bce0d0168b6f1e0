"""Right-sizing in the what-if: trace series, the recommender's history, the webhook's rule."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from defrag.rightsizing.recommender import Mode, milli_for
from gpufrag.errors import BadInput
from scheduler.core import PodRequest
from simulations.rightsizing import (
    MemoryTrace,
    Rightsizing,
    read_memory_trace,
    synthetic_memory_trace,
)

GIB = 1024**3
GPU_MIB = 32_768


def one_series(fractions: list[float], step_s: float = 600.0) -> MemoryTrace:
    t = np.arange(len(fractions)) * step_s
    return MemoryTrace((t,), (np.array(fractions),))


def test_read_memory_trace_aligns_each_container_at_zero(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("timestamp_anon,value,container_ip\n"
                    f"100,{0.5 * 48 * GIB},b\n160,{0.25 * 48 * GIB},b\n"
                    f"40,{2 * 48 * GIB},a\n")
    trace = read_memory_trace(path, 48.0)
    assert trace.containers == 2 and trace.source == "genai trace"
    np.testing.assert_allclose(trace.t_s[1], [0.0, 60.0])  # sorted by container name
    assert trace.at(0, 0.0) == 1.0  # capped at the GPU
    assert trace.at(1, 59.0) == 0.5 and trace.at(1, 60.0) == 0.25 and trace.at(1, 1e6) == 0.25
    times, fractions = trace.between(1, 0.0, 60.0)
    assert list(times) == [60.0] and list(fractions) == [0.25]


def test_read_memory_trace_bad_rows_name_the_row(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("timestamp_anon,value\n1,abc\n")
    with pytest.raises(BadInput, match="row 2, field 'value': not a number"):
        read_memory_trace(path, 48.0)


def test_synthetic_trace_is_seeded_and_bounded() -> None:
    a, b = synthetic_memory_trace(3, containers=4), synthetic_memory_trace(3, containers=4)
    assert all(np.array_equal(x, y) for x, y in zip(a.fraction, b.fraction, strict=True))
    assert all(f.min() >= 0.0 and f.max() <= 1.0 for f in a.fraction)


def test_replacements_get_the_webhooks_share() -> None:
    # 600 milli of a 32 GiB GPU (19,660 MiB) using 20%..40% of it over four hours.
    sizing = Rightsizing(one_series([0.2, 0.3, 0.4, 0.2] * 6), mode=Mode.AUTO)
    pod = PodRequest("a", namespace="ns", num_gpu=1, gpu_milli=600)
    sizing.track("ns/a", pod, GPU_MIB)
    sizing.observe(4 * 3600.0, {"ns/a": GPU_MIB})
    rec = sizing.pods["ns/a"].recommendation
    assert rec is not None
    peak_mib = int(0.4 * 0.6 * GPU_MIB)
    assert rec.peak_mib == peak_mib
    # The recommender: p95 of hourly peaks + 15% + 256 MiB; the webhook: never below peak,
    # never above what the template asks.
    assert rec.memory_mib == math.ceil(peak_mib * 1.15) + 256
    expected = min(600, max(rec.milli, milli_for(rec.peak_mib, GPU_MIB)))
    assert sizing.rightsized({"ns/a": pod}) == {"ns/a": expected}
    assert expected < 600


@pytest.mark.parametrize("mode", [Mode.RECOMMEND, Mode.OFF])
def test_no_replacement_changes_outside_auto(mode: Mode) -> None:
    sizing = Rightsizing(one_series([0.2] * 12), mode=mode)
    pod = PodRequest("a", namespace="ns", num_gpu=1, gpu_milli=600)
    sizing.track("ns/a", pod, GPU_MIB)
    sizing.observe(3600.0, {"ns/a": GPU_MIB})
    assert sizing.rightsized({"ns/a": pod}) == {}
    assert sizing.skips == {f"mode_{mode.value}": 1}


def test_whole_gpu_pods_become_shares_after_a_day_of_history_multi_gpu_pods_never() -> None:
    # 10% of a 32 GiB GPU, sampled every 10 minutes for 30 hours.
    sizing = Rightsizing(one_series([0.1] * 180))
    whole = PodRequest("w", namespace="ns", num_gpu=1, gpu_milli=1000)
    multi = PodRequest("m", namespace="ns", num_gpu=2, gpu_milli=1000)
    sizing.track("ns/w", whole, GPU_MIB)
    sizing.track("ns/m", multi, GPU_MIB)
    sizing.observe(12 * 3600.0, {"ns/w": GPU_MIB, "ns/m": GPU_MIB})
    # Half a day: the history is too short to share a whole GPU.
    assert sizing.rightsized({"ns/w": whole, "ns/m": multi}) == {}
    assert sizing.skips == {"whole_gpu_kept": 1}
    assert sizing.pods["ns/m"].recommendation is None  # no history kept: nothing to change
    sizing.observe(30 * 3600.0, {"ns/w": GPU_MIB, "ns/m": GPU_MIB})
    rec = sizing.pods["ns/w"].recommendation
    assert rec is not None and rec.whole_gpu and rec.intervals >= 24
    expected = max(rec.milli, milli_for(rec.peak_mib, GPU_MIB))
    assert sizing.rightsized({"ns/w": whole, "ns/m": multi}) == {"ns/w": expected}
    assert expected < 200
    assert sizing.admitted_milli("ns/m", multi) == 0 and sizing.skips == {"multi_gpu": 1}


def test_a_right_sized_pod_whose_use_grew_gets_its_template_share_back() -> None:
    # Its use rises to 90% of the original reservation: the webhook admits the template's
    # 600 milli again (never above), so the planner is told the replacement grows.
    sizing = Rightsizing(one_series([0.2] * 6 + [0.9] * 6, step_s=3600.0))
    asked = PodRequest("a", namespace="ns", num_gpu=1, gpu_milli=600)
    sizing.track("ns/a", asked, GPU_MIB)
    sizing.observe(5 * 3600.0, {"ns/a": GPU_MIB})
    small = sizing.rightsized({"ns/a": asked})["ns/a"]
    assert small < 600
    now = PodRequest("a", namespace="ns", num_gpu=1, gpu_milli=small)
    sizing.observe(12 * 3600.0, {"ns/a": GPU_MIB})
    assert sizing.rightsized({"ns/a": now}) == {"ns/a": 600}
    assert sizing.used_mib("ns/a", 12 * 3600.0) == pytest.approx(0.9 * 0.6 * GPU_MIB)


def test_readings_above_a_right_sized_share_are_counted_out_of_sample_and_raise_the_pod() -> None:
    # 600 milli of a 32 GiB GPU (19,660 MiB), using 20% of it for 4 hours, then 90%.
    sizing = Rightsizing(one_series([0.2] * 24 + [0.9] * 6))
    pod = PodRequest("a", namespace="ns", num_gpu=1, gpu_milli=600)
    sizing.track("ns/a", pod, GPU_MIB)
    full = 0.6 * GPU_MIB
    sizing.observe(4 * 3600.0, {"ns/a": GPU_MIB}, {"ns/a": full})
    assert sizing.over_share.samples == 0  # it holds what it asked: nothing to judge
    # Right-sized to 200 milli (6,553 MiB): the 90% readings (11,796 MiB) overrun it.
    sizing.observe(5 * 3600.0, {"ns/a": GPU_MIB}, {"ns/a": 0.2 * GPU_MIB})
    over = sizing.over_share
    assert (over.samples, over.over, over.raised, over.over_again) == (5, 5, 1, 0)
    rec = sizing.pods["ns/a"].recommendation
    assert rec is not None and rec.held(5 * 3600.0)
    assert rec.raised_mib == math.ceil(int(0.9 * full) * 1.2)
    assert sizing.rightsized({"ns/a": pod}) == {}  # held: the replacement asks 600 again
    assert sizing.skips == {"oom_cooloff": 1}


@pytest.mark.parametrize("hours", [6.0, 30.0, 60.0])
def test_shares_without_the_annotation_round_trip_are_the_webhooks(hours: float) -> None:
    """``count_skips=False`` reads the webhook's share off the recommendation: the same
    shares as the webhook's decide, for shares, whole GPUs and multi-GPU pods, before and
    after the history allows a whole GPU to be shared and during the guard's cool-off."""
    trace = one_series([0.1] * 100 + [0.9] * 10 + [0.1] * 300)
    pods = {"ns/s": PodRequest("s", namespace="ns", num_gpu=1, gpu_milli=600),
            "ns/w": PodRequest("w", namespace="ns", num_gpu=1, gpu_milli=1000),
            "ns/m": PodRequest("m", namespace="ns", num_gpu=2, gpu_milli=1000)}
    both = [Rightsizing(trace), Rightsizing(trace, count_skips=False)]
    for sizing in both:
        for key, pod in pods.items():
            sizing.track(key, pod, GPU_MIB)
        for t in np.arange(3600.0, hours * 3600.0 + 1, 3600.0):
            gpu = {k: float(GPU_MIB) for k in pods}
            sizing.observe(float(t), gpu, {"ns/s": 0.3 * GPU_MIB})
    slow, fast = both
    assert slow.rightsized(pods) == fast.rightsized(pods)
    assert [slow.admitted_milli(k, p) for k, p in pods.items()] == [
        fast.admitted_milli(k, p) for k, p in pods.items()]
