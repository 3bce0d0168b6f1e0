"""The real server: ``gpufrag extender --cluster-snapshot`` on 127.0.0.1, with each engine
(``server.engine``: the event loop and gunicorn).

Slow clients hold a request thread for at most ``server.read_timeout_s`` (gunicorn) or
nothing at all (the event loop), and never the probe listener; a chunked body over the limit is
a 413 like an announced one; with TLS and a client CA, only clients with a certificate signed
by that CA get an answer. Plus the pieces in process: gunicorn's options and the probe
listener."""

from __future__ import annotations

import http.client
import math
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from gunicorn.config import Config as GunicornConfig

from scheduler.extender.app import ProbeAnswer
from scheduler.extender.config import ServerConfig
from scheduler.extender.server import HealthServer, ListenError, _Gunicorn, gunicorn_options
from scheduler.kube.snapshot import write_snapshot
from tests.builders import node
from tests.scheduler.extender.helpers import Pki, serve
from tests.scheduler.extender.test_contract import FILTER_KEYS, NODES, PENDING
from tests.sockets import closed_by_peer

THREADS = 2
READ_TIMEOUT_S = 1.5
MAX_BODY_BYTES = 4096
FILTER_BODY = orjson.dumps({"Pod": PENDING, "NodeNames": ["gpu-a", "gpu-b", "cpu-1"]})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    health_port: int
    log_path: Path
    engine: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("snapshot") / "cluster.json"
    write_snapshot(path, NODES, [PENDING])
    return path


def _start(snapshot: Path, log_path: Path, *settings: str, engine: str,
           timeout_s: float = 20.0) -> Iterator[Server]:
    port, health_port = _free_port(), _free_port()
    args = [sys.executable, "-m", "gpufrag.cli", "extender", "--cluster-snapshot", str(snapshot),
            "--host", "127.0.0.1", "--port", str(port), "--threads", str(THREADS),
            "--set", f"server.health_port={health_port}",
            "--set", f"server.read_timeout_s={READ_TIMEOUT_S}",
            "--set", f"server.max_body_bytes={MAX_BODY_BYTES}"]
    for setting in settings:
        args += ["--set", setting]
    with log_path.open("wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL,
                                   env={**os.environ, "GPUFRAG_LOG_FORMAT": "json"})
    server = Server(process, port, health_port, log_path, engine)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            assert process.poll() is None, f"the extender exited:\n{server.log()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz",
                                            timeout=1) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"the extender never got ready:\n{server.log()}"
            time.sleep(0.05)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


ENGINES = ("eventloop", "gunicorn")


@pytest.fixture(scope="module", params=ENGINES)
def server(snapshot: Path, tmp_path_factory: pytest.TempPathFactory,
           request: pytest.FixtureRequest) -> Iterator[Server]:
    engine: str = request.param
    yield from _start(snapshot, tmp_path_factory.mktemp("server") / "extender.log",
                      f"server.engine={engine}", engine=engine)


def _exchange(port: int, raw: bytes, timeout_s: float = 10.0) -> tuple[int, dict[str, object]]:
    """Send ``raw`` as it is; the status and JSON body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(raw)
        reply = http.client.HTTPResponse(sock)
        reply.begin()
        return reply.status, orjson.loads(reply.read())


def _chunked(body: bytes, path: str = "/filter") -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    return head + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


def test_a_chunked_body_over_the_limit_answers_413(server: Server) -> None:
    status, reply = _exchange(server.port, _chunked(FILTER_BODY))
    assert status == 200 and reply["Error"] == ""
    big = orjson.dumps({"Pod": PENDING, "NodeNames": [f"n{i:05d}" for i in range(1000)]})
    assert len(big) > MAX_BODY_BYTES
    status, reply = _exchange(server.port, _chunked(big))
    assert status == 413
    assert set(reply) == FILTER_KEYS
    assert reply["Error"] == (f"request body is larger than the limit of {MAX_BODY_BYTES} bytes "
                              "(server.max_body_bytes)")


def test_a_body_that_stalls_answers_408(server: Server) -> None:
    head = (b"POST /filter HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n")
    started = time.monotonic()
    status, reply = _exchange(server.port, head + b'{"Pod": ')
    assert status == 408
    if server.engine == "gunicorn":  # the deadline is on the whole request
        assert reply["Error"] == (f"request body did not arrive within {READ_TIMEOUT_S:g} s "
                                  "(server.read_timeout_s)")
    else:  # the bound is on each silence: a slow client holds no thread, only a buffer
        assert reply["Error"] == (f"request body stalled: no data for {READ_TIMEOUT_S:g} s "
                                  "(server.read_timeout_s)")
    assert READ_TIMEOUT_S - 0.2 < time.monotonic() - started < READ_TIMEOUT_S + 2


def _answer_s(sock: socket.socket, timeout_s: float) -> float:
    """Seconds until the server closes ``sock`` (a stalled client's connection)."""
    started = time.monotonic()
    sock.settimeout(timeout_s)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - started


@pytest.mark.slow
@pytest.mark.parametrize("server", ["gunicorn"], indirect=True)  # the loop has no such threads
def test_slow_clients_hold_threads_only_for_the_read_timeout(server: Server) -> None:
    # More stalled clients than threads, each having sent half a request line.
    slow = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(THREADS + 2)]
    opened = time.monotonic()
    try:
        for sock in slow:
            sock.sendall(b"POST /filt")
        time.sleep(0.3)  # let them take the threads

        started = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{server.health_port}/healthz",
                                    timeout=2) as reply:
            assert reply.status == 200 and reply.read() == b"ok\n"
        with urllib.request.urlopen(f"http://127.0.0.1:{server.health_port}/readyz",
                                    timeout=2) as reply:
            assert reply.status == 200
        assert time.monotonic() - started < 2

        # A verb waits for a thread, but only until the stalled clients ahead of it in the
        # queue are cut off: each round of them takes at most the read timeout.
        rounds = math.ceil(len(slow) / THREADS)
        started = time.monotonic()
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=15)
        connection.request("POST", "/filter", FILTER_BODY, {"Content-Type": "application/json"})
        reply = connection.getresponse()
        assert reply.status == 200
        assert orjson.loads(reply.read())["NodeNames"] == ["gpu-a"]  # the decision
        connection.close()
        assert time.monotonic() - started < rounds * READ_TIMEOUT_S + 2

        # Every stalled connection was closed by the server within its bound.
        bound_s = (rounds + 1) * READ_TIMEOUT_S + 2
        for sock in slow:
            _answer_s(sock, timeout_s=bound_s)
        assert time.monotonic() - opened < bound_s
    finally:
        for sock in slow:
            sock.close()
    assert "request cut off" in server.log()
    assert "Traceback" not in server.log()


@pytest.mark.parametrize("server", ["eventloop"], indirect=True)
def test_stalled_clients_hold_nothing_on_the_event_loop(server: Server) -> None:
    # Many more stalled clients than threads, each with half a request line or half a body.
    slow = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4 * THREADS)]
    opened = time.monotonic()
    try:
        for i, sock in enumerate(slow):
            sock.sendall(b"POST /filt" if i % 2 else
                         b"POST /filter HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        time.sleep(0.2)
        # The verbs and the probes answer at once, on the verbs' port too.
        started = time.monotonic()
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        for _ in range(3):
            connection.request("POST", "/filter", FILTER_BODY,
                               {"Content-Type": "application/json"})
            reply = connection.getresponse()
            assert reply.status == 200
            assert orjson.loads(reply.read())["NodeNames"] == ["gpu-a"]
        connection.request("GET", "/readyz")
        reply = connection.getresponse()
        assert (reply.status, reply.read()) == (200, b"ok\n")
        connection.close()
        assert time.monotonic() - started < 1.0
        # Each stalled connection gets its 408 and is closed within the read timeout.
        for sock in slow:
            sock.settimeout(READ_TIMEOUT_S + 3)
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
        assert time.monotonic() - opened < READ_TIMEOUT_S + 3
    finally:
        for sock in slow:
            sock.close()
    assert "Traceback" not in server.log()


def test_wrong_methods_and_paths_answer_json_errors(server: Server) -> None:
    status, reply = _exchange(server.port, b"GET /filter HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 405 and "GET /filter" in str(reply["Error"])
    status, reply = _exchange(server.port, b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 404 and "/nothing" in str(reply["Error"])


# ------------------------------------------------------------------------------------ TLS


@pytest.fixture(scope="module", params=ENGINES)
def tls_server(snapshot: Path, pki: Pki, tmp_path_factory: pytest.TempPathFactory,
               request: pytest.FixtureRequest) -> Iterator[Server]:
    engine: str = request.param
    yield from _start(snapshot, tmp_path_factory.mktemp("tls") / "extender.log",
                      f"server.engine={engine}",
                      f"server.tls_cert_file={pki.server_cert}",
                      f"server.tls_key_file={pki.server_key}",
                      f"server.tls_client_ca_file={pki.ca}", engine=engine)


def _https_filter(port: int, pki: Pki, cert: Sequence[Path] = ()) -> int:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    try:
        connection.request("POST", "/filter", FILTER_BODY, {"Content-Type": "application/json"})
        reply = connection.getresponse()
        assert orjson.loads(reply.read())["Error"] == ""
        return reply.status
    finally:
        connection.close()


def test_tls_needs_a_client_certificate_signed_by_the_client_ca(tls_server: Server,
                                                                pki: Pki) -> None:
    assert _https_filter(tls_server.port, pki, (pki.client_cert, pki.client_key)) == 200
    refused = (ssl.SSLError, ConnectionError)  # in the handshake, before any HTTP
    with pytest.raises(refused):
        _https_filter(tls_server.port, pki)
    with pytest.raises(refused):
        _https_filter(tls_server.port, pki, (pki.rogue_cert, pki.rogue_key))
    with pytest.raises(refused):  # and plain HTTP gets nothing either
        _exchange(tls_server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", timeout_s=5)
    assert _https_filter(tls_server.port, pki, (pki.client_cert, pki.client_key)) == 200


def test_a_stalled_tls_handshake_is_cut_off(tls_server: Server, pki: Pki) -> None:
    with socket.create_connection(("127.0.0.1", tls_server.port)) as sock:
        sock.sendall(b"\x16\x03\x01\x00\xff\x01")  # the first bytes of a ClientHello
        assert _answer_s(sock, timeout_s=READ_TIMEOUT_S + 5) < READ_TIMEOUT_S + 2
    assert _https_filter(tls_server.port, pki, (pki.client_cert, pki.client_key)) == 200


def test_no_peer_may_set_forwarding_headers() -> None:
    # Every peer is "trusted" only so that gunicorn skips parsing its address on each
    # request; with no scheme and no forwarder header configured, there is nothing to trust.
    cfg = GunicornConfig()
    options = gunicorn_options(ServerConfig())
    for key in ("forwarded_allow_ips", "secure_scheme_headers", "forwarder_headers"):
        cfg.set(key, options[key])
    assert (cfg.forwarded_allow_ips, cfg.secure_scheme_headers, cfg.forwarder_headers) == (
        ["*"], {}, [])


def test_gunicorn_gets_the_tls_settings(pki: Pki) -> None:
    plain = gunicorn_options(ServerConfig())
    assert plain["bind"] == "127.0.0.1:8888"
    assert not {"certfile", "keyfile", "ca_certs", "cert_reqs"} & set(plain)
    assert plain["worker_class"].read_timeout_s == ServerConfig().read_timeout_s
    server_only = gunicorn_options(ServerConfig(tls_cert_file=str(pki.server_cert),
                                                tls_key_file=str(pki.server_key)))
    assert (server_only["certfile"], server_only["keyfile"]) == (str(pki.server_cert),
                                                                 str(pki.server_key))
    assert "cert_reqs" not in server_only
    mutual = gunicorn_options(ServerConfig(tls_cert_file=str(pki.server_cert),
                                           tls_key_file=str(pki.server_key),
                                           tls_client_ca_file=str(pki.ca), host="::1"))
    assert (mutual["ca_certs"], mutual["cert_reqs"]) == (str(pki.ca), ssl.CERT_REQUIRED)
    assert mutual["bind"] == "[::1]:8888"
    context = mutual["ssl_context"](None, None)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert server_only["ssl_context"](None, None).verify_mode == ssl.CERT_NONE


# --------------------------------------------------------------------- the probe listener


@pytest.fixture
def health() -> Iterator[HealthServer]:
    def ready() -> ProbeAnswer:
        return 200, "text/plain", b"ok\n"

    listener = HealthServer.listen("127.0.0.1", 0)
    listener.max_connections = 4
    listener.start({"/healthz": ready, "/readyz": ready})
    try:
        yield listener
    finally:
        listener.stop()
        listener.listener.close()


def _get(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(raw)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        return data


def test_probe_listener_answers_and_closes(health: HealthServer) -> None:
    answer = _get(health.port, b"GET /healthz?verbose HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nok\n")
    assert b"Connection: close" in answer
    head = _get(health.port, b"HEAD /readyz HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
    assert _get(health.port, b"GET /filter HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404")
    assert _get(health.port, b"POST /healthz HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
    assert _get(health.port, b"hello\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert _get(health.port, b"GET /" + b"x" * 9000).startswith(b"HTTP/1.1 431")


def test_probe_listener_is_not_held_by_stalled_clients(health: HealthServer) -> None:
    stalled = [socket.create_connection(("127.0.0.1", health.port)) for _ in range(10)]
    try:
        for sock in stalled:
            sock.sendall(b"GET /heal")
        started = time.monotonic()
        answer = _get(health.port, b"GET /healthz HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200") and time.monotonic() - started < 1
        # Over max_connections: the oldest stalled connections were dropped for new ones (a
        # close with the client's bytes unread may reach it as a reset: tests/sockets.py).
        assert closed_by_peer(stalled[0], timeout_s=2)
    finally:
        for sock in stalled:
            sock.close()


def test_a_probe_port_in_use_is_an_error_at_start_up(health: HealthServer) -> None:
    with pytest.raises(ListenError, match=f"cannot listen on 127.0.0.1:{health.port} "
                                          r"\(server.health_host, server.health_port\): "):
        HealthServer.listen("127.0.0.1", health.port)


def test_the_worker_takes_the_configured_switch_interval() -> None:
    """Set where the worker loads the app (after the fork), before it serves a request."""
    runtime = serve([node("n1")])
    before = sys.getswitchinterval()
    try:
        app = _Gunicorn(runtime, {}, switch_interval_s=0.002).load()
        assert app is runtime.app
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(before)
        runtime.stop()
