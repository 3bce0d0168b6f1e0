"""The v2 inference protocol's routes, as plain functions of the server's state: no transport.

The HTTP/1.1 front end (:mod:`serving.frontend`) parses a request, looks its path up in a
:class:`RouteTable` and calls what it finds here; everything it gets back is an
:class:`Answer` (status, body, content type, extra headers) it writes as bytes. Keeping the
routes free of the transport is what lets the front end be a hand-written ``asyncio.Protocol``
(measured in docs/serving.md: the HTTP stack was a third of the event loop's time per request)
while the protocol's rules stay in one place and are tested through a real socket.

Routes: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models``,
``/v2/models/{name}``, ``/v2/models/{name}/ready``, ``POST /v2/models/{name}/infer``, the same
three model routes under ``/v2/models/{name}/versions/{version}``, and ``GET /metrics``. Every
error, including unknown routes, has the v2 shape ``{"error": "<message>"}``; 503s carry
``Retry-After``.

An infer request is handled in two steps, so load is shed before the body is read:
:func:`begin_infer` runs when the headers are in (404, 503 not ready / shutting down / queue
full, 413 by ``Content-Length``: answered at once, the body never read), and
:meth:`InferCall.run` when the body is. The answer comes back through a callback when the
batcher resolves the request's future: no task per request, and a client that disconnects
cancels that future (:meth:`InferCall.cancel`), so the request is dropped before compute.

The server serves one version of one model, ``MODEL_VERSION`` ("1"), and advertises it
(``versions`` in the metadata, ``model_version`` in every response), so clients that address
versions explicitly (``tritonclient`` with ``model_version="1"``) must find it there; any other
version is a 404 naming the one that exists, never silently the latest.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import orjson
import structlog
from prometheus_client import CONTENT_TYPE_LATEST

from serving.backends.base import Array
from serving.batcher import DynamicBatcher
from serving.encoding import decode_body
from serving.errors import (
    BodyTooLarge,
    InvalidRequest,
    ModelNotFound,
    RequestTimedOut,
    ServingError,
    Unavailable,
)
from serving.http1 import Answer, Respond
from serving.metrics import ServingMetrics
from serving.protocol import (
    BINARY_CONTENT_TYPE,
    HEADER_LENGTH,
    MODEL_VERSION,
    InferRequest,
    ModelInfo,
    RequestPlans,
    encode_infer_response,
    error_body,
    parse_header_length,
    parse_infer_request,
)

log = structlog.get_logger("serving.app")

SERVER_NAME = "gpufrag-serving"
SERVER_VERSION = "0.1.0"
JSON_CONTENT_TYPE = "application/json"
# Bodies above this are parsed in a worker thread so one large request does not stall the loop.
PARSE_OFFLOAD_BYTES = 256 * 1024


@dataclass
class ServerState:
    """What the routes read; the server fills ``model``/``batcher`` once the model loads."""

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
    # requests that arrived before admission closed whose answer is being made or is not yet
    # written (the drain waits for them before the listener closes)
    active_requests: int = 0
    # binary requests already checked, by their JSON header (serving.protocol.RequestPlans)
    plans: RequestPlans = field(default_factory=RequestPlans, repr=False)
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
        if self.active_requests == 1:  # (set only while none is active)
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


def json_answer(doc: object, status: int = 200) -> Answer:
    return Answer(status, orjson.dumps(doc))


def error_answer(error: ServingError) -> Answer:
    headers: tuple[tuple[str, str], ...] = ()
    if error.retry_after_s is not None:
        headers = (("Retry-After", str(error.retry_after_s)),)
    return Answer(error.status, error_body(error.message), headers=headers)


def plain_error(status: int, message: str,
                headers: tuple[tuple[str, str], ...] = ()) -> Answer:
    """A v2 error for what is not a :class:`ServingError`: unknown route, wrong method, HTTP."""
    return Answer(status, error_body(message), headers=headers)


# -- routing -------------------------------------------------------------------------------

# Route kinds, one per handler below.
SERVER_METADATA = "server_metadata"
LIVE = "live"
READY = "ready"
LIST_MODELS = "list_models"
MODEL_METADATA = "model_metadata"
MODEL_READY = "model_ready"
INFER = "infer"
METRICS = "metrics"
NOT_FOUND = "not_found"

_FIXED_ROUTES = {"/v2": SERVER_METADATA, "/v2/health/live": LIVE, "/v2/health/ready": READY,
                 "/v2/models": LIST_MODELS, "/metrics": METRICS}
_MODEL_ROUTES = {"": MODEL_METADATA, "ready": MODEL_READY, "infer": INFER}


@dataclass(frozen=True, slots=True)
class Route:
    """Where a path leads: a handler kind and, for model routes, the name and version asked."""

    kind: str
    path: str
    name: str | None = None
    version: str | None = None

    @property
    def method(self) -> str:
        """The one method the route answers (GET routes answer HEAD too)."""
        return "POST" if self.kind == INFER else "GET"


def match_route(path: str) -> Route:
    """The route of ``path`` (already percent-decoded, without the query)."""
    kind = _FIXED_ROUTES.get(path)
    if kind is not None:
        return Route(kind, path)
    if path.startswith("/v2/models/"):
        parts = path[len("/v2/models/"):].split("/")
        name = parts[0]
        version = None
        if len(parts) >= 3 and parts[1] == "versions":
            version = parts[2]
            parts = parts[2:]
        action = parts[1] if len(parts) == 2 else ("" if len(parts) == 1 else None)
        kind = _MODEL_ROUTES.get(action) if action is not None else None
        if kind is not None and name and version != "":
            return Route(kind, path, name, version)
    return Route(NOT_FOUND, path)


class RouteTable:
    """Paths -> routes, with the served model's own paths (the hot ones) looked up in one dict
    on the raw bytes of the request target; anything else is decoded and matched."""

    def __init__(self, model_name: str) -> None:
        self._exact: dict[bytes, Route] = {}
        paths = [*_FIXED_ROUTES]
        for prefix in (f"/v2/models/{model_name}", f"/v2/models/{model_name}/versions/1"):
            paths += [prefix, f"{prefix}/ready", f"{prefix}/infer"]
        for path in paths:
            if "%" not in path and "?" not in path and path.isascii():
                self._exact[path.encode()] = match_route(path)

    def lookup(self, target: bytes) -> Route:
        """The route of a request target (origin form: ``/path?query``)."""
        route = self._exact.get(target)
        if route is not None:
            return route
        path = target.split(b"?", 1)[0].split(b"#", 1)[0]
        if not path.startswith(b"/"):  # absolute form, which servers must accept (RFC 9112)
            authority = path.find(b"://")
            start = path.find(b"/", authority + 3) if authority > 0 else -1
            path = path[start:] if start >= 0 else b"/"
        route = self._exact.get(path)
        if route is not None:
            return route
        text = path.decode("latin-1")
        if "%" in text:
            text = unquote(path.decode("utf-8", "replace"), errors="replace")
        return match_route(text)


# -- the GET routes ------------------------------------------------------------------------

_LIVE = json_answer({"live": True})
_SERVER_METADATA = json_answer({"name": SERVER_NAME, "version": SERVER_VERSION,
                                "extensions": ["binary_tensor_data"]})


def answer_get(state: ServerState, route: Route) -> Answer:
    """The answer to a GET (or HEAD) route; ``route.kind`` is not ``INFER``."""
    kind = route.kind
    if kind == LIVE:
        return _LIVE
    if kind == READY:
        return json_answer({"ready": state.ready}, status=200 if state.ready else 503)
    if kind == SERVER_METADATA:
        return _SERVER_METADATA
    if kind == LIST_MODELS:
        return _list_models(state)
    if kind == METRICS:
        return Answer(200, state.metrics.render(), content_type=CONTENT_TYPE_LATEST)
    try:
        if kind == MODEL_METADATA:
            return json_answer(_model(state, route).metadata())
        if kind == MODEL_READY:
            return _model_ready(state, route)
    except ServingError as exc:
        return error_answer(exc)
    return plain_error(404, f"no route for {route.path}")


def _list_models(state: ServerState) -> Answer:
    if state.model is None:
        entry = {"name": state.model_name, "state": "LOADING", "reason": "model is loading"}
    else:
        entry = {"name": state.model.name, "version": MODEL_VERSION,
                 "platform": state.model.platform,
                 "state": "READY" if state.ready else "UNAVAILABLE",
                 "reason": "" if state.ready else "server is shutting down"}
    return json_answer({"models": [entry]})


def _model_ready(state: ServerState, route: Route) -> Answer:
    """200 when the model admits requests, else 503; the body names the model and version,
    as KServe's ``ModelReadyResponse`` does (clients read the status; people read the body)."""
    name = _check_route(state, route)
    return json_answer({"name": name, "version": MODEL_VERSION, "ready": state.ready},
                       status=200 if state.ready else 503)


def _check_route(state: ServerState, route: Route) -> str:
    """The model name of a ``/v2/models/{name}[/versions/{version}]/...`` route, once the
    name and (if given) the version are ones this server serves; else 404."""
    name = route.name
    if name != state.model_name:
        raise ModelNotFound(f"unknown model {name!r}; this server serves {state.model_name!r}")
    version = route.version
    if version is not None and version != MODEL_VERSION:
        raise ModelNotFound(f"model {name!r} has no version {version!r:.40}; this server "
                            f"serves version {MODEL_VERSION!r} only")
    return name


def _model(state: ServerState, route: Route) -> ModelInfo:
    name = _check_route(state, route)
    if state.model is None:
        raise Unavailable(f"model {name!r} is still loading", retry_after_s=state.retry_after_s)
    return state.model


# -- infer -----------------------------------------------------------------------------------

def begin_infer(state: ServerState, route: Route, content_length: int | None,
                respond: Respond) -> InferCall | Answer:
    """Step one of an infer request, when its headers are in: an :class:`InferCall` that
    wants the body, or the error :class:`Answer` to send at once without reading it.

    Shedding load here, before the body is read, keeps a rejection the cheapest thing the
    server does; otherwise parsing would become the bottleneck under overload."""
    started = time.monotonic()
    try:
        model = _model(state, route)
        batcher = state.batcher
        if batcher is None or not state.admitting:
            raise Unavailable("server is shutting down"
                              if state.shutting_down or state.draining
                              else "server is not ready", retry_after_s=state.retry_after_s)
        refused = batcher.admission_error()
        if refused is not None:
            raise refused
        limit = state.max_body_bytes
        if content_length is not None and content_length > limit:
            raise body_too_large(limit)
    except ServingError as exc:
        return _refused(state, exc, started)
    return InferCall(state, model, batcher, started, respond)


def body_too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"request body exceeds the {limit} byte limit (--max-body-bytes); "
                        "send fewer rows per request")


def _refused(state: ServerState, error: ServingError, started: float) -> Answer:
    """An error found before the batcher saw the request: counted here."""
    metrics = state.metrics
    metrics.outcome(error.outcome)
    metrics.request_seconds.observe(time.monotonic() - started)
    return error_answer(error)


class InferCall:
    """One infer request from its body to its answer, driven by callbacks: the body is parsed
    (in a worker thread when large), submitted to the batcher, and the batcher's future
    answers through ``respond`` when it resolves. Exactly one answer, unless cancelled."""

    __slots__ = ("_batcher", "_model", "_parsed", "_pending", "_respond", "_started", "_state")

    def __init__(self, state: ServerState, model: ModelInfo, batcher: DynamicBatcher,
                 started: float, respond: Respond) -> None:
        self._state = state
        self._model = model
        self._batcher = batcher
        self._started = started
        self._respond = respond
        self._parsed: InferRequest | None = None
        self._pending: asyncio.Future[Any] | None = None

    def too_large(self) -> None:
        """The body (chunked, so without a Content-Length) grew past the limit."""
        self._fail(body_too_large(self._state.max_body_bytes))

    def run(self, body: bytes, headers: Mapping[bytes, str],
            client_gone: Callable[[], bool]) -> None:
        """Step two, with the whole body (and the ``Timeout-Ms``,
        ``Inference-Header-Content-Length`` and ``Content-Encoding`` headers, when sent):
        inflate, parse, check and submit. An encoded body is inflated and parsed in a worker
        thread: inflating is the cost its size on the wire does not show."""
        timeout_header = headers.get(b"timeout-ms")
        header_length = headers.get(b"inference-header-content-length")
        encoding = headers.get(b"content-encoding")
        if encoding is not None and encoding.strip().lower() not in ("", "identity"):
            self._offload(body, encoding, timeout_header, header_length, client_gone)
            return
        json_bytes = len(body)  # only the JSON part costs parsing; binary tensors are views
        if json_bytes > PARSE_OFFLOAD_BYTES and header_length is not None:
            try:
                json_bytes = parse_header_length(header_length, json_bytes)
            except InvalidRequest:
                json_bytes = 0  # rejected at once by the parser below
        if json_bytes > PARSE_OFFLOAD_BYTES:
            self._offload(body, None, timeout_header, header_length, client_gone)
            return
        model = self._model
        plans = self._state.plans
        try:
            parsed = parse_infer_request(body, model, timeout_header=timeout_header,
                                         header_length=header_length, plans=plans)
        except ServingError as exc:
            self._fail(exc)
            return
        self._submit(parsed, client_gone)

    def _offload(self, body: bytes, encoding: str | None, timeout_header: str | None,
                 header_length: str | None, client_gone: Callable[[], bool]) -> None:
        """Inflate (when ``encoding``) and parse in a worker thread, then submit."""
        model, plans, limit = self._model, self._state.plans, self._state.max_body_bytes

        def parse() -> InferRequest:
            plain = body if encoding is None else decode_body(body, encoding, limit)
            return parse_infer_request(plain, model, timeout_header=timeout_header,
                                       header_length=header_length, plans=plans)

        future = asyncio.get_running_loop().run_in_executor(None, parse)
        self._pending = future
        future.add_done_callback(lambda done: self._parsed_in_thread(done, client_gone))

    def cancel(self) -> None:
        """The client has gone: drop the request (the batcher skips a cancelled future)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()

    def _parsed_in_thread(self, future: asyncio.Future[InferRequest],
                          client_gone: Callable[[], bool]) -> None:
        if future.cancelled() or self._pending is not future:
            return
        self._pending = None
        error = future.exception()
        if error is not None:
            self._fail(error)
            return
        self._submit(future.result(), client_gone)

    def _submit(self, parsed: InferRequest, client_gone: Callable[[], bool]) -> None:
        timeout_s = parsed.timeout_s
        if timeout_s is not None:  # the deadline runs from arrival, not from enqueue
            timeout_s -= time.monotonic() - self._started
            if timeout_s <= 0:
                self._fail(RequestTimedOut("request timed out while being read and parsed; "
                                           "not computed"))
                return
        try:
            future = self._batcher.submit(parsed.inputs, timeout_s=timeout_s,
                                          client_gone=client_gone)
        except InvalidRequest as exc:
            self._fail(exc)
            return
        except ServingError as exc:  # refused: the batcher counted it
            self._answer(error_answer(exc))
            return
        self._parsed = parsed
        self._pending = future
        future.add_done_callback(self._computed)

    def _computed(self, future: asyncio.Future[dict[str, Array]]) -> None:
        if future.cancelled() or self._pending is not future:
            return
        self._pending = None
        error = future.exception()
        if error is not None:  # counted by the batcher
            self._answer(self._error_answer(error))
            return
        parsed = self._parsed
        assert parsed is not None
        try:
            encoded = encode_infer_response(self._model, parsed, future.result())
        except Exception as exc:
            self._answer(self._error_answer(exc))
            return
        if encoded.header_length is None:
            self._answer(Answer(200, encoded.body))
        else:
            self._answer(Answer(200, encoded.body, BINARY_CONTENT_TYPE,
                                ((HEADER_LENGTH, str(encoded.header_length)),)))

    def _error_answer(self, error: BaseException) -> Answer:
        if isinstance(error, ServingError):
            return error_answer(error)
        log.error("infer_failed", error=f"{type(error).__name__}: {error}")
        return plain_error(500, f"internal error: {type(error).__name__}: {error}")

    def _fail(self, error: BaseException) -> None:
        if isinstance(error, ServingError):
            self._state.metrics.outcome(error.outcome)
        else:
            self._state.metrics.outcome("error")
        self._answer(self._error_answer(error))

    def _answer(self, answer: Answer) -> None:
        self._state.metrics.request_seconds.observe(time.monotonic() - self._started)
        self._respond(answer)
