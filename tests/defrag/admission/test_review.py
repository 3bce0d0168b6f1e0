"""The webhook's decisions, through AdmissionReview v1 bodies, with a fake workload lookup."""

from __future__ import annotations

import base64
import dataclasses
import math
from typing import Any

import orjson
import pytest

from defrag.admission.mutate import decide
from defrag.admission.review import AdmissionMetrics, answer
from defrag.rightsizing.recommender import PodSample, RightsizingConfig, encode, parse, update
from defrag.rightsizing.workloads import Workload
from gpufrag.conventions import DEFAULT_NAMES as NAMES

NOW = 1_767_225_600.0
OWNER = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": "rs-1",
          "controller": True}]


def recommendation(peak_mib: int = 8000, *, version: str = "*") -> str:
    text, _ = update(None, {version: [PodSample("ns", "p", "u", peak_mib, 81920, NOW)]}, NOW,
                     RightsizingConfig(headroom_fraction=0.0, headroom_mib=0, min_mib=0))
    return text


def workload(mode: str | None = "auto", rec: str | None = None) -> Workload:
    annotations = {}
    if mode is not None:
        annotations[NAMES.annotation_rightsizing_mode] = mode
    if rec is not None:
        annotations[NAMES.annotation_gpu_recommendation] = rec
    return Workload("Deployment", "ns", "web", "d-1", annotations)


def pod(milli: str | None = "500", *, owner: Any = OWNER, limits: bool = True,
        labels: dict[str, str] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if milli is not None:
        resources["requests"] = {NAMES.gpu_milli: milli, "cpu": "1"}
        if limits:
            resources["limits"] = {NAMES.gpu_milli: milli}
    meta: dict[str, Any] = {"generateName": "web-abc-", "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = owner
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "main", "image": "x", "resources": resources}]}}


def review(obj: dict[str, Any], operation: str = "CREATE", kind: str = "Pod") -> bytes:
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": {"uid": "req-1", "kind": {"kind": kind},
                                     "operation": operation, "namespace": "ns", "object": obj}})


def run(obj: dict[str, Any], wl: Workload | None, **kw: Any) -> tuple[dict[str, Any],
                                                                      AdmissionMetrics]:
    metrics = AdmissionMetrics()
    out = answer(review(obj, **kw), lambda _ns, _refs: wl, NAMES, metrics, clock=lambda: NOW)
    return out["response"], metrics


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    return orjson.loads(base64.b64decode(response["patch"]))


def skips(metrics: AdmissionMetrics, reason: str) -> float:
    return metrics.registry.get_sample_value("gpufrag_admission_skips_total",
                                             {"reason": reason}) or 0.0


def test_auto_mode_sets_the_share_to_the_recommendation_and_says_why() -> None:
    response, metrics = run(pod("500"), workload("auto", recommendation(8192)))
    assert response["allowed"] is True and response["uid"] == "req-1"
    ops = patch_of(response)
    paths = {op["path"]: op["value"] for op in ops}
    # 8192 MiB of an 81920 MiB GPU = 100 milli.
    assert paths["/spec/containers/0/resources/requests/gpufrag.io~1gpu-milli"] == "100"
    assert paths["/spec/containers/0/resources/limits/gpufrag.io~1gpu-milli"] == "100"
    record = orjson.loads(paths["/metadata/annotations"][NAMES.annotation_rightsizing_change])
    assert (record["from"], record["to"], record["workload"]) == (500, 100, "Deployment/ns/web")
    assert "percentile" in record["why"]
    assert metrics.registry.get_sample_value("gpufrag_admission_milli_saved_total") == 400


def test_never_above_what_the_user_asked() -> None:
    response, metrics = run(pod("50"), workload("auto", recommendation(8192)))
    assert "patch" not in response
    assert skips(metrics, "at_or_below_recommendation") == 1


def test_the_model_versions_own_recommendation_wins() -> None:
    text = recommendation(16384, version="v2")
    response, _ = run(pod("500", labels={NAMES.label_model_version: "v2"}),
                      workload("auto", text))
    assert any(op.get("value") == "200" for op in patch_of(response))


@pytest.mark.parametrize(("obj", "wl", "reason", "warned"), [
    (pod(), workload("off", recommendation()), "mode_off", False),
    (pod(), workload("recommend", recommendation()), "mode_recommend", False),
    (pod(), workload(None, recommendation()), "mode_recommend", False),
    (pod(), workload("sometimes", recommendation()), "bad_mode", True),
    (pod(), workload("auto", None), "no_recommendation", False),
    (pod(), workload("auto", '{"version": 1, "recommendations": {"*": 3}}'),
     "bad_recommendation", True),
    (pod(), workload("auto", "not json"), "bad_recommendation", True),
    (pod(owner=None), workload(), "bare_pod", False),
    (pod(), None, "owner_unknown", False),
    (pod(None), workload("auto", recommendation()), "no_gpu_share", False),
    (pod("2000"), workload("auto", recommendation()), "no_gpu_share", False),
    (pod("lots"), workload("auto", recommendation()), "bad_request", True),
])
def test_skips_admit_unchanged_with_a_reason(obj: dict[str, Any], wl: Workload | None,
                                            reason: str, warned: bool) -> None:
    response, metrics = run(obj, wl)
    assert response["allowed"] is True
    assert "patch" not in response
    assert skips(metrics, reason) == 1
    assert bool(response.get("warnings")) is warned


def test_a_failing_lookup_admits_with_a_warning() -> None:
    def broken(_ns: str, _refs: Any) -> Workload | None:
        raise ConnectionError("api server unreachable")
    metrics = AdmissionMetrics()
    response = answer(review(pod()), broken, NAMES, metrics)["response"]
    assert response["allowed"] is True and "patch" not in response
    assert "unreachable" in response["warnings"][0]
    assert skips(metrics, "lookup_failed") == 1


def test_updates_and_other_kinds_are_not_touched() -> None:
    response, metrics = run(pod(), workload("auto", recommendation()), operation="UPDATE")
    assert "patch" not in response and skips(metrics, "not_a_pod_create") == 1


def test_a_pod_without_annotations_gets_the_map_created() -> None:
    obj = pod("500")
    response, _ = run(obj, workload("auto", recommendation(8192)))
    assert patch_of(response)[-1]["path"] == "/metadata/annotations"
    obj["metadata"]["annotations"] = {"a": "b"}
    response, _ = run(obj, workload("auto", recommendation(8192)))
    assert patch_of(response)[-1]["path"] == "/metadata/annotations/gpufrag.io~1rightsizing"


def test_never_below_the_observed_peak() -> None:
    recs = parse(recommendation(8192))
    recs["*"] = dataclasses.replace(recs["*"], milli=10, peak_mib=16384)
    response, _ = run(pod("500"), workload("auto", encode(recs)))
    assert any(op.get("value") == "200" for op in patch_of(response))


def test_requests_only_pods_are_patched_in_requests_only() -> None:
    response, _ = run(pod("500", limits=False), workload("auto", recommendation(8192)))
    assert [op["path"].split("/")[5] for op in patch_of(response)[:-1]] == ["requests"]


def day_of_history(peak_mib: int = 8192, *, hours: int = 24) -> str:
    """A recommendation learned from ``hours`` hourly peaks of ``peak_mib`` (no headroom)."""
    samples = [PodSample("ns", "p", "u", peak_mib, 81920, NOW - 3600.0 * h) for h in range(hours)]
    text, _ = update(None, {"*": samples}, NOW,
                     RightsizingConfig(headroom_fraction=0.0, headroom_mib=0, min_mib=0))
    return text


def whole_pod(gpus: str = "1") -> dict[str, Any]:
    obj = pod(None)
    obj["spec"]["containers"][0]["resources"] = {
        "requests": {NAMES.gpu: gpus, "cpu": "1"}, "limits": {NAMES.gpu: gpus}}
    return obj


def test_a_whole_gpu_pod_with_a_day_of_history_becomes_a_share_saying_what_it_replaced() -> None:
    response, metrics = run(whole_pod(), workload("auto", day_of_history(8192)))
    ops = patch_of(response)
    base = "/spec/containers/0/resources"
    for part in ("requests", "limits"):
        assert {"op": "remove", "path": f"{base}/{part}/nvidia.com~1gpu"} in ops
        assert {"op": "add", "path": f"{base}/{part}/gpufrag.io~1gpu-milli",
                "value": "100"} in ops  # 8192 MiB of an 81920 MiB GPU
    annotations = next(op["value"] for op in ops if op["path"] == "/metadata/annotations")
    record = orjson.loads(annotations[NAMES.annotation_rightsizing_change])
    assert record["replaced"] == {NAMES.gpu: "1"}
    assert (record["from"], record["to"], record["memory_mib"]) == (1000, 100, 8192)
    assert metrics.registry.get_sample_value("gpufrag_admission_milli_saved_total") == 900
    decision = decide(whole_pod(), workload("auto", day_of_history(8192)), NAMES, NOW)
    assert decision.message == "nvidia.com/gpu 1 -> gpufrag.io/gpu-milli 100"


def test_older_recommendations_never_share_a_whole_gpu() -> None:
    # Written before whole_gpu existed: read as False, whatever the history.
    doc = orjson.loads(day_of_history())
    for rec in doc["recommendations"].values():
        del rec["whole_gpu"]
    assert not parse(orjson.dumps(doc).decode())["*"].whole_gpu
    response, metrics = run(whole_pod(), workload("auto", orjson.dumps(doc).decode()))
    assert "patch" not in response and skips(metrics, "whole_gpu_kept") == 1


@pytest.mark.parametrize(("obj", "wl", "reason"), [
    (whole_pod(), workload("auto", day_of_history(hours=23)), "whole_gpu_kept"),
    (whole_pod(), workload("auto", day_of_history(81920)), "whole_gpu_kept"),  # fills the GPU
    (whole_pod(), workload("auto", recommendation(8192)), "whole_gpu_kept"),  # one interval
    (whole_pod("2"), workload("auto", day_of_history()), "multi_gpu"),
    (whole_pod(), workload("recommend", day_of_history()), "mode_recommend"),
    (whole_pod(), workload("off", day_of_history()), "mode_off"),
])
def test_whole_gpu_pods_stay_whole_without_a_days_history_or_auto(
        obj: dict[str, Any], wl: Workload, reason: str) -> None:
    response, metrics = run(obj, wl)
    assert response["allowed"] is True and "patch" not in response
    assert skips(metrics, reason) == 1


def test_a_raised_workload_in_its_cool_off_is_admitted_as_asked() -> None:
    text, _ = update(None, {"*": [PodSample("ns", "p", "u", 8192, 81920, NOW)]}, NOW,
                     RightsizingConfig(headroom_fraction=0.0, headroom_mib=0, min_mib=0),
                     {"*": 9000})
    response, metrics = run(pod("500"), workload("auto", text))
    assert "patch" not in response and skips(metrics, "oom_cooloff") == 1
    # Judged on the webhook's clock: once the cool-off is over, the (raised) share applies.
    later = AdmissionMetrics()
    out = answer(review(pod("500")), lambda _ns, _refs: workload("auto", text), NAMES, later,
                 clock=lambda: NOW + 2 * 86400)["response"]
    assert any(op.get("value") == str(math.ceil(9000 * 1.2 * 1000 / 81920))
               for op in patch_of(out))


def _malformed_reviews() -> list[tuple[str, dict[str, Any]]]:
    """The whole-GPU auto review with one field at a time replaced by each wrong JSON type."""
    def base() -> dict[str, Any]:
        return orjson.loads(review(whole_pod()))

    paths = [("request", "uid"), ("request", "kind"), ("request", "operation"),
             ("request", "namespace"), ("request", "object"), ("request", "object", "metadata"),
             ("request", "object", "metadata", "labels"),
             ("request", "object", "metadata", "annotations"),
             ("request", "object", "metadata", "ownerReferences"),
             ("request", "object", "metadata", "ownerReferences", 0),
             ("request", "object", "spec"), ("request", "object", "spec", "containers"),
             ("request", "object", "spec", "containers", 0),
             ("request", "object", "spec", "containers", 0, "resources"),
             ("request", "object", "spec", "containers", 0, "resources", "limits"),
             ("request", "object", "spec", "containers", 0, "resources", "limits",
              NAMES.gpu)]
    out = []
    for path in paths:
        for value in ("text", 7, -1.5, True, None, [], [1, "x"], {"a": {"b": []}}):
            doc = base()
            node: Any = doc
            for step in path[:-1]:
                node = node[step]
            node[path[-1]] = value
            out.append((f"{'.'.join(map(str, path))}={value!r}", doc))
    return out


@pytest.mark.parametrize(("case", "doc"), _malformed_reviews(), ids=lambda v: str(v)[:60])
def test_every_malformed_review_is_answered_allowed_and_unchanged(
        case: str, doc: dict[str, Any]) -> None:
    metrics = AdmissionMetrics()
    out = answer(orjson.dumps(doc), lambda _ns, _refs: workload("auto", day_of_history()),
                 NAMES, metrics, clock=lambda: NOW)
    response = out["response"]
    assert out["kind"] == "AdmissionReview" and response["allowed"] is True, case
    assert isinstance(response["uid"], str)
    assert metrics.registry.get_sample_value("gpufrag_admission_skips_total",
                                             {"reason": "internal_error"}) in (None, 0.0), case


def _memory_pod(resources: dict[str, Any], *, owner: Any = None) -> dict[str, Any]:
    obj = pod(None, owner=owner)
    obj["spec"]["containers"][0]["resources"] = resources
    return obj


def test_a_memory_ask_alone_gets_its_carrier_on_any_pod() -> None:
    ask = {NAMES.gpu_memory: "6000"}
    response, metrics = run(_memory_pod({"requests": dict(ask), "limits": dict(ask)}), None)
    assert response["allowed"] and patch_of(response) == [
        {"op": "add", "path": f"/spec/containers/0/resources/{part}/gpufrag.io~1gpu-milli",
         "value": "1"} for part in ("requests", "limits")]
    assert metrics.registry.get_sample_value("gpufrag_admission_carriers_total") == 1.0
    assert skips(metrics, "bare_pod") == 1  # right-sizing itself still skips a bare pod
    # limits only: the request defaults to the limit, so only the limit gets the carrier
    response, _ = run(_memory_pod({"limits": dict(ask)}), None)
    assert [op["path"] for op in patch_of(response)] == [
        "/spec/containers/0/resources/limits/gpufrag.io~1gpu-milli"]


@pytest.mark.parametrize("resources", [
    {"limits": {NAMES.gpu_memory: "6000", NAMES.gpu_milli: "1"}},
    {"limits": {NAMES.gpu_memory: "6000", NAMES.gpu: "1"}},  # HAMi's count
    {"limits": {"cpu": "1"}},
])
def test_a_carried_memory_ask_or_none_is_left_alone(resources: dict[str, Any]) -> None:
    response, metrics = run(_memory_pod(resources), None)
    assert "patch" not in response
    assert metrics.registry.get_sample_value("gpufrag_admission_carriers_total") == 0.0
