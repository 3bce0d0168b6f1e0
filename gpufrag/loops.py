"""Which asyncio event loop the project's event-loop servers run on (``gpufrag serve``, and
the scheduler extender's verbs): uvloop when it is installed, else the standard library's.
One home for the choice, in the shared base, so both servers pick the same way.

Why uvloop: the serving process spends most of its event-loop time in socket reads and writes
and callback dispatch for many small requests, which uvloop does in C on libuv. Measured on the
v2 infer path with ``benchmarks/serving_bench.py`` (figures in docs/serving.md): less event-loop
CPU per request for the same answers. ``--event-loop asyncio`` keeps the standard loop (for
debugging, or where uvloop cannot be installed); ``uvloop`` insists on it and fails the start
with a one-line error when it is missing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

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


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A loop of the ``auto`` choice: uvloop when installed, else the standard one (the
    extender's verbs, and the benchmarks' clients, as ``gpufrag serve`` picks by default)."""
    return loop_factory(resolve_event_loop("auto"))()


def running_loop_kind() -> str:
    """``uvloop`` or ``asyncio``: which loop this coroutine runs on (for the start-up log)."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.split(".")[0] == "uvloop" else "asyncio"
