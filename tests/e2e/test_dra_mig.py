"""MIG partitions (KEP-4815) on the real 1.36 API server and kube-scheduler: a fake node with
two A100 80GB GPUs in MIG mode, whose ResourceSlices are the driver's own
(``node.dra.slices.build_slices``: a counter set of memory slices per GPU, one device per legal
placement), and pods asking MIG profiles through the install's DeviceClass shape
(``mig_class_name``, ``mig_selector``), allocated by kube-scheduler's own allocator.

What is checked: the API server keeps the slices as built (``sharedCounters`` and
``consumesCounters`` survive, so DRAPartitionableDevices is on); first fit follows the device
order within the slice (a 3g at slice 4 of GPU 0, the top first, then a 4g at slice 0 beside
it, the next 3g on GPU 1); no two allocations ever share a memory slice; a 7g stays
unschedulable while every GPU is partly used; ``gpufrag inspect`` shows each bound pod under
its MIG GPU with the profile and start its claim names, and the node agent's ledger holds it
to that GPU; and once the pods of GPU 0 are
deleted, their claims' slices are free again and a 7g takes GPU 0 whole. The generic class
never hands out a partition.

The node has no kubelet, so the pods are bound and allocated but never run (the driver's
prepare is covered by tests/node/dra/test_service.py, against a recorded NVML: no GPU here).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import kubernetes
import pytest
import structlog

from defrag.controller.inspect import main as inspect_main
from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from devkit.stack import GROUP_LABEL, delete_nodes
from node.agent.cgroup import KubePodLister
from node.dra.slices import build_slices
from node.gpus import Gpu
from scheduler.kube.claims import (
    DRIVER_NAME,
    MigPartition,
    gpu_selector,
    mig_class_name,
    mig_partition,
    mig_selector,
)
from tests.deviceclasses import create_device_class

GROUP = "dra-mig"
NODE = f"{GROUP}-0"
PRODUCT, GPU_MEMORY_MIB, GPUS = "NVIDIA A100-SXM4-80GB", 81_920, 2
PROFILES = ("3g.40gb", "4g.40gb", "7g.80gb")
PREFIX = "e2e-"  # the install's class names, prefixed: the test's own, deleted after it
GENERIC = f"{PREFIX}{DRIVER_NAME}"


@pytest.fixture
def mig_node(control_plane: ControlPlane) -> Iterator[list[dict[str, Any]]]:
    """The node, its driver's slices as the API server stores them, and the classes."""
    client = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    classes = {f"{PREFIX}{mig_class_name(p)}": mig_selector(p) for p in PROFILES}
    classes[GENERIC] = gpu_selector()
    control_plane.create_gpu_node(NODE, 0, PRODUCT, GPU_MEMORY_MIB, cpu_milli=64_000,
                                  memory_mib=512 * 1024, labels={GROUP_LABEL: GROUP})
    try:
        for name, expression in classes.items():
            create_device_class(resource, name, selector=expression)
        uid = core.read_node(NODE).metadata.uid
        gpus = [Gpu(i, f"GPU-{NODE}-{i}", PRODUCT, GPU_MEMORY_MIB) for i in range(GPUS)]
        built = build_slices(NODE, DRIVER_NAME, gpus, {i: True for i in range(GPUS)},
                             node_uid=uid)
        stored = []
        for body in built:
            created = resource.create_resource_slice(body)
            stored.append(client.sanitize_for_serialization(created))
        assert [s["spec"].get("sharedCounters") for s in stored] == [
            s["spec"].get("sharedCounters") for s in built]
        assert [[d.get("consumesCounters") for d in s["spec"].get("devices") or ()]
                for s in stored] == [[d.get("consumesCounters") for d in s["spec"].get(
                    "devices") or ()] for s in built]  # DRAPartitionableDevices is on
        yield stored
    finally:
        delete_nodes(control_plane, [NODE])  # its slices go with it (owned by the Node)
        for name in classes:
            with suppress(kubernetes.client.ApiException):
                resource.delete_device_class(name)


def pod_using(name: str, device_class: str, group: str = GROUP) -> dict[str, Any]:
    """A pod on the test's node using the claim ``name`` (made by :func:`claim_of`)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "nodeSelector": {GROUP_LABEL: group},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                     "containers": [{"name": "main", "image": "gpufrag-e2e:none",
                                     "resources": {"requests": {"cpu": "1"},
                                                   "claims": [{"name": "gpu"}]}}]}}


def unschedulable(core: Any, namespace: str, name: str) -> bool | None:
    """True once kube-scheduler found no devices for the pod's claims (not any other reason:
    the message is the DynamicResources plugin's)."""
    for condition in core.read_namespaced_pod(name, namespace).status.conditions or ():
        if (condition.type == "PodScheduled" and condition.reason == "Unschedulable"
                and "cannot allocate all claims" in (condition.message or "")):
            return True
    return None


def claim_of(name: str, device_class: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_class}}]}}}


def test_mig_partitions_are_allocated_by_first_fit_without_sharing_a_slice(
        control_plane: ControlPlane, mig_node: list[dict[str, Any]], namespace: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    client = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    consumes = {d["name"]: {(c["counterSet"], counter) for c in d["consumesCounters"]
                            for counter in c["counters"]}
                for s in mig_node for d in s["spec"].get("devices") or ()}

    def ask(name: str, profile: str) -> None:
        device_class = GENERIC if profile == "generic" else f"{PREFIX}{mig_class_name(profile)}"
        resource.create_namespaced_resource_claim(namespace, claim_of(name, device_class))
        core.create_namespaced_pod(namespace, pod_using(name, device_class))

    def device_of(name: str) -> str | None:
        claim = client.sanitize_for_serialization(
            resource.read_namespaced_resource_claim(name, namespace))
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            return None
        (result,) = allocation["devices"]["results"]
        assert result["pool"] == NODE and result["driver"] == DRIVER_NAME
        return str(result["device"])

    def allocated(name: str) -> str:
        return wait_until(lambda: device_of(name), timeout_s=60,
                          what=f"the claim {name} allocated")

    def no_slice_shared() -> None:
        held = [consumes[device] for claim in resource.list_namespaced_resource_claim(
            namespace).items if (device := device_of(claim.metadata.name)) is not None]
        every = [c for taken in held for c in taken]
        assert len(every) == len(set(every)), held

    # First fit in the slice's order: a 3g on an empty GPU takes the top (start_order puts
    # its placement at 4 before 0; in start order it would take 0 and leave no room for a
    # 4g), then the 4g at 0 beside it, then GPU 1 for the next 3g.
    ask("three-a", "3g.40gb")
    assert allocated("three-a") == "gpu-0-mig-3g-40gb-4"
    ask("four", "4g.40gb")
    assert allocated("four") == "gpu-0-mig-4g-40gb-0"
    ask("three-b", "3g.40gb")
    assert allocated("three-b") == "gpu-1-mig-3g-40gb-4"
    no_slice_shared()

    # gpufrag inspect (the defrag cycle's own snapshot) shows the node with its two MIG GPUs
    # and each bound pod on its GPU with the profile and start its claim was allocated.
    def bound(name: str) -> bool | None:
        return True if core.read_namespaced_pod(name, namespace).spec.node_name == NODE else None

    for name in ("three-a", "four", "three-b"):
        wait_until(lambda n=name: bound(n), timeout_s=60, what=f"the pod {name} bound")
    try:
        assert inspect_main(["--kubeconfig", str(control_plane.kubeconfig_path),
                             "--namespace", namespace, "-o", "json"]) == 0
    finally:
        structlog.reset_defaults()  # inspect configures logging for its process
    (shown,) = json.loads(capsys.readouterr().out)["nodes"]
    assert shown["node"] == NODE and shown["gpus"] == []  # every GPU in MIG mode
    assert [(g["index"], g["product"], g["dynamic"]) for g in shown["mig_gpus"]] == [
        (0, PRODUCT, True), (1, PRODUCT, True)]
    assert {(g["index"], i["profile"], i["start"]): i["pods"] for g in shown["mig_gpus"]
            for i in g["instances"]} == {
        (0, "3g.40gb", 4): [f"{namespace}/three-a"], (0, "4g.40gb", 0): [f"{namespace}/four"],
        (1, "3g.40gb", 4): [f"{namespace}/three-b"]}
    # The node agent's ledger (its pod list) holds each pod to its partition's GPU.
    ledger = {record.ref.name: (record.share.gpus, record.share.partitions)
              for record in KubePodLister(control_plane.new_api_client(), NODE).list_pods()
              if record.share is not None and record.ref.namespace == namespace}
    assert ledger == {"three-a": ((0,), (MigPartition(0, "3g.40gb", 4),)),
                      "four": ((0,), (MigPartition(0, "4g.40gb", 0),)),
                      "three-b": ((1,), (MigPartition(1, "3g.40gb", 4),))}
    # A 7g needs all eight slices of a GPU: none is whole, so it stays unschedulable.
    ask("seven-early", "7g.80gb")
    wait_until(lambda: unschedulable(core, namespace, "seven-early"), timeout_s=60,
               what="the early 7g found unschedulable")
    assert device_of("seven-early") is None
    # The generic class takes no partition: no GPU of the node is outside MIG mode.
    ask("whole", "generic")
    wait_until(lambda: unschedulable(core, namespace, "whole"), timeout_s=60,
               what="the generic claim found unschedulable")
    for name in ("seven-early", "whole"):
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    # GPU 0's pods and claims go: its slices are free again, and a 7g takes it whole.
    for name in ("four", "three-a"):
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        resource.delete_namespaced_resource_claim(name, namespace)

    def gone(name: str) -> bool | None:
        try:
            resource.read_namespaced_resource_claim(name, namespace)
        except kubernetes.client.ApiException as exc:
            return True if exc.status == 404 else None
        return None

    for name in ("four", "three-a"):
        wait_until(lambda n=name: gone(n), timeout_s=60, what=f"the claim {name} deleted")
    ask("seven", "7g.80gb")
    seven = allocated("seven")
    assert seven == "gpu-0-mig-7g-80gb-0"
    assert mig_partition(seven) is not None
    no_slice_shared()
