"""Contract tests: hand-written bodies in the exact shapes kube-scheduler sends (extender v1; Go
types without JSON tags, so PascalCase keys), in both NodeNames (nodeCacheCapable) and Nodes
modes, and the exact shapes it expects back."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from scheduler.extender.runtime import Runtime
from tests.scheduler.extender.helpers import RecordingBinder, make_config, post, serve

FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
A100 = "NVIDIA-A100-SXM4-80GB"


def node_json(name: str, gpus: int, cpu: str = "64", memory: str = "512Gi") -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "100Gi"}
    if gpus:
        labels |= {"nvidia.com/gpu.product": A100, "nvidia.com/gpu.memory": "81920",
                   "nvidia.com/gpu.count": str(gpus)}
        allocatable |= {"nvidia.com/gpu": str(gpus), "gpufrag.io/gpu-milli": str(gpus * 1000)}
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1021",
                     "creationTimestamp": "2026-01-05T10:00:00Z", "labels": labels},
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {"capacity": dict(allocatable), "allocatable": allocatable,
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "nodeInfo": {"kubeletVersion": "v1.36.3"}},
    }


def pod_json(name: str, *, gpus: str | None = "1", milli: str | None = None, node: str = "",
             gpu_indices: str | None = None, labels: dict[str, str] | None = None,
             owner: str = "") -> dict[str, Any]:
    requests = {"cpu": "2", "memory": "8Gi"}
    limits: dict[str, str] = {}
    if gpus is not None:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = gpus
    if milli is not None:
        requests["gpufrag.io/gpu-milli"] = milli
    meta: dict[str, Any] = {"name": name, "namespace": "serving", "uid": f"uid-{name}",
                            "resourceVersion": "2042", "labels": labels or {}}
    if gpu_indices is not None:
        meta["annotations"] = {"gpufrag.io/gpu-indices": gpu_indices}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                    "name": "infer-7d9f", "uid": owner, "controller": True,
                                    "blockOwnerDeletion": True}]
    spec: dict[str, Any] = {
        "containers": [{"name": "server", "image": "server:1",
                        "resources": {"requests": requests, "limits": limits}}],
        "schedulerName": "gpufrag-scheduler", "priority": 0,
        "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                         "effect": "NoExecute", "tolerationSeconds": 300}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec,
            "status": {"phase": "Running" if node else "Pending", "qosClass": "Burstable"}}


NODES = [node_json("gpu-a", 4), node_json("gpu-b", 2), node_json("cpu-1", 0)]
BOUND = [pod_json("busy-0", node="gpu-b", gpu_indices="0"),
         pod_json("busy-1", node="gpu-b", gpu_indices="1")]
PENDING = pod_json("infer-7d9f-abcde")


FEASIBLE = make_config(filter={"answer": "feasible"})


@pytest.fixture
def runtime() -> Runtime:
    """The filter answering every node the pod fits (``filter.answer: feasible``): the wire
    contract in full. The deciding filter is pinned in test_filter_decides.py."""
    return serve(NODES, [*BOUND, PENDING], config=FEASIBLE)


def test_filter_node_names_mode(runtime: Runtime) -> None:
    status, reply = post(runtime.app.test_client(), "/filter", {
        "Pod": PENDING, "Nodes": None, "NodeNames": ["gpu-a", "gpu-b", "cpu-1", "gpu-new"]})
    assert status == 200
    assert set(reply) == FILTER_KEYS
    assert reply == {
        "Nodes": None,
        "NodeNames": ["gpu-a"],
        "FailedNodes": {
            "gpu-b": "needs 1 free GPUs, has 0",
            "gpu-new": "node not yet known to the gpufrag extender (its watch is behind); retry",
        },
        "FailedAndUnresolvableNodes": {"cpu-1": "needs 1 GPUs, node has 0"},
        "Error": "",
    }


def test_filter_nodes_mode_answers_with_the_node_objects_it_was_given(runtime: Runtime) -> None:
    sent = {"metadata": {"resourceVersion": ""}, "items": copy.deepcopy(NODES)}
    status, reply = post(runtime.app.test_client(), "/filter",
                         {"Pod": PENDING, "Nodes": sent, "NodeNames": None})
    assert status == 200
    assert set(reply) == FILTER_KEYS
    assert reply["NodeNames"] is None
    assert reply["Nodes"]["items"] == [NODES[0]]  # the object as sent, untouched
    assert reply["FailedNodes"] == {"gpu-b": "needs 1 free GPUs, has 0"}
    assert reply["FailedAndUnresolvableNodes"] == {"cpu-1": "needs 1 GPUs, node has 0"}
    assert reply["Error"] == ""


def test_filter_never_returns_a_node_that_was_not_asked_about(runtime: Runtime) -> None:
    status, reply = post(runtime.app.test_client(), "/filter",
                         {"Pod": PENDING, "NodeNames": ["gpu-b"]})
    assert status == 200
    assert reply["NodeNames"] == []
    assert set(reply["FailedNodes"]) == {"gpu-b"}


def test_prioritize_node_names_mode(runtime: Runtime) -> None:
    status, reply = post(runtime.app.test_client(), "/prioritize",
                         {"Pod": PENDING, "Nodes": None, "NodeNames": ["cpu-1", "gpu-a", "gpu-x"]})
    assert status == 200
    assert reply == [{"Host": "cpu-1", "Score": 0}, {"Host": "gpu-a", "Score": 10},
                     {"Host": "gpu-x", "Score": 0}]


def test_prioritize_nodes_mode(runtime: Runtime) -> None:
    status, reply = post(runtime.app.test_client(), "/prioritize", {
        "Pod": PENDING, "Nodes": {"metadata": {}, "items": NODES}, "NodeNames": None})
    assert status == 200
    assert [h["Host"] for h in reply] == ["gpu-a", "gpu-b", "cpu-1"]
    assert all(set(h) == {"Host", "Score"} and isinstance(h["Score"], int) for h in reply)
    assert reply[0]["Score"] == 10


def test_bind_records_gpus_then_binds() -> None:
    binder = RecordingBinder()
    runtime = serve(NODES, [*BOUND, PENDING], binder=binder)
    status, reply = post(runtime.app.test_client(), "/bind", {
        "PodName": "infer-7d9f-abcde", "PodNamespace": "serving",
        "PodUID": "uid-infer-7d9f-abcde", "Node": "gpu-a"})
    assert (status, reply) == (200, {"Error": ""})
    [call] = binder.calls
    assert (call.namespace, call.name, call.uid, call.node, call.gpus) == (
        "serving", "infer-7d9f-abcde", "uid-infer-7d9f-abcde", "gpu-a", (0,))


def test_cpu_only_pod_passes_filter_unchanged_and_scores_neutral(runtime: Runtime) -> None:
    pod = pod_json("web", gpus=None)
    client = runtime.app.test_client()
    names = ["gpu-a", "gpu-b", "cpu-1", "gpu-new"]
    _, reply = post(client, "/filter", {"Pod": pod, "NodeNames": names})
    assert reply == {"Nodes": None, "NodeNames": names, "FailedNodes": {},
                     "FailedAndUnresolvableNodes": {}, "Error": ""}
    _, reply = post(client, "/prioritize", {"Pod": pod, "NodeNames": names})
    assert len({h["Score"] for h in reply}) == 1


def test_gpu_share_request_in_milli(runtime: Runtime) -> None:
    pod = pod_json("share", gpus=None, milli="300")
    _, reply = post(runtime.app.test_client(), "/filter",
                    {"Pod": pod, "NodeNames": ["gpu-a", "gpu-b"]})
    assert reply["NodeNames"] == ["gpu-a"]
    assert reply["FailedNodes"] == {"gpu-b": "needs 1 GPUs with >= 300 milli free, has 0"}


def test_url_prefix_moves_the_verbs() -> None:
    runtime = serve(NODES, [PENDING], config=make_config(server={"url_prefix": "/gpufrag"}))
    client = runtime.app.test_client()
    assert post(client, "/gpufrag/filter", {"Pod": PENDING, "NodeNames": ["gpu-a"]})[0] == 200
    status, reply = post(client, "/filter", {"Pod": PENDING, "NodeNames": ["gpu-a"]})
    assert status == 404 and "Error" in reply


def test_bind_verb_absent_when_disabled() -> None:
    runtime = serve(NODES, [PENDING], config=make_config(bind={"enabled": False}))
    status, reply = post(runtime.app.test_client(), "/bind", {
        "PodName": "infer-7d9f-abcde", "PodNamespace": "serving", "Node": "gpu-a"})
    assert status == 404
    assert reply["Error"].startswith("404")


def test_health_ready_and_metrics(runtime: Runtime) -> None:
    client = runtime.app.test_client()
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    post(client, "/filter", {"Pod": PENDING, "NodeNames": ["gpu-a"]})
    post(client, "/filter", b"{")
    text = client.get("/metrics").data.decode()
    assert 'gpufrag_extender_requests_total{code="200",verb="filter"} 1.0' in text
    assert 'gpufrag_extender_requests_total{code="400",verb="filter"} 1.0' in text
    assert 'gpufrag_extender_request_duration_seconds_count{verb="filter"} 2.0' in text
    assert "gpufrag_extender_nodes 3.0" in text
    assert 'gpufrag_extender_pods{state="placed"} 2.0' in text
    assert 'gpufrag_extender_pods{state="pending"} 1.0' in text
    assert "gpufrag_extender_fragmentation_ratio " in text
    assert "gpufrag_extender_synced 1.0" in text
