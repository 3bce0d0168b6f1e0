"""manifests/base's gpufrag-scheduler Deployment on the real node: upstream kube-scheduler (the
plane's own build, as an image) and the extender from the project's image, in one pod.

Both containers pass their probes through the kubelet (the extender's health listener on the pod
IP; kube-scheduler's HTTPS /livez and /readyz), both reach the API server through the
``kubernetes`` Service with their ServiceAccount's token and the RBAC the manifests ship, and a
GPU pod that names gpufrag-scheduler (on a node whose GPUs the device plugin advertises) is
filtered and scored by the extender (its request counters, scraped through the pod IP) and bound
to the node by kube-scheduler. The base lets kube-scheduler bind (no ``bindVerb``; the production
overlay sets it), so no GPU indices are chosen and the kubelet's device manager refuses the pod
at admission, as tests/e2e/node/test_node.py shows for a pod without them.
"""

from __future__ import annotations

import http.client
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devkit.controlplane import ControlPlane
from devkit.node import BUSYBOX_IMAGE, Node
from devkit.procs import wait_until
from gpufrag.conventions import RESOURCE_GPU

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


def _extender_requests(ip: str) -> dict[str, float]:
    """gpufrag_extender_requests_total by verb, scraped from the pod IP."""
    conn = http.client.HTTPConnection(ip, HEALTH_PORT, timeout=5)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 200
        text = response.read().decode()
    finally:
        conn.close()
    by_verb: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "gpufrag_extender_requests":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    verb = sample.labels.get("verb", "")
                    by_verb[verb] = by_verb.get(verb, 0.0) + sample.value
    return by_verb


@pytest.fixture
def scheduler_pod(node: Node, node_plane: ControlPlane,
                  base_manifests: list[dict[str, Any]]) -> kubernetes.client.V1Pod:
    node_plane.kubectl("apply", "-f", "-",
                       input_text=yaml.safe_dump_all(_deployment_and_needs(base_manifests)))
    apps = kubernetes.client.AppsV1Api(node_plane.api_client())
    core = kubernetes.client.CoreV1Api(node_plane.api_client())

    def available() -> kubernetes.client.V1Pod | None:
        status = apps.read_namespaced_deployment(DEPLOYMENT, NAMESPACE).status
        if not (status and status.ready_replicas == 1):
            return None
        (pod,) = core.list_namespaced_pod(
            NAMESPACE, label_selector=f"app.kubernetes.io/name={DEPLOYMENT}").items
        return pod

    try:
        pod: kubernetes.client.V1Pod = wait_until(
            available, timeout_s=120, what=f"Deployment {DEPLOYMENT} to have a ready pod")
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
    yield pod
    node_plane.kubectl("delete", "deployment", DEPLOYMENT, "-n", NAMESPACE, "--wait=false")


def test_the_extender_deployment_runs_and_schedules_for_gpufrag_scheduler(
        node: Node, node_plane: ControlPlane, node_namespace: str,
        scheduler_pod: kubernetes.client.V1Pod, device_plugin: Path) -> None:
    core = kubernetes.client.CoreV1Api(node_plane.api_client())
    # Both containers ready: the kubelet's probes passed (the pod's Ready condition needs all).
    statuses = {c.name: c for c in scheduler_pod.status.container_statuses}
    assert set(statuses) == {"kube-scheduler", "extender"}
    assert all(c.ready and c.restart_count == 0 for c in statuses.values()), statuses
    ip = scheduler_pod.status.pod_ip
    before = _extender_requests(ip)
    # The extender manages GPU resources only (managedResources): a GPU pod, on a node that has
    # them, is the one kube-scheduler asks it about.
    wait_until(lambda: (core.read_node(node.name).status.allocatable or {}).get(RESOURCE_GPU),
               timeout_s=30, what=f"{RESOURCE_GPU} in Node {node.name}'s allocatable")

    core.create_namespaced_pod(node_namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "placed"},
        "spec": {"schedulerName": DEPLOYMENT, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": BUSYBOX_IMAGE,
                                 "imagePullPolicy": "Never",
                                 "command": ["/bin/sh", "-c", "sleep 3600"],
                                 "resources": {"limits": {RESOURCE_GPU: "1"}}}]}})

    def bound() -> kubernetes.client.V1Pod | None:
        pod = core.read_namespaced_pod("placed", node_namespace)
        return pod if pod.spec.node_name else None

    pod = wait_until(bound, timeout_s=60, what="the pod to be scheduled by gpufrag-scheduler")
    assert pod.spec.node_name == node.name
    scheduled = [e for e in core.list_namespaced_event(
        node_namespace, field_selector="involvedObject.name=placed").items
        if e.reason == "Scheduled"]
    assert scheduled, "no Scheduled event"
    assert {e.reporting_component or e.source.component for e in scheduled} == {DEPLOYMENT}

    after = _extender_requests(ip)
    assert after.get("filter", 0) > before.get("filter", 0), (before, after)
    assert after.get("prioritize", 0) >= before.get("prioritize", 0), (before, after)
