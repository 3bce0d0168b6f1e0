"""What the DRA driver exports over HTTP: ``/metrics``, ``/healthz`` and ``/readyz``.

Liveness means "the publish loop is still turning"; readiness means "the kubelet has
registered the driver and this node's slice is published".
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import generate_latest

from gpufrag import probes
from gpufrag.httpserve import Server
from gpufrag.metrics import new_registry


class DriverMetrics:
    """The driver's Prometheus series, on its own registry."""

    def __init__(self, *, recorded: bool, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else new_registry()
        self.inventory_recorded = Gauge(
            "gpufrag_dra_inventory_recorded",
            "1 when the GPUs come from an NVML recording (--nvml-recording), not the driver.",
            registry=r)
        self.inventory_recorded.set(1 if recorded else 0)
        self.claims = Counter(
            "gpufrag_dra_claims",
            "Claims the kubelet asked to prepare or unprepare, by call and outcome "
            "(ok, error).", ["call", "outcome"], registry=r)
        self.slice_syncs = Counter(
            "gpufrag_dra_slice_syncs",
            "Passes that checked this node's ResourceSlice, by result (created, replaced, "
            "unchanged, failed).", ["result"], registry=r)
        self.health_streams = Gauge(
            "gpufrag_dra_health_streams",
            "NodeWatchResources streams open (the kubelet keeps one).", registry=r)
        self.health_streams_refused = Counter(
            "gpufrag_dra_health_streams_refused",
            "NodeWatchResources calls refused because the most streams were open.", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def start_http_server(port: int, metrics: DriverMetrics, live: Callable[[], bool],
                      ready: Callable[[], bool], *, host: str = "0.0.0.0") -> Server:
    """Serve in a daemon thread (:func:`gpufrag.probes.start_http_server`); ``stop()`` it."""
    return probes.start_http_server(
        port, lambda path: probes.respond(
            path, metrics.render, live, ready,
            stalled="stalled: the slice publish loop is stuck (see the log)",
            not_ready="not ready: not registered with the kubelet, or the slice is not "
                      "published"),
        name="dra-http", host=host)
