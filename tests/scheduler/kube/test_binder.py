"""KubeBinder's one write: a Binding that carries the GPU annotation and the UID precondition,
POSTed as prebuilt JSON with the client configuration's credentials, and the API server's
refusals turned into messages that say what happened. The server here is a real HTTP server
on a local port that records each request and answers what the test tells it to (the API
server's own answers are pinned by the e2e tests)."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
from collections.abc import Iterator
from typing import Any

import kubernetes
import orjson
import pytest

from gpufrag.conventions import KubeNames
from scheduler.kube import binder as binder_module
from scheduler.kube.binder import BindError, KubeBinder

TOKEN = "t0ken"


class _Server(http.server.ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.answer: tuple[int, bytes] = (201, b'{"kind":"Status","status":"Success"}')
        self.connections: set[tuple[str, int]] = set()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server
    server: _Server

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()},
                                     orjson.loads(body)))
        self.server.connections.add(self.client_address)
        status, answer = self.server.answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    thread = threading.Thread(target=s.serve_forever, daemon=True)
    thread.start()
    yield s
    s.shutdown()
    s.server_close()


def _binder(host: str) -> KubeBinder:
    config = kubernetes.client.Configuration()
    config.host = host
    config.api_key = {"authorization": TOKEN}
    config.api_key_prefix = {"authorization": "Bearer"}
    return KubeBinder(kubernetes.client.ApiClient(config), KubeNames(), pool_size=4)


def _url(server: _Server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def _conflict(message: str) -> tuple[int, bytes]:
    return 409, orjson.dumps({"kind": "Status", "status": "Failure", "reason": "Conflict",
                              "code": 409, "message": message})


def test_a_gpu_bind_is_one_binding_with_the_annotation_and_the_uid(server: _Server) -> None:
    _binder(_url(server)).bind("ns", "p", "uid-1", "n0", (0, 3))
    [(path, headers, body)] = server.requests
    assert path == "/api/v1/namespaces/ns/pods/p/binding"
    assert headers["authorization"] == f"Bearer {TOKEN}"
    assert headers["content-type"] == "application/json"
    assert body == {"apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1",
                                 "annotations": {KubeNames().annotation_gpu_indices: "0,3"}},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": "n0"}}


def test_a_refreshed_token_is_used_within_a_second(server: _Server,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    binder = _binder(_url(server))
    now = [100.0]
    monkeypatch.setattr(binder_module.time, "monotonic", lambda: now[0])
    binder.bind("ns", "p0", "", "n0", None)
    binder.poster._config.api_key = {"authorization": "n3w"}  # the refresh hook's doing
    now[0] += binder_module.AUTH_REFRESH_S / 2
    binder.bind("ns", "p1", "", "n0", None)
    now[0] += binder_module.AUTH_REFRESH_S
    binder.bind("ns", "p2", "", "n0", None)
    assert [r[1]["authorization"] for r in server.requests] == [
        f"Bearer {TOKEN}", f"Bearer {TOKEN}", "Bearer n3w"]


def test_a_cpu_pod_is_bound_without_an_annotation(server: _Server) -> None:
    _binder(_url(server)).bind("ns", "p", "", "n0", None)
    assert server.requests[0][2]["metadata"] == {"name": "p", "namespace": "ns"}


def test_binds_reuse_their_connections_and_keep_the_servers_path_prefix(
        server: _Server) -> None:
    binder = _binder(_url(server) + "/k8s/")
    for i in range(5):
        binder.bind("ns", f"p{i}", "", "n0", (i,))
    assert [r[0] for r in server.requests] == [
        f"/k8s/api/v1/namespaces/ns/pods/p{i}/binding" for i in range(5)]
    assert len(server.connections) == 1


def test_a_failed_uid_precondition_says_the_pod_was_recreated(server: _Server) -> None:
    server.answer = _conflict('Operation cannot be fulfilled on pods "p": Precondition failed: '
                              'UID in precondition: uid-1, UID in object meta: uid-2')
    with pytest.raises(BindError) as caught:
        _binder(_url(server)).bind("ns", "p", "uid-1", "n0", (0,))
    assert str(caught.value) == ("pod ns/p is not the pod to bind: its UID is no longer uid-1 "
                                 "(re-created under the same name)")
    assert not caught.value.retryable


def test_other_refusals_keep_the_api_servers_message(server: _Server) -> None:
    server.answer = _conflict('Operation cannot be fulfilled on pods/binding "p": pod p is '
                              'already assigned to node "n1"')
    with pytest.raises(BindError) as caught:
        _binder(_url(server)).bind("ns", "p", "uid-1", "n0", (0,))
    assert "binding pod ns/p to n0: HTTP 409 Conflict" in str(caught.value)
    assert 'already assigned to node "n1"' in str(caught.value)
    assert not caught.value.retryable


def test_a_server_error_is_retryable(server: _Server) -> None:
    server.answer = (503, b'{"kind":"Status","message":"etcd leader changed"}')
    with pytest.raises(BindError) as caught:
        _binder(_url(server)).bind("ns", "p", "uid-1", "n0", (0,))
    assert caught.value.retryable
    assert "HTTP 503" in str(caught.value) and "etcd leader changed" in str(caught.value)


def test_no_server_is_retryable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(BindError) as caught:
        _binder(f"http://127.0.0.1:{port}").bind("ns", "p", "uid-1", "n0", (0,))
    assert caught.value.retryable
    assert "cannot reach the API server" in str(caught.value)


class _RawServer:
    """A TCP server that answers requests as ``script`` says, one step per request: "answer"
    (201, kept alive), "answer-then-close" (201, then the socket closes without saying so),
    "drop" (close without a byte), "early-hints" (a 103 first, then the 201), "eof-body" (a
    201 with no length, its body ended by closing the socket), "garbage" (bytes that are not
    HTTP)."""

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.requests = 0
        self.connections = 0
        self.closed = threading.Semaphore(0)  # released as each connection closes
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn, contextlib.suppress(OSError):  # the client may reset it: done then
                self._answer(conn)
            self.closed.release()

    def _answer(self, conn: socket.socket) -> None:
        """Answer the requests on ``conn`` as the script says, until it is to close."""
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                data = conn.recv(65536)
                if not data:
                    break
                buffer += data
            if b"\r\n\r\n" not in buffer:
                break
            head, _, rest = buffer.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(rest) < length:
                rest += conn.recv(65536)
            buffer = rest[length:]
            step = self.script.pop(0) if self.script else "answer"
            if step == "drop":
                break
            if step == "garbage":  # not HTTP at all
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                break
            self.requests += 1
            if step == "early-hints":  # an interim answer first, then the real one
                conn.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
            if step == "eof-body":  # no length: the body ends when the socket closes
                conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Type: "
                             b"application/json\r\n\r\n{}")
                break
            conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 2\r\n\r\n{}")
            if step == "answer-then-close":
                break

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> _RawServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def test_a_kept_connection_the_server_closed_is_replaced_by_a_new_one() -> None:
    with _RawServer(["answer-then-close", "answer"]) as server:
        binder = _binder(f"http://127.0.0.1:{server.port}")
        binder.bind("ns", "p0", "", "n0", (0,))
        assert server.closed.acquire(timeout=5)  # the server has closed the kept connection
        binder.bind("ns", "p1", "", "n0", (1,))  # found closed before use: a new one
        assert (server.requests, server.connections) == (2, 2)


def test_a_new_connection_closed_without_an_answer_is_not_sent_twice() -> None:
    with _RawServer(["drop"]) as server:
        with pytest.raises(BindError) as caught:
            _binder(f"http://127.0.0.1:{server.port}").bind("ns", "p", "", "n0", (0,))
        assert caught.value.retryable  # kube-scheduler's retry decides, not a blind resend
        assert "closed the connection" in str(caught.value)
        assert (server.requests, server.connections) == (0, 1)


def test_kept_connections_the_server_closed_are_dropped_before_use() -> None:
    with _RawServer(["answer-then-close"] * 4) as server:
        binder = _binder(f"http://127.0.0.1:{server.port}")
        for i in range(4):  # each kept connection is closed by the time the next bind comes
            binder.bind("ns", f"p{i}", "", "n0", (i,))
            assert server.closed.acquire(timeout=5)
        assert (server.requests, server.connections) == (4, 4)


def test_an_interim_answer_fails_the_bind_and_the_next_bind_reads_its_own() -> None:
    # urllib3's HTTP/1.1 layer would take a 103 for the answer, the real one still unread: the
    # connection is closed rather than left out of step, and the bind is not resent.
    with _RawServer(["early-hints", "answer"]) as server:
        binder = _binder(f"http://127.0.0.1:{server.port}")
        with pytest.raises(BindError, match=r"interim answer \(103\)") as caught:
            binder.bind("ns", "p0", "", "n0", (0,))
        assert caught.value.retryable
        binder.bind("ns", "p1", "", "n0", (1,))
        assert (server.requests, server.connections) == (2, 2)  # a new one, in step


def test_an_answer_ended_by_the_close_is_whole() -> None:
    with _RawServer(["eof-body", "answer"]) as server:
        binder = _binder(f"http://127.0.0.1:{server.port}")
        binder.bind("ns", "p0", "", "n0", (0,))  # not kept: the close ended its answer
        binder.bind("ns", "p1", "", "n0", (1,))
        assert (server.requests, server.connections) == (2, 2)


def test_an_answer_that_is_not_http_is_a_retryable_error_naming_it() -> None:
    with _RawServer(["garbage"]) as server:
        with pytest.raises(BindError) as caught:
            _binder(f"http://127.0.0.1:{server.port}").bind("ns", "p", "", "n0", (0,))
        assert caught.value.retryable
        assert "the API server's answer is not HTTP/1.1" in str(caught.value)
