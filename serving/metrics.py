"""Prometheus metrics for the serving runtime, on a registry of its own.

A private :class:`prometheus_client.CollectorRegistry` (not the global default) so two servers
in one test process never collide and ``/metrics`` shows exactly this runtime. Names are
prefixed ``gpufrag_serving_`` and carry their unit. The HPA signals read from here:
``gpufrag_serving_queue_depth`` (per pod), ``gpufrag_serving_gpu_utilization_ratio`` and the
p99 of ``gpufrag_serving_request_duration_seconds``. The leak alarm reads
``gpufrag_serving_gpu_memory_growth_batches_total`` (batches after which a GPU's memory had grown
by more than ``--gpu-memory-growth-warn-mib``; counted by :class:`serving.gpu.MemoryGrowthWatch`).

GPU gauges are read from the probe at scrape time by a custom collector; without a GPU the
collector yields nothing, so the series are absent rather than zero (a zero would read as an
idle GPU to an autoscaler).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from serving.cache import CacheState
from serving.config import BatcherConfig
from serving.gpu import GpuProbe, GrowthObserver

PREFIX = "gpufrag_serving"
OUTCOMES = ("ok", "rejected", "timeout", "error", "cancelled", "invalid")

# Latency buckets from 1 ms to 10 s: the HPA's p99 > 200 ms signal falls between buckets.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
                     0.75, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256)


class ServingMetrics:
    """Implements :class:`serving.batcher.BatchObserver`; the HTTP layer adds request metrics."""

    def __init__(self, *, model: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = ("model",)
        self._model = model
        self.queue_depth_gauge = Gauge(
            f"{PREFIX}_queue_depth", "Requests waiting in the batcher's queue.",
            labels, registry=self.registry).labels(model)
        self.request_seconds = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "Time from receiving an infer request to sending its response.",
            labels, buckets=LATENCY_BUCKETS_S, registry=self.registry).labels(model)
        self.queue_seconds = Histogram(
            f"{PREFIX}_queue_duration_seconds",
            "Time a computed request waited in the queue before its batch started.",
            labels, buckets=LATENCY_BUCKETS_S, registry=self.registry).labels(model)
        self.compute_seconds = Histogram(
            f"{PREFIX}_compute_duration_seconds", "Backend time per batch.",
            labels, buckets=LATENCY_BUCKETS_S, registry=self.registry).labels(model)
        self.batch_size = Histogram(
            f"{PREFIX}_batch_size", "Rows per computed batch (padding not counted).",
            labels, buckets=BATCH_BUCKETS, registry=self.registry).labels(model)
        requests = Counter(
            f"{PREFIX}_requests", "Infer requests by outcome: ok, rejected (503), timeout "
            "(504), error (500), cancelled (client gone), invalid (400/404/413).",
            ("model", "outcome"), registry=self.registry)
        self._outcomes = {outcome: requests.labels(model, outcome) for outcome in OUTCOMES}
        self.model_load_seconds = Gauge(
            f"{PREFIX}_model_load_seconds",
            "Seconds this process took to load its model: getting the model file (a built-in "
            "is generated) and loading it into the backend (a TensorRT engine is built or "
            "deserialised). cache: warm = everything needed was in the model cache, cold = "
            "something had to be made, none = the load uses no cache.",
            ("model", "backend", "cache"), registry=self.registry)
        self.ready = Gauge(f"{PREFIX}_ready", "1 while the server admits requests.",
                           labels, registry=self.registry).labels(model)
        self.settings = Gauge(
            f"{PREFIX}_batcher_setting", "The batcher's configured knobs, for dashboards.",
            ("model", "setting"), registry=self.registry)
        # Registered, with its one series at 0, only once there is a GPU (add_gpu_collector):
        # the first growth is then an increase(), and a CPU pod exports no GPU metric at all.
        self._growth_batches: Counter | None = None

    def record_settings(self, config: BatcherConfig) -> None:
        for setting, value in (("max_batch_size", config.max_batch_size),
                               ("max_queue_delay_seconds", config.max_queue_delay_s),
                               ("max_queue_size", config.max_queue_size),
                               ("default_timeout_seconds", config.default_timeout_s),
                               ("max_concurrent_batches", config.max_concurrent_batches)):
            self.settings.labels(self._model, setting).set(value)

    def record_model_load(self, *, backend: str, cache: CacheState, seconds: float) -> None:
        """One series per process (a process loads its model once), labelled with what the
        model cache had, so cold and warm starts can be told apart across pods."""
        self.model_load_seconds.labels(self._model, backend, cache).set(seconds)

    def add_gpu_collector(self, probe: GpuProbe) -> None:
        self.registry.register(GpuCollector(probe))
        self._growth_batches = Counter(
            f"{PREFIX}_gpu_memory_growth_batches",
            "Batches after which a GPU's used memory had grown by more than "
            "--gpu-memory-growth-warn-mib (a leak, or an allocator growing its pool; the "
            "gpu_memory_growth log line names the GPU).",
            ("model",), registry=self.registry)
        self._growth_batches.labels(self._model)

    # GrowthObserver
    def gpu_memory_grew(self, gpu: int, grown_bytes: int) -> None:
        if self._growth_batches is not None:
            self._growth_batches.labels(self._model).inc()

    # BatchObserver
    def queue_depth(self, depth: int) -> None:
        self.queue_depth_gauge.set(depth)

    def outcome(self, outcome: str, count: int = 1) -> None:
        self._outcomes[outcome].inc(count)

    def batch(self, rows: int, queue_waits_s: Sequence[float], compute_s: float) -> None:
        self.batch_size.observe(rows)
        self.compute_seconds.observe(compute_s)
        for wait in queue_waits_s:
            self.queue_seconds.observe(wait)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class GpuCollector(Collector):
    """Per-GPU utilisation and memory, read from the probe when Prometheus scrapes."""

    def __init__(self, probe: GpuProbe) -> None:
        self._probe = probe

    def collect(self) -> Iterator[Metric]:
        readings = self._probe.read()
        if not readings:
            return
        util = GaugeMetricFamily(f"{PREFIX}_gpu_utilization_ratio",
                                 "GPU busy fraction over the last NVML sample period (0..1).",
                                 labels=["gpu", "uuid"])
        used = GaugeMetricFamily(f"{PREFIX}_gpu_memory_used_bytes", "GPU memory in use.",
                                 labels=["gpu", "uuid"])
        total = GaugeMetricFamily(f"{PREFIX}_gpu_memory_total_bytes", "GPU memory size.",
                                  labels=["gpu", "uuid"])
        for r in readings:
            labels = [str(r.index), r.uuid]
            util.add_metric(labels, r.utilization_ratio)
            used.add_metric(labels, r.memory_used_bytes)
            total.add_metric(labels, r.memory_total_bytes)
        yield util
        yield used
        yield total


def _conforms(metrics: ServingMetrics) -> GrowthObserver:
    return metrics  # mypy: the runtime's metrics are the growth watch's observer
