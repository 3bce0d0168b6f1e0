"""The ``DevicePlugin`` gRPC service for one resource (whole GPUs or shares).

Options: GetPreferredAllocation is offered (it is how the kubelet's books are steered to the
GPUs the extender chose) and PreStartContainer is required: between admission and the start of
a container (an image pull can take minutes) a GPU may fail, and the kubelet then keeps the
container from starting on it and retries, instead of starting it on a lost GPU.

ListAndWatch sends the full device list at once and again on every health change; a stream
holds only the version it last sent, so its memory does not grow with the number of changes.
Each open stream holds one of the endpoint's worker threads, so at most ``MAX_WATCHERS`` are
served at once (the kubelet needs one; a second covers a re-registration while the old stream
ends): more are refused with RESOURCE_EXHAUSTED, and Allocate always has threads left.

Allocate and PreStartContainer take only device IDs this plugin advertised, each once: the
kubelet never sends others, so an unknown or repeated ID is a caller that is not the kubelet
(or a kubelet bug), and is refused with INVALID_ARGUMENT before anything is allocated.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import grpc
from structlog.typing import FilteringBoundLogger

from gpufrag.probes import Liveness
from node.deviceplugin.allocator import AllocationRefused, Allocator
from node.deviceplugin.api import pb
from node.deviceplugin.config import Kind
from node.deviceplugin.devices import DeviceList
from node.deviceplugin.metrics import PluginMetrics
from node.health import HealthBoard

OPTIONS = pb.DevicePluginOptions(pre_start_required=True,
                                 get_preferred_allocation_available=True)
STREAM_POLL_S = 1.0  # how often a waiting stream notices that its caller went away
MAX_WATCHERS = 2  # ListAndWatch streams served at once (each holds a worker thread)


class DevicePluginServicer:
    """Serves one resource; conforms to :class:`node.deviceplugin.api.DevicePluginService`."""

    def __init__(self, kind: Kind, resource: str, board: HealthBoard, allocator: Allocator,
                 metrics: PluginMetrics, *, log: FilteringBoundLogger,
                 liveness: Liveness | None = None) -> None:
        self.kind = kind
        # Every call the kubelet waits on counts as work in progress: one stuck past the
        # bound fails the liveness probe (gpufrag.probes.Liveness), so the plugin is restarted.
        self._liveness = liveness or Liveness(time.monotonic, stall_after_s=float("inf"))
        self.resource = resource
        self._board = board
        self._devices = DeviceList(kind, board.gpus)
        self._allocator = allocator
        self._metrics = metrics
        self._log = log.bind(resource=resource)
        self._watchers = threading.BoundedSemaphore(MAX_WATCHERS)

    def _check_ids(self, ids: Sequence[str], context: grpc.ServicerContext) -> None:
        """Abort the call unless every ID is one this plugin advertised, each once."""
        problem = self._devices.problem(ids)
        if problem is not None:
            self._metrics.allocations.labels(self.resource, "refused").inc()
            self._log.warning("device_ids_refused", problem=problem)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)

    def GetDevicePluginOptions(self, request: pb.Empty,
                               context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return OPTIONS

    def ListAndWatch(self, request: pb.Empty,
                     context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        if not self._watchers.acquire(blocking=False):
            self._log.warning("list_and_watch_refused", open=MAX_WATCHERS)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{MAX_WATCHERS} ListAndWatch streams are open already (the kubelet "
                          "needs one)")
        try:
            yield from self._watch(context)
        finally:
            self._watchers.release()

    def _watch(self, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        version, health = self._board.snapshot()
        self._log.info("list_and_watch_opened", gpus=len(health),
                       unhealthy=sorted(u for u, ok in health.items() if not ok))
        yield self._devices.response(health)
        while context.is_active() and not self._board.closed:
            now = self._board.wait_change(version, STREAM_POLL_S)
            if now != version:
                version, health = self._board.snapshot()
                yield self._devices.response(health)

    def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest,
                               context: grpc.ServicerContext) -> pb.PreferredAllocationResponse:
        with self._liveness.working(f"GetPreferredAllocation ({self.resource})"):
            return pb.PreferredAllocationResponse(container_responses=[
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=self._allocator.preferred(self.kind, container))
                for container in request.container_requests])

    def Allocate(self, request: pb.AllocateRequest,
                 context: grpc.ServicerContext) -> pb.AllocateResponse:
        for container in request.container_requests:
            self._check_ids(container.devices_ids, context)
        started = time.perf_counter()
        responses = []
        try:
            with self._liveness.working(f"Allocate ({self.resource})"):
                for container in request.container_requests:
                    responses.append(self._allocator.allocate(self.kind, container.devices_ids))
        except AllocationRefused as exc:
            self._metrics.allocations.labels(self.resource, "refused").inc()
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        finally:
            self._metrics.allocate_seconds.labels(self.resource).observe(
                time.perf_counter() - started)
        self._metrics.allocations.labels(self.resource, "ok").inc(len(responses))
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: pb.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> pb.PreStartContainerResponse:
        try:
            self._check_ids(request.devices_ids, context)
            with self._liveness.working(f"PreStartContainer ({self.resource})"):
                self._allocator.prestart(request.devices_ids)
        except AllocationRefused as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.PreStartContainerResponse()
