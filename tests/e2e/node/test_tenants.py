"""Tenants cannot take each other's GPUs, on the real node (kubelet device manager, the device
plugin on recorded GPUs) with an ordinary namespace user (``edit`` in its own namespace):

1. a pod created bound (``spec.nodeName``) with a ``gpu-indices`` naming the victim's GPU,
2. a genuine record (signed for the user's pod and GPU 0) rewritten to name the victim's GPU
   before the kubelet admits the pod,
3. the victim's record copied onto the user's pod,

are each refused at the kubelet's admission with the device plugin's reason in the pod's status
and in a Warning Event, while the victim keeps running on its GPU; a pod the extender placed
(signed record) runs. Reservations (the third attack of the issue) are pinned on the real API
server in tests/e2e/test_reservations.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from devkit.controlplane import ControlPlane
from devkit.node import BUSYBOX_IMAGE, Node
from devkit.procs import wait_until
from gpufrag.conventions import ANNOTATION_GPU_INDICES, ANNOTATION_GPU_RECORD, RESOURCE_GPU
from tests.e2e.node.conftest import GPU_UUIDS
from tests.records import SIGNER, UNSERVED_SCHEDULER, place_as_the_extender
from tests.tenants import tenant_client

pytestmark = pytest.mark.e2e


def _gpu_pod(name: str, *, node: str = "", annotations: dict[str, str] | None = None
             ) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", "env | grep NVIDIA_; sleep 3600"],
                        "resources": {"limits": {RESOURCE_GPU: "1"}}}]}
    if node:
        spec["nodeName"] = node
    else:
        spec["schedulerName"] = UNSERVED_SCHEDULER
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}}, "spec": spec}


def _settled(core: Any, namespace: str, name: str) -> Any:
    def done() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase in ("Running", "Failed") else None
    return wait_until(done, timeout_s=60, what=f"pod {namespace}/{name} to run or fail")


def _refused(core: Any, namespace: str, name: str, reason: str) -> None:
    pod = _settled(core, namespace, name)
    assert pod.status.phase == "Failed", (pod.status.phase, pod.status.message)
    assert pod.status.reason == "UnexpectedAdmissionError", pod.status
    assert reason in (pod.status.message or ""), pod.status.message
    events = wait_until(lambda: [e for e in core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}").items
        if reason in (e.message or "")] or None, timeout_s=30,
        what=f"the device plugin's Warning Event on {name}")
    assert events[0].type == "Warning"


def test_a_tenant_cannot_take_another_tenant_s_gpu(
        node: Node, node_plane: ControlPlane, device_plugin: Path, tmp_path: Path) -> None:
    admin = kubernetes.client.CoreV1Api(node_plane.api_client())
    suffix = uuid.uuid4().hex[:6]
    victims, thieves = (node_plane.create_namespace(f"tenant-{who}-{suffix}") for who in "ab")
    user = kubernetes.client.CoreV1Api(tenant_client(node_plane, thieves, tmp_path))
    wait_until(lambda: (admin.read_node(node.name).status.allocatable or {}).get(RESOURCE_GPU)
               == "2" or None, timeout_s=30, what="both GPUs in the Node's allocatable")
    try:
        victim = place_as_the_extender(admin, victims, _gpu_pod("victim"), node.name, "1")
        assert _settled(admin, victims, "victim").status.phase == "Running"
        victim_record = admin.read_namespaced_pod("victim", victims).metadata.annotations

        # 1. Created bound, naming the victim's GPU.
        user.create_namespaced_pod(thieves, _gpu_pod(
            "forged", node=node.name, annotations={ANNOTATION_GPU_INDICES: "1"}))
        _refused(admin, thieves, "forged", "it carries no gpu-record signature")

        # 2. A genuine record for GPU 0, rewritten to GPU 1 after the extender signed it.
        created = user.create_namespaced_pod(thieves, _gpu_pod("rewritten"))
        genuine = SIGNER.sign(uid=created.metadata.uid, node=node.name, gpus_text="0")
        user.patch_namespaced_pod("rewritten", thieves, {"metadata": {"annotations": {
            ANNOTATION_GPU_INDICES: "1", ANNOTATION_GPU_RECORD: genuine}}})
        admin.create_namespaced_pod_binding("rewritten", thieves, kubernetes.client.V1Binding(
            metadata=kubernetes.client.V1ObjectMeta(name="rewritten"),
            target=kubernetes.client.V1ObjectReference(kind="Node", name=node.name)),
            _preload_content=False)
        _refused(admin, thieves, "rewritten", "does not match the pod's UID, node and GPU")

        # 3. The victim's own record, copied.
        user.create_namespaced_pod(thieves, _gpu_pod("copied", node=node.name, annotations={
            ANNOTATION_GPU_INDICES: victim_record[ANNOTATION_GPU_INDICES],
            ANNOTATION_GPU_RECORD: victim_record[ANNOTATION_GPU_RECORD]}))
        _refused(admin, thieves, "copied", "does not match the pod's UID, node and GPU")

        # The victim kept its GPU throughout; nobody else was given it.
        still = admin.read_namespaced_pod("victim", victims)
        assert still.status.phase == "Running" and still.metadata.uid == victim.metadata.uid
        if node.runtime == "containerd":
            log = node.container_log(victims, "victim", "main")
            assert GPU_UUIDS[1] in log and GPU_UUIDS[0] not in log, log
    finally:
        for namespace in (victims, thieves):
            admin.delete_namespace(namespace, grace_period_seconds=0)
