"""Serving a WSGI app over HTTP/1.1: the one way every gpufrag component listens (the
extender's verbs and probes, the admission webhook, the node agent's and device plugin's
probes), on uvicorn with httptools, a maintained asyncio server on a native (llhttp) parser.

Why uvicorn: measured side by side (``benchmarks/wsgi_servers.py``, docs/extender.md, "The
server"), on the extender's own app and traffic. A slow client must not take the server from
everyone else: in thread-per-connection WSGI servers (gunicorn's gthread, cheroot, granian's
WSGI) a request whose body stalls holds a thread until its socket times out, so a few such
clients block the probes and the verbs. An asyncio server reads and parses on its event loop,
so a connection costs a coroutine, not a thread. Of those, Hypercorn (which served here
before) parses with h11 in Python and wrote each answer's head and body apart; uvicorn's
parser is C, which is what the extender's short requests spend most of a server's time on.
Granian (Rust) parses natively too, but runs the app's loop in a worker of its own, so the
project's connection door (below) and reloading TLS context cannot stand in front of it.

What uvicorn leaves to the app, this module's :class:`Gateway` does, in front of the app:

- **The whole body is read before the app runs**, within ``read_timeout_s`` of the headers
  (however slowly it trickles: the deadline is for the body, not each read), so the app's
  threads only ever hold complete requests. A late body reaches the app as a ``wsgi.input``
  whose ``read`` raises ``TimeoutError`` (the app answers 408 in its own shape).
- **Bounded memory**: a body announced over ``max_body_bytes`` is not kept (the app sees its
  ``CONTENT_LENGTH`` and refuses it, 413); a chunked one is kept to one byte past the limit.
  Over all connections at most ``max_buffered_bytes`` of bodies are held at once; past that
  the request is answered 503 with ``Retry-After`` and the body is not kept.
- **A refused body is drained before its answer**: what the client still sends of it is read
  and dropped (at most ``discard_max_bytes``, within ``read_timeout_s``), then the answer goes
  out with ``Connection: close``. Closing with the body unread would make the kernel reset
  the connection, and a client still sending (most send the whole body before they read)
  would lose the answer to the reset.
- **Large bodies one at a time**: a request whose body is at least ``large_body_bytes`` waits
  (within ``read_timeout_s``, else 503 + ``Retry-After``) until fewer than
  ``large_concurrency`` such requests are being handled: what the app builds from a body can
  be ten times its size, and that, not the bytes held, is what runs a process out of memory.
- **The app runs on ``threads`` threads** of its own (or, where ``inline`` says so, on the
  loop's thread, for short CPU-only requests whose hand-off to a thread would cost more than
  they do).
- **A body and an answer are each held once**: the body is written into one buffer as it
  comes, which a read of it whole hands to the app without a copy; the answer's pieces, as
  the app gives them, are sent one after the other, never joined; and the answer's
  ``close`` runs once it is sent (PEP 3333), so what the app holds for it lasts until then.

Before any of that, the connection itself is bounded, since each one held costs memory
whatever its client sends (:mod:`gpufrag.connlimit`, standing in front of uvicorn on the
server's own event loop):

- **At most ``max_connections`` at once** (a TLS handshake in progress counts): one more is
  closed as soon as it is accepted, unread and with no handshake; those held are answered as
  before. Each listener kind has its own cap: few for the probes, more for the verbs.
- **Request headers of at most ``max_header_bytes``** (line and headers): the door counts
  a request's bytes until the blank line that ends its headers and answers 431 once they pass
  the bound unfinished (llhttp keeps no bound of its own); headers that arrived whole in one
  read past it are answered 431 here.
- **Within ``header_timeout_s``** of the connection's opening, or of the first byte after the
  previous answer; else the connection is closed unanswered. Between requests, a connection
  that sends nothing lives for ``keepalive_s`` (uvicorn's keep-alive); a TLS handshake must
  finish within ``read_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import structlog
import uvicorn

from gpufrag.connlimit import Connections, headers_too_large
from gpufrag.loops import new_event_loop
from gpufrag.tls import ServerTLS

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
# Whether a request (its environ, before the body is read) runs on the loop's thread.
Inline = Callable[[dict[str, Any]], bool]
TICK_S = 1.0

log = structlog.get_logger("gpufrag.http")


class ListenError(RuntimeError):
    """An address a component cannot listen on (in use, not this host's)."""


def listen(host: str, port: int, *, setting: str) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: any free port); :class:`ListenError`
    naming ``setting`` (where the address was configured) when it cannot be had."""
    if not 0 <= port <= 65535:
        raise ListenError(f"cannot listen on {host}:{port} ({setting}): a port is 0..65535")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise ListenError(f"cannot listen on {host}:{port} ({setting}): {e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as e:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port} ({setting}): "
                          f"{e.strerror or e}") from None
    return sock


@dataclass(frozen=True, slots=True)
class Limits:
    """What one listener allows; ``setting`` names where ``read_timeout_s`` was configured,
    for the late-body message that cites it."""

    max_body_bytes: int = 1024 * 1024
    read_timeout_s: float = 5.0
    keepalive_s: float = 75.0
    threads: int = 2
    max_buffered_bytes: int | None = None  # None: threads x max_body_bytes
    discard_max_bytes: int = 1024**3  # of a refused body, read and dropped before its answer
    # Requests whose body is at least this large are handled ``large_concurrency`` at a time
    # (None: no such bound): what an app builds from a body (parsed JSON) can be ten times
    # its size, so a few large bodies at once, not their bytes, are what exhausts memory.
    large_body_bytes: int | None = None
    large_concurrency: int = 1
    grace_s: float = 10.0
    setting: str = "read_timeout_s"
    # Connections held at once (gpufrag.connlimit); the next is closed unread. The verbs' and
    # the webhook's default: each of the few clients they have (kube-scheduler's binds in
    # parallel, the API server's admission calls) keeps a pool of connections, far fewer than
    # this; a connection held with full headers costs tens of KiB, so all of them a few MiB.
    max_connections: int = 256
    # A request's line and headers, in bytes. Their real ones are under 1 KiB (a POST with a
    # content type, a length, a host; a bearer token would be the largest part); 16 KiB is
    # Node.js's default bound and leaves room for proxies' headers (nginx's per-line bound
    # is 8 KiB); the listener's door enforces it (gpufrag.connlimit).
    max_header_bytes: int = 16 * 1024
    # How long a request's line and headers may take, from the connection's opening or the
    # first byte after the previous answer: clients send them in one write, so seconds are
    # plenty, and a client that trickles them is cut off instead of holding a place.
    header_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_header_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} is {getattr(self, name)}: at least 1")
        if not self.header_timeout_s > 0:
            raise ValueError(f"Limits.header_timeout_s is {self.header_timeout_s}: more than 0")

    @property
    def buffered_budget(self) -> int:
        if self.max_buffered_bytes is not None:
            return self.max_buffered_bytes
        return max(1, self.threads) * self.max_body_bytes


class LateBody(io.RawIOBase):
    """The ``wsgi.input`` of a request whose body did not arrive in time: reading it raises
    ``TimeoutError`` with what was missed."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        raise TimeoutError(self.message)

    def readinto(self, buffer: Any) -> int:
        raise TimeoutError(self.message)


# status, headers, body: the body as one piece or as the pieces the app gave, sent in turn
Answer = tuple[int, list[tuple[bytes, bytes]], bytes | list[bytes]]


def _text(status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> Answer:
    return (status, [(b"content-type", b"text/plain; charset=utf-8"), *headers],
            f"{message}\n".encode())


def _environ(scope: dict[str, Any], body: io.RawIOBase | io.BytesIO) -> dict[str, Any]:
    server = scope.get("server") or ("localhost", 80)
    client = scope.get("client")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": "",
        "PATH_INFO": scope["path"].encode("utf-8").decode("latin-1"),
        "QUERY_STRING": scope["query_string"].decode("latin-1"),
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": f"HTTP/{scope['http_version']}",
        "REMOTE_ADDR": client[0] if client else "",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": body,
        "wsgi.input_terminated": True,  # the whole body is in (or refused): read to the end
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for raw_name, raw_value in scope["headers"]:
        name = raw_name.decode("latin-1").upper().replace("-", "_")
        key = name if name in ("CONTENT_LENGTH", "CONTENT_TYPE") else f"HTTP_{name}"
        value = raw_value.decode("latin-1")
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


class Gateway:
    """The ASGI app uvicorn serves: reads each body within its bounds, then runs the WSGI
    ``app`` on ``pool`` (or inline) and sends its answer (see the module docstring)."""

    def __init__(self, app: WSGIApp, limits: Limits, pool: ThreadPoolExecutor, *,
                 inline: Inline | None = None, connections: Connections | None = None
                 ) -> None:
        self.app = app
        self.limits = limits
        self.pool = pool
        self.inline = inline
        self.connections = connections  # told when a request starts and when it is answered
        self.buffered = 0  # bytes of bodies held now, over every connection (loop thread only)
        self.large = asyncio.Semaphore(limits.large_concurrency)  # bound on the loop's first use

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Any],
                       send: Callable[[dict[str, Any]], Any]) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":  # websockets: not served
            await send({"type": "websocket.close", "code": 1003})
            return
        if self.connections is not None:
            self.connections.request_started(scope)
        try:
            if _header_bytes(scope) > self.limits.max_header_bytes:
                # Whole in one read, so the parser took it: refused all the same, after its
                # body (if any) is drained, as a refused body is.
                await self._discard(receive)
                await self._send(send, _closing(_text(
                    431, headers_too_large(self.limits.max_header_bytes))))
                return
            await self._serve(scope, receive, send)
        finally:
            if self.connections is not None:
                self.connections.request_finished(scope)

    async def _serve(self, scope: dict[str, Any], receive: Callable[[], Any],
                     send: Callable[[dict[str, Any]], Any]) -> None:
        """One request: its body read within the bounds, the app run, its answer sent."""
        held = 0
        unread = False  # part of the body is still on its way: drain it before answering
        try:
            announced = self._announced(scope)
            limits = self.limits
            if announced is not None and announced > limits.max_body_bytes:
                body: io.RawIOBase | io.BytesIO = io.BytesIO(b"")  # the app refuses it unkept
                unread = True
            elif self.buffered + (limits.max_body_bytes if announced is None else announced
                                  ) > limits.buffered_budget:
                await self._discard(receive)
                await self._send(send, _closing(_text(
                    503, "too many request bodies held at once; retry shortly",
                    ((b"retry-after", b"1"),))))
                return
            else:
                # An announced body is counted against the budget from its headers on, so
                # bodies arriving together cannot all pass the check before any is held.
                held = announced or 0
                self.buffered += held
                read = await self._read_body(receive, held)
                if read is None:  # the client went away mid-body: nobody to answer
                    return
                body, held = read
                # (a late body is not drained: its sender is too slow to wait for)
                unread = isinstance(body, io.BytesIO) and held > limits.max_body_bytes
            environ = _environ(scope, body)
            # A body the app will refuse unread (over the limit) is cheap to answer: no turn.
            large = (not unread and limits.large_body_bytes is not None
                     and held >= limits.large_body_bytes)
            if large and not await self._admit_large():
                await self._send(send, _text(
                    503, "too many large request bodies being handled at once; retry shortly",
                    ((b"retry-after", b"1"),)))
                return
            try:
                if self.inline is not None and self.inline(environ) and not large:
                    answer, close = self._run(environ)
                else:
                    answer, close = await asyncio.get_running_loop().run_in_executor(
                        self.pool, self._run, environ)
            finally:
                if large:
                    self.large.release()
            try:
                if unread:
                    self.buffered -= held  # the kept part is not needed any more
                    held = 0
                    await self._discard(receive)
                    answer = _closing(answer)
                elif isinstance(body, LateBody):
                    # The rest of a late body may still come: the connection cannot carry
                    # another request after it, so it ends with the answer.
                    answer = _closing(answer)
                await self._send(send, answer)
            finally:
                close()  # once sent (PEP 3333): what the app holds for its answer goes now
        finally:
            self.buffered -= held

    async def _admit_large(self) -> bool:
        """Wait (at most ``read_timeout_s``) for a turn to handle a large body."""
        try:
            async with asyncio.timeout(self.limits.read_timeout_s):
                await self.large.acquire()
        except TimeoutError:
            return False
        return True

    async def _discard(self, receive: Callable[[], Any]) -> None:
        """Read and drop the rest of a refused body: to its end, ``discard_max_bytes``, the
        read deadline, or the client's leaving, whichever comes first."""
        limits = self.limits
        dropped = 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limits.read_timeout_s):
                while dropped <= limits.discard_max_bytes:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    dropped += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        return

    @staticmethod
    def _announced(scope: dict[str, Any]) -> int | None:
        for name, value in scope["headers"]:
            if name == b"content-length":
                return int(value)  # the parser accepts only digits here
        return None

    async def _read_body(self, receive: Callable[[], Any], reserved: int
                         ) -> tuple[io.RawIOBase | io.BytesIO, int] | None:
        """The body and the bytes it holds in :attr:`buffered` (at least ``reserved``, counted
        there already), or None when the client left (then nothing stays counted). Stops one
        byte past the limit (the app then refuses it) or at the deadline."""
        limits = self.limits
        # Written into one buffer as it comes, not kept as pieces and joined: the join would
        # hold the body twice. Trimmed to its size at the end (getvalue), a read of it whole
        # is then that very buffer, not a copy.
        kept = io.BytesIO()
        read = 0
        counted = reserved
        try:
            async with asyncio.timeout(limits.read_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        self.buffered -= counted
                        return None
                    chunk = message.get("body", b"")
                    if chunk:
                        # Kept to one byte past the limit, however much one message holds
                        # (the server hands on what it has buffered, up to its high water).
                        room = limits.max_body_bytes + 1 - read
                        kept.write(chunk if len(chunk) <= room else memoryview(chunk)[:room])
                        read += min(len(chunk), room)
                        if read > counted:
                            self.buffered += read - counted
                            counted = read
                    if read > limits.max_body_bytes or not message.get("more_body", False):
                        break
        except TimeoutError:
            message = (f"request body did not arrive within {limits.read_timeout_s:g} s "
                       f"({limits.setting})")
            return LateBody(message), counted
        kept.getvalue()
        kept.seek(0)
        return kept, counted

    def _run(self, environ: dict[str, Any]) -> tuple[Answer, Callable[[], None]]:
        """The WSGI call, its answer collected as the pieces the app gave (a large answer is
        never joined into one more copy), and the ``close`` to call once it is sent."""
        started: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]],
                           exc_info: Any = None) -> Callable[[bytes], None]:
            started[:] = [status, headers]
            return lambda _data: None  # the legacy write(): unused by Flask

        close: Callable[[], None] = _nothing
        try:
            result = self.app(environ, start_response)
            close = getattr(result, "close", None) or _nothing
            pieces = [piece for piece in result if piece]
        except Exception:
            log.exception("request failed", path=environ.get("PATH_INFO"))
            close()
            return _text(500, "internal error; see the server's log"), _nothing
        status_line, headers = started
        return (int(status_line.split(" ", 1)[0]),
                [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
                pieces[0] if len(pieces) == 1 else pieces), close

    @staticmethod
    async def _send(send: Callable[[dict[str, Any]], Any], answer: Answer) -> None:
        status, headers, body = answer
        await send({"type": "http.response.start", "status": status, "headers": headers})
        pieces = [body] if isinstance(body, bytes) else body
        for i, piece in enumerate(pieces):
            await send({"type": "http.response.body", "body": piece,
                        "more_body": i < len(pieces) - 1})
        if not pieces:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def _nothing() -> None:
    """The ``close`` of an answer that has nothing to release."""


def _header_bytes(scope: dict[str, Any]) -> int:
    """About the bytes of the request's line and headers as they came (each header line is
    ``name: value`` and CRLF; the parser keeps the names and values as sent, less spaces)."""
    line = (len(scope["method"]) + len(scope.get("raw_path") or b"") + len(scope["query_string"])
            + len("  HTTP/1.1?\r\n"))
    return line + sum(len(name) + len(value) + 4 for name, value in scope["headers"]) + 2


def _closing(answer: Answer) -> Answer:
    """``answer`` with ``Connection: close``: the connection ends after it."""
    status, headers, body = answer
    return status, [*(h for h in headers if h[0] != b"connection"),
                    (b"connection", b"close")], body


def reason_phrase(status: int, unknown: str = "Unknown") -> str:
    """The status line's reason for ``status`` (RFC 9110's phrase), ``unknown`` for a code it
    does not name: the one table of them, for every server of the project."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return unknown


def reason(status: int) -> str:
    """``"404 Not Found"``: the status line's text, for WSGI's ``start_response``."""
    return f"{status} {reason_phrase(status)}"


class _ToStructlog(logging.Handler):
    """The server's error log, as the component's JSON lines (warnings and worse)."""

    def emit(self, record: logging.LogRecord) -> None:
        log.warning("http server", message=record.getMessage())


def _quiet_server_logs() -> None:
    """Uvicorn logs to the ``uvicorn`` loggers; the project logs JSON lines through
    structlog. Its warnings and errors are passed on; its start and stop lines are not."""
    for name in ("uvicorn", "uvicorn.error"):
        errorlog = logging.getLogger(name)
        if not any(isinstance(h, _ToStructlog) for h in errorlog.handlers):
            errorlog.addHandler(_ToStructlog())
        errorlog.setLevel(logging.WARNING)
        errorlog.propagate = False


def _config(app: Gateway, limits: Limits, tls: ServerTLS | None) -> uvicorn.Config:
    """Uvicorn's settings for one listener: the native (llhttp) parser, no lifespan, no
    websockets, no server or date header, no access log; TLS from ``tls``'s reloading
    context."""
    _quiet_server_logs()
    context = None if tls is None else tls.context
    config = uvicorn.Config(
        app, http="httptools", ws="none", lifespan="off", interface="asgi3", loop="none",
        log_config=None, log_level=logging.WARNING, access_log=False, server_header=False,
        date_header=False, proxy_headers=False,
        # Typed int, used as a float (call_later): the limits' own value, not rounded.
        timeout_keep_alive=limits.keepalive_s,  # type: ignore[arg-type]
        timeout_graceful_shutdown=limits.grace_s,  # type: ignore[arg-type]
        ssl_context_factory=(None if context is None
                             else lambda _config, _default: context))
    config.load()
    return config


class Server:
    """One listener serving a WSGI app on an event loop of its own: :meth:`run` in this
    thread, or :meth:`start` in a thread of its own; :meth:`stop` from any thread. The loop
    ticks every :data:`TICK_S` (:meth:`stalled_for`: a stuck loop is what a liveness probe
    should see)."""

    def __init__(self, app: WSGIApp, sock: socket.socket, limits: Limits, *,
                 tls: ServerTLS | None = None, name: str = "http",
                 inline: Inline | None = None) -> None:
        self.sock = sock
        self.limits = limits
        self.tls = tls
        self.name = name
        self.pool = ThreadPoolExecutor(max(1, limits.threads), thread_name_prefix=name)
        self.connections = Connections(max_connections=limits.max_connections,
                                       header_timeout_s=limits.header_timeout_s,
                                       max_header_bytes=limits.max_header_bytes,
                                       handshake_timeout_s=limits.read_timeout_s, name=name)
        self.gateway = Gateway(app, limits, self.pool, inline=inline,
                               connections=self.connections)
        self._ticked_at = time.monotonic()
        self.host: str = sock.getsockname()[0]
        self.port: int = sock.getsockname()[1]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_asked = threading.Event()
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None

    async def _main(self, *, signals: bool) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(signum, self._stop.set)
        if self._stop_asked.is_set():
            self._stop.set()
        ticker = asyncio.create_task(self._tick())
        server = uvicorn.Server(_config(self.gateway, self.limits, self.tls))
        stopper = asyncio.create_task(self._stop_on(server))
        self._listening.set()
        try:
            await server.serve(sockets=[self.sock])
        finally:
            ticker.cancel()
            stopper.cancel()

    async def _stop_on(self, server: uvicorn.Server) -> None:
        """Tell uvicorn to stop (it finishes the answers in flight) once :meth:`stop` asks."""
        assert self._stop is not None
        await self._stop.wait()
        server.should_exit = True

    async def _tick(self) -> None:
        while True:
            self._ticked_at = time.monotonic()
            await asyncio.sleep(TICK_S)

    def stalled_for(self) -> float:
        """Seconds since the loop last ticked (about :data:`TICK_S` at most when well)."""
        return max(0.0, time.monotonic() - self._ticked_at - TICK_S)

    def run(self, *, signals: bool = False) -> None:
        """Serve in this thread until :meth:`stop` (or, with ``signals``, SIGTERM/SIGINT:
        only the main thread may take them); answers in flight get ``limits.grace_s``."""
        # A TLS listener's door begins each handshake itself, which needs a loop that reads
        # nothing of a connection paused in connection_made: the standard library's
        # (CPython gh-103607); uvloop starts reading regardless (gpufrag.connlimit).
        loop = new_event_loop(server_wrap=self.connections.wrap,
                              choice="auto" if self.tls is None else "asyncio")
        try:
            loop.run_until_complete(self._main(signals=signals))
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)
            loop.close()
            self._listening.set()

    def start(self) -> Server:
        """Serve in a daemon thread; returns once the loop runs."""
        self._thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self._thread.start()
        self._listening.wait()
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop listening, let answers in flight finish (``limits.grace_s``), and, for a
        server :meth:`start` ran, wait up to ``timeout_s`` for its thread."""
        self._stop_asked.set()
        loop, event = self._loop, self._stop
        if loop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed already
                loop.call_soon_threadsafe(event.set)
        if self._thread is not None:
            self._thread.join(self.limits.grace_s + 5.0 if timeout_s is None else timeout_s)


__all__ = [
    "Gateway",
    "Inline",
    "LateBody",
    "Limits",
    "ListenError",
    "Server",
    "WSGIApp",
    "listen",
    "reason",
    "reason_phrase",
]
