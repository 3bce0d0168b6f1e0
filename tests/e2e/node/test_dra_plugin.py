"""``gpufrag dra-plugin`` with the real 1.36 kubelet, API server, kube-scheduler and resourceclaim
controller, on containerd 2 (whose CRI plugin applies CDI devices): the driver registers through
the kubelet's plugin watcher, publishes its slice, and pods asking GPUs are allocated by
kube-scheduler's first fit, prepared by the driver (a CDI spec per claim) and run with the
environment the device plugin sets, read from inside the container (its ``env``, in its log):
the visible GPU UUIDs, the memory limit and, the driver running with ``--mps``, the MPS limits
and the pipe directory mounted. Deleting the pods unprepares the claims.

- Compute shares and a memory share through ResourceClaimTemplates: shares of 250, 900 and 250
  milli in turn land on gpu-0, gpu-1, gpu-0 (first fit follows the slice's device order,
  docs/dra.md's first next step), and a memory share beside them on gpu-0.
- Whole GPUs: one through a template, one through extended-resource mapping (KEP-5004: a pod
  asking an extended resource that a DeviceClass maps, with no claim in its spec). Shares
  cannot come this way: the mapping counts devices (docs/dra.md).
- A tenant cannot rewrite its claim's allocation.
- A pod asking ``gpufrag.io/gpu-milli`` in a namespace labelled for DRA delivery is converted
  by the admission webhook and runs with its share's environment.
- Device health in the pod's status (KEP-4680): a GPU that stops answering NVML is streamed
  Unhealthy to the kubelet, which shows it in ``allocatedResourcesStatus``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from defrag.admission.templates import TemplateClient
from defrag.admission.toclaims import Shape, template_for
from devkit.controlplane import NOT_READY_TAINT, ControlPlane
from devkit.node import BUSYBOX_IMAGE, Node
from devkit.procs import ComponentProcess, wait_until
from gpufrag.conventions import DEFAULT_NAMES, DELIVERY_DRA
from node.dra.config import DRIVER_NAME
from scheduler.kube.claims import mig_class_name, mig_selector
from tests.deviceclasses import create_device_class
from tests.e2e.node.conftest import (
    GPU_ENV_COMMAND,
    GPU_UUIDS,
    container_environment,
    logged_events,
    require_containers,
    write_gpu_recording,
)
from tests.node.dra.fakes import A100_80GB_PROFILES
from tests.tenants import tenant_client
from tests.webhooks import registered_webhook

CDI_FILE = "gpufrag.io-gpu_{uid}.json"
WHOLE_CLASS = "whole.gpu.gpufrag.io"
GPU_MIB = 81_920  # the recorded A100s' memory
# A file in the MPS pipe directory: a share's container sees it where the CDI mount puts it.
PIPE_PROBE = "gpufrag-pipe-probe"
POD_COMMAND = (f'test -f "$CUDA_MPS_PIPE_DIRECTORY/{PIPE_PROBE}" && echo MPS_PIPE_MOUNTED=yes; '
               f"{GPU_ENV_COMMAND}")


@dataclass
class Driver:
    log: Path
    cdi_dir: Path
    mps_pipe_dir: Path
    own_dir: Path  # <plugins-dir>/<driver>: its socket and its MIG records


@contextmanager
def running_driver(node: Node, node_plane: ControlPlane, recording: Path,
                   log: Path) -> Iterator[Driver]:
    """``gpufrag dra-plugin`` on the node, its GPUs from ``recording``, registered."""
    short = Path(tempfile.mkdtemp(prefix="dra-"))  # unix socket paths must stay short
    mps_pipe_dir = short / "mps"
    mps_pipe_dir.mkdir()
    (mps_pipe_dir / PIPE_PROBE).write_text("")
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "gpufrag"), "dra-plugin",
             f"--node-name={node.name}", f"--nvml-recording={recording}",
             f"--registry-dir={node.root_dir / 'plugins_registry'}",
             f"--plugins-dir={short / 'plugins'}", f"--cdi-dir={node.cdi_dir}",
             "--mps", f"--mps-pipe-dir={mps_pipe_dir}",
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
        yield Driver(log, node.cdi_dir, mps_pipe_dir, short / "plugins" / DRIVER_NAME)
    finally:
        ComponentProcess("dra-plugin", process, log, 0).stop()
        resource = kubernetes.client.ResourceV1Api(node_plane.api_client())
        for found in resource.list_resource_slice(
                field_selector=f"spec.driver={DRIVER_NAME}").items:
            resource.delete_resource_slice(found.metadata.name)
        shutil.rmtree(short)


@pytest.fixture
def dra_driver(node: Node, node_plane: ControlPlane, tmp_path: Path) -> Iterator[Driver]:
    recording = write_gpu_recording(tmp_path / "nvml.json")
    with running_driver(node, node_plane, recording, tmp_path / "dra-plugin.log") as driver:
        yield driver


def _gpu_pod(name: str, template: str | None = None,
             extended: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod whose container prints its GPU environment: asking a claim made from ``template``,
    or the ``extended`` resources (a DeviceClass maps them to claims) with no claim at all."""
    container: dict[str, Any] = {
        "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", POD_COMMAND]}
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1, "containers": [container],
        # The dev plane runs no node-lifecycle controller to lift the not-ready taint.
        "tolerations": [{"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoSchedule"}]}
    if template is not None:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    else:
        container["resources"] = {"limits": extended, "requests": extended}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _delete_pods(core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    """Delete the test's pods while the driver still runs: the kubelet unprepares their claims
    before it lets them go, and the driver fixture stops before the namespace is deleted."""
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, timeout_s=90,
               what=f"the pods of {namespace} to be gone")


def _template(name: str, capacity: dict[str, str] | None = None) -> dict[str, Any]:
    """A ResourceClaimTemplate of one request: a share of ``capacity`` (``milli``, ``memory``),
    or with none, a whole GPU."""
    exactly: dict[str, Any] = {"deviceClassName": DRIVER_NAME}
    if capacity is not None:
        exactly["capacity"] = {"requests": capacity}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}}


def _running(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> Any:
    def running() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase == "Running" else None

    return wait_until(running, timeout_s=90, what=f"{name} to run")


def _share_env(device: int, milli: int, limit_mib: int, threads: int,
               pipe_dir: Path) -> dict[str, str]:
    """What a share's container is given with ``--mps`` (the device plugin's own grant)."""
    return {"NVIDIA_VISIBLE_DEVICES": GPU_UUIDS[device], "GPUFRAG_GPU_MILLI": str(milli),
            "GPUFRAG_GPU_MEMORY_LIMIT_MIB": str(limit_mib),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(threads),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={limit_mib}M",
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir), "MPS_PIPE_MOUNTED": "yes"}


def test_shares_claimed_through_templates_go_first_fit_and_get_their_environment(
        node: Node, node_plane: ControlPlane, node_namespace: str, dra_driver: Driver) -> None:
    """Three compute shares in turn: 250 takes gpu-0, 900 does not fit beside it and takes
    gpu-1, the next 250 takes gpu-0 again: first fit in the slice's index order
    (docs/dra.md). A memory share (300 milli and 10Gi) then fits on gpu-0 beside them. Each
    container's environment, read from inside it, is its share's: the GPU's UUID, the memory
    limit (the compute share's part of the GPU's memory, the memory share's own ask) and the
    MPS limits, with the pipe directory mounted."""
    require_containers(node)
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

    create_device_class(resource, DRIVER_NAME)
    pipe = dra_driver.mps_pipe_dir
    try:
        for name, capacity in (("quarter", {"milli": "250"}), ("most", {"milli": "900"}),
                               ("memory", {"milli": "300", "memory": "10Gi"})):
            resource.create_namespaced_resource_claim_template(node_namespace,
                                                               _template(name, capacity))
        spec_files = []
        for pod_name, template, device, consumed, env in (
                ("share-a", "quarter", 0, {"milli": "250"},
                 _share_env(0, 250, GPU_MIB * 250 // 1000, 25, pipe)),
                ("share-b", "most", 1, {"milli": "900"},
                 _share_env(1, 900, GPU_MIB * 900 // 1000, 90, pipe)),
                ("share-c", "quarter", 0, {"milli": "250"},
                 _share_env(0, 250, GPU_MIB * 250 // 1000, 25, pipe)),
                ("memory-d", "memory", 0, {"milli": "300", "memory": "10Gi"},
                 _share_env(0, 300, 10_240, 30, pipe))):
            core.create_namespaced_pod(node_namespace, _gpu_pod(pod_name, template))
            pod = _running(core, node_namespace, pod_name)
            (status,) = pod.status.resource_claim_statuses
            claim = client.sanitize_for_serialization(resource.read_namespaced_resource_claim(
                status.resource_claim_name, node_namespace))
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert (result["driver"], result["pool"], result["device"]) == (
                DRIVER_NAME, node.name, f"gpu-{device}"), pod_name
            assert {k: result["consumedCapacity"][k] for k in consumed} == consumed, pod_name
            spec_file = dra_driver.cdi_dir / CDI_FILE.format(uid=claim["metadata"]["uid"])
            assert spec_file.is_file(), pod_name
            spec_files.append(spec_file)
            assert container_environment(node, node_namespace, pod_name) == env, pod_name
        assert logged_events(dra_driver.log, "claim_prepared") >= 4

        # A deleted pod's device is free again: GPU 0 holds 800 milli of the others, so
        # another 900 fits only on GPU 1, which share-b's deletion gives back.
        core.delete_namespaced_pod("share-b", node_namespace, grace_period_seconds=0)
        wait_until(lambda: not spec_files[1].exists(), timeout_s=60,
                   what="the kubelet to unprepare share-b's claim")
        core.create_namespaced_pod(node_namespace, _gpu_pod("again-b", "most"))
        pod = _running(core, node_namespace, "again-b")
        (status,) = pod.status.resource_claim_statuses
        claim = client.sanitize_for_serialization(resource.read_namespaced_resource_claim(
            status.resource_claim_name, node_namespace))
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "gpu-1"
        spec_files.append(dra_driver.cdi_dir / CDI_FILE.format(uid=claim["metadata"]["uid"]))
        assert container_environment(node, node_namespace, "again-b") == _share_env(
            1, 900, GPU_MIB * 900 // 1000, 90, pipe)

        for pod_name in ("share-a", "again-b", "share-c", "memory-d"):
            core.delete_namespaced_pod(pod_name, node_namespace, grace_period_seconds=0)
        wait_until(lambda: not any(f.exists() for f in spec_files), timeout_s=60,
                   what="the kubelet to unprepare the claims (their CDI specs removed)")
    finally:
        _delete_pods(core, node_namespace)
        resource.delete_device_class(DRIVER_NAME)


def test_whole_gpus_through_a_template_and_an_extended_resource_get_their_environment(
        node: Node, node_plane: ControlPlane, node_namespace: str, dra_driver: Driver) -> None:
    """A template whose request names no capacity takes a whole GPU (all of its milli): gpu-0.
    KEP-5004: a DeviceClass that names an extended resource serves pods that ask for it, with
    no claim in their spec; kube-scheduler makes the claim and first fit takes the next whole
    GPU, gpu-1. Both containers see their GPU's UUID and no share limits. The extended resource
    is the project's own, not ``nvidia.com/gpu``: the mapping only serves nodes that do not
    advertise the resource themselves, and the device-plugin tests on this node do."""
    require_containers(node)
    client = node_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    wanted = "gpufrag.io/dra-gpu"
    create_device_class(resource, DRIVER_NAME)
    create_device_class(resource, WHOLE_CLASS, extendedResourceName=wanted)
    try:
        resource.create_namespaced_resource_claim_template(node_namespace, _template("whole"))
        core.create_namespaced_pod(node_namespace, _gpu_pod("by-template", template="whole"))
        (status,) = _running(core, node_namespace, "by-template").status.resource_claim_statuses
        by_template = status.resource_claim_name
        core.create_namespaced_pod(node_namespace, _gpu_pod("by-extended-resource",
                                                            extended={wanted: "1"}))
        pod = client.sanitize_for_serialization(
            _running(core, node_namespace, "by-extended-resource"))
        by_extended = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]

        spec_files = []
        for pod_name, claim_name, device in (("by-template", by_template, 0),
                                             ("by-extended-resource", by_extended, 1)):
            claim = client.sanitize_for_serialization(
                resource.read_namespaced_resource_claim(claim_name, node_namespace))
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert (result["driver"], result["device"]) == (DRIVER_NAME, f"gpu-{device}")
            assert result["consumedCapacity"]["milli"] == "1k"  # all of it: a whole GPU
            spec_files.append(dra_driver.cdi_dir / CDI_FILE.format(uid=claim["metadata"]["uid"]))
            assert container_environment(node, node_namespace, pod_name) == {
                "NVIDIA_VISIBLE_DEVICES": GPU_UUIDS[device]}, pod_name

        core.delete_namespaced_pod("by-template", node_namespace, grace_period_seconds=0)
        core.delete_namespaced_pod("by-extended-resource", node_namespace,
                                   grace_period_seconds=0)
        wait_until(lambda: not any(f.exists() for f in spec_files), timeout_s=60,
                   what="the kubelet to unprepare the claims (their CDI specs removed)")
    finally:
        _delete_pods(core, node_namespace)
        resource.delete_device_class(WHOLE_CLASS)
        resource.delete_device_class(DRIVER_NAME)


def test_a_tenant_cannot_move_its_claims_allocation(
        node: Node, node_plane: ControlPlane, node_namespace: str, dra_driver: Driver,
        tmp_path: Path) -> None:
    """The allocation record is the claim's status, which only kube-scheduler writes: a
    namespace user with the built-in ``edit`` role may make claims but not rewrite where they
    were allocated (issue 45's reason to prefer DRA's record to an annotation)."""
    client = node_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    create_device_class(resource, DRIVER_NAME)
    try:
        resource.create_namespaced_resource_claim_template(
            node_namespace, _template("quarter", {"milli": "250"}))
        core.create_namespaced_pod(node_namespace, _gpu_pod("share", "quarter"))
        (status,) = _running(core, node_namespace, "share").status.resource_claim_statuses
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



def write_mig_recording(path: Path) -> Path:
    """The node's recorded GPUs with GPU 1 in MIG mode, holding no instance yet, and the GPU
    instance profiles NVML offers on an A100 80GB (so the driver can make its partitions)."""
    recording = json.loads(write_gpu_recording(path).read_text())
    recording["devices"][1]["mig"] = []
    recording["devices"][1]["gpu_instance_profiles"] = [
        {"profile": p.profile, "id": p.id, "slice_count": p.slice_count,
         "memory_size_mb": p.memory_size_mb, "size": p.size, "starts": list(p.starts)}
        for p in A100_80GB_PROFILES]
    path.write_text(json.dumps(recording))
    return path


def test_a_mig_partition_is_made_prepared_and_destroyed_for_its_pod(
        node: Node, node_plane: ControlPlane, node_namespace: str, tmp_path: Path) -> None:
    """GPU 1 in MIG mode (recorded NVML, which enforces NVML's placement rules: no GPU here):
    the driver publishes it as partitions; a pod asking a 3g.40gb through the profile's class
    is allocated the top of GPU 1 by kube-scheduler, the driver makes the instance there and
    the container sees the MIG device's UUID; deleting the pod destroys the instance and
    removes the claim's CDI spec and record."""
    require_containers(node)
    recording = write_mig_recording(tmp_path / "nvml-mig.json")
    client = node_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    mig_class = mig_class_name("3g.40gb")
    create_device_class(resource, mig_class, selector=mig_selector("3g.40gb"))
    with running_driver(node, node_plane, recording, tmp_path / "dra-plugin.log") as driver:
        try:
            template = _template("three")
            template["spec"]["spec"]["devices"]["requests"][0]["exactly"][
                "deviceClassName"] = mig_class
            resource.create_namespaced_resource_claim_template(node_namespace, template)
            core.create_namespaced_pod(node_namespace, _gpu_pod("mig", "three"))
            (status,) = _running(core, node_namespace, "mig").status.resource_claim_statuses
            claim = client.sanitize_for_serialization(resource.read_namespaced_resource_claim(
                status.resource_claim_name, node_namespace))
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert (result["pool"], result["device"]) == (node.name, "gpu-1-mig-3g-40gb-4")
            assert container_environment(node, node_namespace, "mig") == {
                "NVIDIA_VISIBLE_DEVICES": "MIG-1"}  # the recorded NVML's first new instance
            uid = claim["metadata"]["uid"]
            spec_file = driver.cdi_dir / CDI_FILE.format(uid=uid)
            record = driver.own_dir / "partitions" / f"gpufrag.io-partitions_{uid}.json"
            assert spec_file.is_file() and record.is_file()
            assert logged_events(driver.log, "mig_instance_ready") >= 1
            core.delete_namespaced_pod("mig", node_namespace, grace_period_seconds=0)
            wait_until(lambda: not spec_file.exists() and not record.exists(), timeout_s=60,
                       what="the kubelet to unprepare the claim (its spec and record gone)")
            assert logged_events(driver.log, "mig_instance_destroyed") == 1
        finally:
            _delete_pods(core, node_namespace)
            resource.delete_device_class(mig_class)
def _resource_health(core: kubernetes.client.CoreV1Api, namespace: str,
                     name: str) -> list[tuple[str, str, str]]:
    """(status name, health, message) of every device in the pod's first container's
    ``allocatedResourcesStatus``, as the kubelet writes it (KEP-4680)."""
    pod = core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, namespace))
    (status,) = pod["status"].get("containerStatuses") or [{}]
    return [(entry["name"], each["health"], each.get("message", ""))
            for entry in status.get("allocatedResourcesStatus") or ()
            for each in entry.get("resources") or ()]


def test_a_gpu_turning_unhealthy_shows_in_its_pods_status(
        node: Node, node_plane: ControlPlane, node_namespace: str, tmp_path: Path) -> None:
    """The kubelet's DRA health stream (KEP-4680, gate ResourceHealthStatus): a pod holding
    gpu-0 through a claim shows it Healthy in ``allocatedResourcesStatus``; when the recorded
    GPU stops answering NVML (the recording edited, as on the device plugin's path), the
    driver's next health pass streams it Unhealthy and the kubelet writes that, with the
    failed read as the message, into the pod's status; the recording restored, Healthy
    again."""
    require_containers(node)
    recording = write_gpu_recording(tmp_path / "nvml.json")
    client = node_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    create_device_class(resource, DRIVER_NAME)
    with running_driver(node, node_plane, recording, tmp_path / "dra-plugin.log") as driver:
        try:
            resource.create_namespaced_resource_claim_template(node_namespace, _template("whole"))
            core.create_namespaced_pod(node_namespace, _gpu_pod("watched", template="whole"))
            (status,) = _running(core, node_namespace, "watched").status.resource_claim_statuses
            claim = client.sanitize_for_serialization(resource.read_namespaced_resource_claim(
                status.resource_claim_name, node_namespace))
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert result["device"] == "gpu-0"
            assert wait_until(lambda: _resource_health(core, node_namespace, "watched") or None,
                              timeout_s=60, what="the pod's device health reported"
                              ) == [("claim:gpu", "Healthy", "")]
            assert logged_events(driver.log, "health_stream_opened") >= 1

            healthy = recording.read_text()
            lost = json.loads(healthy)
            lost["devices"][0]["errors"] = {"nvmlDeviceGetMemoryInfo": "NVMLError_GpuIsLost"}

            def record(text: str) -> None:  # in one rename: the driver never reads half a file
                edited = recording.with_suffix(".tmp")
                edited.write_text(text)
                edited.replace(recording)

            def reported(health: str) -> list[tuple[str, str, str]] | None:
                found = _resource_health(core, node_namespace, "watched")
                return found if found and found[0][1] == health else None

            record(json.dumps(lost))
            assert wait_until(lambda: reported("Unhealthy"), timeout_s=60,
                              what="the pod's device reported Unhealthy") == [
                ("claim:gpu", "Unhealthy", "GPU 0: reading identity/memory failed: GPU is lost")]
            record(healthy)
            assert wait_until(lambda: reported("Healthy"), timeout_s=60,
                              what="the pod's device reported Healthy again") == [
                ("claim:gpu", "Healthy", "")]
        finally:
            _delete_pods(core, node_namespace)
            resource.delete_device_class(DRIVER_NAME)


def test_a_pod_asking_gpu_milli_in_a_dra_namespace_runs_with_its_share(
        node: Node, node_plane: ControlPlane, node_namespace: str, dra_driver: Driver,
        tmp_path: Path) -> None:
    """Unchanged pod specs (docs/dra.md): in a namespace labelled for DRA delivery, the
    admission webhook moves ``gpufrag.io/gpu-milli: 250`` into a claim made from a template it
    creates; the pod runs with the share's environment, as one asking through a template of
    its own does."""
    require_containers(node)
    client = node_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    core.patch_namespace(node_namespace, {"metadata": {"labels": {
        DEFAULT_NAMES.label_delivery: DELIVERY_DRA}}})
    selector = {"matchLabels": {"kubernetes.io/metadata.name": node_namespace,
                                DEFAULT_NAMES.label_delivery: DELIVERY_DRA}}
    create_device_class(resource, DRIVER_NAME)
    templates = TemplateClient(node_plane.new_api_client(), timeout_s=2.0)
    try:
        with registered_webhook(node_plane, node_namespace, tmp_path / "pki",
                                templates=templates, selector=selector):
            core.create_namespaced_pod(node_namespace, _gpu_pod(
                "converted", extended={DEFAULT_NAMES.gpu_milli: "250"}))
            pod = _running(core, node_namespace, "converted")
        (entry,) = pod.spec.resource_claims
        assert entry.resource_claim_template_name == template_for(Shape(1, 250)).name
        assert container_environment(node, node_namespace, "converted") == _share_env(
            0, 250, GPU_MIB * 250 // 1000, 25, dra_driver.mps_pipe_dir)
    finally:
        _delete_pods(core, node_namespace)
        resource.delete_device_class(DRIVER_NAME)
