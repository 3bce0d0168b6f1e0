"""Which asyncio event loop the project's event-loop servers run on (``gpufrag serve``, and
the scheduler extender's verbs): uvloop when it is installed, else the standard library's.
One home for the choice, in the shared base, so both servers pick the same way.

Why uvloop: the serving process spends most of its event-loop time in socket reads and writes
and callback dispatch for many small requests, which uvloop does in C on libuv. Measured on the
v2 infer path with ``benchmarks/serving_bench.py`` (figures in docs/serving.md): less event-loop
CPU per request for the same answers. ``--event-loop asyncio`` keeps the standard loop (for
debugging, or where uvloop cannot be installed); ``uvloop`` insists on it and fails the start
with a one-line error when it is missing.

A loop of either kind can also stand in front of every listener started on it
(:func:`new_event_loop` with ``server_wrap``): uvicorn starts its listeners with the running loop's
``create_server`` (a public method of the loop), so a loop that wraps the protocol factory it is
given sees every connection first, before the server does, without a private name of uvicorn's or of
asyncio's. :mod:`gpufrag.connlimit` is what stands there (a cap on connections, a deadline and a
size bound on request headers); TLS is handed to the wrapper too (:class:`TLSStart`), so that a
connection it refuses costs no handshake. A wrapper that begins TLS itself needs a loop that reads
nothing of a connection paused in ``connection_made``: the standard library's does (CPython
gh-103607), uvloop does not.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gpufrag.errors import BadInput

EVENT_LOOPS = ("auto", "uvloop", "asyncio")

try:
    import uvloop
except ImportError:  # a dependency on Linux; absent elsewhere, where auto falls back
    uvloop = None  # type: ignore[assignment]


def uvloop_available() -> bool:
    return uvloop is not None


def resolve_event_loop(choice: str) -> str:
    """``auto`` -> ``uvloop`` when importable, else ``asyncio``; ``uvloop`` must be importable."""
    if choice not in EVENT_LOOPS:
        raise BadInput(f"{choice!r} is not one of {', '.join(EVENT_LOOPS)}",
                       field="--event-loop")
    if choice == "auto":
        return "uvloop" if uvloop_available() else "asyncio"
    if choice == "uvloop" and not uvloop_available():
        raise BadInput("uvloop is not installed in this environment; install it or use "
                       "--event-loop asyncio", field="--event-loop")
    return choice


def loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory for ``asyncio.Runner(loop_factory=...)``; ``kind`` as :func:`resolve_event_loop`
    returns it."""
    if kind == "uvloop" and uvloop is not None:
        return uvloop.new_event_loop
    return asyncio.new_event_loop


ProtocolFactory = Callable[[], asyncio.BaseProtocol]


@dataclass(frozen=True, slots=True)
class TLSStart:
    """The TLS a listener was started with (``create_server``'s ``ssl`` arguments), for the
    wrapper to begin on each connection it lets in (``loop.start_tls``)."""

    context: ssl.SSLContext
    handshake_timeout_s: float | None = None
    shutdown_timeout_s: float | None = None


class ServerWrap(Protocol):
    """What stands in front of a listener: given the server's protocol factory and its TLS
    (None: plain TCP), the factory the loop makes each accepted connection's protocol with."""

    def __call__(self, protocol_factory: ProtocolFactory, tls: TLSStart | None, /
                 ) -> ProtocolFactory: ...


class _WrapsServers(asyncio.AbstractEventLoop):
    """A loop whose ``create_server`` hands the protocol factory (and the TLS) to
    :attr:`server_wrap` first; mixed into each loop class before the loop itself."""

    server_wrap: ServerWrap | None = None

    async def create_server(self, protocol_factory: ProtocolFactory, *args: Any,
                            **kwargs: Any) -> asyncio.Server:
        wrap = self.server_wrap
        if wrap is None:
            return await super().create_server(protocol_factory, *args, **kwargs)
        context = kwargs.pop("ssl", None)
        handshake_s = kwargs.pop("ssl_handshake_timeout", None)
        shutdown_s = kwargs.pop("ssl_shutdown_timeout", None)
        if context is not None and not isinstance(context, ssl.SSLContext):
            raise TypeError(f"a wrapped listener's ssl must be an SSLContext, not {context!r}")
        tls = None if context is None else TLSStart(context, handshake_s, shutdown_s)
        return await super().create_server(wrap(protocol_factory, tls), *args, **kwargs)


class _WrappingSelectorLoop(_WrapsServers, asyncio.SelectorEventLoop):
    """The standard library's loop, wrapping its listeners."""


if uvloop is not None:
    # (uvloop's stubs and typeshed's AbstractEventLoop differ in many signatures; uvloop's own
    # Loop carries the same ignore.)
    class _WrappingUvloop(_WrapsServers, uvloop.Loop):  # type: ignore[misc]
        """uvloop, wrapping its listeners."""


def new_event_loop(*, server_wrap: ServerWrap | None = None,
                   choice: str = "auto") -> asyncio.AbstractEventLoop:
    """A loop of the ``auto`` choice: uvloop when installed, else the standard one (the
    extender's verbs, and the benchmarks' clients, as ``gpufrag serve`` picks by default),
    or of ``choice`` (:func:`resolve_event_loop`). With ``server_wrap``, every listener
    started on it is wrapped (the module docstring)."""
    kind = resolve_event_loop(choice)
    if server_wrap is None:
        return loop_factory(kind)()
    loop: _WrapsServers = (_WrappingUvloop() if kind == "uvloop" and uvloop is not None
                           else _WrappingSelectorLoop())
    loop.server_wrap = server_wrap
    return loop


def running_loop_kind() -> str:
    """``uvloop`` or ``asyncio``: which loop this coroutine runs on (for the start-up log)."""
    loop = asyncio.get_running_loop()
    return "uvloop" if uvloop is not None and isinstance(loop, uvloop.Loop) else "asyncio"
