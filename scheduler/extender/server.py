"""Serving the extender's Flask app: the project's one HTTP server (:mod:`gpufrag.httpserve`,
uvicorn), one process (the cluster state lives in it).

- **The verbs** (and the probes, for ``curl``) on ``server.host:server.port``, over TLS with
  client certificates when ``server.tls_*`` are set (kube-scheduler's ``enableHTTPS`` and
  ``tlsConfig``), the files re-read when renewed (:class:`gpufrag.tls.ServerTLS`).
  Filter and prioritize are answered on the event loop's thread (``inline_verbs``: the
  hand-off to a thread would be latency on every pod); bind and preempt, which wait on the API
  server or take their budget, on ``server.threads`` threads.
- **The probes on a listener of their own** (``server.health_port``), so the kubelet's probes
  never queue behind verbs; their ``/healthz`` fails once the verbs' event loop has not ticked
  for ``server.timeout_s`` (a verb that never returns, a blocked loop), so the kubelet
  restarts an extender that serves nothing.
- **Slow clients hold no thread** (see :mod:`gpufrag.httpserve`): a body must arrive within
  ``server.read_timeout_s`` of its headers (408), one over ``server.max_body_bytes`` is
  refused (413), headers must come within the keep-alive of :data:`KEEPALIVE_S`, and at most
  ``server.threads`` x ``server.max_body_bytes`` of bodies are held at once (503).
- **A graceful stop** on SIGTERM/SIGINT: the listener closes, answers in flight get
  :data:`STOP_GRACE_S`, verbs still queued for a thread are dropped, then the watches stop.
"""

from __future__ import annotations

import sys

import structlog

from gpufrag.httpserve import Limits, Server, listen
from gpufrag.probes import probe_limits
from gpufrag.tls import ServerTLS
from scheduler.core import fragkernel
from scheduler.extender.app import create_probe_app, inline_verbs
from scheduler.extender.config import ServerConfig
from scheduler.extender.runtime import Runtime

# Longer than kube-scheduler's idle connections live (Go's transport: 90 s idle, but it reuses
# a connection at once under load): a server that closed a kept connection first would race
# the next POST on it, which Go does not resend (the pod then misses the extender).
KEEPALIVE_S = 75.0
STOP_GRACE_S = 10.0
# Bodies at least this large are handled one at a time (see limits()).
LARGE_BODY_BYTES = 4 * 1024 * 1024

log = structlog.get_logger("gpufrag.extender")


def limits(server: ServerConfig) -> Limits:
    """The verbs' listener's bounds, from ``server``.

    Memory: the bodies held at once are bounded by two of the largest (``max_body_bytes``
    each), and bodies of ``LARGE_BODY_BYTES`` or more are handled one at a time (a filter with
    full ``Nodes`` objects for 5,000 nodes is ~50 MB, and parsing one costs ~170 MB more; eight
    at once peaked at 1.15 GB against the manifests' 1 GiB limit). Small bodies (a
    ``NodeNames`` filter for 5,000 nodes is ~100 KB) are never held back by them. What the
    verbs build from the bodies is bounded apart, by ``server.memory_budget_bytes``
    (:mod:`scheduler.extender.app`).

    Connections: :class:`~gpufrag.httpserve.Limits`' defaults (256 at once, 16 KiB of
    headers each, in within ``server.read_timeout_s``): kube-scheduler, the one client,
    keeps a pool of a few dozen at most, binding in parallel."""
    return Limits(max_body_bytes=server.max_body_bytes, read_timeout_s=server.read_timeout_s,
                  keepalive_s=KEEPALIVE_S, threads=server.threads, grace_s=STOP_GRACE_S,
                  setting="server.read_timeout_s",
                  max_buffered_bytes=2 * server.max_body_bytes,
                  large_body_bytes=LARGE_BODY_BYTES, large_concurrency=1,
                  header_timeout_s=server.read_timeout_s)


def verbs_server(runtime: Runtime, server: ServerConfig) -> Server:
    """The verbs' listener (bound now: a port in use is a ``ListenError`` here)."""
    sock = listen(server.host, server.port, setting="server.host, server.port")
    tls = (ServerTLS(server.tls_cert_file, server.tls_key_file, server.tls_client_ca_file)
           if server.tls else None)
    return Server(runtime.app, sock, limits(server), tls=tls, name="verbs",
                  inline=inline_verbs(server.url_prefix))


def health_server(runtime: Runtime, server: ServerConfig, verbs: Server) -> Server:
    """The probes' listener (``server.health_port``), whose ``/healthz`` watches ``verbs``."""

    def stalled() -> str | None:
        seconds = verbs.stalled_for()
        if seconds <= server.timeout_s:
            return None
        return (f"verbs' event loop stalled for {seconds:.1f} s "
                f"(server.timeout_s {server.timeout_s:g})")

    sock = listen(server.health_host, server.health_port,
                  setting="server.health_host, server.health_port")
    app = create_probe_app(runtime.extender, runtime.metrics, stalled=stalled)
    return Server(app, sock, probe_limits(), name="health")


def serve(runtime: Runtime, server: ServerConfig) -> None:
    """Serve until SIGTERM/SIGINT; ``ListenError`` when a port cannot be had (before any
    watch starts)."""
    verbs = verbs_server(runtime, server)
    health = None
    try:
        if server.health_port:
            health = health_server(runtime, server, verbs)
    except BaseException:
        verbs.sock.close()
        raise
    sys.setswitchinterval(server.switch_interval_s)
    runtime.start()
    if health is not None:
        health.start()
    # Which fragmentation engine runs the filters (GPUFRAG_KERNEL pins one, or the fastest
    # installed is taken): a numpy fallback is several times slower, so it is said at start.
    log.info("serving", port=verbs.port, health_port=health.port if health else None,
             fragmentation_engine=fragkernel.engine())
    try:
        verbs.run(signals=True)
    finally:
        log.info("stopped serving; stopping the watches")
        runtime.stop()
        if health is not None:
            health.stop()


__all__ = ["KEEPALIVE_S", "STOP_GRACE_S", "health_server", "limits", "serve", "verbs_server"]
