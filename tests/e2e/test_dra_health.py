"""Device health as device taints (KEP-5055) on the real 1.36 API server and kube-scheduler: a
fake node's slice as the DRA driver publishes it with GPU 0 unhealthy (``build_slices(...,
unhealthy=...)``: its device tainted ``NoSchedule``, as the driver's health thread does when
NVML stops answering for it). kube-scheduler's first fit would take GPU 0; with the taint it
takes GPU 1, and a second whole GPU is unschedulable. Republished healthy, GPU 0 is allocated
again. The node has no kubelet: the pods are bound and allocated, never run."""

from __future__ import annotations

from typing import Any

import kubernetes

from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from devkit.stack import GROUP_LABEL, delete_nodes
from node.dra.slices import TAINT_UNHEALTHY, build_slices
from node.gpus import Gpu
from scheduler.kube.claims import DRIVER_NAME
from tests.deviceclasses import create_device_class
from tests.e2e.test_dra_mig import claim_of, pod_using, unschedulable

GROUP = "dra-health"
NODE = f"{GROUP}-0"
CLASS = f"e2e-health.{DRIVER_NAME}"


def test_a_tainted_gpu_is_not_allocated_until_it_is_healthy_again(
        control_plane: ControlPlane, namespace: str) -> None:
    client = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    control_plane.create_gpu_node(NODE, 0, "A100", 81_920, cpu_milli=64_000,
                                  memory_mib=512 * 1024, labels={GROUP_LABEL: GROUP})
    create_device_class(resource, CLASS)  # the install's selector: GPUs outside MIG mode
    try:
        uid = core.read_node(NODE).metadata.uid
        gpus = [Gpu(i, f"GPU-{NODE}-{i}", "A100", 81_920) for i in range(2)]
        (body,) = build_slices(NODE, DRIVER_NAME, gpus, {}, node_uid=uid, unhealthy={0})
        stored = client.sanitize_for_serialization(resource.create_resource_slice(body))
        (taint,) = stored["spec"]["devices"][0]["taints"]  # DRADeviceTaints is on
        assert (taint["key"], taint["effect"]) == (TAINT_UNHEALTHY, "NoSchedule")

        def ask(name: str) -> None:
            resource.create_namespaced_resource_claim(namespace, claim_of(name, CLASS))
            core.create_namespaced_pod(namespace, pod_using(name, CLASS, GROUP))

        def device_of(name: str) -> str | None:
            claim: Any = client.sanitize_for_serialization(
                resource.read_namespaced_resource_claim(name, namespace))
            allocation = (claim.get("status") or {}).get("allocation")
            return str(allocation["devices"]["results"][0]["device"]) if allocation else None

        ask("first")
        assert wait_until(lambda: device_of("first"), timeout_s=60,
                          what="the first claim allocated") == "gpu-1"
        ask("second")
        wait_until(lambda: unschedulable(core, namespace, "second"), timeout_s=60,
                   what="the second claim found unschedulable")
        assert device_of("second") is None
        core.delete_namespaced_pod("second", namespace, grace_period_seconds=0)
        # GPU 0 recovers: the driver republishes without the taint (a newer generation).
        (healthy,) = build_slices(NODE, DRIVER_NAME, gpus, {}, node_uid=uid, generation=2)
        healthy["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
        resource.replace_resource_slice(body["metadata"]["name"], healthy)
        ask("third")
        assert wait_until(lambda: device_of("third"), timeout_s=60,
                          what="the third claim allocated") == "gpu-0"
    finally:
        delete_nodes(control_plane, [NODE])
        resource.delete_device_class(CLASS)
