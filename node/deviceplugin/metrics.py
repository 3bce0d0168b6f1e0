"""What the device plugin exports over HTTP: ``/metrics``, ``/healthz`` and ``/readyz``.

``gpufrag_deviceplugin_inventory_recorded`` is 1 when the GPUs come from a recording
(``--nvml-recording``) rather than the NVIDIA driver, so a dashboard or alert can tell a
recorded node from a real one. Liveness means "the supervisor loop is still ticking"
(registration and kubelet-restart watch); readiness means "registered with the kubelet for
every resource served".
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from gpufrag import probes
from gpufrag.httpserve import Server
from gpufrag.metrics import new_registry
from node.gpus import Gpu

# Allocate must answer well inside the kubelet's patience; buckets resolve the 50 ms target.
_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5)


class PluginMetrics:
    """The plugin's Prometheus series, on its own registry."""

    def __init__(self, node_name: str, *, recorded: bool,
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else new_registry()
        r = self.registry
        self.node_name = node_name
        self.recorded = Gauge("gpufrag_deviceplugin_inventory_recorded",
                              "1 when the GPUs are read from an NVML recording, not a driver.",
                              registry=r)
        self.recorded.set(1 if recorded else 0)
        self.gpu_healthy = Gauge("gpufrag_deviceplugin_gpu_healthy",
                                 "1 while the GPU is reported Healthy to the kubelet.",
                                 ("gpu", "UUID", "model_name", "Hostname"), registry=r)
        self.registered = Gauge("gpufrag_deviceplugin_registered",
                                "1 while registered with the kubelet for the resource.",
                                ("resource",), registry=r)
        self.registrations = Counter("gpufrag_deviceplugin_registrations",
                                     "Registrations with the kubelet by result.",
                                     ("resource", "result"), registry=r)
        self.allocations = Counter("gpufrag_deviceplugin_allocations",
                                   "Allocate calls (per container) by result (ok, refused).",
                                   ("resource", "result"), registry=r)
        self.allocated_containers = Counter(
            "gpufrag_deviceplugin_allocated_containers",
            "Containers given GPUs, by whose choice: record (the extender's gpu-indices "
            "annotation) or kubelet (a whole-GPU pod with no record: the kubelet's devices).",
            ("resource", "source"), registry=r)
        self.allocate_seconds = Histogram("gpufrag_deviceplugin_allocate_seconds",
                                          "Time to answer one Allocate call.", ("resource",),
                                          buckets=_LATENCY_BUCKETS_S, registry=r)
        self.mark_errors = Counter("gpufrag_deviceplugin_mark_errors",
                                   "Failed writes of the gpu-allocated annotation.", registry=r)
        self.refused_records = Counter(
            "gpufrag_deviceplugin_refused_records",
            "Containers refused because their pod's gpu-indices record is not one the "
            "extender signed for this pod on this node (missing, altered, copied or of an "
            "unknown key): a forged record names another pod's GPU.", registry=r)

    def observe_health(self, gpu: Gpu, healthy: bool) -> None:
        self.gpu_healthy.labels(str(gpu.index), gpu.uuid, gpu.product,
                                self.node_name).set(1 if healthy else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def respond(path: str, metrics: PluginMetrics, live: Callable[[], bool],
            ready: Callable[[], bool]) -> probes.ProbeAnswer:
    """(status, content type, body) for one GET (:func:`gpufrag.probes.respond`)."""
    return probes.respond(path, metrics.render, live, ready,
                          stalled="stalled: the supervisor loop or a kubelet call is stuck "
                                  "(see the log)",
                          not_ready="not ready: not registered with the kubelet for every "
                                    "resource")


def start_http_server(port: int, metrics: PluginMetrics, live: Callable[[], bool],
                      ready: Callable[[], bool], *, host: str = "0.0.0.0") -> Server:
    """Serve in a daemon thread (:func:`gpufrag.probes.start_http_server`); ``stop()`` it."""
    return probes.start_http_server(port, lambda path: respond(path, metrics, live, ready),
                                    name="deviceplugin-http", host=host)
