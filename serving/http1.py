"""HTTP/1.1 on one event loop for ``gpufrag serve``'s v2 front end (:mod:`serving.frontend`):
one ``asyncio.Protocol`` per connection, parsed by httptools (llhttp, the C parser uvicorn and
Node.js use), answers written as bytes. Every other gpufrag listener is on the project's one
server (:mod:`gpufrag.httpserve`); this one is the serving runtime's own.

Why hand-written: for requests that cost the application ~0.1 ms (a sub-millisecond model),
aiohttp's HTTP stack cost more event-loop CPU per request than everything else the server
did (figures in docs/serving.md). What a request means is the :class:`Site`'s: this module
only frames requests and answers.

What it does, and the bounds on each (:class:`HttpLimits`):

- keep-alive and pipelining: requests on one connection are answered in the order they came,
  whatever order the site finishes them in; reading pauses while ``max_pipelined`` answers
  are outstanding or the socket's write buffer is full (backpressure, bounded memory);
- at most ``max_connections`` connections: one more is closed as soon as it is accepted;
- at most ``max_buffered_bytes`` of request bodies held over all connections (read, or handed
  to the site and not yet answered): a body that would pass it gets 503 + ``Retry-After`` and
  its connection closes, so many slow uploads cannot add up past a bound;
- bodies by ``Content-Length`` or ``Transfer-Encoding: chunked`` (llhttp decodes chunks), up
  to the site's ``max_body_bytes``; ``Expect: 100-continue`` gets ``100 Continue`` only once
  the request has been admitted, otherwise its final answer at once;
- the site admits or refuses a request when its headers are in (:meth:`Site.begin`), without
  reading the body; a refused body is read and dropped (the connection stays usable), up to
  ``discard_max_bytes``, then the connection closes;
- a client that disconnects cancels its requests (:meth:`Call.cancel`);
- headers bounded in bytes and count (431, or 414 for the request target), a request whose
  headers take longer than ``header_timeout_s`` or whose body stalls for ``body_timeout_s``
  gets 408 and the connection closes (slowloris), an idle keep-alive connection closes after
  ``keepalive_timeout_s``; the timers are one sweep per interval for all connections, not one
  per request;
- anything llhttp cannot parse is a 400 naming what it found, and the connection closes;
- ``HEAD`` gets the answer's head only (its Content-Length, no body);
- once the site is draining (or the server closing) a connection's last answer carries
  ``Connection: close`` and the connection closes after it: every request already read on it
  is answered first, pipelined ones included;
- :meth:`HttpServer.close` answers everything it accepted (below), gives busy connections a
  grace to finish, then aborts what is left.

Closing without resets. Closing a listening socket makes the kernel reset every connection
still in its accept queue, and closing a connection whose request is unread resets it too;
under load both hit clients whose requests had reached the server (issue 44). So
:meth:`HttpServer.close`:

- stops the loop's accepting, then takes what is already queued from a duplicate of each
  listening socket (the kernel's socket lives on while one descriptor does) and only then
  closes it: a connection the kernel accepted is served like any other, its request answered.
  What is left is the kernel's own instant: a handshake that completes between the last
  accept and the close (or is half done at the close) is still reset, before its client
  could have had an answer from anyone;
- closes a connection only between requests: one with a request in flight closes after its
  answer; one fresh from the accept queue is given ``close_linger_s`` to send its first
  request; an idle keep-alive one is half-closed (FIN) at once, unless bytes of a request
  are already waiting to be read (then that request is read and answered), and what still
  arrives on it is read and dropped for ``close_linger_s`` (a lingering close), so a request
  racing the FIN ends in an orderly EOF the client may retry (RFC 9112 section 9.3.1), never
  in a reset. That race is HTTP/1.1's own: no server can pick an instant at which no request
  is on its way on an idle connection.

Every method runs on the event loop's thread; a site that answers from another thread hands
the answer over with ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import termios
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import formatdate
from typing import NamedTuple, Protocol, cast

import httptools
import structlog

from gpufrag.httpserve import reason_phrase

log = structlog.get_logger("serving.http1")

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# Answers longer than this are written as their own buffer rather than copied onto the head.
_COPY_BODY_BYTES = 64 * 1024
# Encoded extra headers kept for reuse (an answer's Inference-Header-Content-Length or
# Retry-After repeats); the cache is emptied when it reaches this many.
_EXTRA_HEADS_KEPT = 256
# The listening socket's accept queue; at close at most this many more are taken from it.
_BACKLOG = 1024

# What a connection is reading.
_IDLE, _HEADERS, _BODY, _DISCARD = range(4)


class Answer(NamedTuple):
    """One response, as the transport writes it (it adds Content-Length and Connection). A
    named tuple: one is made per request, and a tuple is the cheapest immutable record."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


Respond = Callable[[Answer], None]


class Call(Protocol):
    """A request the site admitted, waiting for its body; it answers exactly once through the
    ``respond`` it was given, unless cancelled."""

    def run(self, body: bytes, headers: Mapping[bytes, str],
            client_gone: Callable[[], bool]) -> None:
        """The whole body is in; ``headers`` holds the site's ``captured_headers`` present."""
        ...

    def too_large(self) -> None:
        """A chunked body (no Content-Length to check at admission) grew past the limit."""
        ...

    def cancel(self) -> None:
        """The client has gone, or the connection is closing: no answer is wanted."""
        ...


class Site(Protocol):
    """What the requests mean: admission, routing, answers, and the error format."""

    @property
    def max_body_bytes(self) -> int:
        """The framing checks it only for a chunked body; a ``Content-Length`` over it is
        :meth:`begin`'s to refuse (llhttp reads no more than a ``Content-Length`` says)."""
        ...

    @property
    def captured_headers(self) -> frozenset[bytes]:
        """Lower-case header names whose values :meth:`Call.run` wants."""
        ...

    @property
    def draining(self) -> bool:
        """Whether every answer now closes its connection."""
        ...

    def begin(self, method: bytes, url: bytes, content_length: int | None,
              respond: Respond) -> Answer | Call:
        """A request's headers are in: its answer now (the body, if any, is dropped), or the
        call that takes the body."""
        ...

    def error(self, status: int, message: str,
              headers: tuple[tuple[str, str], ...] = ()) -> Answer:
        """An HTTP-level error (malformed request, timeout, limits) in the site's format."""
        ...

    def request_started(self) -> bool:
        """A request's headers are in; True if the site counts it (then it hears
        :meth:`request_finished` once its answer is written or dropped)."""
        ...

    def request_finished(self) -> None: ...


@dataclass(frozen=True)
class HttpLimits:
    """Bounds on what one connection may make the server hold or wait for."""

    max_header_bytes: int = 32 * 1024  # request target + every header name and value
    max_headers: int = 100
    header_timeout_s: float = 10.0  # first byte of a request to the end of its headers
    body_timeout_s: float = 30.0  # longest silence while a body is arriving
    keepalive_timeout_s: float = 75.0  # an idle keep-alive connection (aiohttp's default)
    max_pipelined: int = 64  # answers outstanding on one connection before reading pauses
    discard_max_bytes: int = 1024**3  # of a refused body, read and dropped (not kept)
    max_connections: int = 4096  # open at once; one more is closed as it is accepted
    timeouts_setting: str = ""  # the setting a 408's message names for both timeouts
    # Bytes of request bodies held at once, over all connections (read, or handed to the
    # site and not yet answered); a body that would pass it is refused 503 + Retry-After.
    max_buffered_bytes: int = 1024 * 1024 * 1024
    # When the server closes: how long a connection that has sent no request yet is given to
    # send one, and how long a half-closed idle one is still read (what arrives is dropped)
    # before it closes, so a request racing the FIN is not answered by a reset. Apache
    # lingers 2 s, Go's server 0.5 s.
    close_linger_s: float = 1.0

    @property
    def sweep_interval_s(self) -> float:
        return min(1.0, self.header_timeout_s / 4, self.body_timeout_s / 4,
                   self.keepalive_timeout_s / 4)


class _StopParsing(Exception):
    """Raised from a parser callback once the connection has its error answer."""


class _Exchange:
    """One request on a connection, from its headers to its answer written."""

    __slots__ = (
        "answer",
        "call",
        "close",
        "connection",
        "counted",
        "head_only",
        "held",
        "http10",
        "keep_alive",
    )

    def __init__(self, connection: Connection, keep_alive: bool, http10: bool) -> None:
        self.connection = connection
        self.keep_alive = keep_alive
        self.http10 = http10
        self.head_only = False
        self.held = 0  # body bytes counted against max_buffered_bytes until answered
        self.counted = False
        self.call: Call | None = None
        self.answer: Answer | None = None  # once there is one; encoded when it is written
        self.close = False  # close the connection after this answer

    def __call__(self, answer: Answer) -> None:  # the Call's respond callback
        self.connection.respond(self, answer)


class HttpServer:
    """The listener and its connections; :meth:`start`, then :meth:`close` once drained.

    ``on_sweep`` runs once per sweep interval on the loop (a heartbeat, a certificate
    check)."""

    def __init__(self, site: Site, limits: HttpLimits | None = None, *,
                 server_name: str, on_sweep: Callable[[], None] | None = None) -> None:
        self.site = site
        self.limits = limits or HttpLimits()
        self.server_line = f"Server: {server_name}\r\n".encode("latin-1")
        self.on_sweep = on_sweep
        self.connections: set[Connection] = set()
        self.closing = False  # close() has begun: every connection closes once done
        self._server: asyncio.Server | None = None
        # duplicates of the listening sockets, so close() can take their accept queues
        self._listeners: list[socket.socket] = []
        self._sweeper: asyncio.TimerHandle | None = None
        self._prefixes: dict[tuple[int, str], bytes] = {}
        self._extra_heads: dict[tuple[tuple[str, str], ...], bytes] = {}
        # the header names on_header looks at; the rest are only counted
        self.noted_headers = site.captured_headers | {b"content-length", b"expect"}
        self.date_line = b""
        self.refused_connections = 0
        self.buffered = 0  # body bytes held now (HttpLimits.max_buffered_bytes)
        self._none_left = asyncio.Event()
        self._none_left.set()

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port); the port bound."""
        loop = asyncio.get_running_loop()
        self._sweep()
        self._server = await loop.create_server(
            lambda: Connection(self), host, port, reuse_address=True, backlog=_BACKLOG)
        for sock in self._server.sockets:
            listener = sock.dup()
            listener.setblocking(False)
            self._listeners.append(listener)
        for sock in self._server.sockets:
            return int(sock.getsockname()[1])
        return port

    async def close(self, grace_s: float) -> None:
        """Stop listening, answering the connections already in the accept queue; close every
        connection between requests (module docstring); give busy ones ``grace_s`` to write
        their answers, then abort the rest."""
        self.closing = True
        await self._stop_accepting()
        for connection in list(self.connections):
            connection.close_when_done()
        try:
            await asyncio.wait_for(self._none_left.wait(), timeout=max(grace_s, 0.0))
        except TimeoutError:
            log.error("connections_aborted", connections=len(self.connections))
            for connection in list(self.connections):
                connection.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._server is not None:
            await self._server.wait_closed()

    async def _stop_accepting(self) -> None:
        """The loop stops accepting; then the connections the kernel has already accepted
        are taken from the duplicate listening sockets, and only then are those closed (a
        listening socket closed with connections queued resets them)."""
        if self._server is not None:
            # The standard loop accepts in a reader callback and sets each connection up in
            # a task one turn later; Server.close() in between drops that connection, which
            # the kernel then resets (CPython gh-109564). So its reader goes first and the
            # loop turns once, setting up what it accepted, before the server closes.
            # (uvloop accepts and sets up in one step; it has no such reader.)
            loop = asyncio.get_running_loop()
            for sock in self._server.sockets:
                loop.remove_reader(sock.fileno())
            await asyncio.sleep(0)
            self._server.close()
        listeners, self._listeners = self._listeners, []
        queued: list[socket.socket] = []
        for listener in listeners:
            with listener:
                for _ in range(_BACKLOG + 1):  # bounded: arrivals go on while this runs
                    try:
                        accepted, _ = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError as exc:  # (ECONNABORTED, EMFILE, ...): take no more
                        log.warning("accept_queue_not_taken", error=str(exc))
                        break
                    queued.append(accepted)
        if queued:
            log.info("accept_queue_taken", connections=len(queued))
            await asyncio.gather(*(self._adopt(sock) for sock in queued))

    async def _adopt(self, sock: socket.socket) -> None:
        """Serve a connection taken from the accept queue (as the listener would have)."""
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: Connection(self), sock)
        except OSError as exc:  # gone meanwhile: nothing to answer
            log.debug("queued_connection_lost", error=str(exc))
            sock.close()

    def opened(self, connection: Connection) -> bool:
        """Whether ``connection`` may stay (False: over ``max_connections``)."""
        if len(self.connections) >= self.limits.max_connections:
            self.refused_connections += 1
            return False
        self.connections.add(connection)
        self._none_left.clear()
        return True

    def closed(self, connection: Connection) -> None:
        self.connections.discard(connection)
        if not self.connections:
            self._none_left.set()

    def _sweep(self) -> None:
        """Once per interval: the Date header, every connection's timeouts, ``on_sweep``."""
        loop = asyncio.get_running_loop()
        self.date_line = b"Date: " + formatdate(usegmt=True).encode() + b"\r\n"
        now = loop.time()
        for connection in list(self.connections):
            connection.check_timeouts(now)
        if self.on_sweep is not None:
            try:
                self.on_sweep()
            except Exception:  # a hook's fault must not stop the timeouts
                log.exception("sweep_hook_failed")
        self._sweeper = loop.call_later(self.limits.sweep_interval_s, self._sweep)

    def encode_head(self, answer: Answer, *, close: bool, keep_alive_10: bool) -> bytes:
        """Status line and headers; the status/content-type part is built once per pair."""
        key = (answer.status, answer.content_type)
        prefix = self._prefixes.get(key)
        if prefix is None:
            prefix = self._prefixes[key] = (
                f"HTTP/1.1 {answer.status} {reason_phrase(answer.status)}\r\n".encode()
                + self.server_line + f"Content-Type: {answer.content_type}\r\n".encode())
        extra = b""
        if answer.headers:
            extra = self._extra_heads.get(answer.headers, b"")
            if not extra:
                if len(self._extra_heads) >= _EXTRA_HEADS_KEPT:
                    self._extra_heads.clear()
                extra = self._extra_heads[answer.headers] = b"".join(
                    f"{name}: {value}\r\n".encode("latin-1") for name, value in answer.headers)
        connection = (b"Connection: close\r\n" if close
                      else b"Connection: keep-alive\r\n" if keep_alive_10 else b"")
        return b"%s%sContent-Length: %d\r\n%s%s\r\n" % (
            prefix, self.date_line, len(answer.body), extra, connection)


class Connection(asyncio.Protocol):
    """One client connection: parses requests, hands them to the site, writes the answers in
    order. Every method runs on the event loop's thread."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._site = server.site
        self._limits = server.limits
        self._captured_names = server.site.captured_headers
        self._noted_names = server.noted_headers
        self._max_header_bytes = server.limits.max_header_bytes
        self._max_headers = server.limits.max_headers
        self._client_gone = self._gone  # (one bound method for every call)
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._exchanges: deque[_Exchange] = deque()
        self._current: _Exchange | None = None  # the request being read, once its headers are
        self._phase = _IDLE
        self._since = self._loop.time()  # when the current phase began (or last body data)
        self._closed = False  # closing or closed: nothing more is read or written
        self._closing = False  # an answer said Connection: close; close once it is written
        self._close_when_done = False  # the server is closing: close between requests
        self._served = False  # a request has begun on this connection
        # closing: the wait for a first request, then (half-closed) for the full close
        self._linger: asyncio.TimerHandle | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._error: Answer | None = None
        self._reset_request()

    def _reset_request(self) -> None:
        self._url = b""
        self._header_bytes = 0
        self._header_count = 0
        self._content_length: int | None = None
        self._expect_continue = False
        self._captured: dict[bytes, str] = {}
        self._body: list[bytes] = []
        self._body_size = 0
        self._body_held = 0  # of _body, counted in the server's buffered bytes
        self._discarded = 0

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's TCP transport implements asyncio.Transport without subclassing it)
        self._transport = cast(asyncio.Transport, transport)
        if not self._server.opened(self):
            self._closed = True
            self._transport.abort()  # over max_connections: nothing read, nothing held
        elif self._server.closing:  # made as the server closes: waits for its request
            self.close_when_done()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        self._free_body()
        for exchange in self._exchanges:
            self._drop(exchange)
        self._exchanges.clear()
        self._current = None
        self._server.closed(self)

    def data_received(self, data: bytes) -> None:
        if self._closed or (self._closing and self._phase != _DISCARD):
            return  # what follows a closing answer is not read (but its own refused body is)
        if self._phase >= _BODY:
            self._since = self._loop.time()  # the body's silence timer restarts
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # An Upgrade request is answered as plain HTTP; what follows it is not HTTP, so
            # the connection closes after that answer.
            self._pause_reading()
            if self._exchanges:
                self._exchanges[-1].close = True
            else:
                self._close()
        except httptools.HttpParserCallbackError:
            if self._closed:
                return
            if self._error is not None:
                self._http_error(self._error)
            else:  # a fault of ours in a callback: a 500, never a traceback to the client
                log.exception("http_callback_failed")
                self._http_error(self._site.error(500, "internal error while reading the "
                                                       "request"))
        except httptools.HttpParserError as exc:
            self._http_error(self._site.error(400, f"malformed HTTP request: {_describe(exc)}"))
        else:
            if self._close_when_done and not self._exchanges:
                # e.g. a refused body read to its end after its keep-alive answer: idle now
                self._close_if_between_requests(wait_for_a_first_request=True)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._maybe_resume_reading()

    # -- httptools callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._phase = _HEADERS
        self._served = True
        self._since = self._loop.time()
        if self._body_held:
            self._free_body()  # (a body read for a call that went away meanwhile)
        self._reset_request()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._header_bytes += len(url)
        if self._header_bytes > self._limits.max_header_bytes:
            self._stop(self._site.error(414, "request target is longer than the "
                                             f"{self._limits.max_header_bytes} byte header "
                                             "limit"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._header_bytes += len(name) + len(value) + 4
        if (self._header_bytes > self._max_header_bytes
                or self._header_count > self._max_headers):
            self._headers_too_large()
        key = name.lower()
        if key in self._noted_names:
            self._note_header(key, value)

    def _headers_too_large(self) -> None:
        limits = self._limits
        if self._header_bytes > limits.max_header_bytes:
            self._stop(self._site.error(431, "request headers are larger than the "
                                             f"{limits.max_header_bytes} byte limit"))
        self._stop(self._site.error(431, f"request has more than {limits.max_headers} "
                                         "headers"))

    def _note_header(self, key: bytes, value: bytes) -> None:
        if key == b"content-length":
            self._content_length = int(value)  # llhttp has checked it is a number
        elif key == b"expect":
            if value.strip().lower() != b"100-continue":
                self._stop(self._site.error(417, f"unsupported Expect: {value[:40]!r}; only "
                                                 "100-continue is"))
            self._expect_continue = True
        elif key in self._captured_names:
            self._captured[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        parser = self._parser
        exchange = _Exchange(self, parser.should_keep_alive(),
                             parser.get_http_version() == "1.0")
        self._exchanges.append(exchange)
        self._current = exchange
        self._phase = _BODY
        self._since = self._loop.time()
        site = self._site
        exchange.counted = site.request_started()
        if len(self._exchanges) >= self._limits.max_pipelined:
            self._pause_reading()
        method = parser.get_method()
        exchange.head_only = method == b"HEAD"
        try:
            result = site.begin(method, self._url, self._content_length, exchange)
        except Exception:  # a fault of the site's: a 500, never a traceback to the client
            log.exception("request_begin_failed")
            result = site.error(500, "internal error while routing the request")
        if isinstance(result, Answer):
            self._refuse(exchange, result)
            return
        exchange.call = result
        if self._expect_continue and self._exchanges[0] is exchange:
            # (a pipelined request behind others gets no 100: the client sends its body
            # after its own wait, as RFC 9110 allows)
            self._write(CONTINUE)

    def on_body(self, body: bytes) -> None:
        if self._phase == _BODY:
            size = len(body)
            self._body_size += size
            exchange = self._current
            server = self._server
            if exchange is not None and exchange.call is not None:
                # (a Content-Length was checked at admission, and llhttp reads no further)
                if (self._content_length is None
                        and self._body_size > self._site.max_body_bytes):  # chunked
                    self._give_up_body(exchange).too_large()
                    return
                if server.buffered + size > self._limits.max_buffered_bytes:
                    self._give_up_body(exchange).cancel()
                    self.respond(exchange, self._site.error(
                        503, "the server holds as many request bytes as it may now; retry",
                        (("Retry-After", "1"),)))
                    return
            server.buffered += size
            self._body_held += size
            self._body.append(body)
        elif self._phase == _DISCARD:
            self._discarded += len(body)
            if self._discarded > self._limits.discard_max_bytes:
                self._close()
                raise _StopParsing

    def _give_up_body(self, exchange: _Exchange) -> Call:
        """The body arriving for ``exchange`` will not be used: what was read is freed, the
        rest is read and dropped, and the connection closes after its answer. Its call, for
        the caller to answer through or cancel."""
        call, exchange.call = exchange.call, None
        assert call is not None
        exchange.close = True
        self._free_body()
        self._phase = _DISCARD
        return call

    def on_message_complete(self) -> None:
        exchange, self._current = self._current, None
        phase, self._phase = self._phase, _IDLE
        self._since = self._loop.time()
        if exchange is None:
            return
        call = exchange.call
        if phase == _BODY and call is not None:
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
            self._body = []
            exchange.held, self._body_held = self._body_held, 0  # held until answered
            try:
                call.run(body, self._captured, self._client_gone)
            except Exception:
                log.exception("request_start_failed")
                exchange.call = None
                self.respond(exchange, self._site.error(500, "internal error starting the "
                                                             "request"))
        if self._closing:  # a closing answer was written while this body arrived
            self._close()
            raise _StopParsing  # nothing after it is read

    # -- answers -------------------------------------------------------------------------------

    def _refuse(self, exchange: _Exchange, answer: Answer) -> None:
        """Answer now, before the body is read; the body, if any, is read and dropped. After a
        413, or when the client waits for a 100 Continue it will not get, the connection
        closes once the answer is written (the body may never come)."""
        self._phase = _DISCARD
        if answer.status == 413 or self._expect_continue:
            exchange.close = True
        self.respond(exchange, answer)

    def respond(self, exchange: _Exchange, answer: Answer) -> None:
        """``exchange``'s answer is ready: write it, and every answer after it that is."""
        exchange.call = None
        if self._closed:
            return
        exchange.answer = answer
        if self._exchanges and self._exchanges[0] is exchange:
            self._flush()

    def _flush(self) -> None:
        """Write the answers that are ready, in order. Whether one closes the connection is
        settled here, as it goes out: when the site is draining or the server closing, the
        last answer closes, and one with requests read after it does not (they are answered
        too)."""
        exchanges = self._exchanges
        transport = self._transport
        while exchanges and exchanges[0].answer is not None:
            exchange = exchanges.popleft()
            answer = exchange.answer
            assert answer is not None and transport is not None
            close = exchange.close = (
                exchange.close or not exchange.keep_alive
                or (not exchanges and self._phase != _HEADERS
                    and (self._close_when_done or self._site.draining)))
            head = self._server.encode_head(answer, close=close,
                                            keep_alive_10=exchange.http10 and not close)
            body = b"" if exchange.head_only else answer.body
            if len(body) <= _COPY_BODY_BYTES:
                transport.write(head + body)
            else:
                transport.write(head)
                transport.write(body)
            if exchange.held:
                self._release(exchange)
            if exchange.counted:
                exchange.counted = False
                self._site.request_finished()
            if exchange.close:
                self._stop_after_answers()
                # the refused body of this very request may still be arriving: read it to
                # its end (or the discard limit) first, so the client sees the answer rather
                # than a reset
                if self._current is not exchange:
                    self._close()
                return
        if not exchanges and self._phase == _IDLE:
            self._since = self._loop.time()  # idle keep-alive from here
        if self._reading_paused:
            self._maybe_resume_reading()

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._closed:
            self._transport.write(data)

    def _stop_after_answers(self) -> None:
        """Nothing more is read; pending requests after the closing one are dropped."""
        self._closing = True
        for exchange in self._exchanges:
            self._drop(exchange)
        self._exchanges.clear()

    def _free_body(self) -> None:
        """The body being read is dropped: its bytes no longer count."""
        self._server.buffered -= self._body_held
        self._body_held = 0
        self._body = []

    def _release(self, exchange: _Exchange) -> None:
        self._server.buffered -= exchange.held
        exchange.held = 0

    def _drop(self, exchange: _Exchange) -> None:
        self._release(exchange)
        if exchange.call is not None:
            exchange.call.cancel()
            exchange.call = None
        if exchange.counted:
            exchange.counted = False
            self._site.request_finished()

    def _stop(self, answer: Answer) -> None:
        self._error = answer
        raise _StopParsing

    def _http_error(self, answer: Answer) -> None:
        """A request that cannot be read on: answer it (after the answers before it) and close."""
        self._error = None
        self._free_body()
        exchange = self._current
        if exchange is None:
            exchange = _Exchange(self, False, False)
            self._exchanges.append(exchange)
        elif exchange.call is not None:
            exchange.call.cancel()
            exchange.call = None
        self._current = None
        self._phase = _IDLE
        self._pause_reading()
        exchange.close = True
        if exchange.answer is None:
            self.respond(exchange, answer)
        elif exchange not in self._exchanges:  # its answer is out already
            self._close()

    def _gone(self) -> bool:
        """For the site: whether this request's client has gone."""
        return self._closed

    # -- flow control and closing --------------------------------------------------------------

    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None and not self._closed:
            self._reading_paused = True
            self._transport.pause_reading()

    def _maybe_resume_reading(self) -> None:
        if (self._reading_paused and not self._writing_paused and not self._closed
                and not self._closing and len(self._exchanges) < self._limits.max_pipelined
                and self._transport is not None):
            self._reading_paused = False
            self._transport.resume_reading()

    def _close(self) -> None:
        if not self._closed and self._transport is not None:
            self._closed = True
            self._transport.close()  # what was written is sent first

    def abort(self) -> None:
        if self._transport is not None:
            self._closed = True
            self._transport.abort()

    def close_when_done(self) -> None:
        """The server is closing: close between requests. A request in flight, or one whose
        bytes are waiting to be read, closes the connection with its answer; a connection
        that has not sent a request yet (fresh from the accept queue, most likely, its
        request on the way) is given ``close_linger_s`` to send one; an idle keep-alive one
        is half-closed now."""
        self._close_when_done = True
        self._close_if_between_requests(wait_for_a_first_request=True)

    def _close_if_between_requests(self, wait_for_a_first_request: bool) -> None:
        if (self._closed or self._closing or self._exchanges or self._phase != _IDLE
                or self._bytes_waiting()):
            return
        if not self._served and wait_for_a_first_request:
            if self._linger is None:
                self._linger = self._loop.call_later(
                    self._limits.close_linger_s, self._close_if_between_requests, False)
            return
        self._half_close()

    def _bytes_waiting(self) -> bool:
        """Whether bytes have arrived that the loop has not read yet (a request racing the
        close: the loop reads it next, and it is answered)."""
        sock = self._transport.get_extra_info("socket") if self._transport else None
        if sock is None:
            return False
        try:
            raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return False
        return int(struct.unpack("i", raw)[0]) > 0

    def _half_close(self) -> None:
        """A lingering close: FIN now, then read and drop whatever still arrives until the
        client closes too or ``close_linger_s`` has passed, so a request racing the FIN
        meets an orderly EOF rather than a reset (closing with unread bytes sends one)."""
        transport = self._transport
        assert transport is not None
        self._closing = True  # from here what arrives is dropped unread by the parser
        if self._linger is not None:
            self._linger.cancel()
        if not transport.can_write_eof():
            self._close()
            return
        transport.write_eof()
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        self._linger = self._loop.call_later(self._limits.close_linger_s, self._close)

    def check_timeouts(self, now: float) -> None:
        if self._closed:
            return
        age = now - self._since
        limits = self._limits
        phase = self._phase
        setting = f" ({limits.timeouts_setting})" if limits.timeouts_setting else ""
        if phase == _HEADERS and age > limits.header_timeout_s:
            self._http_error(self._site.error(408, "request headers not complete within "
                                                   f"{limits.header_timeout_s:g} s{setting}"))
        elif phase == _BODY and age > limits.body_timeout_s:
            self._http_error(self._site.error(408, "request body stalled: no data for "
                                                   f"{limits.body_timeout_s:g} s{setting}"))
        elif phase == _DISCARD and age > limits.body_timeout_s:
            self._phase = _IDLE
            self._current = None
            if self._closing:
                self._close()
        elif (phase == _IDLE and not self._exchanges
              and age > limits.keepalive_timeout_s):
            self._close()


def _describe(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text[:200]


__all__ = ["Answer", "Call", "Connection", "HttpLimits", "HttpServer", "Respond", "Site"]
