"""Serving the app with gunicorn: one worker (the cluster state lives in it), gthread workers'
threads for concurrency, keep-alive long enough for kube-scheduler's connection reuse, and
gunicorn's C request parser whenever it is installed (``pip install gpufrag[fast]``).

Three hardenings on top of gunicorn's gthread worker, each for a way one client could take the
extender from every other (see "Threat model" in docs/operations.md):

- **A deadline per request** (:class:`BoundedThreadWorker`). gthread hands a connection to a
  thread as soon as its first bytes arrive, and the thread then reads the rest with a
  blocking socket that has no timeout: ``server.threads`` clients that send half a request line
  and stall hold every thread for ever, health checks included. Here each request must have
  arrived completely (request line, headers, body; the TLS handshake for a new connection)
  within ``server.read_timeout_s`` of the thread taking it, or its connection is closed (408
  when the headers were in and the body was late); each blocking write of the answer gets as
  long. A thread is therefore held by a slow client for at most that long, however slowly it
  trickles bytes.
- **Probes on a listener of their own** (:class:`HealthServer`, ``server.health_port``):
  ``/healthz``, ``/readyz`` and ``/metrics`` are answered by one thread that never blocks on a
  client, so the kubelet's probes do not queue behind slow verb clients (a liveness probe that
  times out restarts the extender, and with it the whole cluster state, for nothing).
- **TLS with client certificates** (``server.tls_*``), as kube-scheduler's extender
  ``tlsConfig`` expects: gunicorn's ``certfile``/``keyfile``, and with a client CA
  ``ca_certs`` with ``cert_reqs=CERT_REQUIRED``, so a client without a certificate signed by
  that CA fails the handshake and never reaches a verb. The context comes from gunicorn's
  ``ssl_context`` hook (:func:`tls_context_factory`) only so that the handshake, too, is
  bounded by ``server.read_timeout_s``.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from flask import Flask
from gunicorn.app.base import BaseApplication
from gunicorn.http.errors import NoMoreData
from gunicorn.workers.gthread import TConn, ThreadWorker

from scheduler.extender.app import Probe, app_probes
from scheduler.extender.config import ServerConfig
from scheduler.extender.runtime import Runtime

KEEPALIVE_S = 75
# The probe listener: a request line and headers must arrive within this long and fit this
# much; at most this many connections are open at once (the oldest is dropped for a new one).
PROBE_DEADLINE_S = 2.0
PROBE_MAX_REQUEST_BYTES = 8192
PROBE_MAX_CONNECTIONS = 64

log = structlog.get_logger("gpufrag.extender")


class ListenError(RuntimeError):
    """An address the extender cannot listen on (in use, not this host's)."""


# ------------------------------------------------------------------ the per-request deadline


class RequestReadTimeout(NoMoreData, TimeoutError):  # type: ignore[misc]  # gunicorn: untyped
    """A request that did not arrive by its deadline.

    A :class:`TimeoutError`, so that the app answers a late body with 408; and gunicorn's
    ``NoMoreData``, so that a request line or headers cut off by the deadline close the
    connection quietly (as a client that went away) rather than with a traceback in the log."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class _DeadlineSocket:
    """The request parser's view of a connection's socket: every ``recv`` waits only until the
    current request's deadline, so the deadline bounds the whole request, not each read.

    Everything else is the socket's own (gunicorn sets timeouts on it to drain a body, TLS
    reads through it). After each read the socket's timeout goes back to the connection's
    ``read_timeout_s``, which then bounds each blocking write of the answer."""

    def __init__(self, conn: _BoundedConn) -> None:
        self._conn = conn
        self._sock = conn.sock
        self.deadline = time.monotonic() + conn.read_timeout_s

    def recv(self, size: int) -> bytes:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self._conn.cut_off("the request did not arrive")
        self._sock.settimeout(remaining)
        try:
            data: bytes = self._sock.recv(size)
            return data
        except TimeoutError:
            raise self._conn.cut_off("the request did not arrive") from None
        finally:
            with contextlib.suppress(OSError):
                self._sock.settimeout(self._conn.read_timeout_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _peer_text(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


class _BoundedConn(TConn):  # type: ignore[misc]  # gunicorn has no type hints
    """A gthread connection whose every request runs against a deadline.

    gthread calls ``init()`` on the thread that is about to read a request, after making the
    socket blocking (again), for the first request of a connection and every kept-alive one,
    so that is where the deadline starts and the timeouts are put back."""

    read_timeout_s: float = ServerConfig().read_timeout_s
    was_cut_off: bool = False

    def init(self) -> None:
        # The first init() of a TLS connection wraps the socket and shakes hands, bounded by
        # the timeout that _HandshakeBoundedContext puts on the socket as it wraps it.
        try:
            super().init()
        except TimeoutError:
            raise self.cut_off("the TLS handshake did not finish") from None
        self.sock.settimeout(self.read_timeout_s)
        unreader = getattr(self.parser, "unreader", None)
        if unreader is None or not hasattr(unreader, "sock"):  # not HTTP/1 (h2 is off)
            return
        if not isinstance(unreader.sock, _DeadlineSocket):
            unreader.sock = _DeadlineSocket(self)
        unreader.sock.deadline = time.monotonic() + self.read_timeout_s

    def cut_off(self, what: str) -> RequestReadTimeout:
        """Note that this connection missed its deadline (logged once) and say so."""
        if not self.was_cut_off:
            log.warning("request cut off", peer=_peer_text(self.client),
                        reason=f"{what} within server.read_timeout_s",
                        read_timeout_s=self.read_timeout_s)
        self.was_cut_off = True
        return RequestReadTimeout(f"{what} within {self.read_timeout_s:g} s "
                                  "(server.read_timeout_s)")

    def close(self, graceful: bool = False) -> None:
        # A connection cut off by its deadline is closed at once. gunicorn's graceful close
        # lingers, on the worker's one main thread, for up to 2 s until the peer closes too;
        # a stalled client never does, so each would stall every other connection that long.
        if graceful and not self.was_cut_off:
            super().close(graceful=True)
        else:
            super().close()


class BoundedThreadWorker(ThreadWorker):  # type: ignore[misc]  # gunicorn has no type hints
    """gunicorn's gthread worker with a deadline on every request (see the module docstring).

    ``read_timeout_s`` is set on a subclass made by :func:`bounded_worker`, so the setting is
    settled when the server is configured and read by no one else."""

    read_timeout_s: float = ServerConfig().read_timeout_s

    def enqueue_req(self, conn: Any) -> None:
        # gthread makes its connections itself; give each one the deadline before any thread
        # reads from it (this is the one place every connection passes through first).
        if not isinstance(conn, _BoundedConn):
            conn.__class__ = _BoundedConn
            conn.read_timeout_s = self.read_timeout_s
        super().enqueue_req(conn)


def bounded_worker(read_timeout_s: float) -> type[BoundedThreadWorker]:
    """A :class:`BoundedThreadWorker` class for ``read_timeout_s`` (gunicorn takes a class)."""
    return type("BoundedThreadWorker", (BoundedThreadWorker,),
                {"read_timeout_s": read_timeout_s})


class _HandshakeBoundedContext(ssl.SSLContext):
    """An SSL context that puts a timeout on each socket as it wraps it, so that the TLS
    handshake (which gthread runs on a socket it has just made blocking, with no timeout)
    ends within ``server.read_timeout_s`` too; the wrapped socket inherits the timeout."""

    handshake_timeout_s: float = ServerConfig().read_timeout_s

    def wrap_socket(self, sock: socket.socket, server_side: bool = False,
                    do_handshake_on_connect: bool = True, suppress_ragged_eofs: bool = True,
                    server_hostname: str | bytes | None = None,
                    session: ssl.SSLSession | None = None) -> ssl.SSLSocket:
        sock.settimeout(self.handshake_timeout_s)
        return super().wrap_socket(sock, server_side, do_handshake_on_connect,
                                   suppress_ragged_eofs, server_hostname, session)


def tls_context_factory(server: ServerConfig) -> Callable[[Any, Any], ssl.SSLContext]:
    """gunicorn's ``ssl_context`` hook for ``server``: what gunicorn's own default context does
    (the certificate chain; with a client CA, that CA only, and a client certificate required),
    in a :class:`_HandshakeBoundedContext`.

    gunicorn calls it for every new connection, so renewed certificate files are picked up
    without a restart (as with gunicorn's default)."""

    def make(_conf: Any, _default_factory: Any) -> ssl.SSLContext:
        context = _HandshakeBoundedContext(ssl.PROTOCOL_TLS_SERVER)
        context.handshake_timeout_s = server.read_timeout_s
        context.load_cert_chain(certfile=server.tls_cert_file, keyfile=server.tls_key_file)
        if server.tls_client_ca_file:
            context.load_verify_locations(cafile=server.tls_client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    return make


# ------------------------------------------------------------------ the probe listener


@dataclass
class _ProbeConn:
    sock: socket.socket
    deadline: float
    received: bytearray = field(default_factory=bytearray)
    reply: bytes = b""
    draining: bool = False  # answered; reading what the client still sends until it closes


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}


def _http_reply(status: int, content_type: str, body: bytes, *, head: bool = False) -> bytes:
    header = (f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n"
              f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
              "Connection: close\r\n\r\n").encode("ascii")
    return header if head else header + body


class HealthServer:
    """``/healthz``, ``/readyz`` and ``/metrics`` on a listener of their own, answered by one
    thread with a selector: it never blocks on a client, so a slow or stalled one cannot delay
    the next probe (see the module docstring for why that matters).

    Each connection gets one request (HTTP/1.x ``GET`` or ``HEAD``, request line and headers
    within :data:`PROBE_MAX_REQUEST_BYTES`), which must arrive within ``deadline_s``; the answer
    closes the connection. With ``max_connections`` open, a new connection drops the oldest, so
    a flood of idle ones cannot lock the kubelet out either. Plain HTTP: what it serves is
    read-only (see "Threat model" in docs/operations.md).

    The listening socket is made (and bound) by :meth:`listen` before gunicorn forks, so that a
    port in use is an error at start-up and a restarted worker serves the same socket; the
    thread is started in the worker by :meth:`start`.
    """

    def __init__(self, listener: socket.socket, *, deadline_s: float = PROBE_DEADLINE_S,
                 max_connections: int = PROBE_MAX_CONNECTIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.listener = listener
        self.deadline_s = deadline_s
        self.max_connections = max_connections
        self.clock = clock
        self.probes: Mapping[str, Probe] = {}
        self._conns: dict[int, _ProbeConn] = {}  # by file descriptor, oldest first
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def listen(cls, host: str, port: int) -> HealthServer:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
            family, kind, proto, _, address = infos[0]
            sock = socket.socket(family, kind, proto)
        except OSError as e:
            raise ListenError(f"cannot listen on {host}:{port} (server.health_host, "
                              f"server.health_port): {e}") from None
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(128)
        except OSError as e:
            sock.close()
            raise ListenError(f"cannot listen on {host}:{port} (server.health_host, "
                              f"server.health_port): {e.strerror or e}") from None
        sock.setblocking(False)
        return cls(sock)

    @property
    def port(self) -> int:
        port: int = self.listener.getsockname()[1]
        return port

    def start(self, probes: Mapping[str, Probe]) -> None:
        self.probes = probes
        self._thread = threading.Thread(target=self._serve, name="health", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # The loop ------------------------------------------------------------------------------
    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.listener, selectors.EVENT_READ, None)
            while not self._stop.is_set():
                for key, events in selector.select(timeout=0.25):
                    try:
                        if key.data is None:
                            self._accept(selector)
                        elif events & selectors.EVENT_READ and key.data.draining:
                            self._drain(selector, key.data)
                        elif events & selectors.EVENT_READ and not key.data.reply:
                            self._read(selector, key.data)
                        elif events & selectors.EVENT_WRITE:
                            self._write(selector, key.data)
                    except Exception:  # one connection's trouble must not end the loop
                        log.exception("health listener: connection failed")
                        if key.data is not None:
                            self._close(selector, key.data)
                now = self.clock()
                for conn in [c for c in self._conns.values() if c.deadline <= now]:
                    self._close(selector, conn)
            for conn in list(self._conns.values()):
                self._close(selector, conn)

    def _accept(self, selector: selectors.BaseSelector) -> None:
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        sock.setblocking(False)
        while len(self._conns) >= self.max_connections:
            self._close(selector, next(iter(self._conns.values())))
        conn = _ProbeConn(sock, self.clock() + self.deadline_s)
        self._conns[sock.fileno()] = conn
        selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, selector: selectors.BaseSelector, conn: _ProbeConn) -> None:
        try:
            data = conn.sock.recv(PROBE_MAX_REQUEST_BYTES + 1 - len(conn.received))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(selector, conn)
            return
        if not data:
            self._close(selector, conn)
            return
        conn.received += data
        end = conn.received.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.received) > PROBE_MAX_REQUEST_BYTES:
                self._reply(selector, conn, _http_reply(431, "text/plain", b"request too large\n"))
            return
        self._reply(selector, conn, self._answer(bytes(conn.received[:end])))

    def _answer(self, head: bytes) -> bytes:
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return _http_reply(400, "text/plain", b"not an HTTP/1.x request\n")
        method, target = parts[0], parts[1].split(b"?", 1)[0].decode("latin-1")
        probe = self.probes.get(target)
        if probe is None:
            known = ", ".join(self.probes)
            return _http_reply(404, "text/plain", f"not found: try {known}\n".encode())
        if method not in (b"GET", b"HEAD"):
            return _http_reply(405, "text/plain", b"only GET and HEAD\n")
        status, content_type, body = probe()
        return _http_reply(status, content_type, body, head=method == b"HEAD")

    def _reply(self, selector: selectors.BaseSelector, conn: _ProbeConn, reply: bytes) -> None:
        conn.reply = reply
        selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(selector, conn)

    def _write(self, selector: selectors.BaseSelector, conn: _ProbeConn) -> None:
        try:
            sent = conn.sock.send(conn.reply)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(selector, conn)
            return
        conn.reply = conn.reply[sent:]
        if conn.reply:
            return
        # Answered. Closing now, with request bytes still unread, would make the kernel reset
        # the connection and could cost the client the answer: half-close and read what it
        # still sends until it closes (or its deadline passes), without ever waiting for it.
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(selector, conn)
            return
        conn.draining = True
        selector.modify(conn.sock, selectors.EVENT_READ, conn)

    def _drain(self, selector: selectors.BaseSelector, conn: _ProbeConn) -> None:
        try:
            if conn.sock.recv(65536):
                return
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass
        self._close(selector, conn)

    def _close(self, selector: selectors.BaseSelector, conn: _ProbeConn) -> None:
        fd = conn.sock.fileno()
        if fd >= 0 and self._conns.pop(fd, None) is not None:
            with contextlib.suppress(KeyError, ValueError):
                selector.unregister(conn.sock)
        conn.sock.close()


# ------------------------------------------------------------------ gunicorn


class _Gunicorn(BaseApplication):  # type: ignore[misc]  # gunicorn has no type hints
    def __init__(self, runtime: Runtime, options: dict[str, Any],
                 health: HealthServer | None = None, *,
                 switch_interval_s: float) -> None:
        self.runtime = runtime
        self.switch_interval_s = switch_interval_s
        self.options = options
        self.health = health
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Flask:
        # Runs in the worker after the fork: the watch, maintenance and health threads start
        # here (threads do not survive a fork; the health listener's socket does).
        sys.setswitchinterval(self.switch_interval_s)
        self.runtime.start()
        if self.health is not None:
            self.health.start(app_probes(self.runtime.app))
        return self.runtime.app


def gunicorn_options(server: ServerConfig) -> dict[str, Any]:
    """gunicorn's settings for ``server``.

    ``timeout`` is the worker's heartbeat (a worker whose main loop stops answering is
    restarted), not a request timeout: that is ``server.read_timeout_s``, enforced by the
    worker class. Kept-alive and not-yet-sending connections wait in the worker's poller, not
    in a thread, and are closed after ``keepalive`` seconds."""
    options: dict[str, Any] = {
        "bind": f"[{server.host}]:{server.port}" if ":" in server.host
                else f"{server.host}:{server.port}",
        "workers": 1,
        "worker_class": bounded_worker(server.read_timeout_s),
        "threads": server.threads,
        "timeout": max(1, int(server.timeout_s)),
        "graceful_timeout": 10,
        "keepalive": KEEPALIVE_S,
        "accesslog": None,  # the app logs the requests itself (at debug), as JSON
        # gunicorn asks on every request whether the peer is a trusted proxy, parsing its
        # address each time (13% of the worker's CPU in a profile of the scheduling
        # benchmark). The extender honours no forwarding header: with no scheme header and
        # no forwarder header to apply, trusting every peer is the same as trusting none,
        # without the parse.
        "forwarded_allow_ips": "*",
        "secure_scheme_headers": {},
        "forwarder_headers": "",
        "errorlog": "-",
        "loglevel": "warning",
        # gunicorn 27's control socket defaults under $HOME, which the image's user does not
        # have (read-only root, HOME=/nonexistent): it logged a non-JSON error line at start.
        # The extender is controlled by signals and its probes, never through that socket.
        "control_socket_disable": True,
        "proc_name": "gpufrag-extender",
    }
    if server.tls:
        options.update(certfile=server.tls_cert_file, keyfile=server.tls_key_file,
                       ssl_context=tls_context_factory(server))
        if server.tls_client_ca_file:
            options.update(ca_certs=server.tls_client_ca_file, cert_reqs=ssl.CERT_REQUIRED)
    return options


def serve(runtime: Runtime, server: ServerConfig) -> None:
    """Serve until SIGTERM/SIGINT; :class:`ListenError` when the health port cannot be had."""
    health = (HealthServer.listen(server.health_host, server.health_port)
              if server.health_port else None)
    _Gunicorn(runtime, gunicorn_options(server), health,
              switch_interval_s=server.switch_interval_s).run()


__all__ = ["BoundedThreadWorker", "HealthServer", "ListenError", "RequestReadTimeout",
           "bounded_worker", "gunicorn_options", "serve", "tls_context_factory"]
