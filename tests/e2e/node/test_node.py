"""A real kubelet: registration, the pod lifecycle through its runtime, the node agent's
cgroup-to-pod mapping on the cgroups the kubelet made, and the device plugin's registration with
it (``gpufrag device-plugin`` on recorded NVML readings)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import kubernetes
from kubernetes.utils import parse_quantity

from devkit.controlplane import ControlPlane
from devkit.node import BUSYBOX_IMAGE, Node
from devkit.procs import wait_until
from gpufrag.conventions import ANNOTATION_GPU_INDICES, RESOURCE_GPU, RESOURCE_GPU_MILLI
from node.agent.cgroup import KubePodLister, PodDirectory, PodRef, PodResolver
from tests import skips
from tests.e2e.node.conftest import GPU_UUIDS
from tests.records import place_as_the_extender


def _core(plane: ControlPlane) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(plane.api_client())


def _pod(name: str, node: Node, *, command: str, resources: dict[str, str] | None = None,
         readiness: bool = False) -> dict[str, object]:
    container: dict[str, object] = {
        "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", command]}
    if resources:
        container["resources"] = {"limits": resources, "requests": resources}
    if readiness:
        container["readinessProbe"] = {"httpGet": {"path": "/index.html", "port": 8080},
                                       "periodSeconds": 1, "failureThreshold": 1}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node.name, "containers": [container],
                     "terminationGracePeriodSeconds": 2}}


def _ready(pod: kubernetes.client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True"
               for c in (pod.status.conditions or []))


def test_the_kubelet_registers_a_ready_node(node: Node, node_plane: ControlPlane) -> None:
    got = _core(node_plane).read_node(node.name)
    assert got.status.node_info.kubelet_version == "v1.36.3"
    runtime = got.status.node_info.container_runtime_version
    assert runtime.startswith("containerd://" if node.runtime == "containerd" else "remote://") \
        or node.runtime == "fake", runtime
    assert {"cpu", "memory", "pods"} <= set(got.status.allocatable)


def test_a_pod_bound_to_the_node_runs_and_its_probe_passes(
        node: Node, node_plane: ControlPlane, node_namespace: str) -> None:
    core = _core(node_plane)
    # busybox httpd serves /var/www (index.html is in the image) on the pod's own IP: the
    # kubelet's readiness probe reaches it through the CNI bridge.
    core.create_namespaced_pod(node_namespace, _pod(
        "web", node, command="echo started; exec httpd -f -p 8080 -h /var/www",
        readiness=True))

    def running_and_ready() -> kubernetes.client.V1Pod | None:
        pod = core.read_namespaced_pod("web", node_namespace)
        return pod if pod.status.phase == "Running" and _ready(pod) else None

    pod = wait_until(running_and_ready, timeout_s=60, what="pod web to be Running and Ready")
    if node.runtime == "containerd":
        assert pod.status.pod_ip and pod.status.pod_ip.startswith("10.244.0."), pod.status.pod_ip
        assert "started" in node.container_log(node_namespace, "web", "main")
    # Termination through the kubelet: the pod goes away within its grace period.
    started = time.monotonic()
    core.delete_namespaced_pod("web", node_namespace)

    def gone() -> bool | None:
        try:
            core.read_namespaced_pod("web", node_namespace)
        except kubernetes.client.ApiException as exc:
            return True if exc.status == 404 else None
        return None

    wait_until(gone, timeout_s=30, what="pod web to be deleted by the kubelet")
    assert time.monotonic() - started < 30


def test_the_agent_maps_the_kubelets_pod_cgroups_to_pods(
        node: Node, node_plane: ControlPlane, node_namespace: str) -> None:
    if node.runtime != "containerd":
        skips.skip(skips.NO_CONTAINERS, f"the {node.runtime} runtime: nothing to map")
    core = _core(node_plane)
    for name in ("first", "second"):
        core.create_namespaced_pod(node_namespace, _pod(name, node, command="sleep 3600"))

    def running(name: str) -> kubernetes.client.V1Pod | None:
        pod = core.read_namespaced_pod(name, node_namespace)
        return pod if pod.status.phase == "Running" else None

    resolver = PodResolver(PodDirectory(KubePodLister(node_plane.api_client(), node.name)))
    for name in ("first", "second"):
        pod = wait_until(lambda n=name: running(n), timeout_s=60, what=f"pod {name} Running")
        (status,) = pod.status.container_statuses
        pid = node.container_pid(status.container_id)
        # What the kubelet made (cgroupfs driver, v1): .../kubepods/besteffort/pod<uid>/<id>.
        assert pod.metadata.uid in Path(f"/proc/{pid}/cgroup").read_text()
        assert resolver.pod_for_pid(pid) == PodRef(node_namespace, name, pod.metadata.uid)
    assert resolver.pod_for_pid(os.getpid()) is None  # this test runs in no pod


def test_the_device_plugin_registers_and_a_gpu_pod_is_admitted(
        node: Node, node_plane: ControlPlane, node_namespace: str, device_plugin: Path) -> None:
    core = _core(node_plane)

    # The two resources are two plugin endpoints, each registered and listed on its own: wait
    # for both to reach the Node's status (under load the second can trail the first).
    def advertised() -> dict[str, str] | None:
        allocatable = core.read_node(node.name).status.allocatable or {}
        both = (allocatable.get(RESOURCE_GPU) == str(len(GPU_UUIDS))
                and parse_quantity(allocatable.get(RESOURCE_GPU_MILLI, "0")) > 0)
        return allocatable if both else None

    try:
        allocatable = wait_until(advertised, timeout_s=30,
                                 what=f"{RESOURCE_GPU} and {RESOURCE_GPU_MILLI} in Node "
                                      f"{node.name}'s allocatable")
    except Exception:
        print(device_plugin.read_text())
        raise
    # The kubelet writes the quantity in its canonical form ("2k").
    assert parse_quantity(allocatable[RESOURCE_GPU_MILLI]) == 1000 * len(GPU_UUIDS), allocatable

    # A GPU share without the extender's GPU choice: the plugin's Allocate refuses (a share
    # names no GPU of its own; a whole-GPU pod would get the kubelet's choice, pinned in
    # test_node_gpus.py), and the kubelet's device manager turns that into an admission
    # failure (the pod never starts, and holds nothing the next tests need).
    core.create_namespaced_pod(node_namespace, _pod(
        "unplaced", node, command="sleep 3600", resources={RESOURCE_GPU_MILLI: "500"}))

    def refused() -> kubernetes.client.V1Pod | None:
        pod = core.read_namespaced_pod("unplaced", node_namespace)
        return pod if pod.status.phase == "Failed" else None

    pod = wait_until(refused, timeout_s=30, what="the kubelet to refuse the unplaced GPU share pod")
    assert pod.status.reason == "UnexpectedAdmissionError", pod.status
    assert ANNOTATION_GPU_INDICES in (pod.status.message or ""), pod.status.message

    # With it (as gpufrag-scheduler's bind writes it), Allocate answers and the pod runs.
    manifest = _pod("gpu", node, command="env | grep -i -e nvidia -e gpufrag; sleep 3600",
                    resources={RESOURCE_GPU: "1"})
    place_as_the_extender(core, node_namespace, manifest, node.name, "1")

    def settled() -> kubernetes.client.V1Pod | None:
        pod = core.read_namespaced_pod("gpu", node_namespace)
        return pod if pod.status.phase in ("Running", "Failed") else None

    try:
        pod = wait_until(settled, timeout_s=60, what="the GPU pod to be admitted and Running")
    except Exception:
        print(device_plugin.read_text())
        raise
    assert pod.status.phase == "Running", (pod.status.reason, pod.status.message)
    if node.runtime == "containerd":
        # Allocate's answer reached the container: its environment names GPU 1 only.
        def visible() -> str | None:
            log = node.container_log(node_namespace, "gpu", "main")
            return log if any(uuid in log for uuid in GPU_UUIDS) else None
        log = wait_until(visible, timeout_s=20, what="the GPU pod's environment in its log")
        assert GPU_UUIDS[1] in log and GPU_UUIDS[0] not in log, log
