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

The per-request series (request and queue durations, outcomes, queue depth, batch size and
compute time) are plain counters updated on the event loop's thread without a lock
(:class:`LoopHistogram`) and turned into Prometheus families only when scraped: the same
names, labels and buckets as ``prometheus_client``'s own types (without their ``_created``
samples), at about a quarter of their cost per update (measured in docs/serving.md). They must
only be updated from the event loop's thread, which is where the batcher and the routes run.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gpufrag.metrics import new_registry
from serving.cache import CacheState
from serving.config import BatcherConfig
from serving.gpu import GpuProbe, GrowthObserver

PREFIX = "gpufrag_serving"
OUTCOMES = ("ok", "rejected", "timeout", "error", "cancelled", "invalid")

# Latency buckets from 1 ms to 10 s: the HPA's p99 > 200 ms signal falls between buckets.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
                     0.75, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256)


class LoopHistogram:
    """A histogram for one thread: a bisect and two additions per observation, no lock."""

    __slots__ = ("_le", "bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.total = 0.0
        # the ``le`` labels as prometheus_client writes them ("0.005", "1.0", "+Inf")
        self._le = (*(repr(b) for b in self.bounds), "+Inf")

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # bucket i: value <= bounds[i]
        self.total += value

    def family(self, name: str, documentation: str, model: str) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, documentation, labels=["model"])
        cumulative, buckets = 0, []
        for le, count in zip(self._le, list(self.counts), strict=True):
            cumulative += count
            buckets.append((le, float(cumulative)))
        family.add_metric([model], buckets, sum_value=self.total)
        return family


class ServingMetrics:
    """Implements :class:`serving.batcher.BatchObserver`; the HTTP layer adds request metrics."""

    def __init__(self, *, model: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or new_registry()
        labels = ("model",)
        self._model = model
        self.depth = 0
        self.request_seconds = LoopHistogram(LATENCY_BUCKETS_S)
        self.queue_seconds = LoopHistogram(LATENCY_BUCKETS_S)
        self.compute_seconds = LoopHistogram(LATENCY_BUCKETS_S)
        self.batch_size = LoopHistogram(BATCH_BUCKETS)
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.registry.register(_LoopCollector(self))
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
        self.depth = depth

    def outcome(self, outcome: str, count: int = 1) -> None:
        self.outcomes[outcome] += count

    def batch(self, rows: int, queue_waits_s: Sequence[float], compute_s: float) -> None:
        self.batch_size.observe(rows)
        self.compute_seconds.observe(compute_s)
        for wait in queue_waits_s:
            self.queue_seconds.observe(wait)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    @property
    def model(self) -> str:
        return self._model


class _LoopCollector(Collector):
    """The per-request series of :class:`ServingMetrics`, as Prometheus families at scrape."""

    def __init__(self, metrics: ServingMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        model = m.model
        depth = GaugeMetricFamily(f"{PREFIX}_queue_depth",
                                  "Requests waiting in the batcher's queue.", labels=["model"])
        depth.add_metric([model], m.depth)
        yield depth
        yield m.request_seconds.family(
            f"{PREFIX}_request_duration_seconds",
            "Time from receiving an infer request to sending its response.", model)
        yield m.queue_seconds.family(
            f"{PREFIX}_queue_duration_seconds",
            "Time a computed request waited in the queue before its batch started.", model)
        yield m.compute_seconds.family(f"{PREFIX}_compute_duration_seconds",
                                       "Backend time per batch.", model)
        yield m.batch_size.family(f"{PREFIX}_batch_size",
                                  "Rows per computed batch (padding not counted).", model)
        requests = CounterMetricFamily(
            f"{PREFIX}_requests", "Infer requests by outcome: ok, rejected (503), timeout "
            "(504), error (500), cancelled (client gone), invalid (400/404/413).",
            labels=["model", "outcome"])
        for outcome, count in list(m.outcomes.items()):
            requests.add_metric([model, outcome], count)
        yield requests


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
