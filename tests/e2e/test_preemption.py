"""gpufrag-scheduler preemption end to end: kube-scheduler's DefaultPreemption proposes victims
by its own node-wide arithmetic, the extender's ``preempt`` verb keeps only the nodes (and the
victims) that free a GPU the preemptor fits on.

The layout is built so that kube-scheduler alone would pick the wrong node. Two 2-GPU nodes,
each full of low-priority share pods (bound directly, with their GPU indices, so the layout is
exact); every pod asks for as much CPU (millicores) as GPU share (milli-GPU) and each node has
2000m of CPU, so kube-scheduler's CPU arithmetic is the node-wide sum of the shares the
extender counts per GPU:

    split: GPU0 a1=600 (p40) a2=400 (p10)   GPU1 a3=400 (p50) a4=600 (p20)
    good:  GPU0 b1=700 (p30) b2=300 (p60)   GPU1 b3=500 (p70) b4=500 (p80)

The preemptor asks for 700 (priority 1000). kube-scheduler reprieves the most important pods
first: on ``split`` it evicts a4 and a2 (1000m of CPU, but 400 free on GPU0 and 600 on GPU1:
no GPU holds 700), on ``good`` b1 alone (700 free on GPU0). Its own tie-break (the lowest
highest-priority victim: 20 < 30) would choose ``split``; the extender drops ``split``, so the
pod is nominated to ``good``, b1 is deleted, and the pod binds there on GPU0.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from devkit.controlplane import ControlPlane
from devkit.extender import ExtenderProcess, gpufrag_scheduler_config
from devkit.procs import wait_until
from devkit.stack import GROUP_LABEL, bound_node, delete_nodes, gpu_pod
from gpufrag import conventions as cv

GROUP = "preempt"
# node -> [(pod, milli (= CPU millicores), GPU index, priority)]
LAYOUT: dict[str, list[tuple[str, int, int, int]]] = {
    f"{GROUP}-split": [("a1", 600, 0, 40), ("a2", 400, 0, 10), ("a3", 400, 1, 50),
                       ("a4", 600, 1, 20)],
    f"{GROUP}-good": [("b1", 700, 0, 30), ("b2", 300, 0, 60), ("b3", 500, 1, 70),
                      ("b4", 500, 1, 80)],
}
PREEMPTOR_PRIORITY = 1000


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[ExtenderProcess]:
    log = tmp_path_factory.mktemp("extender-preempt") / "extender.log"
    ext = ExtenderProcess(control_plane, log)
    ext.start()
    control_plane.start_scheduler("gpufrag-scheduler", gpufrag_scheduler_config(ext.url))
    yield ext
    control_plane.stop_scheduler("gpufrag-scheduler")
    ext.stop()


def _placed_pods(ext: ExtenderProcess) -> int:
    found = re.search(r'^gpufrag_extender_pods\{state="placed"\} ([0-9.e+]+)$', ext.metrics(),
                      re.MULTILINE)
    return int(float(found.group(1))) if found else 0


def _share_pod(name: str, milli: int, priority_class: str) -> dict[str, Any]:
    body = gpu_pod(name, milli=milli, cpu=f"{milli}m", group=GROUP)
    body["spec"]["priorityClassName"] = priority_class
    return body


def test_preemption_evicts_only_the_share_the_pod_needs(
        control_plane: ControlPlane, extender: ExtenderProcess, namespace: str) -> None:
    api = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(api)
    scheduling = kubernetes.client.SchedulingV1Api(api)
    tag = uuid.uuid4().hex[:6]
    priorities = {p for pods in LAYOUT.values() for *_, p in pods} | {PREEMPTOR_PRIORITY}
    classes = {p: f"e2e-preempt-{tag}-{p}" for p in priorities}
    nodes = list(LAYOUT)
    try:
        for value, name in classes.items():
            scheduling.create_priority_class(kubernetes.client.V1PriorityClass(
                metadata=kubernetes.client.V1ObjectMeta(name=name), value=value,
                preemption_policy="PreemptLowerPriority"))
        for node in nodes:
            control_plane.create_gpu_node(node, 2, "A10", 23_028, cpu_milli=2000,
                                          memory_mib=64 * 1024, labels={GROUP_LABEL: GROUP})
        before = _placed_pods(extender)
        for node, pods in LAYOUT.items():
            for name, milli, gpu, priority in pods:
                body = _share_pod(name, milli, classes[priority])
                body["spec"]["nodeName"] = node  # bound as laid out, not scheduled
                body["metadata"]["annotations"][cv.ANNOTATION_GPU_INDICES] = str(gpu)
                core.create_namespaced_pod(namespace, body)
        low = {name for pods in LAYOUT.values() for name, *_ in pods}
        wait_until(lambda: _placed_pods(extender) >= before + len(low), timeout_s=30,
                   what="the extender sees the low-priority pods")

        core.create_namespaced_pod(
            namespace, _share_pod("high", 700, classes[PREEMPTOR_PRIORITY]))
        nominated: set[str] = set()

        def bound() -> str | None:
            pod = core.read_namespaced_pod("high", namespace)
            if pod.status is not None and pod.status.nominated_node_name:
                nominated.add(pod.status.nominated_node_name)
            return (pod.spec.node_name if pod.spec else None) or None

        node = wait_until(bound, timeout_s=90, what="the preemptor bound", interval_s=0.05)
        assert node == f"{GROUP}-good"
        high = core.read_namespaced_pod("high", namespace)
        assert (high.metadata.annotations or {})[cv.ANNOTATION_GPU_INDICES] == "0"
        assert nominated <= {f"{GROUP}-good"}, nominated

        # Exactly b1 is gone (deleted by kube-scheduler's preemption), nothing else.
        def remaining() -> set[str] | None:
            names = {p.metadata.name for p in core.list_namespaced_pod(namespace).items
                     if p.metadata.deletion_timestamp is None}
            return names if "b1" not in names else None

        left = wait_until(remaining, timeout_s=30, what="b1 deleted")
        assert left == (low - {"b1"}) | {"high"}

        # The extender was asked about both nodes and kept only "good", with b1 alone.
        records = [r for r in extender.log_events("preempt")
                   if r.get("pod") == f"{namespace}/high"]
        assert records, "the extender's preempt verb was not called"
        first = records[0]
        assert (first["nodes"], first["kept"], first["victims"]) == (2, 1, 1), first

        # kube-scheduler says why b1 went: preempted for "high" on the good node.
        preempted = wait_until(lambda: [
            e for e in core.list_namespaced_event(namespace).items
            if e.reason == "Preempted"] or None, timeout_s=30, what="Preempted event")
        assert {e.involved_object.name for e in preempted} == {"b1"}
        assert all(f"{GROUP}-good" in (e.message or "") for e in preempted), [
            e.message for e in preempted]
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        delete_nodes(control_plane, nodes)
        for name in classes.values():
            try:
                scheduling.delete_priority_class(name)
            except kubernetes.client.ApiException as e:
                if e.status != 404:
                    raise


def test_preemption_for_a_limit_the_extender_does_not_count(
        control_plane: ControlPlane, extender: ExtenderProcess, namespace: str) -> None:
    """The node's GPUs have room, but its pod count is at its limit: kube-scheduler needs a
    victim for a reason the extender does not track. The extender must not answer that node
    with an empty victim list (kube-scheduler refuses the whole preemption then: "expected at
    least one victim pod on node"); it hands back kube-scheduler's own victim."""
    api = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(api)
    scheduling = kubernetes.client.SchedulingV1Api(api)
    tag = uuid.uuid4().hex[:6]
    classes = {p: f"e2e-preempt-{tag}-{p}" for p in (10, 20, PREEMPTOR_PRIORITY)}
    node = f"{GROUP}-podlimit"
    try:
        for value, name in classes.items():
            scheduling.create_priority_class(kubernetes.client.V1PriorityClass(
                metadata=kubernetes.client.V1ObjectMeta(name=name), value=value))
        control_plane.create_gpu_node(node, 2, "A10", 23_028, cpu_milli=8000,
                                      memory_mib=64 * 1024, pods=2,
                                      labels={GROUP_LABEL: GROUP})
        before = _placed_pods(extender)
        for name, gpu, priority in (("c1", 0, 10), ("c2", 1, 20)):
            body = _share_pod(name, 300, classes[priority])
            body["spec"]["nodeName"] = node
            body["metadata"]["annotations"][cv.ANNOTATION_GPU_INDICES] = str(gpu)
            core.create_namespaced_pod(namespace, body)
        wait_until(lambda: _placed_pods(extender) >= before + 2, timeout_s=30,
                   what="the extender sees the low-priority pods")

        core.create_namespaced_pod(
            namespace, _share_pod("high", 500, classes[PREEMPTOR_PRIORITY]))
        try:
            bound = bound_node(core, namespace, "high", timeout_s=30)
        except TimeoutError:
            events = [e.message for e in core.list_namespaced_event(namespace).items
                      if e.involved_object.name == "high"]
            raise AssertionError(f"high was not bound; its events: {events}") from None
        assert bound == node
        names = {p.metadata.name for p in core.list_namespaced_pod(namespace).items
                 if p.metadata.deletion_timestamp is None}
        assert names == {"c2", "high"}  # c1, the least important, and only c1
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        delete_nodes(control_plane, [node])
        for name in classes.values():
            try:
                scheduling.delete_priority_class(name)
            except kubernetes.client.ApiException as e:
                if e.status != 404:
                    raise
