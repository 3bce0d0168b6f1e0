"""The Python zero-cost extender answers as the Go one does (devkit/cluster/zeroextender.go):
the floor row of benchmarks/scheduling_throughput is only a floor if it does the same work."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from devkit.pyzero import create_app
from scheduler.kube.binder import BindError, DryRunBinder


class RefusingBinder(DryRunBinder):
    def bind(self, namespace: str, name: str, uid: str, node: str,
             gpus: tuple[int, ...] | None, extra: Any = None) -> None:
        raise BindError(f"pod {namespace}/{name} is gone", retryable=False)


def _post(app: Any, path: str, body: dict[str, Any]) -> Any:
    reply = app.test_client().post(path, data=orjson.dumps(body),
                                   content_type="application/json")
    assert reply.status_code == 200
    return orjson.loads(reply.data)


@pytest.mark.parametrize(("one", "passed"), [(True, ["a"]), (False, ["a", "b", "c"])])
def test_filter_passes_the_first_node_or_all(one: bool, passed: list[str]) -> None:
    app = create_app(DryRunBinder(), one_node=one)
    answer = _post(app, "/filter", {"Pod": {}, "Nodes": None, "NodeNames": ["a", "b", "c"]})
    assert answer["NodeNames"] == passed
    nodes = {"items": [{"metadata": {"name": n}} for n in "abc"]}
    answer = _post(app, "/filter", {"Pod": {}, "Nodes": nodes, "NodeNames": None})
    assert [n["metadata"]["name"] for n in answer["Nodes"]["items"]] == passed


def test_prioritize_scores_every_node_zero() -> None:
    app = create_app(DryRunBinder(), one_node=False)
    assert _post(app, "/prioritize", {"Pod": {}, "NodeNames": ["a", "b"]}) == [
        {"Host": "a", "Score": 0}, {"Host": "b", "Score": 0}]


def test_bind_writes_the_binding_or_says_why_not() -> None:
    binder = DryRunBinder()
    args = {"PodName": "p", "PodNamespace": "ns", "PodUID": "u1", "Node": "n1"}
    assert _post(create_app(binder, one_node=True), "/bind", args) == {"Error": ""}
    assert [(c.namespace, c.name, c.uid, c.node) for c in binder.calls] == [("ns", "p", "u1", "n1")]
    refused = _post(create_app(RefusingBinder(), one_node=True), "/bind", args)
    assert refused == {"Error": "pod ns/p is gone"}


def test_preempt_keeps_the_candidates() -> None:
    app = create_app(DryRunBinder(), one_node=False)
    args = {"Pod": {}, "NodeNameToVictims": {"n1": {"Pods": [{"metadata": {"uid": "v1"}}],
                                                    "NumPDBViolations": 1}}}
    assert _post(app, "/preempt", args) == {
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "v1"}], "NumPDBViolations": 1}}}
