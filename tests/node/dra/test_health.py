"""The kubelet's DRA health stream (``NodeWatchResources``) over a real unix socket, with a real
gRPC client as the kubelet's: the first message, a change pushed at once, the periodic resend,
a cancelled or over-the-cap stream, and the board closing."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog

from devkit.procs import wait_until
from node.dra.api import HealthClient, add_health_service, healthpb
from node.dra.health import MISSED_REFRESHES, HealthServicer
from node.dra.metrics import DriverMetrics
from node.dra.slices import build_slices, device_uuids
from node.health import HealthBoard
from node.unixgrpc import listen_unix, stop_unix
from tests.node.dra.builders import NODE, UUIDS, build_gpus

GPUS = build_gpus(2)
MIG = {1: True}  # GPU 0 whole, GPU 1 cut into its partitions
DEVICES = device_uuids(build_slices(NODE, "gpu.gpufrag.io", GPUS, MIG))
LONG_S = 3600.0  # a refresh far past the test: every message after the first is a change


@dataclass
class Served:
    board: HealthBoard
    servicer: HealthServicer
    client: HealthClient
    metrics: DriverMetrics


@contextmanager
def serving(*, refresh_s: float = LONG_S, max_streams: int = 2) -> Iterator[Served]:
    root = Path(tempfile.mkdtemp(prefix="drah-"))  # unix socket paths must stay short
    path = str(root / "dra.sock")
    board = HealthBoard(GPUS)
    metrics = DriverMetrics(recorded=True)
    servicer = HealthServicer(board, DEVICES, pool=NODE, refresh_s=refresh_s, metrics=metrics,
                              max_streams=max_streams, log=structlog.get_logger("test"),
                              clock=lambda: 1_700_000_000.0)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add_health_service(server, servicer)
    listen_unix(server, path)
    server.start()
    client = HealthClient(path)
    try:
        yield Served(board, servicer, client, metrics)
    finally:
        client.close()
        board.close()
        stop_unix(server, [path], 1.0)
        shutil.rmtree(root)


@pytest.fixture
def served() -> Iterator[Served]:
    with serving() as running:
        yield running


def watch(served: Served) -> Any:
    return served.client.node_watch_resources(healthpb.NodeWatchResourcesRequest(), timeout=30)


def health(response: healthpb.NodeWatchResourcesResponse) -> dict[str, str]:
    return {d.device.device_name: healthpb.HealthStatus.Name(d.health)
            for d in response.devices}


def test_the_first_message_lists_every_published_device_healthy(served: Served) -> None:
    stream = watch(served)
    first = next(stream)
    names = [d.device.device_name for d in first.devices]
    assert names[0] == "gpu-0" and len(names) == len(DEVICES) > 2  # GPU 1's partitions too
    assert names == [name for name, _ in DEVICES]
    assert {d.device.pool_name for d in first.devices} == {NODE}
    assert set(health(first).values()) == {"HEALTHY"}
    assert {d.last_updated_time for d in first.devices} == {1_700_000_000}
    assert {d.health_check_timeout_seconds for d in first.devices} == {
        MISSED_REFRESHES * int(LONG_S)}
    assert {d.message for d in first.devices} == {""}
    stream.cancel()


def test_a_gpu_turning_unhealthy_is_pushed_for_all_its_devices_and_back(served: Served) -> None:
    stream = watch(served)
    next(stream)
    served.board.set(UUIDS[1], False, "NVMLError_GpuIsLost")
    changed = next(stream)
    by_name = {d.device.device_name: d for d in changed.devices}
    assert by_name["gpu-0"].health == healthpb.HEALTHY
    assert by_name["gpu-0"].message == ""
    partitions = [d for name, d in by_name.items() if name != "gpu-0"]
    assert partitions and {d.health for d in partitions} == {healthpb.UNHEALTHY}
    assert {d.message for d in partitions} == {"NVMLError_GpuIsLost"}
    served.board.set(UUIDS[1], True)
    assert set(health(next(stream)).values()) == {"HEALTHY"}
    stream.cancel()


def test_the_list_is_sent_again_each_refresh_with_nothing_changed() -> None:
    with serving(refresh_s=0.05) as served:
        stream = watch(served)
        first, again = next(stream), next(stream)
        assert again == first  # same devices, same health, same (fixed) clock
        assert served.board.version == 0  # no change made the second one
        assert {d.health_check_timeout_seconds for d in first.devices} == {1}
        stream.cancel()


def test_a_cancelled_stream_ends_and_frees_its_slot(served: Served) -> None:
    stream = watch(served)
    next(stream)
    assert served.servicer.open_streams == 1
    stream.cancel()
    wait_until(lambda: served.servicer.open_streams == 0, timeout_s=10,
               what="the cancelled stream's slot freed")
    with pytest.raises(grpc.RpcError) as raised:
        next(stream)
    assert raised.value.code() == grpc.StatusCode.CANCELLED


def test_a_stream_past_the_cap_is_refused_and_one_is_taken_again_once_freed() -> None:
    with serving(max_streams=1) as served:
        first = watch(served)
        next(first)
        extra = watch(served)
        with pytest.raises(grpc.RpcError) as raised:
            next(extra)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "1 NodeWatchResources streams are open" in str(raised.value.details())
        assert served.servicer.open_streams == 1
        metrics = served.metrics.render().decode()
        assert "gpufrag_dra_health_streams 1.0" in metrics
        assert "gpufrag_dra_health_streams_refused_total 1.0" in metrics
        first.cancel()
        wait_until(lambda: served.servicer.open_streams == 0, timeout_s=10,
                   what="the first stream's slot freed")
        assert "gpufrag_dra_health_streams 0.0" in served.metrics.render().decode()
        again = watch(served)
        assert set(health(next(again)).values()) == {"HEALTHY"}
        again.cancel()


def test_closing_the_board_ends_the_stream_cleanly(served: Served) -> None:
    stream = watch(served)
    next(stream)
    served.board.close()
    with pytest.raises(StopIteration):
        next(stream)
    assert stream.code() == grpc.StatusCode.OK
    wait_until(lambda: served.servicer.open_streams == 0, timeout_s=10,
               what="the ended stream's slot freed")
