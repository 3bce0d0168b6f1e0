"""The real server: ``gpufrag extender --cluster-snapshot`` on 127.0.0.1, on the project's one
HTTP server (uvicorn, :mod:`gpufrag.httpserve`): body limits and deadlines, slow clients,
TLS with client certificates, and the probe listener. The gateway's own bounds are pinned in
tests/gpufrag/test_httpserve.py.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import select
import signal
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

from devkit.procs import wait_until
from gpufrag.httpserve import ListenError
from scheduler.extender.config import ServerConfig
from scheduler.extender.server import health_server, verbs_server
from scheduler.kube.snapshot import write_snapshot
from tests.builders import node
from tests.scheduler.extender.helpers import Pki, serve
from tests.scheduler.extender.test_contract import FILTER_KEYS, NODES, PENDING

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

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("snapshot") / "cluster.json"
    write_snapshot(path, NODES, [PENDING])
    return path


def _start(snapshot: Path, log_path: Path, *settings: str,
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
    server = Server(process, port, health_port, log_path)
    def ready() -> bool:
        assert process.poll() is None, f"the extender exited:\n{server.log()}"
        with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz",
                                    timeout=1) as reply:
            return reply.status == 200

    try:
        wait_until(ready, timeout_s=timeout_s, interval_s=0.05,
                   what="the extender to get ready")
        yield server
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.fixture(scope="module")
def server(snapshot: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _start(snapshot, tmp_path_factory.mktemp("server") / "extender.log")


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


def test_a_body_that_stalls_or_trickles_answers_408(server: Server) -> None:
    head = (b"POST /filter HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n")
    started = time.monotonic()
    status, reply = _exchange(server.port, head + b'{"Pod": ')
    assert status == 408
    assert set(reply) == FILTER_KEYS
    assert reply["Error"] == (f"request body did not arrive within {READ_TIMEOUT_S:g} s "
                              "(server.read_timeout_s)")
    assert READ_TIMEOUT_S - 0.2 < time.monotonic() - started < READ_TIMEOUT_S + 2
    # A byte at a time, never silent for long: the deadline is on the whole body.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head)
        started = time.monotonic()
        sock.setblocking(False)
        answer = b""
        while not answer and time.monotonic() - started < READ_TIMEOUT_S + 3:
            with contextlib.suppress(BlockingIOError):
                sock.send(b" ")
            with contextlib.suppress(BlockingIOError):
                answer = sock.recv(4096)
            select.select([sock], [], [], 0.1)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:60]
        assert time.monotonic() - started < READ_TIMEOUT_S + 2


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


def test_stalled_clients_hold_nothing(server: Server) -> None:
    # Many more stalled clients than threads, each with half a request line or half a body.
    slow = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4 * THREADS)]
    opened = time.monotonic()
    try:
        for i, sock in enumerate(slow):
            sock.sendall(b"POST /filt" if i % 2 else
                         b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        # The verbs and the probes answer at once, on the verbs' port and the probes' own.
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
        with urllib.request.urlopen(f"http://127.0.0.1:{server.health_port}/healthz",
                                    timeout=2) as probe:
            assert probe.status == 200 and probe.read() == b"ok\n"
        assert time.monotonic() - started < 2.0
        # Each stalled body gets its 408 within the read timeout and the connection closes.
        for sock in slow[::2]:
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


@pytest.fixture(scope="module")
def tls_server(snapshot: Path, pki: Pki, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Server]:
    yield from _start(snapshot, tmp_path_factory.mktemp("tls") / "extender.log",
                      f"server.tls_cert_file={pki.server_cert}",
                      f"server.tls_key_file={pki.server_key}",
                      f"server.tls_client_ca_file={pki.ca}")


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


# --------------------------------------------------------------------- the probe listener


def _get(port: int, raw: bytes) -> bytes:
    """The whole answer to ``raw`` (sent with ``Connection: close`` after its first line)."""
    first, _, rest = raw.partition(b"\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(first + b"\r\nConnection: close\r\n" + rest if rest else raw)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        return data


def test_the_probe_listener_serves_the_probes_only(server: Server) -> None:
    answer = _get(server.health_port, b"GET /healthz?verbose HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\nok\n")
    metrics = _get(server.health_port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b"gpufrag_extender_requests_total" in metrics
    head = _get(server.health_port, b"HEAD /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
    # No verb here: the probe port is plain HTTP, whatever TLS the verbs' port has.
    refused = _get(server.health_port, b"POST /filter HTTP/1.1\r\nHost: x\r\n"
                                       b"Content-Length: 2\r\n\r\n{}")
    assert refused.startswith(b"HTTP/1.1 404")
    assert _get(server.health_port, b"hello\r\n\r\n").startswith(b"HTTP/1.1 400")


def test_healthz_fails_once_the_verbs_loop_stops_ticking() -> None:
    runtime = serve([node("n1")])
    config = ServerConfig(port=0, health_port=0, timeout_s=0.5)
    verbs = verbs_server(runtime, config)
    health = health_server(runtime, config, verbs).start()
    try:
        # The verbs' loop never ran: its last tick is when it was made, so it stalls.
        wait_until(lambda: _get(health.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                                ).startswith(b"HTTP/1.1 503"), timeout_s=10,
                   what="/healthz to fail on a verbs loop that does not tick")
        answer = _get(health.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"verbs' event loop stalled for" in answer and b"server.timeout_s 0.5" in answer
        verbs.start()
        wait_until(lambda: _get(health.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                                ).startswith(b"HTTP/1.1 200"), timeout_s=10,
                   what="/healthz to pass once the loop ticks")
    finally:
        health.stop()
        verbs.stop()
        runtime.stop()


def test_a_port_in_use_is_an_error_at_start_up(server: Server) -> None:
    runtime = serve([node("n1")])
    try:
        with pytest.raises(ListenError, match=f"cannot listen on 127.0.0.1:{server.port} "
                                              r"\(server.host, server.port\): "):
            verbs_server(runtime, ServerConfig(port=server.port))
    finally:
        runtime.stop()


def test_sigusr1_logs_every_threads_stack_as_json_and_the_extender_keeps_serving(
        server: Server) -> None:
    """``kill -USR1`` on a running extender (gpufrag.diagnose): one JSON ``thread_stack`` line
    per thread, then a summary, and the verbs still answer."""
    before = server.log().count('"thread_stacks"')
    server.process.send_signal(signal.SIGUSR1)
    wait_until(lambda: server.log().count('"thread_stacks"') > before, timeout_s=10,
               interval_s=0.05, what="the stack dump in the extender's log")
    lines = [orjson.loads(line) for line in server.log().splitlines()
             if line.startswith("{") and '"thread_stack' in line]
    stacks = [d for d in lines if d["event"] == "thread_stack"]
    (summary,) = [d for d in lines if d["event"] == "thread_stacks"][before:]
    assert summary["threads"] >= 2 and summary["component"] == "extender"  # loop + probes
    assert {d["thread"] for d in stacks} >= {"MainThread"}
    assert all(d["frames"] and all(" in " in f for f in d["frames"]) for d in stacks)
    status, reply = _exchange(server.port, _chunked(FILTER_BODY))
    assert status == 200 and reply["Error"] == ""
    assert server.process.poll() is None
