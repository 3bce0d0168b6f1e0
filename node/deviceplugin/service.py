"""The ``DevicePlugin`` gRPC service for one resource (whole GPUs or shares).

Options: GetPreferredAllocation is offered (it is how the kubelet's books are steered to the
GPUs the extender chose) and PreStartContainer is required: between admission and the start of
a container (an image pull can take minutes) a GPU may fail, and the kubelet then keeps the
container from starting on it and retries, instead of starting it on a lost GPU.

ListAndWatch sends the full device list at once and again on every health change; a stream
holds only the version it last sent, so its memory does not grow with the number of changes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
from structlog.typing import FilteringBoundLogger

from node.deviceplugin.allocator import AllocationRefused, Allocator
from node.deviceplugin.api import pb
from node.deviceplugin.config import Kind
from node.deviceplugin.devices import DeviceList
from node.deviceplugin.inventory import HealthBoard
from node.deviceplugin.metrics import PluginMetrics

OPTIONS = pb.DevicePluginOptions(pre_start_required=True,
                                 get_preferred_allocation_available=True)
STREAM_POLL_S = 1.0  # how often a waiting stream notices that its caller went away


class DevicePluginServicer:
    """Serves one resource; conforms to :class:`node.deviceplugin.api.DevicePluginService`."""

    def __init__(self, kind: Kind, resource: str, board: HealthBoard, allocator: Allocator,
                 metrics: PluginMetrics, *, log: FilteringBoundLogger) -> None:
        self.kind = kind
        self.resource = resource
        self._board = board
        self._devices = DeviceList(kind, board.gpus)
        self._allocator = allocator
        self._metrics = metrics
        self._log = log.bind(resource=resource)

    def GetDevicePluginOptions(self, request: pb.Empty,
                               context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return OPTIONS

    def ListAndWatch(self, request: pb.Empty,
                     context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
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
        return pb.PreferredAllocationResponse(container_responses=[
            pb.ContainerPreferredAllocationResponse(
                deviceIDs=self._allocator.preferred(self.kind, container))
            for container in request.container_requests])

    def Allocate(self, request: pb.AllocateRequest,
                 context: grpc.ServicerContext) -> pb.AllocateResponse:
        started = time.perf_counter()
        responses = []
        try:
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
            self._allocator.prestart(request.devices_ids)
        except AllocationRefused as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.PreStartContainerResponse()
