"""The extender's HTTP face: a Flask app over :class:`~scheduler.extender.service.Extender`.

Routes (``{prefix}`` is ``server.url_prefix``):

- ``POST {prefix}/filter``, ``POST {prefix}/prioritize``, ``POST {prefix}/bind`` (when
  ``bind.enabled``) — the kube-scheduler extender v1 protocol (see ``wire``).
- ``GET /healthz`` (the process answers), ``GET /readyz`` (the state has synced and the
  target workload reflects it: 503 before),
  ``GET /metrics`` (Prometheus).

Bad input is the caller's problem, never ours: malformed JSON, wrong types, a missing Pod or an
unreadable quantity answer 400, an oversized body 413, each with ``{"Error": "<what is wrong>"}``
in the verb's result shape. A bind the extender cannot do (pod gone, does not fit any more)
answers 200 with the reason in ``Error``, which kube-scheduler reports on the pod. Only a bug
answers 500, and then without a traceback (it goes to the log).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import structlog
from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from gpufrag.errors import BadInput
from scheduler.extender import wire
from scheduler.extender.metrics import ExtenderMetrics
from scheduler.extender.service import BindRefused, Extender

Payload = dict[str, Any] | bytes  # bytes: JSON already encoded
Work = Callable[[bytes], tuple[Payload, dict[str, Any]]]

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


def create_app(extender: Extender, *, registry: CollectorRegistry | None = None) -> Flask:
    """The Flask app serving ``extender``; metrics go to ``registry`` (a fresh one if None)."""
    config = extender.config
    app = Flask("gpufrag.extender")
    app.config["MAX_CONTENT_LENGTH"] = config.server.max_body_bytes
    metrics = ExtenderMetrics(extender, registry)
    app.extensions["gpufrag"] = {"extender": extender, "metrics": metrics}
    prefix = config.server.url_prefix
    limit = config.server.max_body_bytes

    def handle(verb: str, work: Work) -> Response:
        started = time.perf_counter()
        fields: dict[str, Any] = {}
        status = 200
        try:
            if request.content_length is not None and request.content_length > limit:
                raise RequestEntityTooLarge()
            payload, fields = work(request.get_data(cache=False))
        except RequestEntityTooLarge:
            status = 413
            payload = _error_payload(verb, f"request body is larger than the limit of {limit} "
                                           "bytes (server.max_body_bytes)")
        except (wire.WireError, BadInput) as e:
            status = 400
            payload = _error_payload(verb, str(e))
        except Exception:
            status = 500
            log.exception("request failed", verb=verb)
            payload = _error_payload(verb, "internal error in the gpufrag extender; see its log")
        duration_s = time.perf_counter() - started
        metrics.observe(verb, status, duration_s)
        if status == 200:
            log.info(verb, duration_ms=round(duration_s * 1000, 3), **fields)
        else:
            error = payload.get("Error") if isinstance(payload, dict) else None
            log.warning(verb, status=status, error=error,
                        duration_ms=round(duration_s * 1000, 3), **fields)
        return _json(payload, status)

    def do_filter(body: bytes) -> tuple[Payload, dict[str, Any]]:
        args = wire.parse_extender_args(body)
        fields: dict[str, Any] = {"pod": _pod_id(args.pod), "nodes": len(args.names)}
        outcome = extender.filter(args.pod, args.names)
        fields.update(passed=int(outcome.passed.sum()), failed=int(outcome.failed.size))
        return wire.filter_result(args, outcome, extender.node_json), fields

    def do_prioritize(body: bytes) -> tuple[Payload, dict[str, Any]]:
        args = wire.parse_extender_args(body)
        fields: dict[str, Any] = {"pod": _pod_id(args.pod), "nodes": len(args.names)}
        result, best = extender.prioritize(args.pod, args.names)
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

    @app.post(f"{prefix}/filter")
    def filter_verb() -> Response:
        return handle("filter", do_filter)

    @app.post(f"{prefix}/prioritize")
    def prioritize_verb() -> Response:
        return handle("prioritize", do_prioritize)

    if config.bind.enabled:
        @app.post(f"{prefix}/bind")
        def bind_verb() -> Response:
            return handle("bind", do_bind)

    @app.get("/healthz")
    def healthz() -> Response:
        return Response("ok\n", mimetype="text/plain")

    @app.get("/readyz")
    def readyz() -> Response:
        if extender.ready:
            return Response("ok\n", mimetype="text/plain")
        return Response("state not synced yet\n", status=503, mimetype="text/plain")

    @app.get("/metrics")
    def metrics_page() -> Response:
        return Response(generate_latest(metrics.registry), mimetype=CONTENT_TYPE_LATEST)

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Response:
        # Unknown paths, wrong methods: the same JSON shape as every other error.
        code = e.code or 500
        return _json({"Error": f"{code} {e.name}: {request.method} {request.path}"}, code)

    return app


__all__ = ["create_app"]
