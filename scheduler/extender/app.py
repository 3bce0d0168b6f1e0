"""The extender's HTTP face: a Flask app over :class:`~scheduler.extender.service.Extender`.

Routes (``{prefix}`` is ``server.url_prefix``):

- ``POST {prefix}/filter``, ``POST {prefix}/prioritize``, ``POST {prefix}/preempt``,
  ``POST {prefix}/bind`` (when ``bind.enabled``): the extender v1 protocol (see ``wire``).
- ``GET /healthz`` (the process answers), ``GET /readyz`` (the state has synced and the
  target workload reflects it: 503 before),
  ``GET /metrics`` (Prometheus).

Bad input is the caller's problem, never ours: malformed JSON (NaN, Infinity, 1e400, nesting
past 1,024 levels), wrong types, a missing Pod or an unreadable quantity answer 400, a body
over ``server.max_body_bytes`` 413 (whether its length was announced or it came chunked), a
body that did not arrive within ``server.read_timeout_s`` 408, each with ``{"Error": "<what is
wrong>"}`` in the verb's result shape. A bind the extender cannot do (pod gone, does not fit any
more, not a pod of this scheduler) answers 200 with the reason in ``Error``, which
kube-scheduler reports on the pod. Only a bug answers 500, and then without a traceback (it goes
to the log).

The probes are also served alone by :func:`create_probe_app`, on a listener of their own
(``server.health_port``), away from the verbs. How the app is served: :mod:`.server`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import structlog
from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from werkzeug.exceptions import HTTPException, MethodNotAllowed, RequestEntityTooLarge

from gpufrag.errors import BadInput
from scheduler.extender import wire
from scheduler.extender.metrics import ExtenderMetrics
from scheduler.extender.service import BindRefused, Extender

Payload = dict[str, Any] | bytes  # bytes: JSON already encoded
Work = Callable[[bytes], tuple[Payload, dict[str, Any]]]
TEXT = "text/plain; charset=utf-8"
# Bodies are read in pieces of this size, so that one over the limit is refused after reading
# at most this much past it.
_READ_CHUNK_BYTES = 1024 * 1024
# A filter or prioritize body up to this size is answered on the server's loop (a
# 10,000-node list is ~200 KB); larger ones go to a thread so one cannot hold the loop.
INLINE_BODY_BYTES = 1024 * 1024

log = structlog.get_logger("gpufrag.extender")


def _json(payload: Any, status: int = 200) -> Response:
    data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    return Response(data, status=status, mimetype="application/json")


def _error_payload(verb: str, message: str) -> Payload:
    return wire.filter_error(message) if verb == "filter" else {"Error": message}


def _pod_id(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return ""
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


class BodyTimeout(Exception):
    """The request body did not arrive within ``server.read_timeout_s`` (answered 408)."""


def read_body(environ: Mapping[str, Any], limit: int) -> bytes:
    """The request's body (from its WSGI ``environ``), refused (413) once it is over
    ``limit`` bytes.

    The limit is checked here rather than by Flask's ``MAX_CONTENT_LENGTH``: for a chunked
    body (no Content-Length) Werkzeug stops reading at the limit and hands back the truncated
    body, which then fails as "not valid JSON" (400) instead of "too large" (413). Reading
    stops at ``limit + 1`` bytes, so an endless body costs at most that much. A body without
    a Content-Length is read only where the server says it ends the stream itself
    (``wsgi.input_terminated``, as :mod:`gpufrag.httpserve` does: it reads every body whole
    before the app runs), as Werkzeug does.

    Reading is the client's side of the exchange: a read that times out (the server's
    per-request deadline, see ``server.read_timeout_s``) raises :class:`BodyTimeout`; a body
    that cannot be read at all (a malformed chunk, the client gone) is a :class:`WireError`.
    """
    announced = environ.get("CONTENT_LENGTH")
    try:
        length = int(announced) if announced else None
    except ValueError:
        raise wire.WireError(f"Content-Length {announced!r} is not a number") from None
    if length is not None and length > limit:
        raise RequestEntityTooLarge()
    if length is None and not environ.get("wsgi.input_terminated"):
        return b""
    stream = environ["wsgi.input"]
    want = limit + 1 if length is None else length
    chunks: list[bytes] = []
    total = 0
    try:
        while total < want:
            chunk = stream.read(min(_READ_CHUNK_BYTES, want - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except TimeoutError:
        raise BodyTimeout() from None
    except HTTPException:
        raise
    except Exception as e:  # the server's stream: malformed chunks, a client gone mid-body
        raise wire.WireError(f"request body could not be read: {type(e).__name__}: {e}") from None
    if total > limit:
        raise RequestEntityTooLarge()
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _probe_routes(app: Flask, extender: Extender, metrics: ExtenderMetrics, *,
                  stalled: Callable[[], str | None] | None = None) -> None:
    """``/healthz`` (the process answers; with ``stalled``, also that what it names is not
    stuck), ``/readyz`` (the state has synced and the target workload reflects it) and
    ``/metrics``, as routes of ``app``."""

    def healthz() -> Response:
        problem = stalled() if stalled is not None else None
        if problem:
            return Response(f"{problem}\n", status=503, content_type=TEXT)
        return Response(b"ok\n", content_type=TEXT)

    def readyz() -> Response:
        if extender.ready:
            return Response(b"ok\n", content_type=TEXT)
        return Response(b"state not synced yet\n", status=503, content_type=TEXT)

    def metrics_page() -> Response:
        return Response(generate_latest(metrics.registry), content_type=CONTENT_TYPE_LATEST)

    app.add_url_rule("/healthz", view_func=healthz, methods=["GET"])
    app.add_url_rule("/readyz", view_func=readyz, methods=["GET"])
    app.add_url_rule("/metrics", view_func=metrics_page, methods=["GET"])


def _json_errors(app: Flask) -> None:
    """Unknown paths and wrong methods answered in the verbs' JSON shape (``{"Error": ...}``),
    with ``Allow`` on a 405."""

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Response:
        # Unknown paths, wrong methods: the same JSON shape as every other error.
        code = e.code or 500
        response = _json({"Error": f"{code} {e.name}: {request.method} {request.path}"}, code)
        if isinstance(e, MethodNotAllowed) and e.valid_methods:
            response.headers["Allow"] = ", ".join(e.valid_methods)
        return response


def create_probe_app(extender: Extender, metrics: ExtenderMetrics, *,
                     stalled: Callable[[], str | None] | None = None) -> Flask:
    """The probes alone (``server.health_port``): a listener of their own, so the kubelet's
    probes never queue behind verbs; ``stalled`` says what is stuck, if anything (the verbs'
    event loop), for ``/healthz`` to fail on."""
    app = Flask("gpufrag.extender.probes")
    _probe_routes(app, extender, metrics, stalled=stalled)
    _json_errors(app)
    return app


def create_app(extender: Extender, *, metrics: ExtenderMetrics | None = None,
               registry: CollectorRegistry | None = None) -> Flask:
    """The Flask app serving ``extender``: every verb and probe is one of its routes (see
    ``app.url_map``). Metrics go to ``metrics`` (made on ``registry``, a fresh one if None,
    when not given)."""
    config = extender.config
    app = Flask("gpufrag.extender")
    metrics = metrics if metrics is not None else ExtenderMetrics(extender, registry)
    prefix = config.server.url_prefix
    limit = config.server.max_body_bytes
    read_timeout_s = config.server.read_timeout_s
    name_lists = wire.NameLists()

    def handle(verb: str, work: Work, read: Callable[[], bytes]) -> tuple[int, bytes]:
        started = time.perf_counter()
        fields: dict[str, Any] = {}
        status = 200
        try:
            payload, fields = work(read())
        except RequestEntityTooLarge:
            status = 413
            payload = _error_payload(verb, f"request body is larger than the limit of {limit} "
                                           "bytes (server.max_body_bytes)")
        except BodyTimeout:
            status = 408
            payload = _error_payload(verb, f"request body did not arrive within "
                                           f"{read_timeout_s:g} s (server.read_timeout_s)")
        except (wire.WireError, BadInput) as e:
            status = 400
            payload = _error_payload(verb, str(e))
        except Exception:
            status = 500
            log.exception("request failed", verb=verb)
            payload = _error_payload(verb, "internal error in the gpufrag extender; see its log")
        duration_s = time.perf_counter() - started
        metrics.observe(verb, status, duration_s)
        if status == 200 and "refused" not in fields:
            # Every answered verb at debug only: at info, a line per request cost 0.7-1.1 ms
            # per pod on the scheduling path (docs/extender.md, "Logging").
            log.debug(verb, duration_ms=round(duration_s * 1000, 3), **fields)
        elif status == 200:  # a refused bind: kube-scheduler retries the pod
            log.warning(verb, duration_ms=round(duration_s * 1000, 3), **fields)
        else:
            error = payload.get("Error") if isinstance(payload, dict) else None
            log.warning(verb, status=status, error=error,
                        duration_ms=round(duration_s * 1000, 3), **fields)
        return status, payload if isinstance(payload, bytes) else orjson.dumps(payload)

    def do_filter(body: bytes) -> tuple[Payload, dict[str, Any]]:
        args = wire.parse_extender_args(body, name_lists)
        fields: dict[str, Any] = {"pod": _pod_id(args.pod), "nodes": len(args.names)}
        outcome = extender.filter(args.pod, args.names, args.name_set)
        fields.update(passed=int(outcome.passed.sum()), failed=int(outcome.failed.size))
        if outcome.decided:
            fields["node"] = outcome.decided
        return wire.filter_result(args, outcome, extender.node_json), fields

    def do_prioritize(body: bytes) -> tuple[Payload, dict[str, Any]]:
        args = wire.parse_extender_args(body, name_lists)
        fields: dict[str, Any] = {"pod": _pod_id(args.pod), "nodes": len(args.names)}
        result, best = extender.prioritize(args.pod, args.names, args.name_set)
        fields["node"] = best
        return wire.priorities(args, result, extender.node_json), fields

    def do_bind(body: bytes) -> tuple[Payload, dict[str, Any]]:
        args = wire.parse_binding_args(body)
        fields: dict[str, Any] = {"pod": f"{args.pod_namespace}/{args.pod_name}",
                                  "node": args.node}
        try:
            outcome = extender.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
        except BindRefused as e:
            fields["refused"] = str(e)
            return {"Error": str(e)}, fields
        fields["gpus"] = ",".join(str(g) for g in outcome.gpus)
        return {"Error": ""}, fields

    def do_preempt(body: bytes) -> tuple[Payload, dict[str, Any]]:
        args = wire.parse_preemption_args(body)
        fields: dict[str, Any] = {"pod": _pod_id(args.pod), "nodes": len(args.victims)}
        chosen = extender.preempt(args.pod, args.victims)
        fields.update(kept=len(chosen), victims=sum(len(u) for u, _ in chosen.values()))
        return wire.preemption_result(chosen), fields

    verbs: dict[str, tuple[str, Work]] = {
        f"{prefix}/filter": ("filter", do_filter),
        f"{prefix}/prioritize": ("prioritize", do_prioritize),
        f"{prefix}/preempt": ("preempt", do_preempt),
    }
    if config.bind.enabled:
        verbs[f"{prefix}/bind"] = ("bind", do_bind)

    def verb_view(verb: str, work: Work) -> Callable[[], Response]:
        def view() -> Response:
            status, body = handle(verb, work, lambda: read_body(request.environ, limit))
            return Response(body, status=status, mimetype="application/json")
        return view

    for path, (verb, work) in verbs.items():
        app.add_url_rule(path, endpoint=verb, view_func=verb_view(verb, work),
                         methods=["POST"])
    _probe_routes(app, extender, metrics)
    _json_errors(app)
    return app


def inline_verbs(prefix: str) -> Callable[[dict[str, Any]], bool]:
    """Which requests the server may answer on its event loop's thread rather than hand to
    a request thread: filter and prioritize with a body up to :data:`INLINE_BODY_BYTES`.

    They are CPU only and take about a millisecond; kube-scheduler asks for one per pod in
    its serial scheduling cycle, so the hand-off to a thread and back (two waits for the GIL)
    would be latency on every pod. The bind waits on the API server and preempt may take its
    budget, so they, and huge node lists, go to the threads (docs/extender.md, Performance)."""
    paths = frozenset({f"{prefix}/filter", f"{prefix}/prioritize"})

    def inline(environ: dict[str, Any]) -> bool:
        try:
            length = int(environ.get("CONTENT_LENGTH") or INLINE_BODY_BYTES + 1)
        except ValueError:
            return False
        return (environ["REQUEST_METHOD"] == "POST" and environ["PATH_INFO"] in paths
                and length <= INLINE_BODY_BYTES)

    return inline


__all__ = ["BodyTimeout", "Work", "create_app", "create_probe_app", "inline_verbs",
           "read_body"]
