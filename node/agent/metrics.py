"""What the agent exports over HTTP: ``/metrics``, ``/healthz`` and ``/readyz``.

GPU series use the DCGM exporter's names and label names (``DCGM_FI_DEV_FB_USED`` and friends,
labelled ``gpu``, ``UUID``, ``modelName``, ``Hostname``) so dashboards, HPA rules and
``gpufrag defrag --prometheus`` written for dcgm-exporter work against the agent unchanged.
Their one departure from Prometheus's conventions is dcgm-exporter's: the camelCase
``modelName`` (``promtool check metrics`` names it, and the project's lint accepts exactly that
for the ``DCGM_`` families it mirrors). The DCGM series keep DCGM's units (MiB, percent) since
the names promise them. The agent's own series (``gpufrag_``) follow Prometheus's conventions:
snake_case labels, base units (bytes, seconds), ``node`` for the node as kube-state-metrics
names it. Everything is registered on the agent's own :class:`CollectorRegistry`, never the
global one, so tests and other components in the same process do not collide.

Liveness means "the loop is still ticking" (a hung NVML call fails it); readiness means "at
least one reading has been read and published".
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import generate_latest

from gpufrag import probes
from gpufrag.gpu_usage import STRAY_REASONS, NodeGpuUsage
from gpufrag.httpserve import Server
from gpufrag.metrics import new_registry
from gpufrag.nvml import MIB
from gpufrag.probes import Liveness
from gpufrag.records import ALLOCATION_MISMATCH_REASONS
from node.agent.cgroup import PodRef
from node.agent.isolation import Overrun

# dcgm-exporter's label names, modelName included (see the module docstring).
_GPU_LABELS = ("gpu", "UUID", "modelName", "Hostname")
_POD_GPU_LABELS = ("namespace", "pod", "node", "gpu")


class AgentMetrics:
    """The agent's Prometheus series; label sets of GPUs and pods that went away are removed."""

    def __init__(self, node_name: str, registry: CollectorRegistry | None = None) -> None:
        self.node_name = node_name
        self.registry = registry if registry is not None else new_registry()
        r = self.registry
        self.fb_used_mib = Gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).",
                                 _GPU_LABELS, registry=r)
        self.fb_free_mib = Gauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).",
                                 _GPU_LABELS, registry=r)
        self.gpu_util_pct = Gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).",
                                  _GPU_LABELS, registry=r)
        self.pod_memory_bytes = Gauge(
            "gpufrag_pod_gpu_memory_used_bytes",
            "GPU memory held by a pod's processes on one GPU of this node (bytes; read in "
            "whole MiB).", _POD_GPU_LABELS, registry=r,
        )
        self.leak_suspected = Gauge(
            "gpufrag_agent_gpu_memory_leak_suspected",
            "1 while a pod's GPU memory has grown beyond the threshold for N intervals in a row.",
            ("namespace", "pod"), registry=r,
        )
        self.share_bytes = Gauge(
            "gpufrag_pod_gpu_memory_share_bytes",
            "GPU memory a pod may use on one GPU: a share pod's ask, or its milli-GPU share of "
            "the GPU's memory; 0 on a GPU not recorded for the pod. Pods with recorded GPUs "
            "only (whole-GPU pods only where they hold memory on a GPU not theirs).",
            _POD_GPU_LABELS, registry=r,
        )
        self.over_share = Gauge(
            "gpufrag_agent_gpu_memory_over_share",
            "1 while a pod's GPU memory on one GPU has exceeded its share there for N readings "
            "in a row, else 0 (same pods as gpufrag_pod_gpu_memory_share_bytes).",
            _POD_GPU_LABELS, registry=r,
        )
        self.reads = Counter("gpufrag_agent_nvml_reads", "NVML readings by result.",
                             ("result",), registry=r)
        self.publishes = Counter(
            "gpufrag_agent_annotation_publishes",
            "Usage annotation writes by reason (first, changed, refresh) or failure (error).",
            ("reason",), registry=r,
        )
        self.events = Counter("gpufrag_agent_events", "Kubernetes Events created, by reason.",
                              ("reason",), registry=r)
        self.strays = Gauge(
            "gpufrag_agent_stray_gpu_processes",
            "GPU processes that belong to no live pod on this node, by reason (pod_gone: the "
            "cgroup names a pod the node no longer lists; no_pod: outside any pod).",
            ("reason",), registry=r)
        self.stray_bytes = Gauge(
            "gpufrag_agent_stray_gpu_memory_bytes",
            "GPU memory those processes hold (bytes; read in whole MiB), by reason.",
            ("reason",), registry=r)
        for reason in STRAY_REASONS:
            self.strays.labels(reason)
            self.stray_bytes.labels(reason)
        self.allocation_mismatches = Gauge(
            "gpufrag_agent_gpu_allocation_mismatches",
            "Pods on this node whose containers the device plugin gave GPUs other than the ones "
            "gpu-indices records, by reason (other_gpus: GPUs of this node the record does not "
            "name; unknown_gpu: a GPU the agent does not read here).",
            ("reason",), registry=r)
        for reason in ALLOCATION_MISMATCH_REASONS:
            self.allocation_mismatches.labels(reason)
        self.last_publish_s = Gauge(
            "gpufrag_agent_last_publish_timestamp_seconds",
            "Unix time of the last successful usage annotation write.", registry=r,
        )
        self._gpu_labels: set[tuple[str, ...]] = set()
        self._pod_gpu_labels: set[tuple[str, ...]] = set()
        self._leak_labels: set[tuple[str, ...]] = set()
        self._share_labels: set[tuple[str, ...]] = set()

    def observe_usage(self, usage: NodeGpuUsage,
                      no_utilization: Collection[int] = frozenset()) -> None:
        """The GPU and pod series of one reading; ``no_utilization``: GPUs (by index) whose
        utilisation NVML does not give, which get no utilisation series."""
        gpu_labels: set[tuple[str, ...]] = set()
        pod_gpu_labels: set[tuple[str, ...]] = set()
        for gpu in usage.gpus:
            labels = (str(gpu.index), gpu.uuid, gpu.product, self.node_name)
            gpu_labels.add(labels)
            self.fb_used_mib.labels(*labels).set(gpu.memory_used_mib)
            self.fb_free_mib.labels(*labels).set(gpu.memory_free_mib)
            if gpu.mig_mode or gpu.index in no_utilization:
                # NVML has no GPU-level utilisation in MIG mode (NotSupported); no series
                # rather than a 0 that reads as idle.
                self.gpu_util_pct.remove(*labels)  # a no-op when there is none
            else:
                self.gpu_util_pct.labels(*labels).set(gpu.utilization_pct)
            for pod in gpu.pods:
                pod_labels = (pod.namespace, pod.name, self.node_name, str(gpu.index))
                pod_gpu_labels.add(pod_labels)
                self.pod_memory_bytes.labels(*pod_labels).set(pod.memory_used_mib * MIB)
        for gone in self._gpu_labels - gpu_labels:
            for gauge in (self.fb_used_mib, self.fb_free_mib, self.gpu_util_pct):
                gauge.remove(*gone)
        for gone in self._pod_gpu_labels - pod_gpu_labels:
            self.pod_memory_bytes.remove(*gone)
        self._gpu_labels = gpu_labels
        self._pod_gpu_labels = pod_gpu_labels

    def observe_leaks(self, pods: Iterable[PodRef], suspected: frozenset[PodRef]) -> None:
        """0 or 1 for each pod on a GPU now; series of pods that left are removed."""
        leak_labels: set[tuple[str, ...]] = set()
        for pod in pods:
            labels = (pod.namespace, pod.name)
            leak_labels.add(labels)
            self.leak_suspected.labels(*labels).set(1 if pod in suspected else 0)
        for gone in self._leak_labels - leak_labels:
            self.leak_suspected.remove(*gone)
        self._leak_labels = leak_labels

    def observe_shares(self, checked: Iterable[tuple[Overrun, bool]], min_intervals: int) -> None:
        """The share and the over-share flag of every checked pod-GPU pair; pairs that are no
        longer checked are removed. Over means over for at least ``min_intervals`` readings,
        the same rule as the Event."""
        share_labels: set[tuple[str, ...]] = set()
        for overrun, over in checked:
            labels = (overrun.pod.namespace, overrun.pod.name, self.node_name,
                      str(overrun.gpu_index))
            share_labels.add(labels)
            self.share_bytes.labels(*labels).set(overrun.share_mib * MIB)
            self.over_share.labels(*labels).set(
                1 if over and overrun.intervals >= min_intervals else 0)
        for gone in self._share_labels - share_labels:
            self.share_bytes.remove(*gone)
            self.over_share.remove(*gone)
        self._share_labels = share_labels

    def observe_strays(self, strays: Iterable[tuple[str, int]]) -> None:
        """This interval's strays as (reason, MiB): the count and memory of each reason."""
        count = dict.fromkeys(STRAY_REASONS, 0)
        mib = dict.fromkeys(STRAY_REASONS, 0)
        for reason, memory_mib in strays:
            count[reason] += 1
            mib[reason] += memory_mib
        for reason in STRAY_REASONS:
            self.strays.labels(reason).set(count[reason])
            self.stray_bytes.labels(reason).set(mib[reason] * MIB)

    def observe_allocation_mismatches(self, reasons: Iterable[str]) -> None:
        """This interval's mismatched pods, one reason each: the count of each reason."""
        count = dict.fromkeys(ALLOCATION_MISMATCH_REASONS, 0)
        for reason in reasons:
            count[reason] += 1
        for reason, pods in count.items():
            self.allocation_mismatches.labels(reason).set(pods)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class Health:
    """Liveness and readiness, shared between the loop thread and the HTTP thread."""

    def __init__(self, clock: Callable[[], float], *, stall_after_s: float) -> None:
        self._liveness = Liveness(clock, stall_after_s=stall_after_s)
        self._lock = threading.Lock()
        self._ready = False

    @property
    def ready(self) -> bool:
        with self._lock:
            return self._ready

    def mark_ready(self) -> None:
        with self._lock:
            self._ready = True

    def mark_tick(self, now: float) -> None:
        self._liveness.tick(now)

    def live(self) -> bool:
        return self._liveness.live()


def respond(path: str, metrics: AgentMetrics, health: Health) -> probes.ProbeAnswer:
    """(status, content type, body) for one GET (:func:`gpufrag.probes.respond`)."""
    return probes.respond(path, metrics.render, health.live, lambda: health.ready,
                          stalled="stalled: no reading within the deadline",
                          not_ready="not ready: no reading published yet")


def start_http_server(port: int, metrics: AgentMetrics, health: Health, *,
                      host: str = "0.0.0.0") -> Server:
    """Serve in a daemon thread (:func:`gpufrag.probes.start_http_server`); ``stop()`` it."""
    return probes.start_http_server(port, lambda path: respond(path, metrics, health),
                                    name="agent-http", host=host)
