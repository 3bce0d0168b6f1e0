"""The extender with ``dra.enabled`` choosing the node of DRA MIG pods on the real 1.36
kube-scheduler and API server: two fake nodes of two A100 80GB each, every GPU in MIG mode
and published as partitions by the driver's own slices (``node.dra.slices.build_slices``);
pods whose claims ask a MIG profile's class (``mig_class_name``), allocated by kube-scheduler's
own allocator.

What is checked: pinned to the second node, a 3g takes its GPU 0 at slice 4 and a 7g its GPU 1
(first fit); the next 3g, free to go anywhere, is sent by the extender to that node (FGD over
MIG on the profiles seen: a 3g beside the first fills GPU 0, where on the first node's empty
GPUs it would strand a 7g's room), and first fit allocates it the 3g at slice 0 there. The
extender judges it against the allocations: without them the second node would look as empty
as the first, and the tie would go to the first by name.

The nodes have no kubelet, so the pods are bound and allocated but never run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import kubernetes
import pytest

from devkit.controlplane import ControlPlane
from devkit.extender import ExtenderProcess, dra_scheduling, metric_value
from devkit.procs import wait_until
from devkit.stack import GROUP_LABEL, delete_nodes
from gpufrag.conventions import SCHEDULER_NAME
from node.dra.slices import build_slices
from node.gpus import Gpu
from scheduler.kube.claims import DRIVER_NAME, mig_class_name, mig_selector
from tests.deviceclasses import create_device_class

GROUP = "dra-mig-sched"
NODES = [f"{GROUP}-0", f"{GROUP}-1"]
PRODUCT, GPU_MEMORY_MIB, GPUS = "NVIDIA A100-SXM4-80GB", 81_920, 2
PROFILES = ("3g.40gb", "7g.80gb")


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[ExtenderProcess]:
    folder = tmp_path_factory.mktemp("extender-dra-mig")
    # The MIG target workload follows the profiles the pods seen ask, refreshed often here.
    with dra_scheduling(control_plane, folder, {"dra": {"enabled": True},
                                                "workload": {"refresh_s": 0.5},
                                                "bind": {"assume_ttl_s": 600}}) as ext:
        yield ext


@pytest.fixture
def mig_nodes(control_plane: ControlPlane) -> Iterator[None]:
    client = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    for name in NODES:
        control_plane.create_gpu_node(name, 0, PRODUCT, GPU_MEMORY_MIB, cpu_milli=64_000,
                                      memory_mib=512 * 1024, labels={GROUP_LABEL: GROUP})
    try:
        for profile in PROFILES:
            # The extender knows a MIG request by its class's name, the install's:
            # mig-<profile>.<driver> (a crashed run's is replaced).
            create_device_class(resource, mig_class_name(profile),
                                selector=mig_selector(profile))
        for name in NODES:
            uid = core.read_node(name).metadata.uid
            gpus = [Gpu(i, f"GPU-{name}-{i}", PRODUCT, GPU_MEMORY_MIB) for i in range(GPUS)]
            for body in build_slices(name, DRIVER_NAME, gpus, dict.fromkeys(range(GPUS), True),
                                     node_uid=uid):
                resource.create_resource_slice(body)
        yield
    finally:
        delete_nodes(control_plane, NODES)  # their slices go with them (owned by the Node)
        for profile in PROFILES:
            with suppress(kubernetes.client.ApiException):
                resource.delete_device_class(mig_class_name(profile))


def _claim(name: str, profile: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": mig_class_name(profile)}}]}}}


def _pod(name: str, node: str = "") -> dict[str, Any]:
    pinned = {"kubernetes.io/hostname": node} if node else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": SCHEDULER_NAME, "terminationGracePeriodSeconds": 0,
                     "nodeSelector": {GROUP_LABEL: GROUP, **pinned},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                     "containers": [{"name": "main", "image": "gpufrag-e2e:none",
                                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                   "claims": [{"name": "gpu"}]}}]}}


def test_the_extender_sends_a_dra_mig_pod_where_its_partition_completes_a_gpu(
        control_plane: ControlPlane, extender: ExtenderProcess, mig_nodes: None,
        namespace: str) -> None:
    client = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)

    def placed(name: str) -> tuple[str, str] | None:
        """(node, device) once the pod is bound and its claim allocated."""
        node = core.read_namespaced_pod(name, namespace).spec.node_name
        claim = client.sanitize_for_serialization(
            resource.read_namespaced_resource_claim(name, namespace))
        allocation = (claim.get("status") or {}).get("allocation")
        if not node or not allocation:
            return None
        (result,) = allocation["devices"]["results"]
        assert result["pool"] == node
        return node, str(result["device"])

    def run(name: str, profile: str, node: str = "") -> tuple[str, str]:
        resource.create_namespaced_resource_claim(namespace, _claim(name, profile))
        core.create_namespaced_pod(namespace, _pod(name, node))
        found = wait_until(lambda: placed(name), timeout_s=60,
                           what=f"the pod {name} bound and allocated")
        # The extender holds no assumption once the watch showed the claim's allocation.
        wait_until(lambda: metric_value(extender.metrics(), "gpufrag_extender_pods",
                                        state="assumed") == 0 or None,
                   timeout_s=30, what=f"the extender to count {name}'s claim")
        return found

    # Pinned to the second node: a 3g at the top of GPU 0 (first fit), a 7g on GPU 1.
    assert run("seed", "3g.40gb", NODES[1]) == (NODES[1], "gpu-0-mig-3g-40gb-4")
    assert run("whole", "7g.80gb", NODES[1]) == (NODES[1], "gpu-1-mig-7g-80gb-0")
    # Scored on the profiles seen (3g and 7g): on 3g alone a 3g strands nothing anywhere.
    wait_until(lambda: any("7g.80gb" in (r.get("mig_profiles") or {})
                           for event in ("target workload set", "MIG target workload set")
                           for r in extender.log_events(event)) or None,
               timeout_s=30, what="the MIG target workload to count the 7g")
    assert run("next", "3g.40gb") == (NODES[1], "gpu-0-mig-3g-40gb-0")
    decided = [r["node"] for r in extender.log_events("filter")
               if r.get("pod") == f"{namespace}/next" and "node" in r]
    assert decided == [NODES[1]]  # the extender's deciding filter chose it
