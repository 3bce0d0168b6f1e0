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


def test_whole_gpu_pods_keep_what_they_ask() -> None:
    sizing = Rightsizing(one_series([0.1] * 12))
    pod = PodRequest("w", namespace="ns", num_gpu=1, gpu_milli=1000)
    sizing.track("ns/w", pod, GPU_MIB)
    sizing.observe(3600.0, {"ns/w": GPU_MIB})
    assert sizing.rightsized({"ns/w": pod}) == {}
    assert sizing.pods["ns/w"].recommendation is None  # no history kept: nothing to change
    assert sizing.admitted_milli("ns/w", pod) == 0
    assert sizing.skips == {"no_gpu_share": 1}


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
