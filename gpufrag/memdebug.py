"""An opt-in debug listener: where a live process's memory grew, by allocation site.

A serving process whose RSS keeps climbing is asked, without a restart, which lines of code
hold the memory it gained: :class:`AllocationTracer` starts :mod:`tracemalloc` (the
interpreter's own allocation tracer, public API) and keeps a baseline snapshot; each
``GET /debug/memory`` compares a fresh snapshot with it and answers the top allocation sites
by growth (bytes and blocks gained, the traceback of each), the traced total and peak, and
whatever the component adds (``gpufrag serve``: each GPU's used memory, beside the per-batch
growth its metrics count), as JSON.

Off by default: tracing costs every allocation some time and memory (a few percent of CPU and
about 30 bytes per live block, with the frames kept), so a component turns it on only when its
``--debug-port`` is set, and stops tracing when it stops.

Who may call it: only something on the same network namespace -- the listener binds loopback
(127.0.0.1) and nothing else, so from outside the pod it is reached only by who may
``kubectl port-forward`` (the ``pods/portforward`` permission) or ``kubectl exec`` into it.
It answers GET and HEAD only, on the project's one probe server (bounded request size and
read deadline), and a report is bounded too (:data:`TOP_SITES` sites of :data:`FRAMES`
frames).
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from gpufrag.httpserve import Server
from gpufrag.probes import TEXT, ProbeAnswer, start_http_server

LOOPBACK: Final = "127.0.0.1"
FRAMES: Final = 8  # frames kept per allocation: enough to see the caller's caller's caller
TOP_SITES: Final = 25
JSON: Final = "application/json"
# The tracer's own bookkeeping is not the process's growth.
_IGNORED: Final = (tracemalloc.Filter(False, tracemalloc.__file__),
                   tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
                   tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
                   tracemalloc.Filter(False, "<unknown>"))


class AllocationTracer:
    """Traces allocations from now on; :meth:`report` says what grew since then."""

    def __init__(self, *, frames: int = FRAMES, clock: Callable[[], float] = time.time) -> None:
        self._started_here = not tracemalloc.is_tracing()
        if self._started_here:
            tracemalloc.start(frames)
        self._since = clock()
        self._clock = clock
        self._baseline = tracemalloc.take_snapshot().filter_traces(_IGNORED)

    def report(self, top: int = TOP_SITES) -> dict[str, Any]:
        """The ``top`` allocation sites by bytes gained since the baseline, as data."""
        now = tracemalloc.take_snapshot().filter_traces(_IGNORED)
        current, peak = tracemalloc.get_traced_memory()
        sites = [s for s in now.compare_to(self._baseline, "traceback") if s.size_diff > 0]
        return {
            "since": self._since, "seconds": round(self._clock() - self._since, 1),
            "traced_bytes": current, "traced_peak_bytes": peak,
            "top_growth": [{"growth_bytes": s.size_diff, "size_bytes": s.size,
                            "growth_blocks": s.count_diff, "blocks": s.count,
                            "traceback": [f"{f.filename}:{f.lineno}" for f in s.traceback]}
                           for s in sites[:top]]}

    def close(self) -> None:
        """Stop tracing (if this tracer started it) and drop the baseline."""
        if self._started_here and tracemalloc.is_tracing():
            tracemalloc.stop()


def answer(path: str, tracer: AllocationTracer,
           extra: Callable[[], Mapping[str, Any]]) -> ProbeAnswer:
    """(status, content type, body) for one GET of the debug listener."""
    if path == "/debug/memory":
        return 200, JSON, orjson.dumps({**tracer.report(), **extra()},
                                       option=orjson.OPT_INDENT_2) + b"\n"
    return 404, TEXT, b"not found: try /debug/memory\n"


@dataclass(frozen=True, slots=True)
class DebugListener:
    """A running debug listener and the tracer it reports; :meth:`stop` ends both."""

    server: Server
    tracer: AllocationTracer

    @property
    def port(self) -> int:
        return self.server.port

    def stop(self) -> None:
        self.server.stop()
        self.tracer.close()


def start_debug_listener(port: int, extra: Callable[[], Mapping[str, Any]], *,
                         setting: str = "--debug-port") -> DebugListener:
    """Start tracing and serve :func:`answer` on loopback ``port`` in a daemon thread;
    :class:`~gpufrag.httpserve.ListenError` (tracing stopped again) when the port cannot be
    had."""
    tracer = AllocationTracer()
    try:
        server = start_http_server(port, lambda path: answer(path, tracer, extra), name="debug",
                                   host=LOOPBACK, setting=setting)
    except BaseException:
        tracer.close()
        raise
    return DebugListener(server, tracer)
