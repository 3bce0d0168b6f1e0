"""The event-loop engine in process (``server.engine: eventloop``): a :class:`LoopServer` on a
loop thread of its own, over a snapshot, reached through real sockets.

Pinned here: filter is answered on the loop's thread while a bind waits on the API server in
another; a verb body over ``INLINE_BODY_BYTES`` is handled off the loop; one connection over
the limit is closed as it is accepted; the health listener's ``/healthz`` fails once the loop
stops ticking; renewed TLS files are served to the next connections; a stop lets the bind in
flight answer and then closes the connections. The whole process (CLI, probes, slow clients,
TLS with client certificates) is pinned in test_server.py, with both engines."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import shutil
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpufrag.loops import new_event_loop
from scheduler.extender import eventloop
from scheduler.extender.config import ExtenderConfig, ServerConfig
from scheduler.extender.eventloop import Heartbeat, LoopServer
from scheduler.extender.runtime import Runtime
from tests.scheduler.extender.helpers import FakeClock, Pki, RecordingBinder, serve
from tests.scheduler.extender.test_contract import NODES, PENDING

FILTER_BODY = orjson.dumps({"Pod": PENDING, "NodeNames": ["gpu-a", "gpu-b", "cpu-1"]})


class GatedBinder(RecordingBinder):
    """Binds only once ``gate`` is set, recording the thread each bind ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.threads: list[str] = []

    def bind(self, namespace: str, name: str, uid: str, node: str,
             gpus: tuple[int, ...] | None, extra: Mapping[str, str] | None = None) -> None:
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        assert self.gate.wait(10), "the test never opened the gate"
        super().bind(namespace, name, uid, node, gpus, extra)


@dataclass
class Running:
    listener: LoopServer
    loop: asyncio.AbstractEventLoop
    binder: GatedBinder
    runtime: Runtime

    @property
    def port(self) -> int:
        return self.listener.port

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(15)


def _run(server: ServerConfig, binder: GatedBinder) -> Iterator[Running]:
    config = replace(ExtenderConfig(), server=server)
    runtime = serve(NODES, [PENDING], config=config, clock=FakeClock(), binder=binder)
    loop = new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-loop", daemon=True)
    thread.start()
    listener = LoopServer(runtime, server, loop)
    running = Running(listener, loop, binder, runtime)
    running.call(listener.start())
    try:
        yield running
    finally:
        binder.gate.set()
        running.call(listener.stop(grace_s=2.0))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


@pytest.fixture
def running() -> Iterator[Running]:
    yield from _run(ServerConfig(host="127.0.0.1", port=_free_port(), threads=2,
                                 read_timeout_s=1.0), GatedBinder())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _post(connection: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, Any]:
    connection.request("POST", path, body, {"Content-Type": "application/json"})
    reply = connection.getresponse()
    return reply.status, orjson.loads(reply.read())


BIND_BODY = orjson.dumps({"PodName": PENDING["metadata"]["name"],
                          "PodNamespace": PENDING["metadata"]["namespace"],
                          "PodUID": PENDING["metadata"]["uid"], "Node": "gpu-a"})


def test_filter_answers_on_the_loop_while_a_bind_waits_in_a_thread(running: Running) -> None:
    binding = http.client.HTTPConnection("127.0.0.1", running.port, timeout=10)
    binding.request("POST", "/bind", BIND_BODY, {"Content-Type": "application/json"})
    assert running.binder.entered.wait(5)
    # The bind holds a thread; filters on another connection are answered meanwhile.
    other = http.client.HTTPConnection("127.0.0.1", running.port, timeout=5)
    for _ in range(3):
        status, answer = _post(other, "/filter", FILTER_BODY)
        assert status == 200 and answer["Error"] == ""
    other.close()
    running.binder.gate.set()
    reply = binding.getresponse()
    assert (reply.status, orjson.loads(reply.read())) == (200, {"Error": ""})
    binding.close()
    assert running.binder.threads and running.binder.threads[0].startswith("verb")


def test_a_large_verb_body_is_handled_off_the_loop(running: Running,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    verbs = running.listener.site.verbs
    handle = verbs.handle

    def recording(verb: str, work: Any, read: Any) -> tuple[int, bytes]:
        seen.append(threading.current_thread().name)
        return handle(verb, work, read)

    monkeypatch.setattr(running.listener.site, "verbs", replace(verbs, handle=recording))
    connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=5)
    assert _post(connection, "/filter", FILTER_BODY)[0] == 200
    monkeypatch.setattr(eventloop, "INLINE_BODY_BYTES", len(FILTER_BODY) - 1)
    status, answer = _post(connection, "/filter", FILTER_BODY)
    assert status == 200 and answer["Error"] == ""
    connection.close()
    assert seen[0] == "test-loop" and seen[1].startswith("verb")


def test_one_connection_over_the_limit_is_closed_as_accepted(running: Running,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.setattr(running.listener.http, "limits",
                        replace(running.listener.http.limits, max_connections=2))
    kept = [http.client.HTTPConnection("127.0.0.1", running.port, timeout=5) for _ in range(2)]
    for connection in kept:
        assert _post(connection, "/filter", FILTER_BODY)[0] == 200
    with socket.create_connection(("127.0.0.1", running.port), timeout=5) as extra:
        extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        with contextlib.suppress(ConnectionResetError):  # (an abort may reset it)
            assert extra.recv(4096) == b""  # closed, nothing answered
    for connection in kept:  # the two kept connections still work
        assert _post(connection, "/filter", FILTER_BODY)[0] == 200
        connection.close()
    assert running.listener.http.refused_connections == 1


def test_healthz_fails_once_the_loop_stops_ticking() -> None:
    clock = FakeClock()
    beat = Heartbeat(stall_after_s=30.0, clock=clock)
    healthz = beat.checked(lambda: (200, "text/plain", b"ok\n"))
    assert healthz() == (200, "text/plain", b"ok\n")
    clock.advance(29.0)
    assert healthz()[0] == 200
    clock.advance(2.0)
    status, _, body = healthz()
    assert status == 503
    assert body == b"event loop stalled for 31.0 s (server.timeout_s 30)\n"
    beat.tick()
    assert healthz()[0] == 200


def test_the_loop_ticks_the_heartbeat(running: Running) -> None:
    before = running.listener.heartbeat.last
    time.sleep(1.3)  # the sweep runs every second at most
    assert running.listener.heartbeat.last > before


def _served_certificate(port: int) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
            context.wrap_socket(sock) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der


def _der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def _tls_files(pki: Pki, folder: Path) -> tuple[Path, Path, ServerConfig]:
    """Copies of the serving certificate and key (the tests replace them), and a server on
    them."""
    cert, key = folder / "tls.crt", folder / "tls.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    return cert, key, ServerConfig(host="127.0.0.1", port=_free_port(),
                                   tls_cert_file=str(cert), tls_key_file=str(key))


def test_renewed_tls_files_are_served_to_new_connections(pki: Pki, tmp_path: Path) -> None:
    cert, key, server = _tls_files(pki, tmp_path)
    for running in _run(server, GatedBinder()):
        assert _served_certificate(running.port) == _der(pki.server_cert)
        reloader = running.listener.reloader
        assert reloader is not None
        shutil.copy(pki.rogue_cert, cert)  # "renewed": another certificate and key
        shutil.copy(pki.rogue_key, key)
        reloader.checked_at -= eventloop.TLS_RELOAD_S  # as if the interval had passed
        running.loop.call_soon_threadsafe(reloader.maybe_reload)
        time.sleep(0.2)
        assert _served_certificate(running.port) == _der(pki.rogue_cert)


def test_tls_files_that_do_not_load_keep_the_old_certificate(pki: Pki, tmp_path: Path) -> None:
    cert, key, server = _tls_files(pki, tmp_path)
    for running in _run(server, GatedBinder()):
        reloader = running.listener.reloader
        assert reloader is not None
        shutil.copy(pki.rogue_cert, cert)  # a new certificate, its key not written yet
        reloader.checked_at -= eventloop.TLS_RELOAD_S
        running.loop.call_soon_threadsafe(reloader.maybe_reload)
        time.sleep(0.2)
        assert _served_certificate(running.port) == _der(pki.server_cert)  # still served
        assert reloader.stamps != reloader._stamps()  # tried again at the next check
        shutil.copy(pki.rogue_key, key)  # now the pair is whole
        reloader.checked_at -= eventloop.TLS_RELOAD_S
        running.loop.call_soon_threadsafe(reloader.maybe_reload)
        time.sleep(0.2)
        assert _served_certificate(running.port) == _der(pki.rogue_cert)


def test_bodies_past_the_buffered_budget_get_503(running: Running,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(running.listener.http, "limits",
                        replace(running.listener.http.limits,
                                max_buffered_bytes=len(FILTER_BODY) - 1))
    connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=5)
    connection.request("POST", "/filter", FILTER_BODY, {"Content-Type": "application/json"})
    reply = connection.getresponse()
    assert reply.status == 503 and reply.getheader("Retry-After") == "1"
    assert "request bytes" in orjson.loads(reply.read())["Error"]
    connection.close()
    assert running.listener.http.buffered == 0  # nothing left counted
    monkeypatch.undo()
    other = http.client.HTTPConnection("127.0.0.1", running.port, timeout=5)
    assert _post(other, "/filter", FILTER_BODY)[0] == 200
    other.close()
    assert running.listener.http.buffered == 0


def test_a_stop_lets_the_bind_in_flight_answer(running: Running) -> None:
    binding = http.client.HTTPConnection("127.0.0.1", running.port, timeout=10)
    binding.request("POST", "/bind", BIND_BODY, {"Content-Type": "application/json"})
    assert running.binder.entered.wait(5)
    idle = socket.create_connection(("127.0.0.1", running.port), timeout=5)
    time.sleep(0.1)
    stopping = asyncio.run_coroutine_threadsafe(running.listener.stop(grace_s=5.0),
                                                running.loop)
    time.sleep(0.2)
    assert idle.recv(10) == b""  # the idle connection is closed at once
    idle.close()
    running.binder.gate.set()
    reply = binding.getresponse()
    assert reply.status == 200 and orjson.loads(reply.read()) == {"Error": ""}
    assert reply.getheader("Connection") == "close"  # stopping: no keep-alive
    stopping.result(5)
    binding.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", running.port), timeout=1).close()
