"""AdmissionReview v1 in, AdmissionReview v1 out; every right-sizing answer ``allowed: true``.

A webhook that rejects or fails would block pod creation (``failurePolicy: Ignore`` only
covers a webhook that does not answer), so every right-sizing path admits: with a JSON patch
when the pod was right-sized or a GPU-memory ask needed its carrier, unchanged otherwise,
counted by reason in the metrics. A lookup of the pod's workload that fails (API server slow,
RBAC missing) admits unchanged with a warning.

Metrics (own registry, ``/metrics``):

- ``gpufrag_admission_reviews_total{result}`` — ``mutated`` or ``skipped``;
- ``gpufrag_admission_skips_total{reason}`` — one per skipped pod (reasons in
  :data:`defrag.admission.mutate.SKIP_REASONS`, all present from the start at 0);
- ``gpufrag_admission_milli_saved_total`` — GPU share (milli) given back by rewrites;
- ``gpufrag_admission_carriers_total`` — GPU-memory asks that came alone and were given
  ``gpufrag.io/gpu-milli: 1``, the resource the device plugin hands their GPU for
  (:func:`defrag.admission.mutate.carrier_patch`);
- ``gpufrag_admission_review_seconds`` — time to answer, lookups included.

``POST /mutate-dra`` (namespaces that opted in to DRA delivery; docs/dra.md) answers the same
review with the same right-sizing and then moves the pod's GPU asks into ResourceClaims
(:mod:`defrag.admission.toclaims`, after the right-sizing patch, as one patch), making the
templates they name (:mod:`defrag.admission.templates`). Unlike right-sizing, it refuses a pod
it cannot convert (``allowed: false`` with the reason): admitted unconverted, the pod would
stay pending on nodes that have no device plugin. Its counters:

- ``gpufrag_admission_dra_conversions_total{result}`` — one per review on that path:
  ``converted``, ``no_gpu_ask`` (admitted as it is), ``not_a_pod_create``, or why the pod was
  refused: ``bad_request`` (an ask the driver cannot serve), ``template_conflict`` (a template
  under the webhook's name holds another spec), ``template_failed`` (reading or creating the
  template failed), ``internal_error``;
- ``gpufrag_admission_dra_templates_made_total`` — templates this webhook created.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson
import structlog
from prometheus_client import Counter, Histogram

from defrag.admission.jsonpatch import applied
from defrag.admission.mutate import SKIP_REASONS, Decision, carrier_patch, decide, skip
from defrag.admission.templates import TemplateConflict, TemplateStore
from defrag.admission.toclaims import Conversion, convert
from defrag.rightsizing.workloads import Workload, controller_ref
from gpufrag.conventions import KubeNames
from gpufrag.errors import BadInput
from gpufrag.metrics import new_registry
from scheduler.kube.errors import ApiError

log = structlog.get_logger("gpufrag.admission")

# namespace, ownerReferences -> the workload (None: no supported owner); raises on API faults.
Resolver = Callable[[str, Any], Workload | None]

# The results of the conversion into claims (gpufrag_admission_dra_conversions_total), and
# the HTTP status each refusal is answered with.
DRA_RESULTS = ("converted", "no_gpu_ask", "not_a_pod_create", "bad_request",
               "template_conflict", "template_failed", "internal_error")
REFUSAL_CODES = {"bad_request": 422, "template_conflict": 409, "template_failed": 503,
                 "internal_error": 500}


class AdmissionMetrics:
    def __init__(self) -> None:
        self.registry = new_registry()
        r = self.registry
        self.reviews = Counter("gpufrag_admission_reviews", "Pods reviewed", ["result"],
                               registry=r)
        self.skips = Counter("gpufrag_admission_skips", "Pods admitted unchanged, by reason",
                             ["reason"], registry=r)
        self.carriers = Counter("gpufrag_admission_carriers",
                                "GPU-memory asks given gpu-milli 1 as their device-plugin "
                                "carrier", registry=r)
        self.milli_saved = Counter("gpufrag_admission_milli_saved",
                                   "GPU share (milli) given back by rewrites", registry=r)
        self.seconds = Histogram("gpufrag_admission_review_seconds", "Time to answer a review",
                                 registry=r, buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5))
        for result in ("mutated", "skipped"):
            self.reviews.labels(result)
        for reason in SKIP_REASONS:
            self.skips.labels(reason)
        self.dra = Counter("gpufrag_admission_dra_conversions",
                           "Reviews of pods in namespaces with DRA delivery, by result",
                           ["result"], registry=r)
        self.templates_made = Counter("gpufrag_admission_dra_templates_made",
                                         "ResourceClaimTemplates created for converted pods",
                                         registry=r)
        for result in DRA_RESULTS:
            self.dra.labels(result)

    def count(self, decision: Decision) -> None:
        self.carriers.inc(decision.carriers)
        if decision.skip is not None:
            self.reviews.labels("skipped").inc()
            self.skips.labels(decision.skip).inc()
        else:
            self.reviews.labels("mutated").inc()
            change = decision.change or {}
            self.milli_saved.inc(max(int(change.get("from", 0)) - int(change.get("to", 0)), 0))


def _dict(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``obj[key]`` when it is an object, else empty: a review's fields are untrusted JSON."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _text(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    return value if isinstance(value, str) else None


def _malformed(pod: Mapping[str, Any]) -> str | None:
    """What makes a pod in a review unreadable (a field of the wrong JSON type), or None.
    Checked before anything reads it, so every such review is answered as a skip."""
    for key in ("metadata", "spec"):
        if key in pod and not isinstance(pod[key], Mapping):
            return f"object.{key} is not an object"
    meta, spec = _dict(pod, "metadata"), _dict(pod, "spec")
    for key in ("labels", "annotations"):
        if meta.get(key) is not None and not isinstance(meta[key], Mapping):
            return f"object.metadata.{key} is not an object"
    refs = meta.get("ownerReferences")
    if refs is not None and not (isinstance(refs, list)
                                 and all(isinstance(r, Mapping) for r in refs)):
        return "object.metadata.ownerReferences is not a list of objects"
    containers = spec.get("containers")
    if containers is not None and not isinstance(containers, list):
        return "object.spec.containers is not a list"
    for i, container in enumerate(containers or ()):
        if not isinstance(container, Mapping):
            return f"object.spec.containers[{i}] is not an object"
        resources = container.get("resources")
        if resources is not None and not isinstance(resources, Mapping):
            return f"object.spec.containers[{i}].resources is not an object"
        for part in ("requests", "limits"):
            value = (resources or {}).get(part)
            if value is not None and not isinstance(value, Mapping):
                return f"object.spec.containers[{i}].resources.{part} is not an object"
    return None


def decide_request(request: Mapping[str, Any], resolve: Resolver,
                   names: KubeNames, now: float, *, carriers: bool = True) -> Decision:
    """The decision for one AdmissionReview ``request`` at ``now`` (unix seconds);
    ``carriers``: give GPU-memory asks their device-plugin carrier (not where the asks
    become claims)."""
    kind = _text(_dict(request, "kind"), "kind")
    pod = request.get("object")
    operation = _text(request, "operation")
    if kind != "Pod" or operation != "CREATE" or not isinstance(pod, dict):
        return skip("not_a_pod_create", f"{kind} {operation}: only pod creations are "
                                        "right-sized")
    problem = _malformed(pod)
    if problem is not None:
        return skip("bad_request", problem)
    decision = _rightsize(pod, request, resolve, names, now)
    if not carriers:
        return decision
    carried, containers = carrier_patch(pod, names)
    if not carried:
        return decision
    return replace(decision, patch=[*carried, *decision.patch], carriers=containers)


def _rightsize(pod: Mapping[str, Any], request: Mapping[str, Any], resolve: Resolver,
               names: KubeNames, now: float) -> Decision:
    meta = _dict(pod, "metadata")
    namespace = _text(request, "namespace") or _text(meta, "namespace") or ""
    refs = meta.get("ownerReferences")
    if controller_ref(refs) is None:
        return skip("bare_pod", "the pod has no controller; only workloads are right-sized")
    try:
        workload = resolve(namespace, refs)
    except Exception as e:  # an API fault must not block the pod; it is counted and warned
        return skip("lookup_failed", f"reading the pod's controller failed: "
                                     f"{type(e).__name__}: {e}")
    if workload is None:
        return skip("owner_unknown", "the pod's controller is not a supported kind or is gone")
    return decide(pod, workload, names, now)


@dataclass(frozen=True, slots=True)
class Converted:
    """What the conversion into claims made of a review: its result (a
    :data:`DRA_RESULTS` entry), the patch to add, and for a refusal its message."""

    result: str
    conversion: Conversion | None = None
    message: str = ""

    @property
    def refused(self) -> bool:
        return self.result in REFUSAL_CODES


def convert_request(request: Mapping[str, Any], decision: Decision, names: KubeNames,
                    templates: TemplateStore, metrics: AdmissionMetrics) -> Converted:
    """The conversion of the pod in ``request`` as ``decision`` (right-sizing) leaves it,
    with the templates it names made (none on a dry run)."""
    pod = request.get("object")
    if decision.skip == "not_a_pod_create" or not isinstance(pod, dict):
        return Converted("not_a_pod_create")
    if decision.skip == "bad_request":
        return Converted("bad_request", message=decision.message)
    try:
        conversion = convert(applied(pod, decision.patch), names)
    except BadInput as e:
        return Converted("bad_request", message=str(e))
    if not conversion.patch:
        return Converted("no_gpu_ask")
    namespace = (_text(request, "namespace") or _text(_dict(pod, "metadata"), "namespace")
                 or "")
    dry_run = request.get("dryRun") is True
    for template in conversion.templates:
        try:
            if templates.ensure(namespace, template, dry_run=dry_run):
                metrics.templates_made.inc()
        except TemplateConflict as e:
            return Converted("template_conflict", message=str(e))
        except ApiError as e:
            return Converted("template_failed", message=str(e))
    return Converted("converted", conversion, conversion.message)


def answer(body: bytes, resolve: Resolver, names: KubeNames,
           metrics: AdmissionMetrics, clock: Callable[[], float] = time.time, *,
           templates: TemplateStore | None = None) -> dict[str, Any]:
    """The AdmissionReview response to ``body`` (a review with a ``request``); ``clock``: the
    time the guard's cool-off is judged at; ``templates``: where converted pods' templates are
    made, for a namespace with DRA delivery (``/mutate-dra``), else None.

    Raises ValueError for a body that is not an AdmissionReview (the server answers 400)."""
    started = time.perf_counter()
    review = orjson.loads(body)
    if not isinstance(review, dict) or not isinstance(review.get("request"), dict):
        raise ValueError("expected an AdmissionReview with a request")
    request = review["request"]
    try:
        decision = decide_request(request, resolve, names, clock(),
                                  carriers=templates is None)
    except Exception as e:  # a bug here must not block pods either
        log.exception("review_failed")
        decision = skip("internal_error", f"{type(e).__name__}: {e}")
    converted = None
    if templates is not None:
        try:
            converted = convert_request(request, decision, names, templates, metrics)
        except Exception as e:  # refused: admitted unconverted it would never run
            log.exception("conversion_failed")
            converted = Converted("internal_error", message=f"{type(e).__name__}: {e}")
        metrics.dra.labels(converted.result).inc()
    uid = request.get("uid")
    response: dict[str, Any] = {"uid": uid if isinstance(uid, str) else "", "allowed": True}
    if converted is not None and converted.refused:
        response["allowed"] = False
        response["status"] = {"code": REFUSAL_CODES[converted.result],
                              "message": f"gpufrag: {converted.message}"}
    else:
        patch = [*decision.patch, *(converted.conversion.patch
                                    if converted and converted.conversion else [])]
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
        if decision.warnings:
            response["warnings"] = decision.warnings
        metrics.count(decision)
    metrics.seconds.observe(time.perf_counter() - started)
    log.info("reviewed", namespace=_text(request, "namespace"),
             pod=_text(_dict(_dict(request, "object"), "metadata"), "generateName"),
             result="skipped" if decision.skip else "mutated", reason=decision.skip,
             message=decision.message,
             dra=converted.result if converted else None,
             dra_message=converted.message if converted else None)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": response}
