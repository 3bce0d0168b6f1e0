"""What every long-running process serves and obeys: ``/metrics``, ``/healthz`` and
``/readyz`` on a listener of their own (the one probe listener of the project, on
:mod:`gpufrag.httpserve`), a stall-based liveness, and SIGTERM/SIGINT setting a stop event.

The node agent and the device plugin both run a supervisor loop on one thread and answer
probes from another; the loop ticking is what "alive" means (a hung NVML or kubelet call
fails it) and each component says what "ready" means. One home for both, in the shared base,
because the two are siblings in the import layers and may not import each other.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from structlog.typing import FilteringBoundLogger

from gpufrag.errors import BadInput
from gpufrag.httpserve import Limits, Server, WSGIApp, listen, reason

TEXT = "text/plain; charset=utf-8"
# A probe's answer: HTTP status, content type, body.
ProbeAnswer = tuple[int, str, bytes]
# A probe is a GET: its request must be in within this long, and carry no body past this.
PROBE_DEADLINE_S = 2.0
PROBE_MAX_BODY_BYTES = 8192
# Its callers are few: the kubelet's probes (liveness, readiness, start-up: each on a
# connection of its own, closed after the answer), a Prometheus scrape or two (one kept-alive
# connection each) and an operator's curl. Past this many at once the listener closes new
# connections unread (gpufrag.connlimit), so no pod that reaches the port can hold more of
# the component's memory than 16 connections' state and headers (tests/gpufrag/test_probes.py
# measures it with slow senders).
PROBE_MAX_CONNECTIONS = 16
# A probe's line and headers: ~150 bytes from the kubelet, a few hundred from Prometheus
# (a bearer token, where one is sent, is the largest part); 8 KiB is nginx's bound per line.
PROBE_MAX_HEADER_BYTES = 8192


class Liveness:
    """Ticks from the supervisor loop; stalled after ``stall_after_s`` without one (alive
    until the first tick, so a slow start is the start-up probe's to judge).

    A ticking loop is not enough when the work is done elsewhere: a request path that is stuck
    (a deadlock, a call that never returns) leaves the loop ticking and the component useless.
    So each call on a request path runs inside :meth:`working`, and a call in progress for
    longer than ``stuck_after_s`` makes the component not live either: the kubelet restarts it
    instead of leaving a node that admits no GPU pod while it says it is fine."""

    def __init__(self, clock: Callable[[], float], *, stall_after_s: float,
                 stuck_after_s: float = 60.0) -> None:
        self._clock = clock
        self._stall_after_s = stall_after_s
        self._stuck_after_s = stuck_after_s
        self._last: float | None = None
        self._lock = threading.Lock()
        self._calls: dict[int, tuple[str, float]] = {}  # call id -> (what, started)
        self._next_call = 0

    def tick(self, now: float | None = None) -> None:
        with self._lock:
            self._last = self._clock() if now is None else now

    @property
    def last(self) -> float | None:
        """When the last tick came (None before the first)."""
        with self._lock:
            return self._last

    def stalled_for(self) -> float:
        """Seconds since the last tick (0 before the first)."""
        last = self.last
        return 0.0 if last is None else self._clock() - last

    @contextmanager
    def working(self, what: str) -> Iterator[None]:
        """Count the block as a call in progress, named ``what`` (an RPC, a request)."""
        with self._lock:
            call = self._next_call
            self._next_call += 1
            self._calls[call] = (what, self._clock())
        try:
            yield
        finally:
            with self._lock:
                del self._calls[call]

    def stuck(self) -> tuple[str, float] | None:
        """The oldest call in progress for longer than ``stuck_after_s``: (what, seconds)."""
        now = self._clock()
        with self._lock:
            oldest = min(self._calls.values(), key=lambda call: call[1], default=None)
        if oldest is None or now - oldest[1] <= self._stuck_after_s:
            return None
        return oldest[0], now - oldest[1]

    def live(self) -> bool:
        return self.stalled_for() <= self._stall_after_s and self.stuck() is None

    def why_not_live(self) -> str:
        """What the 503 of ``/healthz`` says ('' while live)."""
        stuck = self.stuck()
        if stuck is not None:
            return f"{stuck[0]} in progress for {stuck[1]:.0f}s (bound {self._stuck_after_s:g}s)"
        stalled = self.stalled_for()
        if stalled > self._stall_after_s:
            return f"no supervisor tick for {stalled:.0f}s (bound {self._stall_after_s:g}s)"
        return ""


def respond(path: str, render_metrics: Callable[[], bytes], live: Callable[[], bool],
            ready: Callable[[], bool], *, stalled: str, not_ready: str) -> ProbeAnswer:
    """(status, content type, body) for one GET; apart from the server so it is testable.
    ``stalled`` and ``not_ready`` say, in the 503 body, what the component is waiting for."""
    route = path.split("?", 1)[0]
    if route == "/metrics":
        return 200, CONTENT_TYPE_LATEST, render_metrics()
    if route == "/healthz":
        return (200, TEXT, b"ok\n") if live() else (503, TEXT, f"{stalled}\n".encode())
    if route == "/readyz":
        return (200, TEXT, b"ready\n") if ready() else (503, TEXT, f"{not_ready}\n".encode())
    return 404, TEXT, b"not found: try /metrics, /healthz, /readyz\n"


def check_metrics_port(port: int) -> int:
    """``port`` for the probe server's ``--metrics-port`` (0 disables it), else bad input."""
    if not 0 <= port <= 65535:
        raise BadInput(f"{port} is not a TCP port (0 disables)", field="metrics_port")
    return port


def probe_app(answer: Callable[[str], ProbeAnswer]) -> WSGIApp:
    """A WSGI app answering ``GET``/``HEAD`` with ``answer(path)`` (405 for other methods)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        method = environ["REQUEST_METHOD"]
        if method in ("GET", "HEAD"):
            status, content_type, body = answer(environ.get("PATH_INFO") or "/")
        else:
            status, content_type, body = 405, TEXT, b"only GET and HEAD\n"
        start_response(reason(status), [("Content-Type", content_type),
                                        ("Content-Length", str(len(body)))])
        return [b"" if method == "HEAD" else body]

    return app


def probe_limits() -> Limits:
    """The bounds of every probe listener (the node daemons', the debug listener's and the
    extender's ``health_port``): small requests, few clients, prompt ones."""
    return Limits(max_body_bytes=PROBE_MAX_BODY_BYTES, read_timeout_s=PROBE_DEADLINE_S,
                  threads=2, keepalive_s=10.0, grace_s=1.0,
                  max_connections=PROBE_MAX_CONNECTIONS,
                  max_header_bytes=PROBE_MAX_HEADER_BYTES, header_timeout_s=PROBE_DEADLINE_S)


def start_http_server(port: int, answer: Callable[[str], ProbeAnswer], *, name: str,
                      host: str = "0.0.0.0", setting: str = "--metrics-port") -> Server:
    """Serve ``answer(path)`` for every GET on ``host:port`` in a daemon thread named
    ``name`` (the project's one server, :mod:`gpufrag.httpserve`: no slow client holds the
    probes); ``stop()`` the result. :class:`~gpufrag.httpserve.ListenError` names
    ``setting`` when the port cannot be had."""
    sock = listen(host, port, setting=setting)
    return Server(probe_app(answer), sock, probe_limits(), name=name).start()


def stop_on_signals(stop: threading.Event, log: FilteringBoundLogger) -> None:
    """SIGTERM and SIGINT set ``stop`` (and say so); only the main thread may install them,
    so elsewhere (a test driving ``main()`` from a thread) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handle(signum: int, _frame: object) -> None:
        log.info("stopping", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
