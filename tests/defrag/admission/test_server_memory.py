"""The webhook parses a review only once what parsing it holds fits its memory budget: 413
for a body that never could (unparsed), 503 with Retry-After while others hold the room."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from defrag.admission import server
from defrag.admission.review import AdmissionMetrics
from defrag.rightsizing.workloads import Workload
from gpufrag.conventions import DEFAULT_NAMES as NAMES
from gpufrag.membudget import MemoryBudget

REVIEW: dict[str, Any] = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                          "request": {"uid": "u-1", "kind": {"kind": "Pod"},
                                      "operation": "CREATE", "namespace": "serving",
                                      "object": {"metadata": {"name": "p"},
                                                 "spec": {"containers": []}}}}


def _no_workload(namespace: str, refs: Any) -> Workload | None:
    return None


def _post(budget: MemoryBudget, body: bytes) -> tuple[int, dict[str, Any], str | None]:
    app = server.create_app(_no_workload, NAMES, AdmissionMetrics(), budget=budget)
    response = app.test_client().post("/mutate", data=body, content_type="application/json")
    return (response.status_code, orjson.loads(response.data),
            response.headers.get("Retry-After"))


def test_a_review_that_would_take_more_than_the_budget_is_refused_unparsed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*_: Any) -> None:
        raise AssertionError("parsed")

    monkeypatch.setattr(server, "answer", never)
    budget = MemoryBudget(1024 * 1024, wait_s=0, setting="the test's budget")
    body = b'{"request":[' + b",".join([b"{}"] * 40_000) + b"]}"  # 120 KB, ~10 MB parsed
    status, reply, _ = _post(budget, body)
    assert status == 413 and "the test's budget" in reply["error"]
    assert budget.held_bytes == 0


def test_while_others_hold_the_budget_a_review_answers_503_retry_after() -> None:
    budget = MemoryBudget(1024 * 1024, wait_s=0)
    held = budget.reserve(budget.total_bytes)
    status, reply, retry = _post(budget, orjson.dumps(REVIEW))
    assert (status, retry) == (503, "1") and "retry shortly" in reply["error"]
    held.release()
    status, reply, _ = _post(budget, orjson.dumps(REVIEW))
    assert status == 200 and reply["response"]["allowed"] is True
    assert budget.held_bytes == 0


def test_the_default_budget_leaves_room_for_the_largest_real_review() -> None:
    # A pod at the API server's object limit, made of what pods are made of (env entries).
    env = [{"name": f"VAR_{i}", "value": "x" * 40} for i in range(20_000)]
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "env": env}]}}
    body = orjson.dumps({**REVIEW, "request": {**REVIEW["request"], "object": pod}})
    assert len(body) < server.MAX_BODY_BYTES
    budget = MemoryBudget(server.MEMORY_BUDGET_BYTES, wait_s=0)
    status, _, _ = _post(budget, body)
    assert status == 200
