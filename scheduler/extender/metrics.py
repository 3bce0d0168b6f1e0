"""Prometheus metrics of the extender, in a registry of its own (one per app).

Per verb: request counts by HTTP status and a latency histogram with buckets around the 5 ms
budget. Cluster figures (nodes, pods by state, fragmentation ratio, whether the watch has synced,
objects left out of the state because they could not be read) are read from the cache at scrape
time, under its lock, so they are never stale and cost nothing between scrapes. The Events
written about those objects (:class:`SkipEventCollector`) exist only where there is an API
server to write to, so the runtime registers that collector for a live cluster only. The
process's CPU by thread (:class:`gpufrag.metrics.ThreadCPUCollector`) says where the extender's
CPU goes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpufrag.metrics import ThreadCPUCollector, new_registry
from scheduler.extender.extender import Extender
from scheduler.kube.cache import SKIPPED_KINDS
from scheduler.kube.skipreport import SKIP_EVENT_OUTCOMES

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _ClusterCollector(Collector):
    def __init__(self, extender: Extender) -> None:
        self.extender = extender

    def collect(self) -> Iterator[Metric]:
        cache = self.extender.placement.cache
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
        ratio.add_metric([], self.extender.placement.fragmentation_ratio())
        yield ratio
        synced = GaugeMetricFamily("gpufrag_extender_synced",
                                   "1 once the node and pod lists have been loaded.")
        synced.add_metric([], 1.0 if cache.synced else 0.0)
        yield synced
        with cache.lock:
            current, total = cache.skipped_counts(), dict(cache.skips_total)
            dropped = dict(cache.relist_dropped)
            failed = dict(cache.apply_failures)
        relist = CounterMetricFamily(
            "gpufrag_extender_relist_dropped_objects",
            "Cached objects a full list found gone although no watch event had said so: "
            "expected after a watch gap (410, restart); from the periodic relist "
            "(watch.relist_s), a deletion the watch missed, which held its GPUs until then.",
            labels=["kind"])
        for kind, count in sorted(dropped.items()):
            relist.add_metric([kind], count)
        yield relist
        apply_failures = CounterMetricFamily(
            "gpufrag_extender_watch_apply_failures",
            "Watch events the extender's cache failed to apply (see the log): each ended its "
            "watch and a full list followed within the watch backoff, instead of the object "
            "staying stale until the periodic relist.", labels=["kind"])
        for kind, count in sorted(failed.items()):
            apply_failures.add_metric([kind], count)
        yield apply_failures
        skipped = GaugeMetricFamily(
            "gpufrag_extender_skipped_objects",
            "Objects left out of the state now because they could not be read (see the log "
            "and the object's GpufragUnreadable Event for why).", labels=["kind"])
        skips = CounterMetricFamily(
            "gpufrag_extender_object_skips",
            "Objects newly left out of the state because they could not be read.",
            labels=["kind"])
        for kind in SKIPPED_KINDS:
            skipped.add_metric([kind], current.get(kind, 0))
            skips.add_metric([kind], total.get(kind, 0))
        yield skipped
        yield skips
        with cache.lock:
            refused = cache.reservations.refused
        for name, text, value in (
            ("gpufrag_extender_bypassed_pods",
             "GPU pods of this scheduler bound without this extender's say: kube-scheduler "
             "skipped the extender (it failed or ran past httpTimeout and is ignorable), bound "
             "the pod elsewhere than it passed, or the pod was created bound; each also gets a "
             "GpufragBypassed Warning Event.", cache.bypass.total),
            ("gpufrag_extender_record_changes",
             "Bound pods whose GPU record (gpu-indices) changed after the bind, which only the "
             "bind writes: the extender keeps counting the GPUs they were bound with, and each "
             "gets a GpufragRecordChanged Warning Event.", cache.record_changes),
            ("gpufrag_extender_reservation_refusals",
             "Pods whose controller reference named a GPU reservation's owner from outside the "
             "owner's namespace: judged as ordinary pods (a tenant cannot take another's "
             "reserved GPU by naming its ReplicaSet).", refused),
            ("gpufrag_extender_unassumed_decisions",
             "Deciding filters for pods the watch had not seen pending: answered, but no GPU "
             "held for them (a caller that is not kube-scheduler, or a watch running behind).",
             self.extender.filter.unassumed_decisions),
            ("gpufrag_extender_watch_waits_timed_out",
             "Deciding filters for a GPU pod the watch had not shown within "
             "filter.await_watch_s (the pod then holds nothing until its bind).",
             self.extender.filter.watch_waits_timed_out)):
            counter = CounterMetricFamily(name, text)
            counter.add_metric([], value)
            yield counter


class SkipEventOutcomes(Protocol):
    """What :class:`SkipEventCollector` reads (``scheduler.kube.watch.SkipReporter``)."""

    @property
    def outcomes(self) -> Mapping[str, int]: ...


class SkipEventCollector(Collector):
    """``gpufrag_extender_skip_events_total{outcome}``: Warning Events about unreadable
    objects written, failed (the API refused or did not answer) and dropped (queue full)."""

    def __init__(self, reporter: SkipEventOutcomes) -> None:
        self.reporter = reporter

    def collect(self) -> Iterator[Metric]:
        outcomes = dict(self.reporter.outcomes)
        family = CounterMetricFamily(
            "gpufrag_extender_skip_events",
            "Warning Events about objects left out of the state, by outcome: written, failed "
            "(refused or unanswered), dropped (the writer's queue was full).",
            labels=["outcome"])
        for outcome in SKIP_EVENT_OUTCOMES:
            family.add_metric([outcome], outcomes.get(outcome, 0))
        yield family


class ExtenderMetrics:
    def __init__(self, extender: Extender, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or new_registry()
        self.requests = Counter("gpufrag_extender_requests", "Extender requests by verb and "
                                "HTTP status.", ["verb", "code"], registry=self.registry)
        self.latency = Histogram("gpufrag_extender_request_duration_seconds",
                                 "Time to answer an extender request, by verb.", ["verb"],
                                 buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.registry.register(_ClusterCollector(extender))
        # Where the extender's CPU goes: its event loop (HTTP and the inline verbs), watches,
        # bind threads (docs/extender.md, Scheduling throughput).
        self.registry.register(ThreadCPUCollector())

    def observe(self, verb: str, code: int, duration_s: float) -> None:
        self.requests.labels(verb, str(code)).inc()
        self.latency.labels(verb).observe(duration_s)
