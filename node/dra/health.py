"""The kubelet's DRA health service (KEP-4680, ``DRAResourceHealth.NodeWatchResources``):
every device this driver publishes, with its GPU's health, streamed to the kubelet, which shows
an allocated device's health in ``pod.status.containerStatuses[].allocatedResourcesStatus``.

One source of truth: the :class:`node.health.HealthBoard` the health thread writes (the same
pass that taints an unhealthy GPU's devices in the ResourceSlice). Every device of a GPU (the
whole-GPU device, or each of its MIG partitions) shares that GPU's health; the device list is
read from the slices the driver builds (:func:`node.dra.slices.device_uuids`), so the stream
names exactly the devices kube-scheduler can allocate.

A stream sends the whole list at once, again as soon as the board changes, and again every
``refresh_s`` even when nothing changed. The resend is needed: the kubelet stamps each device
with the time it received it and shows it ``Unknown`` once that is older than the device's
``health_check_timeout_seconds`` (30 s when unset; ``pkg/kubelet/cm/dra/healthinfo.go``).
This driver sets that timeout to :data:`MISSED_REFRESHES` refreshes, so a driver that stops
sending shows ``Unknown`` after that many missed ones rather than a stale ``Healthy``.

The kubelet keeps one stream per driver connection and opens a new one 5 s after one ends. A
stream holds one of the gRPC server's worker threads for its whole life, so at most
``max_streams`` run at once (two: the kubelet's and a restarted kubelet's while the old
connection is being noticed gone); one more is refused with ``RESOURCE_EXHAUSTED``, saying so
(``gpufrag_dra_health_streams`` counts the open ones, ``..._refused_total`` the refusals).
A stream ends when its client cancels (the RPC's termination callback wakes it at once), when
the board closes (the driver stops) or when the server stops.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import grpc
from structlog.typing import FilteringBoundLogger

from node.dra.api import healthpb
from node.dra.metrics import DriverMetrics
from node.health import HealthBoard

MISSED_REFRESHES = 3
DEFAULT_MAX_STREAMS = 2


class HealthServicer:
    """``NodeWatchResources`` over a :class:`HealthBoard` (module docstring)."""

    def __init__(self, board: HealthBoard, devices: Sequence[tuple[str, str]], *, pool: str,
                 refresh_s: float, metrics: DriverMetrics, log: FilteringBoundLogger,
                 max_streams: int = DEFAULT_MAX_STREAMS,
                 clock: Callable[[], float] = time.time) -> None:
        """``devices``: (device name, its GPU's UUID) of every published device; ``pool``:
        their pool (the node's name)."""
        self._board = board
        self._devices = tuple(devices)
        self._pool = pool
        self._refresh_s = refresh_s
        self._timeout_s = max(1, math.ceil(MISSED_REFRESHES * refresh_s))
        self._metrics = metrics
        self._log = log
        self._max_streams = max_streams
        self._clock = clock
        self._lock = threading.Lock()
        self._open = 0

    @property
    def open_streams(self) -> int:
        with self._lock:
            return self._open

    def response(self) -> healthpb.NodeWatchResourcesResponse:
        """Every device's health now."""
        _, healthy = self._board.snapshot()
        now = int(self._clock())
        out = []
        for name, uuid in self._devices:
            ok = healthy.get(uuid, False)
            out.append(healthpb.DeviceHealth(
                device=healthpb.DeviceIdentifier(pool_name=self._pool, device_name=name),
                health=healthpb.HEALTHY if ok else healthpb.UNHEALTHY,
                last_updated_time=now, health_check_timeout_seconds=self._timeout_s,
                message="" if ok else self._board.reason(uuid)))
        return healthpb.NodeWatchResourcesResponse(devices=out)

    def NodeWatchResources(self, request: healthpb.NodeWatchResourcesRequest,
                           context: grpc.ServicerContext
                           ) -> Iterator[healthpb.NodeWatchResourcesResponse]:
        with self._lock:
            refused = self._open >= self._max_streams
            if not refused:
                self._open += 1
                self._metrics.health_streams.set(self._open)
        if refused:
            self._metrics.health_streams_refused.inc()
            self._log.warning("health_stream_refused", open=self._max_streams)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{self._max_streams} NodeWatchResources streams are open, the most "
                          "this driver serves; the kubelet keeps one per driver connection, "
                          "so cancel a stale one and call again")
        ended = threading.Event()

        def end() -> None:  # the RPC terminated, however: free the slot once, wake the stream
            if not ended.is_set():
                ended.set()
                with self._lock:
                    self._open -= 1
                    self._metrics.health_streams.set(self._open)
                self._board.wake()

        if not context.add_callback(end):  # already over before it began
            end()
            return
        self._log.info("health_stream_opened", devices=len(self._devices))
        try:
            yield from self._stream(context, ended)
        finally:
            self._log.info("health_stream_ended", client_gone=not context.is_active())

    def _stream(self, context: grpc.ServicerContext, ended: threading.Event
                ) -> Iterator[healthpb.NodeWatchResourcesResponse]:
        seen = self._board.version
        yield self.response()
        due = time.monotonic() + self._refresh_s
        while True:
            version = self._board.wait_change(seen, max(0.0, due - time.monotonic()))
            if ended.is_set() or not context.is_active() or self._board.closed:
                return
            if version == seen and time.monotonic() < due:
                continue  # woken for another stream's end
            seen = version
            yield self.response()
            due = time.monotonic() + self._refresh_s
