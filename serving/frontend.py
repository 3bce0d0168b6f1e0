"""The HTTP/1.1 front end of ``gpufrag serve``: the v2 routes of :mod:`serving.app` behind the
project's event-loop HTTP/1.1 server (:mod:`serving.http1`, one ``asyncio.Protocol`` per
connection, parsed by httptools).

Why hand-written: with a model that computes an image in ~0.1 ms, aiohttp's HTTP stack cost
more event-loop CPU per request (57 µs) than everything else the server did, and more than
the model on a busy machine; httptools on a bare protocol costs 9.5 µs (figures and the
before/after runs in docs/serving.md). The routes themselves live in :mod:`serving.app` as plain
functions; the framing, its limits and timeouts in :mod:`serving.http1`; this module only
says what a request means to the serving runtime (:class:`ServingSite`):

- an infer request is admitted or refused (404, 413 by ``Content-Length``, 503 +
  ``Retry-After``) when its headers are in, from the parser's callback, with no task and
  without reading the body; its ``Inference-Header-Content-Length`` and ``Timeout-Ms``
  headers go to the call with the body;
- a client that disconnects cancels its requests' futures, so the batcher drops them before
  compute;
- only requests that arrived before admission closed are counted for the drain; once the
  server is draining each connection's last answer carries ``Connection: close``.

Who may call it: the pod's clients and probes, inside the cluster. It is plain HTTP/1.1 with
no authentication and no TLS, like the v2 endpoints of Triton and KServe's model servers: put
it behind a Service (and a mesh or gateway for TLS and auth), never on a public address.
"""

from __future__ import annotations

import structlog

from serving import http1
from serving.app import (
    INFER,
    NOT_FOUND,
    SERVER_NAME,
    Route,
    RouteTable,
    ServerState,
    answer_get,
    begin_infer,
    plain_error,
)
from serving.http1 import Answer, Call, HttpLimits, Respond

log = structlog.get_logger("serving.frontend")

# The headers an infer call reads (lower case, as the framing matches them).
INFER_HEADERS = frozenset({b"inference-header-content-length", b"timeout-ms",
                           b"content-encoding"})


class ServingSite:
    """The v2 routes as a :class:`serving.http1.Site`."""

    captured_headers = INFER_HEADERS

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.routes = RouteTable(state.model_name)

    @property
    def max_body_bytes(self) -> int:
        return self.state.max_body_bytes

    @property
    def draining(self) -> bool:
        return self.state.draining

    def request_started(self) -> bool:
        # Only requests that arrived before admission closed are waited for by the drain:
        # the late ones are fast 503s, and under a steady stream of them the count would
        # seldom reach zero.
        if self.state.shutting_down:
            return False
        self.state.request_started()
        return True

    def request_finished(self) -> None:
        self.state.request_finished()

    def error(self, status: int, message: str,
              headers: tuple[tuple[str, str], ...] = ()) -> Answer:
        return plain_error(status, message, headers)

    def begin(self, method: bytes, url: bytes, content_length: int | None,
              respond: Respond) -> Answer | Call:
        route = self.routes.lookup(url)
        if route.kind == INFER and method == b"POST":
            return begin_infer(self.state, route, content_length, respond)
        if route.kind == NOT_FOUND:
            return plain_error(404, f"no route for {route.path}")
        if method == b"HEAD" and route.kind != INFER:
            return self._answer_get(route)  # the framing drops the body
        if method.decode("latin-1") != route.method:
            return plain_error(405, "Method Not Allowed",
                               (("Allow", "GET, HEAD" if route.method == "GET" else "POST"),))
        return self._answer_get(route)

    def _answer_get(self, route: Route) -> Answer:
        try:
            return answer_get(self.state, route)
        except Exception as exc:
            log.exception("route_failed", path=route.path)
            return plain_error(500, f"internal error: {type(exc).__name__}: {exc}")


def front_end(state: ServerState, limits: HttpLimits | None = None) -> http1.HttpServer:
    """The front end serving ``state`` (:meth:`~serving.http1.HttpServer.start`, then
    :meth:`~serving.http1.HttpServer.close` once drained)."""
    return http1.HttpServer(ServingSite(state), limits, server_name=SERVER_NAME)


__all__ = ["INFER_HEADERS", "HttpLimits", "ServingSite", "front_end"]
