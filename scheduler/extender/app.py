"""The extender's HTTP face: a Flask app over an :class:`~scheduler.extender.extender.Extender`,
each verb's route handing its request to that verb's plugin (:mod:`scheduler.extender.verbs`).

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
wrong>"}`` in the verb's result shape.

Memory: what a verb builds from its body (the parsed JSON, then the answer) is reserved from
``server.memory_budget_bytes`` before it is built (:mod:`gpufrag.membudget`): its parse by a
count read off the body, its answer by the text it may send back and its node count (read off
a NodeNames list sent last, else known once the body is parsed). A request that would need
more than the whole budget answers 413; one that finds others holding the room waits up to
``server.read_timeout_s``, then answers 503 with ``Retry-After``. Bodies up to
:data:`INLINE_BODY_BYTES` answered on the event loop never wait (they would stall it): they
are counted at their size's worst (:func:`on_loop_cost`), one at a time, so the others wait
for them. Answers are built in pieces and sent
as they are (``wire.Answer``), never joined into one more copy.

A bind the extender cannot do (pod gone, does not fit any more, not a pod of this scheduler)
answers 200 with the reason in ``Error``, which kube-scheduler reports on the pod. Only a bug
answers 500, and then without a traceback (it goes to the log).

The probes are also served alone by :func:`create_probe_app`, on a listener of their own
(``server.health_port``), away from the verbs. How the app is served: :mod:`.server`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from werkzeug.exceptions import HTTPException, MethodNotAllowed, RequestEntityTooLarge

from gpufrag.errors import BadInput
from gpufrag.membudget import (
    BudgetBusy,
    MemoryBudget,
    OverBudget,
    Reservation,
    parse_cost,
    worst_cost,
)
from scheduler.extender import wire
from scheduler.extender.extender import Extender
from scheduler.extender.metrics import ExtenderMetrics
from scheduler.extender.verbs.bind import BindRefused

Payload = dict[str, Any] | wire.Answer  # an Answer: JSON already encoded, in pieces
# (body, its reservation, the bytes of it reserved for the answer before the body was parsed)
Work = Callable[[bytes, Reservation, int], tuple[Payload, dict[str, Any]]]
TEXT = "text/plain; charset=utf-8"
# Bodies are read in pieces of this size, so that one over the limit is refused after reading
# at most this much past it.
_READ_CHUNK_BYTES = 1024 * 1024
# A filter or prioritize body up to this size is answered on the server's loop (a
# 10,000-node list is ~200 KB); larger ones go to a thread so one cannot hold the loop.
INLINE_BODY_BYTES = 1024 * 1024
# What an answer holds per node it names, beyond the text the body sent (names, the Node
# objects sent back): the entry's JSON, its reason (filter: up to ~100 bytes), the lists and
# arrays it is gathered through (a piece at a time), and the verb's per-node arrays. Measured
# for 3.5M names the body did not know: a prioritize held 41 bytes a name, its answer's 32
# included; a filter ~140, its answer's 85 included.
FILTER_BYTES_PER_NODE = 192
PRIORITIZE_BYTES_PER_NODE = 48
BYTES_PER_NODE = {"filter": FILTER_BYTES_PER_NODE, "prioritize": PRIORITIZE_BYTES_PER_NODE}
# The app's MemoryBudget, in ``app.extensions``.
MEMORY_BUDGET = "gpufrag.memory_budget"

log = structlog.get_logger("gpufrag.extender")


def on_loop_cost(size: int) -> int:
    """What a request answered on the event loop is counted at: the worst its body of ``size``
    bytes can cost to parse and answer (an entry for every 4 bytes sent, ``"a",``), read off
    its size, not by scanning it. On kube-scheduler's serial path the scan (and the names'
    count) took 0.2 ms of a 5,000-node filter's ~2 ms; the count is given back within it."""
    return worst_cost(size) + size + FILTER_BYTES_PER_NODE * (size // 4 + 1)


def _json(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status=status, mimetype="application/json")


def _error_payload(verb: str, message: str) -> Payload:
    return wire.filter_error(message) if verb == "filter" else {"Error": message}


def _pod_id(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return ""
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


@dataclass(frozen=True, slots=True)
class Handled:
    """A verb's outcome: its status, its answer (pieces of JSON), the memory reserved for the
    answer until it is sent, and whether to say ``Retry-After``."""

    status: int
    answer: wire.Answer
    reservation: Reservation | None
    retry: bool = False


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
        if environ.get("wsgi.input_terminated"):
            # The server holds the whole body (gpufrag.httpserve): one read hands over its
            # very buffer, where reading it in pieces and joining them would copy it twice.
            first = stream.read(want)
            chunks.append(first)
            total = len(first)
            if not first:
                want = 0
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
    config = extender.placement.config
    node_json = extender.placement.node_json
    app = Flask("gpufrag.extender")
    metrics = metrics if metrics is not None else ExtenderMetrics(extender, registry)
    prefix = config.server.url_prefix
    limit = config.server.max_body_bytes
    read_timeout_s = config.server.read_timeout_s
    name_lists = wire.NameLists()

    budget = MemoryBudget(config.server.memory_budget_bytes, wait_s=read_timeout_s,
                          setting="server.memory_budget_bytes")
    on_loop = inline_verbs(prefix)
    app.extensions[MEMORY_BUDGET] = budget  # for the tests and whoever inspects the app

    def handle(verb: str, work: Work, environ: dict[str, Any]) -> Handled:
        started = time.perf_counter()
        fields: dict[str, Any] = {}
        status = 200
        retry = False
        reservation: Reservation | None = None
        try:
            body = read_body(environ, limit)
            if on_loop(environ):  # never waits: it would stall the loop
                early = on_loop_cost(len(body))  # its answer included: it never grows
                reservation = budget.charge(early)
            else:  # one reservation: never hold one and wait for more
                early = answer_upfront(verb, body)
                parsing = wire.parse_cost_of(body) if verb in BYTES_PER_NODE else parse_cost(body)
                reservation = budget.reserve(parsing + early)
            payload, fields = work(body, reservation, early)
        except RequestEntityTooLarge:
            status = 413
            payload = _error_payload(verb, f"request body is larger than the limit of {limit} "
                                           "bytes (server.max_body_bytes)")
        except OverBudget as e:
            status = 413
            payload = _error_payload(verb, str(e))
        except BudgetBusy as e:
            status, retry = 503, True
            payload = _error_payload(verb, str(e))
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
        answer = wire.joined(payload if isinstance(payload, list) else [orjson.dumps(payload)])
        if reservation is not None:
            # What was built from the body is gone; the answer is held until it is sent.
            reservation.shrink(sum(map(len, answer)))
        return Handled(status, answer, reservation, retry)

    def answer_cost(body: bytes, nodes: int, per_node: int) -> int:
        """What an answer about ``nodes`` nodes holds (the text of the body it echoes, names or
        Node objects, at most)."""
        return len(body) + per_node * nodes

    def answer_upfront(verb: str, body: bytes) -> int:
        """What can be known of a filter's or prioritize's answer cost before its body is
        parsed: its text, and its entries when their count can be read off the body (a
        NodeNames list written last). The rest is reserved once the body is parsed."""
        per_node = BYTES_PER_NODE.get(verb)
        if per_node is None or not body:
            return 0
        return answer_cost(body, wire.names_sent(body) or 0, per_node)

    def do_filter(body: bytes, reservation: Reservation, early: int
                  ) -> tuple[Payload, dict[str, Any]]:
        args = wire.parse_extender_args(body, name_lists)
        reservation.grow(answer_cost(body, len(args.names), FILTER_BYTES_PER_NODE) - early)
        fields: dict[str, Any] = {"pod": _pod_id(args.pod), "nodes": len(args.names)}
        outcome = extender.filter(args.pod, args.names, args.name_set)
        fields.update(passed=int(outcome.passed.sum()), failed=int(outcome.failed.size))
        if outcome.decided:
            fields["node"] = outcome.decided
        return wire.filter_result(args, outcome, node_json), fields

    def do_prioritize(body: bytes, reservation: Reservation, early: int
                      ) -> tuple[Payload, dict[str, Any]]:
        args = wire.parse_extender_args(body, name_lists)
        reservation.grow(answer_cost(body, len(args.names), PRIORITIZE_BYTES_PER_NODE) - early)
        fields: dict[str, Any] = {"pod": _pod_id(args.pod), "nodes": len(args.names)}
        result, best = extender.prioritize(args.pod, args.names, args.name_set)
        fields["node"] = best
        return wire.priorities(args, result, node_json), fields

    def do_bind(body: bytes, *_: Any) -> tuple[Payload, dict[str, Any]]:
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

    def do_preempt(body: bytes, *_: Any) -> tuple[Payload, dict[str, Any]]:
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
            handled = handle(verb, work, request.environ)
            response = Response(handled.answer, status=handled.status,
                                mimetype="application/json")
            if handled.retry:
                response.headers["Retry-After"] = "1"
            if handled.reservation is not None:
                # Given back once the answer is sent (the server closes the response then).
                response.call_on_close(handled.reservation.release)
            return response
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


__all__ = [
    "FILTER_BYTES_PER_NODE",
    "INLINE_BODY_BYTES",
    "MEMORY_BUDGET",
    "PRIORITIZE_BYTES_PER_NODE",
    "BodyTimeout",
    "Handled",
    "Work",
    "create_app",
    "create_probe_app",
    "inline_verbs",
    "on_loop_cost",
    "read_body",
]
