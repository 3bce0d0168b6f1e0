"""The webhook's HTTPS server: a Flask app (``POST /mutate``, ``POST /mutate-dra``,
``GET /healthz``, ``GET /metrics``) on the project's one server (:mod:`gpufrag.httpserve`).

``/mutate-dra`` is the same review for namespaces with DRA delivery, which also moves GPU asks
into ResourceClaims (:mod:`defrag.admission.review`); the webhook configuration sends those
namespaces there and every other namespace to ``/mutate``.

The API server only speaks HTTPS to webhooks. The serving certificate and key are files
(mounted from a Secret that cert-manager, or ``scripts``-style openssl, keeps; see
docs/rightsizing.md), re-read when they change on disk (:class:`gpufrag.tls.ServerTLS`), so a
renewed certificate is served without a restart. Slow clients hold no thread; a body must
arrive within :data:`READ_TIMEOUT_S` (408) and fit :data:`MAX_BODY_BYTES` (413).

Memory: a review is parsed only once what parsing it will hold (read off the body,
:func:`gpufrag.membudget.parse_cost`) fits in :data:`MEMORY_BUDGET_BYTES` beside the reviews
being answered: a review that never could is answered 413, one that finds no room within
:data:`BUDGET_WAIT_S` 503 with ``Retry-After`` (either way the API server admits the pod
unchanged: ``failurePolicy: Ignore``). A real pod's review costs a few MiB at most; a body of
the same size made of empty objects (``[{},{},...]``) costs 21 times its size, so without the
budget four threads parsing such bodies took the webhook past its 256 Mi limit.

Who may call it: the API server (``/mutate``, ``/mutate-dra``) and the kubelet's probes; it
answers what a pod should get, and writes only the ResourceClaimTemplates converted pods name.
"""

from __future__ import annotations

import orjson
from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from werkzeug.exceptions import HTTPException

from defrag.admission.review import AdmissionMetrics, Resolver, answer
from defrag.admission.templates import TemplateStore
from gpufrag.conventions import KubeNames
from gpufrag.httpserve import Limits, Server, listen
from gpufrag.membudget import BudgetBusy, MemoryBudget, OverBudget, parse_cost
from gpufrag.tls import ServerTLS

MAX_BODY_BYTES = 3 * 1024 * 1024  # the API server's own request limit for objects
READ_TIMEOUT_S = 10.0
# What the reviews being answered may hold at once (see the module docstring), and how long
# one waits for room: under the API server's timeoutSeconds (5) for the webhook.
MEMORY_BUDGET_BYTES = 24 * 1024 * 1024
BUDGET_WAIT_S = 2.0


def _json(payload: object, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status=status, mimetype="application/json")


def create_app(resolve: Resolver, names: KubeNames, metrics: AdmissionMetrics, *,
               budget: MemoryBudget | None = None,
               templates: TemplateStore | None = None) -> Flask:
    """The webhook's routes; ``budget``: what reviews may hold at once (a fresh
    :data:`MEMORY_BUDGET_BYTES` one by default); ``templates``: where ``/mutate-dra`` makes
    the templates of converted pods (None: that path answers 404)."""
    app = Flask("gpufrag.admission")
    budget = budget or MemoryBudget(MEMORY_BUDGET_BYTES, wait_s=BUDGET_WAIT_S,
                                    setting="the webhook's memory budget")

    @app.post("/mutate")
    def mutate() -> Response:
        return review(None)

    @app.post("/mutate-dra")
    def mutate_dra() -> Response:
        if templates is None:
            return _json({"error": "no ResourceClaimTemplate client: /mutate-dra is off"}, 404)
        return review(templates)

    def review(store: TemplateStore | None) -> Response:
        try:
            length = int(request.environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > MAX_BODY_BYTES:
            return _json({"error": f"body over {MAX_BODY_BYTES} bytes"}, 413)
        try:
            body = request.environ["wsgi.input"].read()
        except TimeoutError as e:
            return _json({"error": str(e)}, 408)
        if not body:
            return _json({"error": "body missing: POST an AdmissionReview"}, 400)
        if len(body) > MAX_BODY_BYTES:
            return _json({"error": f"body over {MAX_BODY_BYTES} bytes"}, 413)
        try:
            with budget.reserve(parse_cost(body)):
                reviewed = answer(body, resolve, names, metrics, templates=store)
        except OverBudget as e:
            return _json({"error": str(e)}, 413)
        except BudgetBusy as e:
            busy = _json({"error": str(e)}, 503)
            busy.headers["Retry-After"] = "1"
            return busy
        except (ValueError, orjson.JSONDecodeError) as e:
            return _json({"error": str(e)}, 400)
        return _json(reviewed)

    @app.get("/healthz")
    def healthz() -> Response:
        return Response(b"ok\n", content_type="text/plain")

    @app.get("/metrics")
    def metrics_page() -> Response:
        return Response(generate_latest(metrics.registry), content_type=CONTENT_TYPE_LATEST)

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Response:
        code = e.code or 500
        return _json({"error": f"{code} {e.name}; the webhook paths are POST /mutate and "
                               "POST /mutate-dra"}, code)

    return app


class AdmissionServer:
    """The webhook on ``address`` (bound now: a ``ListenError`` when it cannot be had; TLS
    files that do not load raise ``OSError`` or ``ssl.SSLError``); :meth:`run` or
    :meth:`start`, then :meth:`stop`."""

    def __init__(self, address: tuple[str, int], *, resolve: Resolver, names: KubeNames,
                 cert_file: str | None, key_file: str | None,
                 metrics: AdmissionMetrics | None = None,
                 templates: TemplateStore | None = None) -> None:
        self.metrics = metrics or AdmissionMetrics()
        tls = ServerTLS(cert_file, key_file) if cert_file and key_file else None
        sock = listen(address[0], address[1], setting="--host, --port")
        # Connections and headers: Limits' defaults (256 at once, 16 KiB of headers, in within
        # 5 s); the API server, its one caller beside the probes, keeps a pool of a few.
        limits = Limits(max_body_bytes=MAX_BODY_BYTES, read_timeout_s=READ_TIMEOUT_S,
                        threads=4, setting="the webhook's read timeout")
        self.server = Server(create_app(resolve, names, self.metrics, templates=templates),
                             sock, limits, tls=tls, name="admission")

    @property
    def port(self) -> int:
        return self.server.port

    def run(self, *, signals: bool = True) -> None:
        """Serve in this thread until SIGTERM/SIGINT (or :meth:`stop`)."""
        self.server.run(signals=signals)

    def start(self) -> AdmissionServer:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()


__all__ = ["MAX_BODY_BYTES", "AdmissionServer", "create_app"]
