"""Prometheus series: names, labels, the observer hooks, GPU gauges present only with a GPU."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpufrag.nvml import NvmlReader
from gpufrag.nvml_recorded import RecordedNvml
from serving.config import BatcherConfig
from serving.gpu import NvmlProbe
from serving.metrics import OUTCOMES, ServingMetrics

RECORDING_PATH = Path(__file__).parent / "data" / "nvml_2x_h100.json"
RECORDING = json.loads(RECORDING_PATH.read_text())


def samples(metrics: ServingMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def test_every_series_is_prefixed_and_on_a_private_registry() -> None:
    a, b = ServingMetrics(model="m"), ServingMetrics(model="m")  # no duplicate-name clash
    names = {name for name, _ in samples(a)}
    assert names and all(name.startswith("gpufrag_serving_") for name in names)
    assert a.registry is not b.registry


def test_observer_hooks_feed_the_series() -> None:
    m = ServingMetrics(model="m")
    m.queue_depth(7)
    m.batch(8, [0.001, 0.004], compute_s=0.02)
    m.outcome("ok", 2)
    m.outcome("timeout")
    m.record_model_load(backend="onnxruntime-cpu", cache="cold", seconds=1.5)
    m.record_settings(BatcherConfig(max_batch_size=16))
    got = samples(m)
    model = (("model", "m"),)
    assert got[("gpufrag_serving_queue_depth", model)] == 7
    assert got[("gpufrag_serving_batch_size_sum", model)] == 8
    assert got[("gpufrag_serving_queue_duration_seconds_count", model)] == 2
    assert got[("gpufrag_serving_compute_duration_seconds_sum", model)] == 0.02
    assert got[("gpufrag_serving_requests_total", (("model", "m"), ("outcome", "ok")))] == 2
    assert got[("gpufrag_serving_requests_total",
                (("model", "m"), ("outcome", "timeout")))] == 1
    assert got[("gpufrag_serving_model_load_seconds",
                (("backend", "onnxruntime-cpu"), ("cache", "cold"), ("model", "m")))] == 1.5
    assert got[("gpufrag_serving_batcher_setting",
                (("model", "m"), ("setting", "max_batch_size")))] == 16
    for outcome in OUTCOMES:  # every outcome exists from the start, so rate() works at once
        assert ("gpufrag_serving_requests_total", (("model", "m"), ("outcome", outcome))) in got


def test_gpu_series_come_from_the_probe_at_scrape_time() -> None:
    m = ServingMetrics(model="m")
    assert not any(name.startswith("gpufrag_serving_gpu_") for name, _ in samples(m))
    reader = NvmlReader(RecordedNvml.load(RECORDING_PATH))
    reader.open()
    m.add_gpu_collector(NvmlProbe(reader))
    got = samples(m)
    uuid = RECORDING["devices"][0]["uuid"]
    assert got[("gpufrag_serving_gpu_utilization_ratio", (("gpu", "0"), ("uuid", uuid)))] == 0.87
    assert got[("gpufrag_serving_gpu_memory_used_bytes",
                (("gpu", "0"), ("uuid", uuid)))] == 21474836480
    assert ("gpufrag_serving_gpu_memory_total_bytes",
            (("gpu", "1"), ("uuid", RECORDING["devices"][1]["uuid"]))) in got
