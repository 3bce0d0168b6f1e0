"""The DevicePlugin gRPC service over a real unix socket, called as the kubelet calls it."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import structlog

from gpufrag.conventions import RESOURCE_GPU, RESOURCE_GPU_MILLI
from node.deviceplugin.api import HEALTHY, UNHEALTHY, DevicePluginClient, pb
from node.deviceplugin.config import Kind
from node.deviceplugin.server import Endpoint
from node.deviceplugin.service import DevicePluginServicer
from tests.node.deviceplugin.builders import UUIDS, build_pod
from tests.node.deviceplugin.fakes import Setup, build_allocator


@pytest.fixture
def setup() -> Setup:
    return build_allocator([build_pod("ok", whole=1, gpus="2", created="2026-01-01T00:00:01Z"),
                            build_pod("share", milli=250, gpus="3")])


@pytest.fixture(params=[Kind.WHOLE, Kind.SHARE])
def served(request: pytest.FixtureRequest, setup: Setup) -> Iterator[DevicePluginClient]:
    kind: Kind = request.param
    resource = RESOURCE_GPU if kind is Kind.WHOLE else RESOURCE_GPU_MILLI
    servicer = DevicePluginServicer(kind, resource, setup.board, setup.allocator,
                                    setup.metrics, log=structlog.get_logger("test"))
    with tempfile.TemporaryDirectory(prefix="dp-") as folder:
        endpoint = Endpoint(servicer, str(Path(folder) / f"{kind.value}.sock"))
        endpoint.start()
        client = DevicePluginClient(endpoint.socket_path)
        try:
            yield client
        finally:
            client.close()
            setup.board.close()
            endpoint.stop(grace_s=0.1)


def test_options_ask_for_preferred_allocation_and_prestart(served: DevicePluginClient) -> None:
    options = served.get_device_plugin_options(pb.Empty(), timeout=5)
    assert options.get_preferred_allocation_available and options.pre_start_required


def test_list_and_watch_sends_the_devices_then_each_health_change(
        served: DevicePluginClient, setup: Setup) -> None:
    stream = served.list_and_watch(pb.Empty(), timeout=10)
    first = next(stream)
    per_gpu = len(first.devices) // 4
    assert per_gpu in (1, 1000)
    assert {d.health for d in first.devices} == {HEALTHY}
    setup.board.set(UUIDS[1], False, "lost")
    second = next(stream)
    unhealthy = [d.ID for d in second.devices if d.health == UNHEALTHY]
    assert len(unhealthy) == per_gpu and all(i.startswith(UUIDS[1]) for i in unhealthy)
    setup.board.set(UUIDS[1], True)
    assert {d.health for d in next(stream).devices} == {HEALTHY}
    stream.cancel()


def test_allocate_refusal_is_a_failed_precondition_with_the_reason(setup: Setup) -> None:
    servicer = DevicePluginServicer(Kind.WHOLE, RESOURCE_GPU, setup.board, setup.allocator,
                                    setup.metrics, log=structlog.get_logger("test"))
    with tempfile.TemporaryDirectory(prefix="dp-") as folder:
        endpoint = Endpoint(servicer, str(Path(folder) / "w.sock"))
        endpoint.start()
        client = DevicePluginClient(endpoint.socket_path)
        try:
            ok = client.allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[UUIDS[0]])]), timeout=5)
            assert ok.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == UUIDS[2]
            with pytest.raises(grpc.RpcError) as refused:
                client.allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=[UUIDS[0], UUIDS[1]])]), timeout=5)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "no pod on node gpu-node-1 is waiting for 2 nvidia.com/gpu" in (
                refused.value.details() or "")
            client.pre_start_container(pb.PreStartContainerRequest(devices_ids=[UUIDS[0]]),
                                       timeout=5)
        finally:
            client.close()
            endpoint.stop(grace_s=0.1)
    counts = {tuple(s.labels.values()): s.value for m in setup.metrics.registry.collect()
              if m.name == "gpufrag_deviceplugin_allocations" for s in m.samples
              if s.name.endswith("_total")}
    assert counts == {(RESOURCE_GPU, "ok"): 1.0, (RESOURCE_GPU, "refused"): 1.0}


def test_preferred_allocation_answers_per_container(served: DevicePluginClient) -> None:
    reply = served.get_preferred_allocation(pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=list(UUIDS),
                                               allocation_size=1)]), timeout=5)
    assert len(reply.container_responses) == 1
