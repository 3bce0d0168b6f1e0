"""manifests/base's gpufrag-scheduler Deployment on the real node: upstream kube-scheduler (the
plane's own build, as an image) and the extender from the project's image, in one pod.

Both containers pass their probes through the kubelet (the extender's health listener on the pod
IP; kube-scheduler's HTTPS /livez and /readyz), both reach the API server through the
``kubernetes`` Service with their ServiceAccount's token and the RBAC the manifests ship, and a
GPU pod that names gpufrag-scheduler (on a node whose GPUs the device plugin advertises) is
filtered and scored by the extender (its request counters, scraped through the pod IP) and bound
to the node. Both kustomizations: the base lets kube-scheduler bind (no ``bindVerb``), so no GPU
indices are chosen and the kubelet's device manager refuses the pod at admission, as
tests/e2e/node/test_node.py shows for a pod without them; the production overlay (two
leader-elected replicas) has the extender bind with the GPU it chose, and the container gets
exactly that GPU from the device plugin.
"""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devkit.controlplane import ControlPlane
from devkit.node import BUSYBOX_IMAGE, Node
from devkit.procs import wait_until
from gpufrag.conventions import ANNOTATION_GPU_INDICES, RESOURCE_GPU
from tests.e2e.node.conftest import GPU_UUIDS, Render

DEPLOYMENT = "gpufrag-scheduler"
NAMESPACE = "gpufrag-system"
HEALTH_PORT = 8889  # the extender's probes and /metrics (server.health_port in the manifest)
# What the Deployment needs from the base; its other workloads (the agent and device-plugin
# DaemonSets, the defrag CronJob, the serving example) are tested on their own.
NEEDED_KINDS = {"CustomResourceDefinition", "Namespace", "ServiceAccount", "ClusterRole",
                "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap"}


def _deployment_and_needs(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in manifests if d["kind"] in NEEDED_KINDS
            or (d["kind"] == "Deployment" and d["metadata"]["name"] == DEPLOYMENT)]


def _metrics(ip: str) -> str:
    """The extender's /metrics page, scraped from the pod IP."""
    conn = http.client.HTTPConnection(ip, HEALTH_PORT, timeout=5)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 200
        return response.read().decode()
    finally:
        conn.close()


def _extender_requests(ip: str) -> dict[str, float]:
    """gpufrag_extender_requests_total by verb, scraped from the pod IP."""
    by_verb: dict[str, float] = {}
    for family in text_string_to_metric_families(_metrics(ip)):
        if family.name == "gpufrag_extender_requests":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    verb = sample.labels.get("verb", "")
                    by_verb[verb] = by_verb.get(verb, 0.0) + sample.value
    return by_verb


def _bypassed(ip: str) -> float:
    """gpufrag_extender_bypassed_pods_total, scraped from the pod IP."""
    return sum(sample.value for family in text_string_to_metric_families(_metrics(ip))
               if family.name == "gpufrag_extender_bypassed_pods"
               for sample in family.samples if sample.name.endswith("_total"))


def _a_pod_placed_without_the_extender_is_reported(core: kubernetes.client.CoreV1Api,
                                                   node: Node, namespace: str,
                                                   ips: list[str]) -> None:
    """A GPU pod of gpufrag-scheduler created bound (spec.nodeName: no scheduler asked, as
    when kube-scheduler skips the extender) is counted by the extender kube-scheduler uses,
    and gets a GpufragBypassed Warning Event."""
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unscored"},
        "spec": {"schedulerName": DEPLOYMENT, "nodeName": node.name,
                 "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": BUSYBOX_IMAGE,
                                 "imagePullPolicy": "Never", "command": ["sleep", "3600"],
                                 "resources": {"limits": {RESOURCE_GPU: "1"}}}]}})
    wait_until(lambda: sum(_bypassed(ip) for ip in ips) == 1 or None, timeout_s=30,
               what="the extender to count the pod placed without it")
    events = wait_until(lambda: [e for e in core.list_namespaced_event(
        namespace, field_selector="involvedObject.name=unscored").items
        if e.reason == "GpufragBypassed"] or None, timeout_s=30,
        what="the GpufragBypassed Event on the pod placed without the extender")
    assert events[0].type == "Warning" and "without the gpufrag extender" in events[0].message
    core.delete_namespaced_pod("unscored", namespace, grace_period_seconds=0)


def _sum(counters: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for by_verb in counters:
        for verb, value in by_verb.items():
            total[verb] = total.get(verb, 0.0) + value
    return total


# The production overlay elects a leader on its own lease (gpufrag-system/gpufrag-scheduler),
# which system:kube-scheduler does not cover; manifests/base grants it
# (gpufrag-scheduler-leader-election). Found on this node: without it no replica ever led.
@pytest.fixture(params=["base", "overlays/production"])
def scheduler_pods(request: pytest.FixtureRequest, node: Node, node_plane: ControlPlane,
                   node_manifests: Render) -> Iterator[tuple[str, list[kubernetes.client.V1Pod]]]:
    """The Deployment as that kustomization ships it, all replicas ready (the production
    overlay: two, leader-elected, the extender binding)."""
    overlay: str = request.param
    docs = _deployment_and_needs(node_manifests(overlay))
    replicas = next(d for d in docs if d["kind"] == "Deployment")["spec"]["replicas"]
    node_plane.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(docs))
    apps = kubernetes.client.AppsV1Api(node_plane.api_client())
    core = kubernetes.client.CoreV1Api(node_plane.api_client())
    selector = f"app.kubernetes.io/name={DEPLOYMENT}"

    def available() -> list[kubernetes.client.V1Pod] | None:
        status = apps.read_namespaced_deployment(DEPLOYMENT, NAMESPACE).status
        if not (status and status.ready_replicas == replicas
                and status.updated_replicas == replicas and status.replicas == replicas):
            return None
        pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        return pods if len(pods) == replicas else None

    try:
        pods: list[kubernetes.client.V1Pod] = wait_until(
            available, timeout_s=180, what=f"Deployment {DEPLOYMENT} to have {replicas} ready")
    except Exception:
        for event in core.list_namespaced_event(NAMESPACE).items:
            print(f"event {event.involved_object.kind}/{event.involved_object.name}: "
                  f"{event.reason}: {event.message}")
        for p in core.list_namespaced_pod(NAMESPACE).items:
            print(f"--- pod {p.metadata.name}: {p.status}")
            for name in ("extender", "kube-scheduler"):
                print(f"--- {name}:\n"
                      + node.container_log(NAMESPACE, p.metadata.name, name)[-4000:])
        raise
    yield overlay, pods
    node_plane.kubectl("delete", "deployment", DEPLOYMENT, "-n", NAMESPACE)
    wait_until(lambda: not core.list_namespaced_pod(NAMESPACE, label_selector=selector).items,
               timeout_s=60, what=f"the {DEPLOYMENT} pods to be gone")


def test_the_extender_deployment_runs_and_schedules_for_gpufrag_scheduler(
        node: Node, node_plane: ControlPlane, node_namespace: str,
        scheduler_pods: tuple[str, list[kubernetes.client.V1Pod]], device_plugin: Path) -> None:
    overlay, pods = scheduler_pods
    core = kubernetes.client.CoreV1Api(node_plane.api_client())
    # Every container ready: the kubelet's probes passed (the pod's Ready condition needs all).
    for scheduler_pod in pods:
        statuses = {c.name: c for c in scheduler_pod.status.container_statuses}
        assert set(statuses) == {"kube-scheduler", "extender"}
        assert all(c.ready and c.restart_count == 0 for c in statuses.values()), statuses
    if overlay != "base":  # leader-elected: one replica must hold the lease
        coordination = kubernetes.client.CoordinationV1Api(node_plane.api_client())
        wait_until(lambda: coordination.read_namespaced_lease(
            DEPLOYMENT, NAMESPACE).spec.holder_identity, timeout_s=30,
            what=f"a {DEPLOYMENT} replica to hold the lease {NAMESPACE}/{DEPLOYMENT}")
    ips = [p.status.pod_ip for p in pods]
    before = _sum([_extender_requests(ip) for ip in ips])
    # The extender manages GPU resources only (managedResources): a GPU pod, on a node that has
    # them, is the one kube-scheduler asks it about.
    wait_until(lambda: (core.read_node(node.name).status.allocatable or {}).get(RESOURCE_GPU),
               timeout_s=30, what=f"{RESOURCE_GPU} in Node {node.name}'s allocatable")

    core.create_namespaced_pod(node_namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "placed"},
        "spec": {"schedulerName": DEPLOYMENT, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": BUSYBOX_IMAGE,
                                 "imagePullPolicy": "Never",
                                 "command": ["/bin/sh", "-c", "env; sleep 3600"],
                                 "resources": {"limits": {RESOURCE_GPU: "1"}}}]}})

    def bound() -> kubernetes.client.V1Pod | None:
        pod = core.read_namespaced_pod("placed", node_namespace)
        return pod if pod.spec.node_name else None

    try:
        pod = wait_until(bound, timeout_s=60, what="the pod to be scheduled by gpufrag-scheduler")
    except Exception:
        for event in core.list_namespaced_event(node_namespace).items:
            print(f"event {event.reason}: {event.message}")
        for p in pods:
            print(f"--- {p.metadata.name}:\n"
                  + node.container_log(NAMESPACE, p.metadata.name, "kube-scheduler")[-3000:])
        raise
    assert pod.spec.node_name == node.name
    # kube-scheduler records the event after the bind returns, through its asynchronous event
    # broadcaster: the pod can show its node first (the extender's bind wrote it).
    scheduled = wait_until(lambda: [e for e in core.list_namespaced_event(
        node_namespace, field_selector="involvedObject.name=placed").items
        if e.reason == "Scheduled"] or None, timeout_s=30, what="the pod's Scheduled event")
    assert {e.reporting_component or e.source.component for e in scheduled} == {DEPLOYMENT}

    after = _sum([_extender_requests(ip) for ip in ips])
    if after.get("filter", 0) <= before.get("filter", 0):
        for p in pods:
            for name in ("extender", "kube-scheduler"):
                print(f"--- {p.metadata.name} {name}:\n"
                      + node.container_log(NAMESPACE, p.metadata.name, name)[-6000:])
    assert after.get("filter", 0) > before.get("filter", 0), (before, after)
    assert after.get("prioritize", 0) >= before.get("prioritize", 0), (before, after)
    # ... and kube-scheduler did not skip it (an ignorable extender that fails or times out
    # is skipped, the pod then placed by the default plugins: what this test once hid).
    assert sum(_bypassed(ip) for ip in ips) == 0
    _a_pod_placed_without_the_extender_is_reported(core, node, node_namespace, ips)
    if overlay == "base":
        return  # kube-scheduler bound it: no GPU chosen (see the module docstring)
    # Production: the extender bound it, with the GPU it chose; the device plugin hands exactly
    # that GPU to the container.
    assert after.get("bind", 0) > before.get("bind", 0), (before, after)
    (index,) = pod.metadata.annotations[ANNOTATION_GPU_INDICES].split(",")

    def running() -> kubernetes.client.V1Pod | None:
        got = core.read_namespaced_pod("placed", node_namespace)
        assert got.status.phase != "Failed", got.status
        return got if got.status.phase == "Running" else None

    wait_until(running, timeout_s=60, what="the extender-bound GPU pod to run")

    def visible() -> str | None:
        log = node.container_log(node_namespace, "placed", "main")
        return log if any(uuid in log for uuid in GPU_UUIDS) else None

    log = wait_until(visible, timeout_s=20, what="the GPU pod's environment in its log")
    assert [uuid for uuid in GPU_UUIDS if uuid in log] == [GPU_UUIDS[int(index)]], log
