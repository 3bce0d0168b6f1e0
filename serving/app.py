"""The HTTP layer: v2 inference protocol routes on aiohttp, feeding the dynamic batcher.

Why aiohttp (not Flask/gunicorn like the scheduler extender): the batcher holds many requests
open at once while they wait to be grouped, which is natural with one asyncio loop and costly
with a thread per request; and with ``handler_cancellation`` on, a client that disconnects
cancels its handler, which cancels the future the batcher holds, so the request is dropped
before compute instead of burning a batch slot on an answer nobody reads.

Routes: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models``,
``/v2/models/{name}``, ``/v2/models/{name}/ready``, ``POST /v2/models/{name}/infer``, the same
three model routes under ``/v2/models/{name}/versions/{version}``, and ``GET /metrics``. Every
error, including unknown routes, has the v2 shape ``{"error": "<message>"}``; 503s carry
``Retry-After``.

The server serves one version of one model, ``MODEL_VERSION`` ("1"), and advertises it
(``versions`` in the metadata, ``model_version`` in every response), so clients that address
versions explicitly (``tritonclient`` with ``model_version="1"``) must find it there; any other
version is a 404 naming the one that exists, never silently the latest.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from serving.batcher import DynamicBatcher
from serving.errors import (
    BodyTooLarge,
    InvalidRequest,
    ModelNotFound,
    RequestTimedOut,
    ServingError,
    Unavailable,
)
from serving.metrics import ServingMetrics
from serving.protocol import (
    BINARY_CONTENT_TYPE,
    HEADER_LENGTH,
    MODEL_VERSION,
    InferRequest,
    ModelInfo,
    encode_infer_response,
    error_body,
    parse_header_length,
    parse_infer_request,
)

log = structlog.get_logger("serving.app")

SERVER_NAME = "gpufrag-serving"
# Bodies above this are parsed in a worker thread so one large request does not stall the loop.
PARSE_OFFLOAD_BYTES = 256 * 1024


@dataclass
class ServerState:
    """What the handlers read; the server fills ``model``/``batcher`` once the model loads."""

    model_name: str
    metrics: ServingMetrics
    max_body_bytes: int
    retry_after_s: int = 1
    model: ModelInfo | None = None
    batcher: DynamicBatcher | None = None
    ready: bool = False
    # SIGTERM seen: readiness is 503 and every answer carries ``Connection: close``, but
    # requests are still admitted until the drain delay ends (``shutting_down``).
    draining: bool = False
    # admission closed: new requests get 503 + Retry-After; accepted ones are still answered
    shutting_down: bool = False
    # requests that arrived before admission closed whose handler is running or whose
    # response is still being written (the drain waits for them before the listener closes)
    active_requests: int = 0
    _idle: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def __post_init__(self) -> None:
        self._idle.set()

    def set_ready(self, ready: bool) -> None:
        self.ready = ready
        self.metrics.ready.set(1 if ready else 0)

    @property
    def admitting(self) -> bool:
        """Whether an inference request may be queued now: ready, or draining before
        admission closes (the endpoint may still be in a load balancer)."""
        return self.batcher is not None and not self.shutting_down and (
            self.ready or self.draining)

    def request_started(self) -> None:
        self.active_requests += 1
        self._idle.clear()

    def request_finished(self) -> None:
        self.active_requests -= 1
        if self.active_requests <= 0:
            self.active_requests = 0
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is being handled or written; False if ``timeout_s`` ran out."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=max(timeout_s, 0.0))
        except TimeoutError:
            return False
        return True


STATE = web.AppKey("state", ServerState)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(doc: object, status: int = 200,
                  headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, headers=headers,
                        content_type="application/json")


def error_response(error: ServingError) -> web.Response:
    headers = {}
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(error.retry_after_s)
    return web.Response(body=error_body(error.message), status=error.status, headers=headers,
                        content_type="application/json")


@web.middleware
async def v2_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Router 404/405s and anything unexpected, in the v2 error shape (never a traceback)."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.reason if exc.status != 404 else f"no route for {request.path}"
        return web.Response(body=error_body(message), status=exc.status,
                            content_type="application/json")
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception as exc:
        log.exception("handler_failed", path=request.path)
        return web.Response(body=error_body(f"internal error: {type(exc).__name__}: {exc}"),
                            status=500, content_type="application/json")


@web.middleware
async def lifecycle(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Counts every request until its response is written (the drain waits for that before
    the listener closes), and once draining answers with ``Connection: close``, so keep-alive
    clients reconnect (to another pod) instead of reusing a connection that will close."""
    state = request.app[STATE]
    # Only requests that arrived before admission closed are waited for: the late ones are
    # fast 503s, and under a steady stream of them the count would seldom reach zero.
    counted = not state.shutting_down
    if counted:
        state.request_started()
    try:
        response = await handler(request)
        if state.draining:
            response.force_close()  # before prepare: the header is set from it
        # Written here rather than after the middleware returns, so the count covers the
        # write; aiohttp's own prepare/write_eof afterwards are no-ops.
        await response.prepare(request)
        await response.write_eof()
        return response
    finally:
        if counted:
            state.request_finished()


def build_app(state: ServerState) -> web.Application:
    # client_max_size is the hard stop; the handler checks Content-Length first for a clear 413.
    app = web.Application(client_max_size=state.max_body_bytes,
                          middlewares=[lifecycle, v2_errors])
    app[STATE] = state
    app.router.add_get("/v2", server_metadata)
    app.router.add_get("/v2/health/live", live)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2/models", list_models)
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        app.router.add_get(prefix, model_metadata)
        app.router.add_get(f"{prefix}/ready", model_ready)
        app.router.add_post(f"{prefix}/infer", infer)
    app.router.add_get("/metrics", metrics)
    return app


async def server_metadata(request: web.Request) -> web.Response:
    return json_response({"name": SERVER_NAME, "version": "0.1.0",
                          "extensions": ["binary_tensor_data"]})


async def live(request: web.Request) -> web.Response:
    return json_response({"live": True})


async def ready(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return json_response({"ready": state.ready}, status=200 if state.ready else 503)


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.model is None:
        entry = {"name": state.model_name, "state": "LOADING", "reason": "model is loading"}
    else:
        entry = {"name": state.model.name, "version": MODEL_VERSION,
                 "platform": state.model.platform,
                 "state": "READY" if state.ready else "UNAVAILABLE",
                 "reason": "" if state.ready else "server is shutting down"}
    return json_response({"models": [entry]})


def _check_route(state: ServerState, request: web.Request) -> str:
    """The model name of a ``/v2/models/{name}[/versions/{version}]/...`` route, once the
    name and (if given) the version are ones this server serves; else 404."""
    name = request.match_info["name"]
    if name != state.model_name:
        raise ModelNotFound(f"unknown model {name!r}; this server serves {state.model_name!r}")
    version = request.match_info.get("version")
    if version is not None and version != MODEL_VERSION:
        raise ModelNotFound(f"model {name!r} has no version {version!r:.40}; this server "
                            f"serves version {MODEL_VERSION!r} only")
    return name


def _model(state: ServerState, request: web.Request) -> ModelInfo:
    name = _check_route(state, request)
    if state.model is None:
        raise Unavailable(f"model {name!r} is still loading", retry_after_s=state.retry_after_s)
    return state.model


async def model_metadata(request: web.Request) -> web.Response:
    try:
        model = _model(request.app[STATE], request)
    except ServingError as exc:
        return error_response(exc)
    return json_response(model.metadata())


async def model_ready(request: web.Request) -> web.Response:
    """200 when the model admits requests, else 503; the body names the model and version,
    as KServe's ``ModelReadyResponse`` does (clients read the status; people read the body)."""
    state = request.app[STATE]
    try:
        name = _check_route(state, request)
    except ServingError as exc:
        return error_response(exc)
    return json_response({"name": name, "version": MODEL_VERSION, "ready": state.ready},
                         status=200 if state.ready else 503)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def infer(request: web.Request) -> web.Response:
    state = request.app[STATE]
    started = time.perf_counter()
    try:
        response = await _infer(request, state)
    except ServingError as exc:
        response = error_response(exc)
    state.metrics.request_seconds.observe(time.perf_counter() - started)
    return response


async def _infer(request: web.Request, state: ServerState) -> web.Response:
    arrived = time.monotonic()
    try:
        model = _model(state, request)
        batcher = state.batcher
        if not state.admitting or batcher is None:
            raise Unavailable("server is shutting down"
                              if state.shutting_down or state.draining
                              else "server is not ready", retry_after_s=state.retry_after_s)
        # Shed load before reading and parsing the body: under overload the rejection must
        # be the cheapest thing the server does, or parsing becomes the bottleneck.
        refused = batcher.admission_error()
        if refused is not None:
            raise refused
        parsed = await _read_request(request, state, model)
        timeout_s = parsed.timeout_s
        if timeout_s is not None:  # the deadline runs from arrival, not from enqueue
            timeout_s -= time.monotonic() - arrived
            if timeout_s <= 0:
                raise RequestTimedOut("request timed out while being read and parsed; "
                                      "not computed")
    except ServingError as exc:  # raised here, before the batcher: counted here
        state.metrics.outcome(exc.outcome)
        raise
    transport = request.transport

    def client_gone() -> bool:
        return transport is None or transport.is_closing()

    try:
        future = batcher.submit(parsed.inputs, timeout_s=timeout_s, client_gone=client_gone)
    except InvalidRequest as exc:
        state.metrics.outcome(exc.outcome)
        raise
    outputs = await future  # cancelled with the handler if the client disconnects
    encoded = encode_infer_response(model, parsed, outputs)
    if encoded.header_length is None:
        return web.Response(body=encoded.body, content_type="application/json")
    return web.Response(body=encoded.body, content_type=BINARY_CONTENT_TYPE,
                        headers={HEADER_LENGTH: str(encoded.header_length)})


async def _read_request(request: web.Request, state: ServerState,
                        model: ModelInfo) -> InferRequest:
    limit = state.max_body_bytes
    too_large = BodyTooLarge(f"request body exceeds the {limit} byte limit (--max-body-bytes); "
                             "send fewer rows per request")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None
    timeout_header = request.headers.get("Timeout-Ms")
    header_length = request.headers.get(HEADER_LENGTH)
    json_bytes = len(body)  # only the JSON part costs parsing; binary tensors are views
    if header_length is not None:
        try:
            json_bytes = parse_header_length(header_length, len(body))
        except InvalidRequest:
            json_bytes = 0  # rejected at once by the parser below
    if json_bytes > PARSE_OFFLOAD_BYTES:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None, lambda: parse_infer_request(body, model, timeout_header=timeout_header,
                                              header_length=header_length))
    return parse_infer_request(body, model, timeout_header=timeout_header,
                               header_length=header_length)
