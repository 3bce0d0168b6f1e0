"""The extender's watch and bind against a real API server (no kube-scheduler involved here;
tests/e2e/test_scheduling.py drives it through the real scheduler).

The extender runs in this process (``cluster_runtime`` + its threads, the same objects
``gpufrag extender --kubeconfig`` serves) so the tests can look at its cache directly:

- list + watch: nodes created before start are listed, nodes and pods created, changed and
  deleted afterwards arrive through the watch;
- bind: chooses GPUs, writes the GPU annotation and a real Binding, counts the pod as assumed
  at once, and the watch then confirms it;
- the placement-hints ConfigMap is followed;
- ``gpufrag export-snapshot`` writes what the API server holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import orjson
import pytest

from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from devkit.stack import delete_nodes
from gpufrag import conventions as cv
from scheduler.extender.config import config_from_mapping
from scheduler.extender.runtime import Runtime, cluster_runtime
from scheduler.kube.export import main as export_main
from scheduler.kube.snapshot import read_snapshot

pytestmark = pytest.mark.e2e

WAIT_S = 30.0
NOWHERE = "gpufrag-e2e-nobody"  # a scheduler name no scheduler answers to: pods stay pending


@pytest.fixture
def prefix() -> str:
    return f"xw-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def core(control_plane: ControlPlane) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(control_plane.api_client())


@pytest.fixture
def nodes(control_plane: ControlPlane, prefix: str) -> Iterator[list[str]]:
    names = [f"{prefix}-gpu-{i}" for i in range(2)]
    for name in names:
        control_plane.create_gpu_node(name, gpus=4, product="NVIDIA-A100-SXM4-80GB",
                                      gpu_memory_mib=81920)
    yield names
    delete_nodes(control_plane, names)


@pytest.fixture
def runtime(control_plane: ControlPlane, nodes: list[str], namespace: str) -> Iterator[Runtime]:
    config = config_from_mapping({
        "watch": {"timeout_s": 5, "backoff_initial_s": 0.2, "backoff_max_s": 2},
        # The extender binds only its own scheduler's pods, which no kube-scheduler serves here.
        "names": {"hints_namespace": namespace, "scheduler_name": NOWHERE},
        "maintenance_interval_s": 0.2,
    })
    rt = cluster_runtime(control_plane.new_api_client, config)
    rt.start()
    try:
        wait_until(lambda: rt.extender.ready or None, timeout_s=WAIT_S,
                   what="the extender to list nodes and pods")
        yield rt
    finally:
        rt.stop()


def pod_body(name: str, *, gpus: int = 1, node: str = "",
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": NOWHERE, "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "gpufrag-e2e:none", "resources": {
            "requests": {"cpu": "1", "memory": "1Gi", cv.RESOURCE_GPU: str(gpus)},
            "limits": {cv.RESOURCE_GPU: str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {},
                         "labels": {cv.LABEL_MODEL: "llama", cv.LABEL_MODEL_VERSION: "3"}},
            "spec": spec}


def free_gpus(rt: Runtime, node: str) -> list[int] | None:
    with rt.cache.lock:
        state = rt.cache.state
        row = state.index.get(node)
        if row is None or not state.active[row]:
            return None
        return state.gpu_free[row, : int(state.gpu_count[row])].tolist()


def test_list_then_watch_nodes(control_plane: ControlPlane, core: kubernetes.client.CoreV1Api,
                               runtime: Runtime, nodes: list[str], prefix: str) -> None:
    assert free_gpus(runtime, nodes[0]) == [1000] * 4  # listed at start
    late = f"{prefix}-late"
    control_plane.create_gpu_node(late, gpus=2, product="NVIDIA-H100", gpu_memory_mib=81920)
    try:
        wait_until(lambda: free_gpus(runtime, late) == [1000, 1000] or None,
                   timeout_s=WAIT_S, what=f"node {late} in the extender's state")
        with runtime.cache.lock:
            assert runtime.cache.state.node_spec(runtime.cache.state.index[late]).gpu_product \
                == "NVIDIA-H100"
    finally:
        core.delete_node(late)
    wait_until(lambda: free_gpus(runtime, late) is None or None, timeout_s=WAIT_S,
               what=f"node {late} gone from the extender's state")


def test_pods_added_and_deleted_through_the_watch(core: kubernetes.client.CoreV1Api,
                                                  runtime: Runtime, nodes: list[str],
                                                  namespace: str) -> None:
    node = nodes[0]
    core.create_namespaced_pod(namespace, pod_body(
        "bound", gpus=2, node=node, annotations={cv.ANNOTATION_GPU_INDICES: "1,3"}))
    wait_until(lambda: free_gpus(runtime, node) == [1000, 0, 1000, 0] or None,
               timeout_s=WAIT_S, what="the bound pod on GPUs 1 and 3")
    with runtime.cache.lock:
        assert runtime.cache.state.replicas[("llama", "3")][runtime.cache.state.index[node]] == 1

    core.create_namespaced_pod(namespace, pod_body("waiting"))
    key = f"{namespace}/waiting"
    wait_until(lambda: key in runtime.cache.pods or None, timeout_s=WAIT_S,
               what="the pending pod in the cache")
    assert runtime.cache.pods[key].node == ""

    core.delete_namespaced_pod("bound", namespace, grace_period_seconds=0)
    wait_until(lambda: free_gpus(runtime, node) == [1000] * 4 or None, timeout_s=WAIT_S,
               what="the deleted pod's GPUs freed")
    with runtime.cache.lock:
        # The replica left: the warm window starts now.
        assert runtime.cache.state.index[node] in runtime.cache.state.model_last_seen[
            ("llama", "3")]


def test_bind_annotates_binds_and_is_confirmed_by_the_watch(
        core: kubernetes.client.CoreV1Api, runtime: Runtime, nodes: list[str],
        namespace: str) -> None:
    node = nodes[1]
    created = core.create_namespaced_pod(namespace, pod_body("to-bind", gpus=2))
    uid = created.metadata.uid
    key = f"{namespace}/to-bind"
    wait_until(lambda: key in runtime.cache.pods or None, timeout_s=WAIT_S,
               what="the pod in the cache")
    client = runtime.app.test_client()
    reply = client.post("/bind", data=orjson.dumps({
        "PodName": "to-bind", "PodNamespace": namespace, "PodUID": uid, "Node": node}))
    assert reply.status_code == 200 and orjson.loads(reply.data) == {"Error": ""}
    # Counted at once, before the watch shows the binding.
    assert free_gpus(runtime, node) == [0, 0, 1000, 1000]

    pod = core.read_namespaced_pod("to-bind", namespace)
    assert pod.spec.node_name == node
    assert pod.metadata.annotations[cv.ANNOTATION_GPU_INDICES] == "0,1"

    wait_until(lambda: (runtime.cache.pods[key].node == node
                        and key not in runtime.cache.assumed) or None,
               timeout_s=WAIT_S, what="the watch to confirm the binding")
    assert free_gpus(runtime, node) == [0, 0, 1000, 1000]

    # Binding a bound pod again is refused (the extender's cache shows it bound).
    reply = client.post("/bind", data=orjson.dumps({
        "PodName": "to-bind", "PodNamespace": namespace, "PodUID": uid, "Node": node}))
    assert "already bound" in orjson.loads(reply.data)["Error"]


def test_binds_in_a_row_reuse_connections_cleanly(core: kubernetes.client.CoreV1Api,
                                                  runtime: Runtime, nodes: list[str],
                                                  namespace: str) -> None:
    # kube-scheduler binds one pod after another; each bind is an API call on a pooled
    # connection, which must be read to the end before it is reused.
    names = [f"row-{i}" for i in range(6)]
    uids = {n: core.create_namespaced_pod(namespace, pod_body(n)).metadata.uid for n in names}
    client = runtime.app.test_client()
    for name in names:
        reply = client.post("/bind", data=orjson.dumps({
            "PodName": name, "PodNamespace": namespace, "PodUID": uids[name],
            "Node": nodes[0] if name < "row-3" else nodes[1]}))
        assert orjson.loads(reply.data) == {"Error": ""}, name
    bound = {p.metadata.name: (p.spec.node_name, p.metadata.annotations[
        cv.ANNOTATION_GPU_INDICES]) for p in core.list_namespaced_pod(namespace).items}
    assert bound == {"row-0": (nodes[0], "0"), "row-1": (nodes[0], "1"),
                     "row-2": (nodes[0], "2"), "row-3": (nodes[1], "0"),
                     "row-4": (nodes[1], "1"), "row-5": (nodes[1], "2")}


def test_bind_with_a_stale_uid_is_refused_by_the_api_server(
        core: kubernetes.client.CoreV1Api, runtime: Runtime, nodes: list[str],
        namespace: str) -> None:
    old = core.create_namespaced_pod(namespace, pod_body("again")).metadata.uid
    core.delete_namespaced_pod("again", namespace, grace_period_seconds=0)
    wait_until(lambda: not core.list_namespaced_pod(
        namespace, field_selector="metadata.name=again").items or None,
        timeout_s=WAIT_S, what="the first pod gone")
    core.create_namespaced_pod(namespace, pod_body("again"))
    reply = runtime.app.test_client().post("/bind", data=orjson.dumps({
        "PodName": "again", "PodNamespace": namespace, "PodUID": old, "Node": nodes[0]}))
    error = orjson.loads(reply.data)["Error"]
    assert error == (f"pod {namespace}/again is not the pod to bind: its UID is no longer {old} "
                     "(re-created under the same name)")
    pod = core.read_namespaced_pod("again", namespace)
    assert not pod.spec.node_name  # refused as one write: neither bound nor annotated
    assert cv.ANNOTATION_GPU_INDICES not in (pod.metadata.annotations or {})
    assert f"{namespace}/again" not in runtime.cache.assumed  # the assumption is undone


def test_bind_of_a_pod_the_watch_has_not_delivered(core: kubernetes.client.CoreV1Api,
                                                   runtime: Runtime, nodes: list[str],
                                                   namespace: str) -> None:
    # Bound straight after it is created: when the watch has not delivered the pod yet, the
    # extender reads it from the API server.
    created = core.create_namespaced_pod(namespace, pod_body("fast", gpus=1))
    reply = runtime.app.test_client().post("/bind", data=orjson.dumps({
        "PodName": "fast", "PodNamespace": namespace, "PodUID": created.metadata.uid,
        "Node": nodes[0]}))
    assert orjson.loads(reply.data) == {"Error": ""}
    pod = core.read_namespaced_pod("fast", namespace)
    assert pod.spec.node_name == nodes[0]
    assert pod.metadata.annotations[cv.ANNOTATION_GPU_INDICES] in {"0", "1", "2", "3"}


def test_hints_configmap_is_followed(core: kubernetes.client.CoreV1Api, runtime: Runtime,
                                     nodes: list[str], namespace: str) -> None:
    body = kubernetes.client.V1ConfigMap(
        metadata=kubernetes.client.V1ObjectMeta(name=cv.HINTS_CONFIGMAP),
        data={"owner-1": orjson.dumps([{"node": nodes[1], "expires": 4e9}]).decode()})
    core.create_namespaced_config_map(namespace, body)
    wait_until(lambda: runtime.cache.hints.nodes_for("owner-1", 0) == {nodes[1]} or None,
               timeout_s=WAIT_S, what="the hint in the extender")
    core.delete_namespaced_config_map(cv.HINTS_CONFIGMAP, namespace)
    wait_until(lambda: len(runtime.cache.hints) == 0 or None, timeout_s=WAIT_S,
               what="the hints gone")


def test_export_snapshot(control_plane: ControlPlane, core: kubernetes.client.CoreV1Api,
                         nodes: list[str], namespace: str, tmp_path: Path) -> None:
    core.create_namespaced_pod(namespace, pod_body("exported", node=nodes[0]))
    out = tmp_path / "cluster.yaml"
    assert export_main([str(out), "--kubeconfig", str(control_plane.kubeconfig_path)]) == 0
    snapshot = read_snapshot(out)
    assert set(nodes) <= {n["metadata"]["name"] for n in snapshot.nodes}
    exported = [p for p in snapshot.pods if p["metadata"]["name"] == "exported"]
    assert exported and exported[0]["spec"]["nodeName"] == nodes[0]
    assert "managedFields" not in exported[0]["metadata"]
