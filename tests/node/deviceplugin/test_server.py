"""Serving, registering, and registering again when the kubelet restarts.

The kubelet here is a small stand-in Registration service that does what the real one does on
Register (dial the plugin's socket back and ask for its options); the real device manager does
the same in test_kubelet_harness.py.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import structlog

from gpufrag.probes import Liveness
from node.deviceplugin.api import (
    VERSION,
    DevicePluginClient,
    add_registration_service,
    pb,
    unix_target,
)
from node.deviceplugin.config import Kind
from node.deviceplugin.server import Supervisor
from node.deviceplugin.service import DevicePluginServicer
from tests.node.deviceplugin.fakes import build_allocator


@dataclass
class FakeKubelet:
    socket_dir: Path
    requests: list[pb.RegisterRequest] = field(default_factory=list)
    refuse: bool = False
    server: grpc.Server | None = None

    def register(self, request: pb.RegisterRequest,
                 context: grpc.ServicerContext) -> pb.Empty:
        if self.refuse:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "resource name taken")
        client = DevicePluginClient(str(self.socket_dir / request.endpoint))
        try:
            client.get_device_plugin_options(pb.Empty(), timeout=5)
        finally:
            client.close()
        self.requests.append(request)
        return pb.Empty()

    def start(self) -> None:
        """As the kubelet starts: remove every socket in the directory, then listen."""
        for entry in self.socket_dir.iterdir():
            if entry.is_socket():
                entry.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        add_registration_service(server, self.register)
        server.add_insecure_port(unix_target(str(self.socket_dir / "kubelet.sock")))
        server.start()
        self.server = server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait()
            self.server = None


@pytest.fixture
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dp-") as name:
        yield Path(name)


def _supervisor(folder: Path) -> Supervisor:
    setup = build_allocator([], socket_dir=str(folder))
    servicers = [DevicePluginServicer(kind, setup.config.resource(kind), setup.board,
                                      setup.allocator, setup.metrics,
                                      log=structlog.get_logger("test"))
                 for kind in (Kind.WHOLE, Kind.SHARE)]
    return Supervisor(setup.config, servicers, setup.metrics, Liveness(lambda: 0.0,
                      stall_after_s=1), log=structlog.get_logger("test"))


def test_registers_each_resource_once_the_kubelet_is_there(folder: Path) -> None:
    supervisor = _supervisor(folder)
    kubelet = FakeKubelet(folder)
    try:
        supervisor.tick()  # no kubelet yet: nothing to do, nothing served
        assert not supervisor.ready and not any(e.serving for e in supervisor.endpoints)
        kubelet.start()
        supervisor.tick()
        assert supervisor.ready
        assert [(r.version, r.resource_name, r.endpoint) for r in kubelet.requests] == [
            (VERSION, "nvidia.com/gpu", "gpufrag-whole.sock"),
            (VERSION, "gpufrag.io/gpu-milli", "gpufrag-share.sock")]
        assert all(r.options.get_preferred_allocation_available for r in kubelet.requests)
        supervisor.tick()  # nothing changed: no new registration
        assert len(kubelet.requests) == 2
    finally:
        supervisor.stop()
        kubelet.stop()
    assert not any(p.suffix == ".sock" and p.name.startswith("gpufrag")
                   for p in folder.iterdir())


def test_a_restarted_kubelet_gets_fresh_sockets_and_a_new_registration(folder: Path) -> None:
    supervisor = _supervisor(folder)
    kubelet = FakeKubelet(folder)
    try:
        kubelet.start()
        supervisor.tick()
        kubelet.stop()
        supervisor.tick()  # kubelet.sock is still there (a crash): nothing seen yet
        kubelet.start()  # removes the plugin's sockets, creates a new kubelet.sock
        assert not os.path.exists(folder / "gpufrag-whole.sock")
        supervisor.tick()
        assert supervisor.ready and len(kubelet.requests) == 4
        assert os.path.exists(folder / "gpufrag-whole.sock")
    finally:
        supervisor.stop()
        kubelet.stop()


def test_a_refused_registration_is_retried(folder: Path) -> None:
    supervisor = _supervisor(folder)
    kubelet = FakeKubelet(folder, refuse=True)
    try:
        kubelet.start()
        supervisor.tick()
        assert not supervisor.ready and kubelet.requests == []
        kubelet.refuse = False
        supervisor.tick()
        assert supervisor.ready and len(kubelet.requests) == 2
    finally:
        supervisor.stop()
        kubelet.stop()


def test_a_dead_kubelets_socket_fails_registration_at_once(folder: Path) -> None:
    """A kubelet that died leaves kubelet.sock behind with nobody listening: registering fails
    at once and is retried at the next look, so a SIGTERM meanwhile is not held up by the
    registration timeout (10 s per resource)."""
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(folder / "kubelet.sock"))
    stale.close()  # the file stays; connecting to it is refused
    supervisor = _supervisor(folder)
    kubelet = FakeKubelet(folder)
    try:
        started = time.monotonic()
        supervisor.tick()
        assert not supervisor.ready
        assert time.monotonic() - started < 3.0
        kubelet.start()  # the kubelet comes back: the next look registers
        supervisor.tick()
        assert supervisor.ready and len(kubelet.requests) == 2
    finally:
        supervisor.stop()
        kubelet.stop()
