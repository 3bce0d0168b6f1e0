"""A listener's door: how many connections it holds at once, and how long a request's headers
may take to arrive, for every listener of the project (:mod:`gpufrag.httpserve`).

Why: each connection a server holds costs memory whatever its client does (the server's
per-connection protocol and parser, and the incomplete request headers it buffers), so
without a cap any pod that reaches a port can hold enough slow connections to run the process
past its memory limit: 3,000 of them cost ~246 MiB on a probe listener, past the device
plugin's 256 Mi. uvicorn bounds how long a connection may sit idle between requests
(``timeout_keep_alive``), but has no setting for how many connections it holds, none for how
long a request's headers may take (its keep-alive timer stops at a request's first byte, so a
client that sends a byte a second stays), and its parser (llhttp) none for how many bytes of
headers it keeps.

How, with public APIs only: the project's servers run on event loops of their own, and such a
loop hands the protocol factory of each listener started on it to :meth:`Connections.wrap`
(:func:`gpufrag.loops.new_event_loop`). Every accepted connection so meets a :class:`Door`
before the server does:

- **Over the cap** (:attr:`Connections.max_connections` held), the connection is closed at
  once: nothing is read and, on a TLS listener, no handshake is begun. The connections held
  are answered as before.
- **Within it**, the door makes the server's own protocol, hands it the connection (after the
  TLS handshake, which the door begins with the loop's ``start_tls``, so that a handshake in
  progress holds a place too), then stands between the two: it passes every call on, and
  keeps the count and the deadline.
- **Headers on time**: a request's line and headers must be in within
  :attr:`Connections.header_timeout_s` of the connection's opening, or of the first byte
  that follows the previous answer; else the connection is closed unanswered. The HTTP
  parser knows where headers end and tells the app, so the app (the gateway)
  says when a request starts and when it is answered (:meth:`Connections.request_started`,
  :meth:`Connections.request_finished`, with the request's ASGI scope, whose client and
  server addresses name the connection). A connection kept open between requests sends
  nothing: closing it is the keep-alive's business.
- **Headers of bounded size**: until a request's headers end (their blank line), the door
  counts its bytes; past :attr:`Connections.max_header_bytes` unfinished, it answers 431 and
  closes, and the parser never sees more of them. While a request is in flight its connection
  is the server's (its body is bounded by the gateway, in size and time).
- **A place is given back when the connection is gone**: the server ended it (an answer with
  ``Connection: close``, the keep-alive's end, an error), it broke, or the client closed its
  side with no request in flight (a server that noticed such a close only when its
  keep-alive ended, as the one before uvicorn did, would otherwise lock out every client that
  closes first once ``max_connections`` of them had come within a keep-alive).

TLS: the door begins the handshake on a connection paused in ``connection_made``, which the
standard library's loop honours (CPython gh-103607) and uvloop does not (it starts reading as
``connection_made`` returns, and the ClientHello would reach the door, not the handshake), so
a TLS listener runs on the standard library's loop (:mod:`gpufrag.httpserve`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any, cast

import structlog

from gpufrag.loops import ProtocolFactory, TLSStart

# A connection's name: the client's host and port, then the server's.
Peer = tuple[str, int, str, int]
# At most one warning a minute that a listener is full (with how many it refused since).
FULL_LOG_EVERY_S = 60.0

log = structlog.get_logger("gpufrag.http")


def headers_too_large(max_header_bytes: int) -> str:
    """The one text of a 431: the door's (headers unfinished past the bound) and the
    gateway's (headers that arrived whole past it)."""
    return f"request headers over {max_header_bytes} bytes"


def _peer(client: object, server: object) -> Peer | None:
    """``(client host, client port, server host, server port)`` from two socket addresses (a
    transport's ``peername`` and ``sockname``, or an ASGI scope's ``client`` and ``server``)."""
    if (isinstance(client, (tuple, list)) and len(client) >= 2
            and isinstance(server, (tuple, list)) and len(server) >= 2):
        return str(client[0]), int(client[1]), str(server[0]), int(server[1])
    return None


class Connections:
    """The connections one listener holds: at most ``max_connections`` at once, each
    request's headers within ``header_timeout_s``. Used on the listener's loop thread only.

    :attr:`held`, :attr:`refused` (over the cap, since the start) and :attr:`late` (closed
    for headers past the deadline) are what a test or a metric reads."""

    def __init__(self, *, max_connections: int, header_timeout_s: float,
                 max_header_bytes: int = 16 * 1024, handshake_timeout_s: float | None = None,
                 name: str = "http") -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections is {max_connections}: at least 1")
        if not header_timeout_s > 0:
            raise ValueError(f"header_timeout_s is {header_timeout_s}: more than 0")
        if max_header_bytes < 1:
            raise ValueError(f"max_header_bytes is {max_header_bytes}: at least 1")
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.max_header_bytes = max_header_bytes
        # A TLS handshake's deadline where the server starting the listener names none.
        self.handshake_timeout_s = handshake_timeout_s
        # The answer to headers that pass max_header_bytes unfinished, written by the door.
        message = f"{headers_too_large(max_header_bytes)}\n".encode()
        self.too_large = (
            f"HTTP/1.1 431 {HTTPStatus(431).phrase}\r\n"
            "content-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(message)}\r\nconnection: close\r\n\r\n").encode() + message
        self.name = name
        self.held = 0
        self.refused = 0
        self.late = 0
        self.oversized = 0
        self._doors: dict[Peer, Door] = {}
        self._refused_logged = 0
        self._next_full_log = float("-inf")

    def wrap(self, protocol_factory: ProtocolFactory, tls: TLSStart | None) -> ProtocolFactory:
        """The factory a listener makes its connections' protocols with: a :class:`Door` in
        front of ``protocol_factory``'s (a :class:`gpufrag.loops.ServerWrap`)."""
        return lambda: Door(self, protocol_factory, tls)

    def request_started(self, scope: Mapping[str, Any]) -> None:
        """The request of ``scope`` (ASGI) has its headers in: its connection's deadline is
        met."""
        door = self._door(scope)
        if door is not None:
            door.request_started()

    def request_finished(self, scope: Mapping[str, Any]) -> None:
        """The request of ``scope`` is answered: the next byte on its connection starts the
        next request's deadline."""
        door = self._door(scope)
        if door is not None:
            door.request_finished()

    def _door(self, scope: Mapping[str, Any]) -> Door | None:
        peer = _peer(scope.get("client"), scope.get("server"))
        return None if peer is None else self._doors.get(peer)

    def admit(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Count one more connection, or refuse it (False) when ``max_connections`` are
        held; a refusal is logged at most every :data:`FULL_LOG_EVERY_S`."""
        if self.held < self.max_connections:
            self.held += 1
            return True
        self.refused += 1
        now = loop.time()
        if now >= self._next_full_log:
            self._next_full_log = now + FULL_LOG_EVERY_S
            log.warning("connection cap reached: new connections are closed unread",
                        listener=self.name, max_connections=self.max_connections,
                        refused=self.refused - self._refused_logged)
            self._refused_logged = self.refused
        return False

    def release(self) -> None:
        """One counted connection is gone."""
        self.held -= 1

    def opened(self, peer: Peer, door: Door) -> None:
        self._doors[peer] = door

    def closed(self, peer: Peer) -> None:
        self._doors.pop(peer, None)


class Door(asyncio.Protocol):
    """What one accepted connection meets first (see the module docstring): refused over the
    cap, else handed to the server's protocol (``serve``), every call passed on, and closed
    when a request's headers are late."""

    def __init__(self, connections: Connections, serve: ProtocolFactory,
                 tls: TLSStart | None) -> None:
        self._connections = connections
        self._serve = serve
        self._tls = tls
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._peer: Peer | None = None
        self._counted = False
        self._lost = False
        self._raw: asyncio.Transport | None = None  # a TLS connection's, under the TLS
        self._handshake: asyncio.Task[None] | None = None
        # What arrived (decrypted) between the handshake's end and the server's protocol.
        self._early: list[bytes] = []
        self._early_eof = False
        self._requests = 0  # requests started and not yet answered
        self._deadline: asyncio.TimerHandle | None = None
        # The next request's line and headers so far: bytes read, whether their end (the
        # blank line) has come, and the last bytes read (an end split over two reads).
        self._head = 0
        self._head_done = False
        self._tail = b""

    # -------------------------------------------------------------- the transport's calls

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not registered as asyncio.Transport: no isinstance)
        stream = cast(asyncio.Transport, transport)
        self._loop = asyncio.get_running_loop()
        if not self._connections.admit(self._loop):
            stream.abort()  # unread, so no request of it reaches the server
            return
        self._counted = True
        if self._tls is None:
            self._attach(stream)
        else:
            # Nothing read until the handshake reads it: the ClientHello is start_tls's. (The
            # standard library's loop honours a pause from connection_made, CPython
            # gh-103607; uvloop starts reading as connection_made returns, so a TLS
            # listener runs on the former: gpufrag.httpserve.)
            stream.pause_reading()
            self._raw = stream
            self._handshake = self._loop.create_task(self._start_tls(stream, self._tls))

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            if self._raw is not None and self._raw.get_protocol() is self:
                # Bytes of the handshake, read before start_tls took the connection: a loop
                # that ignored the pause. They cannot be handed on, so the connection ends.
                log.error("TLS bytes read before the handshake began: this event loop "
                          "ignores pause_reading() in connection_made",
                          listener=self._connections.name)
                self._raw.abort()
                return
            self._early.append(data)  # decrypted, before start_tls has returned
            return
        if self._requests == 0:
            self._arm()
            if not self._head_done and not self._head_within(data):
                self._refuse_head()
                return
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._inner is None:
            self._early_eof = True
            return None
        if self._requests == 0:
            # The client closed its side with no request in flight: it is gone, and its place
            # is given back now, whenever the server ends the connection: counting it until
            # a keep-alive ran out would lock out clients that close first (curl, a blackbox
            # probe, any client without keep-alive) after max_connections requests.
            self._disarm()
            self._release()
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._disarm()
        if self._peer is not None:
            self._connections.closed(self._peer)
        self._release()
        if self._inner is not None:
            self._inner.connection_lost(exc)

    # ------------------------------------------------------------------ the gateway's calls

    def request_started(self) -> None:
        self._requests += 1
        self._disarm()

    def request_finished(self) -> None:
        self._requests = max(0, self._requests - 1)
        if self._requests == 0:
            self._head, self._head_done, self._tail = 0, False, b""

    # ------------------------------------------------------------------------------ inside

    async def _start_tls(self, raw: asyncio.Transport, tls: TLSStart) -> None:
        """The handshake, begun on the counted connection; the connection's place is given
        back if it fails (``start_tls`` closes the connection then)."""
        assert self._loop is not None
        transport: asyncio.Transport | None = None
        try:
            transport = await self._loop.start_tls(
                raw, self, tls.context, server_side=True,
                ssl_handshake_timeout=(tls.handshake_timeout_s
                                       or self._connections.handshake_timeout_s),
                ssl_shutdown_timeout=tls.shutdown_timeout_s)
        except OSError:  # a failed or late handshake, a client gone: the client's doing
            pass
        finally:
            if transport is None or self._lost:
                self._release()
        if transport is not None and not self._lost:
            self._attach(transport)

    def _attach(self, transport: asyncio.Transport) -> None:
        """Hand the connection to a protocol of the server's, and start the first request's
        deadline."""
        self._transport = transport
        self._peer = _peer(transport.get_extra_info("peername"),
                           transport.get_extra_info("sockname"))
        if self._peer is not None:
            self._connections.opened(self._peer, self)
        inner = self._serve()
        if not isinstance(inner, asyncio.Protocol):
            transport.abort()
            raise TypeError(f"a listener's protocol must be an asyncio.Protocol, not {inner!r}")
        self._inner = inner
        inner.connection_made(transport)
        self._arm()
        early, self._early = self._early, []
        for data in early:
            inner.data_received(data)
        if self._early_eof and not inner.eof_received():
            transport.close()

    def _head_within(self, data: bytes) -> bool:
        """Count ``data`` toward the next request's line and headers: False once they pass
        ``max_header_bytes`` with their end not yet read. (Headers that end within the read
        that passes the bound are the gateway's to refuse: the parser has them whole.)"""
        seen = self._tail + data
        if seen.find(b"\r\n\r\n") >= 0:
            self._head_done = True
            return True
        self._head += len(data)
        self._tail = seen[-3:]
        return self._head <= self._connections.max_header_bytes

    def _refuse_head(self) -> None:
        """Answer 431 and close: the headers would grow past the bound in the parser."""
        self._connections.oversized += 1
        self._disarm()
        if self._transport is not None and not self._lost:
            self._transport.write(self._connections.too_large)
            self._transport.close()

    def _arm(self) -> None:
        if (self._deadline is None and self._requests == 0 and self._transport is not None
                and self._loop is not None and not self._lost):
            self._deadline = self._loop.call_later(self._connections.header_timeout_s,
                                                   self._late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _late(self) -> None:
        self._deadline = None
        if self._requests == 0 and self._transport is not None and not self._lost:
            self._connections.late += 1
            self._transport.abort()

    def _release(self) -> None:
        if self._counted:
            self._counted = False
            self._connections.release()


__all__ = ["FULL_LOG_EVERY_S", "Connections", "Door", "Peer", "headers_too_large"]
