"""AdmissionReview v1 in, AdmissionReview v1 out; every answer ``allowed: true``.

A webhook that rejects or fails would block pod creation (``failurePolicy: Ignore`` only covers
a webhook that does not answer), so every path here admits: with a JSON patch when the pod was
right-sized, unchanged otherwise, counted by reason in the metrics. A lookup of the pod's
workload that fails (API server slow, RBAC missing) admits unchanged with a warning.

Metrics (own registry, ``/metrics``):

- ``gpufrag_admission_reviews_total{result}`` — ``mutated`` or ``skipped``;
- ``gpufrag_admission_skips_total{reason}`` — one per skipped pod (reasons in
  :data:`defrag.admission.mutate.SKIP_REASONS`, all present from the start at 0);
- ``gpufrag_admission_milli_saved_total`` — GPU share (milli) given back by rewrites;
- ``gpufrag_admission_review_seconds`` — time to answer, lookups included.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram

from defrag.admission.mutate import SKIP_REASONS, Decision, decide, skip
from defrag.rightsizing.workloads import Workload, controller_ref
from gpufrag.conventions import KubeNames

log = structlog.get_logger("gpufrag.admission")

# namespace, ownerReferences -> the workload (None: no supported owner); raises on API faults.
Resolver = Callable[[str, Any], Workload | None]


class AdmissionMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.reviews = Counter("gpufrag_admission_reviews", "Pods reviewed", ["result"],
                               registry=r)
        self.skips = Counter("gpufrag_admission_skips", "Pods admitted unchanged, by reason",
                             ["reason"], registry=r)
        self.milli_saved = Counter("gpufrag_admission_milli_saved",
                                   "GPU share (milli) given back by rewrites", registry=r)
        self.seconds = Histogram("gpufrag_admission_review_seconds", "Time to answer a review",
                                 registry=r, buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5))
        for result in ("mutated", "skipped"):
            self.reviews.labels(result)
        for reason in SKIP_REASONS:
            self.skips.labels(reason)

    def count(self, decision: Decision) -> None:
        if decision.skip is not None:
            self.reviews.labels("skipped").inc()
            self.skips.labels(decision.skip).inc()
        else:
            self.reviews.labels("mutated").inc()
            change = decision.change or {}
            self.milli_saved.inc(max(int(change.get("from", 0)) - int(change.get("to", 0)), 0))


def decide_request(request: Mapping[str, Any], resolve: Resolver,
                   names: KubeNames, now: float) -> Decision:
    """The decision for one AdmissionReview ``request`` at ``now`` (unix seconds)."""
    kind = (request.get("kind") or {}).get("kind")
    pod = request.get("object")
    if kind != "Pod" or request.get("operation") != "CREATE" or not isinstance(pod, dict):
        return skip("not_a_pod_create", f"{kind} {request.get('operation')}: only pod "
                                        "creations are right-sized")
    meta = pod.get("metadata") or {}
    namespace = request.get("namespace") or meta.get("namespace") or ""
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


def answer(body: bytes, resolve: Resolver, names: KubeNames,
           metrics: AdmissionMetrics, clock: Callable[[], float] = time.time
           ) -> dict[str, Any]:
    """The AdmissionReview response to ``body`` (a review with a ``request``); ``clock``: the
    time the guard's cool-off is judged at.

    Raises ValueError for a body that is not an AdmissionReview (the server answers 400)."""
    started = time.perf_counter()
    review = orjson.loads(body)
    if not isinstance(review, dict) or not isinstance(review.get("request"), dict):
        raise ValueError("expected an AdmissionReview with a request")
    request = review["request"]
    try:
        decision = decide_request(request, resolve, names, clock())
    except Exception as e:  # a bug here must not block pods either
        log.exception("review_failed")
        decision = skip("internal_error", f"{type(e).__name__}: {e}")
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    if decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(decision.patch)).decode()
    if decision.warnings:
        response["warnings"] = decision.warnings
    metrics.count(decision)
    metrics.seconds.observe(time.perf_counter() - started)
    log.info("reviewed", namespace=request.get("namespace"),
             pod=((request.get("object") or {}).get("metadata") or {}).get("generateName"),
             result="skipped" if decision.skip else "mutated", reason=decision.skip,
             message=decision.message)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": response}
