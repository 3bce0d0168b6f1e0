"""``/mutate-dra``: right-sizing, then the GPU asks moved into claims, as one patch; the
templates made through a store; a pod that cannot be converted refused, never admitted as it
is. The API server's side (the templates it stores, the claims its controller makes) is
tests/e2e/test_dra_claims.py."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from flask.testing import FlaskClient

from defrag.admission.jsonpatch import applied
from defrag.admission.review import AdmissionMetrics, answer
from defrag.admission.server import create_app
from defrag.admission.templates import conflict
from defrag.admission.toclaims import ClaimTemplate, Shape, same_spec, template_for
from defrag.rightsizing.workloads import Workload
from gpufrag.conventions import DEFAULT_NAMES as NAMES
from scheduler.kube.errors import ApiError
from tests.defrag.admission.test_review import (
    NOW,
    patch_of,
    pod,
    recommendation,
    review,
    workload,
)


class Store:
    """Templates by (namespace, name), judged as the API-backed store judges them."""

    def __init__(self, found: dict[tuple[str, str], Any] | None = None,
                 fail: ApiError | None = None) -> None:
        self.found = dict(found or {})
        self.fail = fail
        self.dry_runs = 0

    def ensure(self, namespace: str, template: ClaimTemplate, *, dry_run: bool) -> bool:
        if self.fail is not None:
            raise self.fail
        spec = self.found.get((namespace, template.name))
        if spec is not None:
            if not same_spec(spec, template.spec):
                raise conflict(namespace, template)
            return False
        if dry_run:
            self.dry_runs += 1
            return False
        self.found[(namespace, template.name)] = template.spec
        return True


def run(obj: dict[str, Any], wl: Workload | None, store: Store, **kw: Any
        ) -> tuple[dict[str, Any], AdmissionMetrics]:
    metrics = AdmissionMetrics()
    body = orjson.loads(review(obj, **kw.pop("review", {})))
    body["request"].update(kw)
    out = answer(orjson.dumps(body), lambda _ns, _refs: wl, NAMES, metrics, clock=lambda: NOW,
                 templates=store)
    return out["response"], metrics


def result(metrics: AdmissionMetrics, name: str) -> float:
    return metrics.registry.get_sample_value("gpufrag_admission_dra_conversions_total",
                                             {"result": name}) or 0.0


def test_a_share_is_moved_into_a_claim_of_a_template_the_store_now_holds() -> None:
    store = Store()
    response, metrics = run(pod("250"), workload("off"), store)
    assert response["allowed"] is True
    out = applied(pod("250"), patch_of(response))
    template = template_for(Shape(1, 250))
    assert out["spec"]["resourceClaims"] == [
        {"name": "gpufrag-gpu-0", "resourceClaimTemplateName": template.name}]
    assert NAMES.gpu_milli not in out["spec"]["containers"][0]["resources"]["requests"]
    assert store.found == {("ns", template.name): template.spec}
    assert result(metrics, "converted") == 1
    assert metrics.registry.get_sample_value(
        "gpufrag_admission_dra_templates_made_total") == 1
    # The right-sizing step is counted as it always is.
    assert metrics.registry.get_sample_value("gpufrag_admission_skips_total",
                                             {"reason": "mode_off"}) == 1


def test_right_sizing_comes_first_and_the_claim_asks_the_new_share() -> None:
    store = Store()
    response, _ = run(pod("500"), workload("auto", recommendation(8192)), store)
    out = applied(pod("500"), patch_of(response))
    (entry,) = out["spec"]["resourceClaims"]
    assert entry["resourceClaimTemplateName"] == template_for(Shape(1, 100)).name
    record = orjson.loads(out["metadata"]["annotations"][NAMES.annotation_rightsizing_change])
    assert (record["from"], record["to"]) == (500, 100)  # the annotation says what it did
    assert out["spec"]["containers"][0]["resources"]["limits"] == {}


def test_a_memory_ask_alone_gets_its_claim_not_the_device_plugin_carrier() -> None:
    obj = pod(None, owner=None)
    obj["spec"]["containers"][0]["resources"] = {"limits": {NAMES.gpu_memory: "10240"}}
    response, metrics = run(obj, None, Store())
    out = applied(obj, patch_of(response))
    assert out["spec"]["containers"][0]["resources"]["limits"] == {}
    (entry,) = out["spec"]["resourceClaims"]
    assert entry["resourceClaimTemplateName"] == template_for(Shape(1, 1, 10240)).name
    assert metrics.registry.get_sample_value("gpufrag_admission_carriers_total") == 0


def test_a_pod_asking_no_gpu_and_other_operations_are_admitted_unchanged() -> None:
    store = Store()
    response, metrics = run(pod(None), None, store)
    assert response["allowed"] is True and "patch" not in response
    assert result(metrics, "no_gpu_ask") == 1
    response, metrics = run(pod("250"), None, store, review={"operation": "UPDATE"})
    assert response["allowed"] is True and "patch" not in response
    assert result(metrics, "not_a_pod_create") == 1
    assert store.found == {}


def test_a_dry_run_creates_nothing_and_answers_the_same_patch() -> None:
    store = Store()
    dry, _ = run(pod("250"), None, store, dryRun=True)
    assert store.found == {} and store.dry_runs == 1
    real, _ = run(pod("250"), None, store)
    assert patch_of(dry) == patch_of(real) and len(store.found) == 1


def test_a_template_someone_else_made_under_the_name_refuses_the_pod_naming_it() -> None:
    template = template_for(Shape(1, 250))
    steered = orjson.loads(orjson.dumps(template.spec))
    steered["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": 'device.attributes["gpu.gpufrag.io"].index == 0'}}]
    response, metrics = run(pod("250"), None, Store({("ns", template.name): steered}))
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["code"] == 409
    assert f"ResourceClaimTemplate ns/{template.name} exists with a spec other" in (
        response["status"]["message"])
    assert result(metrics, "template_conflict") == 1


def test_our_own_template_found_again_is_fine() -> None:
    template = template_for(Shape(1, 250))
    response, metrics = run(pod("250"), None, Store({("ns", template.name): template.spec}))
    assert response["allowed"] is True and result(metrics, "converted") == 1
    assert metrics.registry.get_sample_value(
        "gpufrag_admission_dra_templates_made_total") == 0


def test_a_mig_ask_is_moved_into_a_claim_of_the_profiles_class() -> None:
    store = Store()
    obj = pod(None)
    obj["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-3g.40gb": "1"}}
    response, metrics = run(obj, workload("off"), store)
    assert response["allowed"] is True
    out = applied(obj, patch_of(response))
    template = template_for(Shape(1, profile="3g.40gb"))
    assert out["spec"]["resourceClaims"] == [
        {"name": "gpufrag-gpu-0", "resourceClaimTemplateName": template.name}]
    assert out["spec"]["containers"][0]["resources"]["limits"] == {}
    assert store.found == {("ns", template.name): template.spec}
    assert result(metrics, "converted") == 1


@pytest.mark.parametrize(("resources", "code", "reason", "words"), [
    ({NAMES.gpu_milli: "1500"}, 422, "bad_request", "a share is part of one GPU"),
    ({NAMES.gpu_milli: "half"}, 422, "bad_request", "gpu-milli"),
    ({"nvidia.com/mig-5g.99gb": "1"}, 422, "bad_request",
     "'5g.99gb' is not a MIG profile of any GPU gpufrag knows"),
    ({"nvidia.com/mig-3g.40gb": "1", NAMES.gpu_milli: "250"}, 422, "bad_request",
     "either MIG partitions or whole GPUs / a share of a GPU, not both"),
])
def test_an_ask_the_driver_cannot_serve_refuses_the_pod_with_the_reason(
        resources: dict[str, str], code: int, reason: str, words: str) -> None:
    obj = pod(None)
    obj["spec"]["containers"][0]["resources"] = {"limits": resources}
    response, metrics = run(obj, workload("off"), Store())
    assert response["allowed"] is False
    assert response["status"]["code"] == code and words in response["status"]["message"]
    assert result(metrics, reason) == 1


def test_a_store_that_fails_refuses_the_pod_with_the_api_error() -> None:
    fail = ApiError("creating ResourceClaimTemplate ns/x", 403, "forbidden", reason="Forbidden")
    response, metrics = run(pod("250"), None, Store(fail=fail))
    assert response["allowed"] is False and response["status"]["code"] == 503
    assert "HTTP 403 Forbidden: forbidden" in response["status"]["message"]
    assert result(metrics, "template_failed") == 1


def test_the_dra_path_is_its_own_route_and_off_without_a_store() -> None:
    body = review(pod("250"))
    metrics = AdmissionMetrics()
    on: FlaskClient = create_app(lambda _ns, _refs: None, NAMES, metrics,
                                 templates=Store()).test_client()
    converted = on.post("/mutate-dra", data=body).get_json()["response"]
    assert converted["allowed"] is True and "patch" in converted
    plain = on.post("/mutate", data=body).get_json()["response"]
    assert "patch" not in plain  # right-sizing only: a bare pod, nothing to do
    off = create_app(lambda _ns, _refs: None, NAMES, metrics).test_client()
    answered = off.post("/mutate-dra", data=body)
    assert answered.status_code == 404 and "off" in answered.get_json()["error"]
