"""The DevicePlugin gRPC service over a real unix socket, called as the kubelet calls it."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
import structlog

from gpufrag.conventions import RESOURCE_GPU, RESOURCE_GPU_MILLI
from node.deviceplugin.api import HEALTHY, UNHEALTHY, DevicePluginClient, pb
from node.deviceplugin.config import Kind
from node.deviceplugin.server import WORKERS_PER_ENDPOINT, Endpoint
from node.deviceplugin.service import MAX_WATCHERS, DevicePluginServicer
from tests.node.deviceplugin.builders import UUIDS, build_pod
from tests.node.deviceplugin.fakes import Setup, build_allocator


@pytest.fixture
def setup() -> Setup:
    return build_allocator([build_pod("ok", whole=1, gpus="2", created="2026-01-01T00:00:01Z"),
                            build_pod("share", milli=250, gpus="3")])


@contextmanager
def serving(setup: Setup, kind: Kind) -> Iterator[DevicePluginClient]:
    """The service for ``kind`` on a real unix socket, and a client of it."""
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


@pytest.fixture(params=[Kind.WHOLE, Kind.SHARE])
def served(request: pytest.FixtureRequest, setup: Setup) -> Iterator[DevicePluginClient]:
    with serving(setup, request.param) as client:
        yield client


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
    with serving(setup, Kind.WHOLE) as client:
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
    counts = {tuple(s.labels.values()): s.value for m in setup.metrics.registry.collect()
              if m.name == "gpufrag_deviceplugin_allocations" for s in m.samples
              if s.name.endswith("_total")}
    assert counts == {(RESOURCE_GPU, "ok"): 1.0, (RESOURCE_GPU, "refused"): 1.0}


def test_preferred_allocation_answers_per_container(served: DevicePluginClient) -> None:
    reply = served.get_preferred_allocation(pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=list(UUIDS),
                                               allocation_size=1)]), timeout=5)
    assert len(reply.container_responses) == 1


@pytest.mark.parametrize(("ids", "problem"), [
    (["GPU-not-ours"], "1 device ID(s) this plugin never advertised ('GPU-not-ours')"),
    ([UUIDS[0], UUIDS[0]], "a device ID is named more than once"),
    ([f"{UUIDS[0]}::000"], "never advertised"),  # a share's ID on the whole-GPU resource
])
def test_ids_never_advertised_or_repeated_are_refused_before_any_allocation(
        setup: Setup, ids: list[str], problem: str) -> None:
    with serving(setup, Kind.WHOLE) as client:
        for call in (lambda: client.allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=5),
                     lambda: client.pre_start_container(
                         pb.PreStartContainerRequest(devices_ids=ids), timeout=5)):
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert problem in (refused.value.details() or "")
        # Nothing was given: the pod waiting for one GPU still gets its recorded one.
        ok = client.allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[UUIDS[0]])]), timeout=5)
        assert ok.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == UUIDS[2]


def test_extra_list_and_watch_streams_are_refused_and_allocate_still_answers(
        setup: Setup) -> None:
    streams = []
    with serving(setup, Kind.WHOLE) as client:
        try:
            for _ in range(MAX_WATCHERS):  # what the kubelet may hold: each one is served
                stream = client.list_and_watch(pb.Empty(), timeout=30)
                assert len(next(stream).devices) == 4
                streams.append(stream)
            for _ in range(WORKERS_PER_ENDPOINT):  # every further one is refused at once
                extra = client.list_and_watch(pb.Empty(), timeout=30)
                with pytest.raises(grpc.RpcError) as refused:
                    next(extra)
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            ok = client.allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[UUIDS[0]])]), timeout=5)
            assert ok.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == UUIDS[2]
        finally:
            for stream in streams:
                stream.cancel()
