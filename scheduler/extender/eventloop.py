"""Serving the verbs on one event loop (``server.engine: eventloop``, the default).

Why: kube-scheduler calls filter once per pod inside its serial scheduling cycle, so
everything between the request's bytes arriving and the answer leaving is latency on every
pod. In gunicorn's gthread worker each request passes from the worker's poller thread to a
request thread and back, each step waiting for the GIL; here the loop's thread reads the
request (:mod:`gpufrag.http1`, httptools), runs filter or prioritize as soon as the body is in
and writes the answer, with no hand-off. Only the bind, which waits on the API server, and
preempt (rare, and it may read pods) go to ``server.threads`` threads, as do verb bodies over
:data:`INLINE_BODY_BYTES` (a 10,000-node list is ~200 KB), so one huge request cannot hold
the loop while it parses. Figures: docs/extender.md, Performance.

The same hardenings as the gunicorn engine (:mod:`scheduler.extender.server`), in the loop's
terms:

- **Slow clients hold nothing.** A connection costs a parser and its buffers, not a thread.
  Headers must arrive within ``server.read_timeout_s`` of the request's first byte and a body
  may not stall longer than that (408, and the connection closes); a body over
  ``server.max_body_bytes`` is refused by its Content-Length before it is read, or once a
  chunked one grows past it (413); at most :data:`MAX_CONNECTIONS` connections are open, each
  read no further while one answer is outstanding and the next request's headers are in, and
  at most ``server.threads`` x ``server.max_body_bytes`` of bodies are held over all of them
  (503 + Retry-After past that), the gunicorn engine's bound.
- **Probes** are answered on the verbs' port by the loop, and on ``server.health_port`` by the
  :class:`~scheduler.extender.server.HealthServer` thread, whose ``/healthz`` also fails when
  the loop has not ticked for ``server.timeout_s`` (what gunicorn's worker timeout did: a
  stuck loop is restarted by the kubelet's liveness probe instead of serving nothing).
- **TLS with client certificates** (``server.tls_*``): the same context as the gunicorn
  engine's, with the handshake bounded by ``server.read_timeout_s``; renewed certificate, key
  and client CA files make a fresh context within :data:`TLS_RELOAD_S`, used for the next
  connections (:class:`TlsReloader`).
- **A graceful stop** on SIGTERM/SIGINT: the listener closes, idle connections close, answers
  being made get :data:`STOP_GRACE_S` to be written (a bind in flight usually answers within
  it: its POST times out after 30 s at most, and a connection still waiting after the grace is
  aborted, the bind's outcome then unanswered), verbs still queued for a thread are dropped,
  then the watches stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import orjson
import structlog
from werkzeug.exceptions import RequestEntityTooLarge

from gpufrag.http1 import Answer, Call, HttpLimits, HttpServer, Respond
from gpufrag.loops import new_event_loop, running_loop_kind
from gpufrag.probes import Liveness
from scheduler.extender.app import TEXT, Probe, ProbeAnswer, Verbs, Work, app_probes, app_verbs
from scheduler.extender.config import ServerConfig
from scheduler.extender.runtime import Runtime
from scheduler.extender.server import KEEPALIVE_S, HealthServer, ListenError, tls_context_factory

SERVER_NAME = "gpufrag-extender"
JSON = "application/json"
# Verbs answered on the loop's thread (CPU only, a few ms at most); the others wait on the API
# server and go to the threads.
INLINE_VERBS = frozenset({"filter", "prioritize"})
# A verb body larger than this is handled in a thread, so parsing it does not hold the loop.
INLINE_BODY_BYTES = 1024 * 1024
MAX_CONNECTIONS = 1024
STOP_GRACE_S = 10.0
TLS_RELOAD_S = 10.0

log = structlog.get_logger("gpufrag.extender")


def _too_large() -> bytes:
    raise RequestEntityTooLarge()


def _error(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Answer:
    return Answer(status, orjson.dumps({"Error": message}), JSON, headers)


def _not_allowed(method: bytes, path: str, allow: str) -> Answer:
    return _error(405, f"405 Method Not Allowed: {method.decode('latin-1')} {path}",
                  (("Allow", allow),))


class _VerbCall:
    """One verb request once its headers are in: run where its verb belongs, answered once."""

    __slots__ = ("_future", "_respond", "_site", "_verb", "_work", "cancelled")

    def __init__(self, site: VerbsSite, verb: str, work: Work, respond: Respond) -> None:
        self._site = site
        self._verb = verb
        self._work = work
        self._respond = respond
        self._future: Future[tuple[int, bytes]] | None = None
        self.cancelled = False

    def run(self, body: bytes, headers: Mapping[bytes, str],
            client_gone: Callable[[], bool]) -> None:
        site = self._site
        if self._verb in INLINE_VERBS and len(body) <= INLINE_BODY_BYTES:
            self._respond(site.answer(self._verb, self._work, lambda: body))
            return
        self._future = site.pool.submit(site.verbs.handle, self._verb, self._work, lambda: body)
        self._future.add_done_callback(self._done_in_thread)

    def _done_in_thread(self, done: Future[tuple[int, bytes]]) -> None:
        # On the thread that ran it: hand the answer to the loop.
        if done.cancelled():  # the client went, or the server stopped, before it ran
            return
        try:
            status, out = done.result()
            answer = Answer(status, out, JSON)
        except Exception:  # handle() answers every error itself; this is a bug of ours
            log.exception("verb failed in its thread", verb=self._verb)
            answer = _error(500, "internal error in the gpufrag extender; see its log")
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody to answer
            self._site.loop.call_soon_threadsafe(self._answer, answer)

    def _answer(self, answer: Answer) -> None:
        if not self.cancelled:
            self._respond(answer)

    def too_large(self) -> None:
        self._respond(self._site.answer(self._verb, self._work, _too_large))

    def cancel(self) -> None:
        # A verb still queued for a thread never runs (kube-scheduler has given up on it and
        # may have retried the pod elsewhere); one already running finishes, unanswered.
        self.cancelled = True
        if self._future is not None:
            self._future.cancel()


class VerbsSite:
    """The extender's routes as a :class:`gpufrag.http1.Site`: the verbs (POST), the probes
    (GET, HEAD), and ``{"Error": ...}`` for everything else, as the Flask app answers."""

    captured_headers: frozenset[bytes] = frozenset()

    def __init__(self, verbs: Verbs, probes: Mapping[str, Probe], pool: ThreadPoolExecutor,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.verbs = verbs
        self.probes = probes
        self.pool = pool
        self.loop = loop
        self.stopping = False

    @property
    def max_body_bytes(self) -> int:
        return self.verbs.max_body_bytes

    @property
    def draining(self) -> bool:
        return self.stopping

    def request_started(self) -> bool:
        return False  # the stop waits on connections, not on a count of requests

    def request_finished(self) -> None:
        pass

    def error(self, status: int, message: str,
              headers: tuple[tuple[str, str], ...] = ()) -> Answer:
        return _error(status, message, headers)

    def answer(self, verb: str, work: Work, read: Callable[[], bytes]) -> Answer:
        """``verb``'s answer, from the app's one handler (its errors, metrics and log)."""
        status, out = self.verbs.handle(verb, work, read)
        return Answer(status, out, JSON)

    def begin(self, method: bytes, url: bytes, content_length: int | None,
              respond: Respond) -> Answer | Call:
        path = url.split(b"?", 1)[0].decode("latin-1")
        found = self.verbs.paths.get(path)
        if found is not None:
            verb, work = found
            if method != b"POST":
                return _not_allowed(method, path, "POST")
            if content_length is not None and content_length > self.verbs.max_body_bytes:
                return self.answer(verb, work, _too_large)
            return _VerbCall(self, verb, work, respond)
        probe = self.probes.get(path)
        if probe is not None:
            if method not in (b"GET", b"HEAD"):
                return _not_allowed(method, path, "GET, HEAD")
            status, content_type, out = probe()
            return Answer(status, out, content_type)
        return _error(404, f"404 Not Found: {method.decode('latin-1')} {path}")


class Heartbeat:
    """The loop's ticks (a :class:`~gpufrag.probes.Liveness`, alive from the start), for the
    health listener's ``/healthz``: a loop that has not ticked for ``stall_after_s`` is stuck
    (a verb that never returns, a blocked callback)."""

    def __init__(self, stall_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_after_s = stall_after_s
        self.liveness = Liveness(clock, stall_after_s=stall_after_s)
        self.liveness.tick()

    @property
    def last(self) -> float | None:
        return self.liveness.last

    def tick(self) -> None:
        self.liveness.tick()

    def checked(self, healthz: Probe) -> Probe:
        def probe() -> ProbeAnswer:
            if not self.liveness.live():
                return 503, TEXT, (f"event loop stalled for {self.liveness.stalled_for():.1f} "
                                   f"s (server.timeout_s {self.stall_after_s:g})\n").encode()
            return healthz()
        return probe


class TlsReloader:
    """Renewed certificate, key and client CA files, for the next handshakes: every
    :data:`TLS_RELOAD_S` their modification times are checked, and when one changed a fresh
    context is made from them, as at start-up. Only a context that loaded whole replaces the
    one in use (:attr:`current`), so files caught half-written leave the old ones serving, and
    a client CA taken out of the file is no longer trusted. The listener's context hands each
    new connection to :attr:`current` from its SNI callback, which OpenSSL calls for every
    ClientHello, with or without a server name (kube-scheduler sends none to an IP)."""

    def __init__(self, server: ServerConfig, context: ssl.SSLContext,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.server = server
        self.current = context
        self.clock = clock
        self.checked_at = clock()
        self.stamps = self._stamps()
        self.make = tls_context_factory(server)
        context.sni_callback = self._pick

    def _pick(self, connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None,
              listening: ssl.SSLContext) -> None:
        if self.current is not listening:
            connection.context = self.current

    def _stamps(self) -> tuple[float, ...]:
        files = [self.server.tls_cert_file, self.server.tls_key_file]
        if self.server.tls_client_ca_file:
            files.append(self.server.tls_client_ca_file)
        stamps = []
        for path in files:
            try:
                stamps.append(os.stat(path).st_mtime)
            except OSError:
                stamps.append(-1.0)
        return tuple(stamps)

    def maybe_reload(self) -> None:
        now = self.clock()
        if now - self.checked_at < TLS_RELOAD_S:
            return
        self.checked_at = now
        stamps = self._stamps()
        if stamps == self.stamps:
            return
        try:
            fresh = self.make(None, None)
        except (OSError, ssl.SSLError) as e:  # half-written files: try again next time
            log.warning("TLS files changed but could not be loaded; still serving the old "
                        "ones", error=str(e))
            return
        self.current = fresh
        self.stamps = stamps
        log.info("TLS certificate reloaded", certfile=self.server.tls_cert_file)


def limits_for(server: ServerConfig) -> HttpLimits:
    """The framing's bounds for ``server``: ``read_timeout_s`` for the headers and for a
    stalled body; gunicorn's keep-alive; reading paused while a connection has an answer
    outstanding and another request's headers in (kube-scheduler never pipelines); and at
    most ``threads`` x ``max_body_bytes`` of bodies held at once, what the gunicorn engine's
    threads could hold."""
    return HttpLimits(header_timeout_s=server.read_timeout_s,
                      body_timeout_s=server.read_timeout_s,
                      keepalive_timeout_s=float(KEEPALIVE_S), max_pipelined=2,
                      max_connections=MAX_CONNECTIONS,
                      timeouts_setting="server.read_timeout_s",
                      max_buffered_bytes=max(1, server.threads) * server.max_body_bytes)


class LoopServer:
    """The verbs' listener on an event loop, with its threads, heartbeat and TLS reloads;
    :meth:`start` on the loop, then :meth:`stop`. Used by :func:`serve` and by the tests."""

    def __init__(self, runtime: Runtime, server: ServerConfig,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.loop = loop
        self.pool = ThreadPoolExecutor(server.threads, thread_name_prefix="verb")
        self.site = VerbsSite(app_verbs(runtime.app), app_probes(runtime.app), self.pool, loop)
        self.heartbeat = Heartbeat(server.timeout_s)
        self.tls = tls_context_factory(server)(None, None) if server.tls else None
        self.reloader = TlsReloader(server, self.tls) if self.tls is not None else None
        self.http = HttpServer(self.site, limits_for(server), server_name=SERVER_NAME,
                               on_sweep=self._sweep)
        self.port = 0

    def _sweep(self) -> None:
        self.heartbeat.tick()
        if self.reloader is not None:
            self.reloader.maybe_reload()

    def probes(self) -> dict[str, Probe]:
        """The probes for the health listener, ``/healthz`` checking the heartbeat too."""
        probes = dict(self.site.probes)
        if "/healthz" in probes:
            probes["/healthz"] = self.heartbeat.checked(probes["/healthz"])
        return probes

    async def start(self) -> int:
        server = self.server
        try:
            self.port = await self.http.start(server.host, server.port, tls=self.tls,
                                              tls_handshake_timeout_s=server.read_timeout_s)
        except OSError as e:
            raise ListenError(f"cannot listen on {server.host}:{server.port} (server.host, "
                              f"server.port): {e.strerror or e}") from None
        return self.port

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        self.site.stopping = True
        await self.http.close(grace_s)
        self.pool.shutdown(wait=False, cancel_futures=True)


async def _loop_kind() -> str:
    return running_loop_kind()


def serve(runtime: Runtime, server: ServerConfig) -> None:
    """Serve until SIGTERM/SIGINT; :class:`ListenError` when a port cannot be had."""
    health = (HealthServer.listen(server.health_host, server.health_port)
              if server.health_port else None)
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    listener = LoopServer(runtime, server, loop)
    try:
        loop.run_until_complete(listener.start())
    except ListenError:
        if health is not None:
            health.listener.close()
        loop.close()
        raise
    # The watches (threads) start only once both ports are had, as in the gunicorn worker.
    sys.setswitchinterval(server.switch_interval_s)
    runtime.start()
    if health is not None:
        health.start(listener.probes())
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info("serving", engine="eventloop", port=listener.port,
             loop=loop.run_until_complete(_loop_kind()))
    try:
        loop.run_until_complete(stop.wait())
        log.info("stopping", grace_s=STOP_GRACE_S)
        loop.run_until_complete(listener.stop())
    finally:
        runtime.stop()
        if health is not None:
            health.stop()
        loop.close()


__all__ = ["INLINE_BODY_BYTES", "INLINE_VERBS", "MAX_CONNECTIONS", "Heartbeat", "LoopServer",
           "TlsReloader", "VerbsSite", "limits_for", "serve"]
