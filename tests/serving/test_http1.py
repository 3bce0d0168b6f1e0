"""gpufrag serve's own HTTP/1.1 framing (serving/http1.py) and its v2 front end, over raw sockets
against a real server.

Each test writes bytes the way a real client (or a broken or hostile one) would and reads the
answers back as bytes: pipelining answered in order, requests split into tiny reads, malformed
request lines, oversized headers, slow and stalled clients, a disconnect mid-body, chunked
bodies, ``Expect: 100-continue``, HEAD and wrong methods, and a 503 sent before the body.
The server's close (issue 44) is driven with its loop held while clients connect and send, so
what it meets is set by the test, not by timing: connections still in the kernel's accept
queue, a request racing the close of its idle keep-alive connection, pipelined requests - each
answered, never reset.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import json
import socket
import struct
import termios
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
import requests

from devkit.procs import wait_until
from serving.config import BatcherConfig
from serving.frontend import HttpLimits
from serving.testing import FakeBackend, ThreadedServer
from tests.sockets import closed_by_peer

FAST = BatcherConfig(max_batch_size=8, max_queue_delay_s=0.0, max_queue_size=8,
                     default_timeout_s=5.0)
LIMITS = HttpLimits(max_header_bytes=4096, max_headers=20, header_timeout_s=0.4,
                    body_timeout_s=0.4, keepalive_timeout_s=0.6)
BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                               "data": [1, 2, 3, 4]}]}).encode()


def infer(body: bytes = BODY, *extra: str) -> bytes:
    head = ["POST /v2/models/fake/infer HTTP/1.1", "Host: t", f"Content-Length: {len(body)}",
            *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def get(path: str, *extra: str, method: str = "GET") -> bytes:
    return ("\r\n".join([f"{method} {path} HTTP/1.1", "Host: t", *extra]) + "\r\n\r\n").encode()


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    """One raw connection; :meth:`reply` reads one answer framed by its Content-Length."""

    def __init__(self, server: ThreadedServer) -> None:
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def reply(self, *, head_only: bool = False) -> Reply:
        while b"\r\n\r\n" not in self.buffer:
            if not self._fill():
                raise ConnectionError(f"closed before an answer; got {self.buffer!r}")
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = 0 if head_only or status == 100 else int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            if not self._fill():
                raise ConnectionError("closed mid-body")
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return Reply(status, headers, body)

    def closed_by_server(self, timeout_s: float = 3.0) -> bool:
        """True once the server has closed the connection (EOF or reset), nothing more sent."""
        return closed_by_peer(self.sock, timeout_s)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedServer]:
    with ThreadedServer(FakeBackend(), FAST, max_body_bytes=1024, limits=LIMITS) as running:
        yield running


@pytest.fixture
def client(server: ThreadedServer) -> Iterator[Client]:
    connection = Client(server)
    yield connection
    connection.close()


wait_for = partial(wait_until, timeout_s=5.0, what="the test's condition",
                   interval_s=0.005)


# -- keep-alive, pipelining, partial reads -----------------------------------------------------

def test_pipelined_requests_are_answered_in_order_on_one_connection(client: Client) -> None:
    client.send(get("/v2/health/live") + infer() + get("/v2/models/fake/ready")
                + infer(BODY[:-1]) + get("/nowhere"))
    replies = [client.reply() for _ in range(5)]
    assert [r.status for r in replies] == [200, 200, 200, 400, 404]
    assert replies[0].json() == {"live": True}
    assert replies[1].json()["outputs"][0]["data"] == [2, 4, 6, 8]
    assert replies[2].json() == {"name": "fake", "version": "1", "ready": True}
    assert "malformed JSON" in replies[3].json()["error"]
    assert replies[4].json() == {"error": "no route for /nowhere"}
    assert not client.closed_by_server(0.1)  # still open: keep-alive


def test_a_fast_answer_waits_behind_a_slow_one_before_it() -> None:
    gate = threading.Event()
    with ThreadedServer(FakeBackend(gate=gate), FAST) as server:
        client = Client(server)
        client.send(infer() + get("/v2/health/live"))  # the GET is answered at once, but 2nd
        # Both requests were parsed by the time the infer reaches the (held) model: the GET's
        # answer is ready and must still wait behind the infer's.
        wait_for(lambda: bool(server.backend.entered))
        client.sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            client.sock.recv(1)  # nothing may be written before the infer answer
        gate.set()
        client.sock.settimeout(5)
        first, second = client.reply(), client.reply()
        assert "outputs" in first.json() and second.json() == {"live": True}
        client.close()


def test_a_request_split_into_tiny_writes_is_read_whole(client: Client) -> None:
    data = infer()
    for i in range(0, len(data), 7):
        client.send(data[i:i + 7])
        time.sleep(0.001)
    reply = client.reply()
    assert reply.status == 200 and reply.json()["outputs"][1]["data"] == [10]


def test_client_connection_close_and_http_1_0_close_after_the_answer(
        server: ThreadedServer) -> None:
    for request in (get("/v2/health/live", "Connection: close"),
                    b"GET /v2/health/live HTTP/1.0\r\n\r\n"):
        client = Client(server)
        client.send(request)
        reply = client.reply()
        assert reply.status == 200 and reply.headers["connection"] == "close"
        assert client.closed_by_server()
        client.close()
    client = Client(server)  # HTTP/1.0 asking for keep-alive gets it, and says so
    client.send(b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert client.reply().headers["connection"] == "keep-alive"
    assert not client.closed_by_server(0.1)
    client.close()


def test_an_absolute_form_target_is_routed_like_its_path(client: Client) -> None:
    client.send(get("http://t:8000/v2/health/live?x=1") + get("/v2/models/fake/ready?verbose"))
    assert client.reply().json() == {"live": True}
    assert client.reply().status == 200


# -- methods -----------------------------------------------------------------------------------

def test_head_has_the_get_headers_and_no_body(client: Client) -> None:
    client.send(get("/v2", method="HEAD") + get("/v2/health/live"))
    head = client.reply(head_only=True)
    assert head.status == 200 and int(head.headers["content-length"]) > 0
    assert client.reply().json() == {"live": True}  # the next answer follows directly


@pytest.mark.parametrize(("request_bytes", "allow"), [
    (get("/v2/models/fake/infer"), "POST"),
    (get("/v2/health/live", "Content-Length: 2", method="POST") + b"{}", "GET, HEAD"),
])
def test_a_wrong_method_is_405_with_allow(client: Client, request_bytes: bytes,
                                          allow: str) -> None:
    client.send(request_bytes + get("/v2/health/live"))
    reply = client.reply()
    assert reply.status == 405 and reply.headers["allow"] == allow
    assert reply.json() == {"error": "Method Not Allowed"}
    assert client.reply().status == 200  # the body (if any) was skipped, the connection lives


# -- bodies ------------------------------------------------------------------------------------

def chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def test_a_chunked_body_is_decoded(client: Client) -> None:
    client.send(b"POST /v2/models/fake/infer HTTP/1.1\r\nHost: t\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + chunked(BODY, 10))
    reply = client.reply()
    assert reply.status == 200, reply.body
    assert reply.json()["outputs"][0]["data"] == [2, 4, 6, 8]


def test_a_chunked_body_over_the_limit_is_413_and_the_connection_closes(client: Client) -> None:
    client.send(b"POST /v2/models/fake/infer HTTP/1.1\r\nHost: t\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + chunked(b" " * 3000, 500))
    reply = client.reply()
    assert reply.status == 413 and "1024 byte limit" in reply.json()["error"]
    assert reply.headers["connection"] == "close" and client.closed_by_server()


def test_expect_100_continue_gets_continue_then_the_answer(client: Client) -> None:
    head, body = infer(BODY, "Expect: 100-continue").split(b"\r\n\r\n", 1)
    client.send(head + b"\r\n\r\n")
    assert client.reply().status == 100  # before the body is sent
    client.send(body)
    assert client.reply().status == 200


def test_expect_100_continue_over_the_limit_gets_413_without_continue(client: Client) -> None:
    client.send(b"POST /v2/models/fake/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n"
                b"Expect: 100-continue\r\n\r\n")
    reply = client.reply()  # the body is never sent: the answer comes without it
    assert reply.status == 413 and reply.headers["connection"] == "close"


def test_an_oversized_body_is_read_and_dropped_so_the_client_sees_the_413(
        client: Client) -> None:
    client.send(infer(b" " * 5000))
    reply = client.reply()
    assert reply.status == 413 and reply.headers["connection"] == "close"
    assert client.closed_by_server()


def test_a_refused_body_that_arrives_after_the_413_is_read_then_the_connection_closes() -> None:
    with ThreadedServer(FakeBackend(), FAST, max_body_bytes=1024,
                        limits=HttpLimits(body_timeout_s=30.0)) as server:
        client = Client(server)
        head, body = infer(b" " * 50_000).split(b"\r\n\r\n", 1)
        client.send(head + b"\r\n\r\n")
        reply = client.reply()  # answered from the headers
        assert reply.status == 413 and reply.headers["connection"] == "close"
        client.send(body + get("/v2/health/live"))  # read and dropped; the GET is not read
        started = time.monotonic()
        assert client.closed_by_server(timeout_s=5.0)  # at the body's end, not in 30 s
        assert time.monotonic() - started < 5.0 and client.buffer == b""
        client.close()


def test_a_503_comes_before_the_body_and_the_connection_stays_usable() -> None:
    gate = threading.Event()
    config = BatcherConfig(max_batch_size=1, max_queue_delay_s=0.0, max_queue_size=1,
                           default_timeout_s=10.0, retry_after_s=3)
    with ThreadedServer(FakeBackend(gate=gate), config) as server:
        batcher = server.state.batcher
        assert batcher is not None
        def batches() -> tuple[int, int]:
            return server.call(lambda: (batcher.inflight_batches, batcher.depth))

        busy = [Client(server) for _ in range(2)]
        for c, state in zip(busy, [(1, 0), (2, 1)], strict=True):
            c.send(infer())  # one computing (held), then one waiting: the queue is full
            wait_for(lambda s=state: batches() == s)  # type: ignore[misc]
        client = Client(server)
        head, body = infer().split(b"\r\n\r\n", 1)
        client.send(head + b"\r\n\r\n")  # headers only: the 503 must not wait for the body
        refused = client.reply()
        assert refused.status == 503 and refused.headers["retry-after"] == "3"
        assert "connection" not in refused.headers
        client.send(body + get("/v2/health/live"))  # the dropped body, then the next request
        assert client.reply().json() == {"live": True}
        gate.set()
        assert [c.reply().status for c in busy] == [200, 200]
        for c in (*busy, client):
            c.close()


def test_a_client_gone_mid_body_is_forgotten(server: ThreadedServer) -> None:
    client = Client(server)
    client.send(infer()[:-10])
    wait_for(lambda: server.call(lambda: server.state.active_requests) == 1)
    client.close()
    wait_for(lambda: server.call(lambda: server.state.active_requests) == 0)
    other = Client(server)
    other.send(infer())
    assert other.reply().status == 200
    other.close()


# -- bad and hostile requests ------------------------------------------------------------------

@pytest.mark.parametrize("garbage", [
    b"NONSENSE\r\n\r\n",
    b"GET /v2 HTTP/9.9\r\n\r\n",
    b"GET /v2 HTTP/1.1\r\nBad Header Line\r\n\r\n",
    b"POST /v2/models/fake/infer HTTP/1.1\r\nContent-Length: nine\r\n\r\n",
    b"POST /v2/models/fake/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello on the plain port
])
def test_a_malformed_request_is_400_and_the_connection_closes(client: Client,
                                                              garbage: bytes) -> None:
    client.send(garbage)
    reply = client.reply()
    assert reply.status == 400 and reply.headers["connection"] == "close"
    assert reply.json()["error"].startswith("malformed HTTP request")
    assert client.closed_by_server()


@pytest.mark.parametrize(("request_bytes", "status", "needle"), [
    (get("/v2/health/live", "X-Big: " + "a" * 5000), 431, "larger than the 4096 byte limit"),
    (get("/v2/health/live", *[f"X-{i}: 1" for i in range(25)]), 431, "more than 20 headers"),
    (get("/v2/" + "a" * 5000), 414, "request target is longer"),
    (get("/v2/health/live", "Expect: something-else"), 417, "only 100-continue"),
])
def test_oversized_headers_are_refused_and_the_connection_closes(
        client: Client, request_bytes: bytes, status: int, needle: str) -> None:
    client.send(request_bytes)
    reply = client.reply()
    assert reply.status == status and needle in reply.json()["error"]
    assert client.closed_by_server()


def test_headers_that_never_finish_get_408(client: Client) -> None:
    client.send(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n")  # no blank line, ever
    started = time.monotonic()
    reply = client.reply()
    assert reply.status == 408 and "headers not complete within 0.4 s" in reply.body.decode()
    assert time.monotonic() - started < 3.0
    assert client.closed_by_server()


def test_a_body_that_stalls_gets_408(server: ThreadedServer, client: Client) -> None:
    client.send(infer()[:-10])
    reply = client.reply()
    assert reply.status == 408 and "body stalled" in reply.body.decode()
    assert client.closed_by_server()
    wait_for(lambda: server.call(lambda: server.state.active_requests) == 0)


def test_an_idle_keep_alive_connection_is_closed(client: Client) -> None:
    client.send(get("/v2/health/live"))
    assert client.reply().status == 200
    assert client.closed_by_server(timeout_s=3.0)  # after ~0.6 s of silence


def test_a_connection_that_never_sends_is_closed(client: Client) -> None:
    assert client.closed_by_server(timeout_s=3.0)


def test_an_upgrade_request_is_answered_as_http_1_1_then_the_connection_closes(
        client: Client) -> None:
    client.send(get("/v2/health/live", "Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c",
                    "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA") + b"PRI * HTTP/2.0\r\n\r\nSM")
    reply = client.reply()
    assert reply.status == 200 and reply.json() == {"live": True}
    assert client.closed_by_server() and client.buffer == b""


def test_a_70_mb_body_announced_over_the_limit_still_gets_its_413_read() -> None:
    # A client that sends its whole body before reading (as requests does): the server
    # answers from the headers and reads the rest to drop it, so the client is not reset
    # mid-send and reads the 413.
    with ThreadedServer(FakeBackend(), FAST, max_body_bytes=1024 * 1024) as server:
        response = requests.post(f"{server.url}/v2/models/fake/infer",
                                 data=b" " * 70_000_000, timeout=60)
        assert response.status_code == 413
        assert "exceeds the 1048576 byte limit" in response.json()["error"]


# -- closing: the listener stops without resetting what it accepted ---------------------------

def unacknowledged_bytes(sock: socket.socket) -> int:
    """Bytes written on ``sock`` that the peer's kernel has not acknowledged yet (SIOCOUTQ):
    0 once everything sent is in the server's receive queue, read by it or not."""
    raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    return int(struct.unpack("i", raw)[0])


class HeldLoop:
    """Holds the server's event loop inside one callback, so clients connect and send while
    nothing is accepted or read. On release that callback, still before the loop reads
    anything, starts the front end's close (``then="close"``: its first step runs before the
    I/O callbacks of the next poll, on the standard loop), or tells each open connection the
    server is closing (``"close_when_done"``: the bytes just sent wait unread), or does
    nothing. Whatever runs first, every request that reached the server must be answered."""

    def __init__(self, server: ThreadedServer, grace_s: float = 5.0, *,
                 then: str = "close") -> None:
        self.server = server
        self.grace_s = grace_s
        self.then = then
        self.entered = threading.Event()
        self.release = threading.Event()
        self.closed: concurrent.futures.Future[None] = concurrent.futures.Future()

    def __enter__(self) -> HeldLoop:
        self.server.loop.call_soon_threadsafe(self._hold)
        assert self.entered.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()

    def _hold(self) -> None:
        self.entered.set()
        self.release.wait(10)
        if self.then == "close_when_done":
            for connection in list(self.server.front_end.connections):
                connection.close_when_done()
        if self.then != "close":
            return
        task = asyncio.ensure_future(self.server.front_end.close(self.grace_s))
        task.add_done_callback(lambda done: self.closed.set_result(done.result()))


def refused(server: ThreadedServer) -> bool:
    try:
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_connections_queued_for_accept_when_the_listener_closes_are_answered() -> None:
    with ThreadedServer(FakeBackend(), FAST) as server:
        with HeldLoop(server) as held:
            queued = [Client(server) for _ in range(6)]  # in the kernel's accept queue
            for client in queued:
                client.send(infer())
            wait_for(lambda: all(unacknowledged_bytes(c.sock) == 0 for c in queued))
        for client in queued:
            reply = client.reply()
            assert reply.status == 200 and reply.headers["connection"] == "close"
            assert client.closed_by_server()
            client.close()
        held.closed.result(timeout=10)
        assert refused(server)


def test_a_queued_connection_whose_request_comes_after_the_listener_closed_is_answered() -> None:
    # (a linger far longer than the test may take: the request is waited for, not raced)
    with ThreadedServer(FakeBackend(), FAST, limits=HttpLimits(close_linger_s=60.0)) as server:
        with HeldLoop(server, grace_s=60.0) as held:
            client = Client(server)  # accepted by the kernel; nothing sent yet
        wait_for(lambda: refused(server))
        client.send(infer())
        reply = client.reply()
        assert reply.status == 200 and reply.headers["connection"] == "close"
        assert client.closed_by_server()
        held.closed.result(timeout=10)
        client.close()


def test_a_queued_connection_that_never_sends_is_closed_after_the_linger_not_the_grace(
        ) -> None:
    with ThreadedServer(FakeBackend(), FAST, limits=HttpLimits(close_linger_s=0.2)) as server:
        with HeldLoop(server, grace_s=60.0) as held:
            client = Client(server)
        assert client.closed_by_server(timeout_s=10.0) and client.buffer == b""
        client.close()
        held.closed.result(timeout=10)  # long before the 60 s grace


def test_a_request_racing_the_close_of_its_idle_keep_alive_connection_is_answered() -> None:
    with ThreadedServer(FakeBackend(), FAST) as server:
        client = Client(server)
        client.send(get("/v2/health/live"))
        assert "connection" not in client.reply().headers  # kept alive, now idle
        with HeldLoop(server, then="close_when_done"):
            client.send(infer())  # arrives while the server decides to close the idle ones
            wait_for(lambda: unacknowledged_bytes(client.sock) == 0)
        reply = client.reply()
        assert reply.status == 200 and reply.headers["connection"] == "close"
        assert client.closed_by_server()
        client.close()


def test_pipelined_requests_read_before_the_close_are_all_answered_the_last_closing() -> None:
    with ThreadedServer(FakeBackend(), FAST) as server:
        client = Client(server)
        client.send(get("/v2/health/live"))
        assert client.reply().status == 200  # accepted, kept alive, now idle
        with HeldLoop(server) as held:
            client.send(infer() + infer() + infer())
            wait_for(lambda: unacknowledged_bytes(client.sock) == 0)
        replies = [client.reply() for _ in range(3)]
        assert [r.status for r in replies] == [200, 200, 200]
        assert [r.headers.get("connection") for r in replies] == [None, None, "close"]
        assert client.closed_by_server()
        held.closed.result(timeout=10)
        client.close()


def test_a_connection_reading_a_refused_body_as_the_server_closes_closes_once_it_is_read(
        ) -> None:
    with ThreadedServer(FakeBackend(), FAST) as server:
        client = Client(server)
        head, body = (get("/nowhere", "Content-Length: 2000", method="POST")
                      + b" " * 2000).split(b"\r\n\r\n", 1)
        client.send(head + b"\r\n\r\n")
        assert "connection" not in client.reply().headers  # 404 before the body, kept alive
        closing = asyncio.run_coroutine_threadsafe(server.front_end.close(60.0), server.loop)
        wait_for(lambda: refused(server))  # the close has begun, the body not yet sent
        client.send(body)  # read and dropped; then the connection is idle, and closes
        assert client.closed_by_server(timeout_s=10.0) and client.buffer == b""
        client.close()
        closing.result(timeout=10)  # long before the 60 s grace


def test_once_draining_requests_pipelined_before_the_closing_answer_are_answered() -> None:
    with ThreadedServer(FakeBackend(), FAST) as server:
        server.call(lambda: setattr(server.state, "draining", True))
        client = Client(server)
        with HeldLoop(server, then="nothing"):  # both arrive before either is read
            client.send(infer() + infer())
            wait_for(lambda: unacknowledged_bytes(client.sock) == 0)
        replies = [client.reply(), client.reply()]
        assert [r.status for r in replies] == [200, 200]
        assert [r.headers.get("connection") for r in replies] == [None, "close"]
        assert client.closed_by_server()
        client.close()


def test_an_idle_keep_alive_connection_is_half_closed_at_once_when_the_server_closes() -> None:
    with ThreadedServer(FakeBackend(), FAST) as server:
        client = Client(server)
        client.send(get("/v2/health/live"))
        assert client.reply().status == 200
        closing = asyncio.run_coroutine_threadsafe(server.front_end.close(30.0), server.loop)
        assert client.closed_by_server(timeout_s=5.0) and client.buffer == b""
        client.close()  # the client's close ends the server's lingering read
        closing.result(timeout=10)  # well within the 30 s grace
