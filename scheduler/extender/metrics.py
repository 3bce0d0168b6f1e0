"""Prometheus metrics of the extender, in a registry of its own (one per app).

Per verb: request counts by HTTP status and a latency histogram with buckets around the 5 ms
budget. Cluster figures (nodes, pods by state, fragmentation ratio, whether the watch has synced)
are read from the cache at scrape time, under its lock, so they are never stale and cost nothing
between scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from scheduler.extender.service import Extender

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _ClusterCollector(Collector):
    def __init__(self, extender: Extender) -> None:
        self.extender = extender

    def collect(self) -> Iterator[Metric]:
        cache = self.extender.cache
        counts = cache.counts()
        nodes = GaugeMetricFamily("gpufrag_extender_nodes", "Nodes in the extender's state.")
        nodes.add_metric([], counts["nodes"])
        yield nodes
        pods = GaugeMetricFamily("gpufrag_extender_pods", "Pods in the extender's state.",
                                 labels=["state"])
        for state in ("placed", "pending", "assumed", "unaccounted"):
            pods.add_metric([state], counts[f"pods_{state}"])
        yield pods
        ratio = GaugeMetricFamily(
            "gpufrag_extender_fragmentation_ratio",
            "Cluster GPU fragmentation (FGD, against the target workload) over free GPU share.")
        ratio.add_metric([], self.extender.fragmentation_ratio())
        yield ratio
        synced = GaugeMetricFamily("gpufrag_extender_synced",
                                   "1 once the node and pod lists have been loaded.")
        synced.add_metric([], 1.0 if cache.synced else 0.0)
        yield synced


class ExtenderMetrics:
    def __init__(self, extender: Extender, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter("gpufrag_extender_requests", "Extender requests by verb and "
                                "HTTP status.", ["verb", "code"], registry=self.registry)
        self.latency = Histogram("gpufrag_extender_request_duration_seconds",
                                 "Time to answer an extender request, by verb.", ["verb"],
                                 buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.registry.register(_ClusterCollector(extender))

    def observe(self, verb: str, code: int, duration_s: float) -> None:
        self.requests.labels(verb, str(code)).inc()
        self.latency.labels(verb).observe(duration_s)
