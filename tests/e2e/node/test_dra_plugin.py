"""``gpufrag dra-plugin`` with the real 1.36 kubelet, API server, kube-scheduler and resourceclaim
controller: the driver registers through the kubelet's plugin watcher, publishes its slice, and a
pod asking a share through a ResourceClaimTemplate is allocated by kube-scheduler's first fit,
prepared by the driver (its CDI spec written with the share's environment) and runs; deleting
the pod unprepares the claim. Three shares in turn check that first fit follows the slice's
device order (docs/dra.md's first next step). A pod asking an extended resource that a
DeviceClass maps (KEP-5004) gets a whole GPU through the driver the same way.

The environment inside the container is not checked: the node's containerd (Debian's 1.6)
predates CDI in its CRI plugin (1.7), so it runs the container without the CDI edits
(docs/dra.md says so); the CDI spec the runtime would apply is checked instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from devkit.controlplane import NOT_READY_TAINT, ControlPlane
from devkit.node import BUSYBOX_IMAGE, Node
from devkit.procs import ComponentProcess, wait_until
from node.dra.config import DRIVER_NAME
from tests.e2e.node.conftest import GPU_UUIDS, logged_events, write_gpu_recording
from tests.tenants import tenant_client

CDI_FILE = "gpufrag.io-gpu_{uid}.json"
WHOLE_CLASS = "whole.gpu.gpufrag.io"


@dataclass
class Driver:
    log: Path
    cdi_dir: Path


@pytest.fixture
def dra_driver(node: Node, node_plane: ControlPlane, tmp_path: Path) -> Iterator[Driver]:
    recording = write_gpu_recording(tmp_path / "nvml.json")
    short = Path(tempfile.mkdtemp(prefix="dra-"))  # unix socket paths must stay short
    cdi_dir = short / "cdi"
    cdi_dir.mkdir()
    log = tmp_path / "dra-plugin.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "gpufrag"), "dra-plugin",
             f"--node-name={node.name}", f"--nvml-recording={recording}",
             f"--registry-dir={node.root_dir / 'plugins_registry'}",
             f"--plugins-dir={short / 'plugins'}", f"--cdi-dir={cdi_dir}",
             f"--kubeconfig={node_plane.kubeconfig_path}", "--metrics-port=0",
             "--publish-interval-s=2"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "GPUFRAG_LOG_FORMAT": "json"})
    try:
        def registered() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the driver exited ({process.returncode}):\n"
                                     f"{log.read_text(errors='replace')[-4000:]}")
            return logged_events(log, "registered") >= 1

        wait_until(registered, timeout_s=60, interval_s=0.1,
                   what="the kubelet to register the DRA driver")
        yield Driver(log, cdi_dir)
    finally:
        ComponentProcess("dra-plugin", process, log, 0).stop()
        resource = kubernetes.client.ResourceV1Api(node_plane.api_client())
        for found in resource.list_resource_slice(
                field_selector=f"spec.driver={DRIVER_NAME}").items:
            resource.delete_resource_slice(found.metadata.name)
        shutil.rmtree(short)


def _share_pod(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{
                "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "env | grep -e NVIDIA_ -e GPUFRAG_; sleep 3600"],
                "resources": {"claims": [{"name": "gpu"}]}}],
            # The dev plane runs no node-lifecycle controller to lift the not-ready taint.
            "tolerations": [{"key": NOT_READY_TAINT, "operator": "Exists",
                             "effect": "NoSchedule"}]}}


def _create_device_class(resource: kubernetes.client.ResourceV1Api, name: str,
                         **spec: str) -> None:
    """A DeviceClass ``name`` selecting the driver's devices (``spec``: more of its fields)."""
    with suppress(kubernetes.client.ApiException):
        resource.delete_device_class(name)  # one a crashed run left
    resource.create_device_class({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
        "spec": {**spec,
                 "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]}})


def _delete_pods(core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    """Delete the test's pods while the driver still runs: the kubelet unprepares their claims
    before it lets them go, and the driver fixture stops before the namespace is deleted."""
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, timeout_s=90,
               what=f"the pods of {namespace} to be gone")


def _template(name: str, milli: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER_NAME,
                "capacity": {"requests": {"milli": str(milli)}}}}]}}}}


def test_shares_claimed_through_templates_go_first_fit_and_are_prepared_and_unprepared(
        node: Node, node_plane: ControlPlane, node_namespace: str, dra_driver: Driver) -> None:
    """Three shares in turn: 250 takes gpu-0, 900 does not fit beside it and takes gpu-1, the
    next 250 takes gpu-0 again: first fit in the slice's index order (docs/dra.md)."""
    client = node_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)

    def published() -> Any:
        found = resource.list_resource_slice(
            field_selector=f"spec.driver={DRIVER_NAME},spec.nodeName={node.name}").items
        return found or None

    (found,) = wait_until(published, timeout_s=30, what="the node's ResourceSlice")
    assert [d.name for d in found.spec.devices] == ["gpu-0", "gpu-1"]
    assert found.spec.pool.name == node.name

    _create_device_class(resource, DRIVER_NAME)
    try:
        for name, milli in (("quarter", 250), ("most", 900)):
            resource.create_namespaced_resource_claim_template(node_namespace,
                                                               _template(name, milli))
        spec_files = []
        for pod_name, template, milli, device in (("share-a", "quarter", 250, 0),
                                                  ("share-b", "most", 900, 1),
                                                  ("share-c", "quarter", 250, 0)):
            core.create_namespaced_pod(node_namespace, _share_pod(pod_name, template))

            def running(pod_name: str = pod_name) -> Any:
                pod = core.read_namespaced_pod(pod_name, node_namespace)
                return pod if pod.status.phase == "Running" else None

            pod = wait_until(running, timeout_s=90, what=f"{pod_name} to run")
            (status,) = pod.status.resource_claim_statuses
            claim = client.sanitize_for_serialization(resource.read_namespaced_resource_claim(
                status.resource_claim_name, node_namespace))
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert (result["driver"], result["pool"], result["device"]) == (
                DRIVER_NAME, node.name, f"gpu-{device}"), pod_name
            assert result["consumedCapacity"]["milli"] == str(milli)
            spec_file = dra_driver.cdi_dir / CDI_FILE.format(uid=claim["metadata"]["uid"])
            (edited,) = json.loads(spec_file.read_text())["devices"]
            assert sorted(edited["containerEdits"]["env"]) == [
                f"GPUFRAG_GPU_MEMORY_LIMIT_MIB={81_920 * milli // 1000}",
                f"GPUFRAG_GPU_MILLI={milli}", f"NVIDIA_VISIBLE_DEVICES={GPU_UUIDS[device]}"]
            spec_files.append(spec_file)
        assert logged_events(dra_driver.log, "claim_prepared") >= 3

        for pod_name in ("share-a", "share-b", "share-c"):
            core.delete_namespaced_pod(pod_name, node_namespace, grace_period_seconds=0)
        wait_until(lambda: not any(f.exists() for f in spec_files), timeout_s=60,
                   what="the kubelet to unprepare the claims (their CDI specs removed)")
    finally:
        _delete_pods(core, node_namespace)
        resource.delete_device_class(DRIVER_NAME)


def test_a_pod_asking_an_extended_resource_gets_a_whole_gpu_through_the_driver(
        node: Node, node_plane: ControlPlane, node_namespace: str, dra_driver: Driver) -> None:
    """KEP-5004: a DeviceClass that names an extended resource serves pods that ask for it,
    with no claim in their spec; kube-scheduler makes the claim, first fit takes a whole GPU
    (a request with no capacity takes all of its milli) and the driver prepares it. The name
    is the project's own, not ``nvidia.com/gpu``: the mapping only serves nodes that do not
    advertise the resource themselves, and the device-plugin tests on this node do."""
    client = node_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    wanted = "gpufrag.io/dra-gpu"
    _create_device_class(resource, WHOLE_CLASS, extendedResourceName=wanted)
    try:
        pod_body = _share_pod("whole", "unused")
        del pod_body["spec"]["resourceClaims"]
        pod_body["spec"]["containers"][0]["resources"] = {"limits": {wanted: "1"},
                                                          "requests": {wanted: "1"}}
        core.create_namespaced_pod(node_namespace, pod_body)

        def running() -> Any:
            pod = core.read_namespaced_pod("whole", node_namespace)
            return pod if pod.status.phase == "Running" else None

        pod = client.sanitize_for_serialization(
            wait_until(running, timeout_s=90, what="the extended-resource pod to run"))
        claim_name = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        claim = client.sanitize_for_serialization(
            resource.read_namespaced_resource_claim(claim_name, node_namespace))
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["device"]) == (DRIVER_NAME, "gpu-0")
        assert result["consumedCapacity"]["milli"] == "1k"  # all of it: a whole GPU
        spec_file = dra_driver.cdi_dir / CDI_FILE.format(uid=claim["metadata"]["uid"])
        (edited,) = json.loads(spec_file.read_text())["devices"]
        assert edited["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={GPU_UUIDS[0]}"]

        core.delete_namespaced_pod("whole", node_namespace, grace_period_seconds=0)
        wait_until(lambda: not spec_file.exists(), timeout_s=60,
                   what="the kubelet to unprepare the claim (its CDI spec removed)")
    finally:
        _delete_pods(core, node_namespace)
        resource.delete_device_class(WHOLE_CLASS)


def test_a_tenant_cannot_move_its_claims_allocation(
        node: Node, node_plane: ControlPlane, node_namespace: str, dra_driver: Driver,
        tmp_path: Path) -> None:
    """The allocation record is the claim's status, which only kube-scheduler writes: a
    namespace user with the built-in ``edit`` role may make claims but not rewrite where they
    were allocated (issue 45's reason to prefer DRA's record to an annotation)."""
    client = node_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    _create_device_class(resource, DRIVER_NAME)
    try:
        resource.create_namespaced_resource_claim_template(node_namespace,
                                                           _template("quarter", 250))
        core.create_namespaced_pod(node_namespace, _share_pod("share", "quarter"))

        def running() -> Any:
            pod = core.read_namespaced_pod("share", node_namespace)
            return pod if pod.status.phase == "Running" else None

        (status,) = wait_until(running, timeout_s=90,
                               what="the share pod to run").status.resource_claim_statuses
        name = status.resource_claim_name
        tenant = kubernetes.client.ResourceV1Api(tenant_client(node_plane, node_namespace,
                                                               tmp_path))
        claim = client.sanitize_for_serialization(
            tenant.read_namespaced_resource_claim(name, node_namespace))
        moved = claim["status"]["allocation"]
        moved["devices"]["results"][0]["device"] = "gpu-1"
        with pytest.raises(kubernetes.client.ApiException) as refused:
            tenant.patch_namespaced_resource_claim_status(
                name, node_namespace, {"status": {"allocation": moved}})
        assert refused.value.status == 403, refused.value.body
        (result,) = resource.read_namespaced_resource_claim(
            name, node_namespace).status.allocation.devices.results
        assert result.device == "gpu-0"
    finally:
        _delete_pods(core, node_namespace)
        resource.delete_device_class(DRIVER_NAME)
