"""GPU placement made real on a real node: the kubelet's device manager and ``gpufrag
device-plugin`` (recorded NVML readings) over the real unix sockets.

- kube-scheduler with the gpufrag extender places a whole-GPU pod and two shares; every
  container gets exactly the GPU the extender chose, and the two shares share one;
- two share pods placed on one GPU are admitted and both containers get that GPU's UUID;
- a GPU that goes unhealthy (its recording starts failing ``nvmlDeviceGetMemoryInfo`` with
  ``GpuIsLost``, as after an XID 79) is reported: the kubelet takes it out of the Node's
  allocatable, and a pod the extender had put on it is refused at admission with the reason;
- the kubelet restarts (its socket directory wiped, a new ``kubelet.sock``): the plugin notices,
  registers again, and a new pod gets its GPU;
- the node agent, reading the real cgroups of running share pods, reports the one holding more
  GPU memory than its share, and a process on a GPU in no pod (this test's own) as a stray;
- a whole-GPU pod the default kube-scheduler places (no gpu-indices record) is admitted and its
  container gets the GPU the kubelet chose;
- right-sizing's whole-GPU path: the webhook turns an ``auto`` Deployment's whole-GPU replicas
  into shares, the extender puts two on one GPU, the plugin hands each its memory limit;
- the guard: a replica the agent reads past its share raises its workload in one defrag
  cycle, and the replica that replaces it is admitted with the raised share.

After the first test the pods carry ``gpufrag.io/gpu-indices`` as gpufrag-scheduler's bind
writes it, with ``spec.nodeName`` standing in for the binding, so each test chooses the GPU it
is about. The tests share one node and one plugin, in any order: each starts once both GPUs are
in the Node's allocatable, creates its own pods in its own namespace, and that namespace's pods
are gone before the next test starts (``node_namespace``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kubernetes.utils import parse_quantity

from defrag.controller.rightsize import EVENT_REASON_RAISED
from defrag.rightsizing.recommender import milli_for
from defrag.rightsizing.recommender import parse as parse_recommendation
from devkit.controlplane import NOT_READY_TAINT, ControlPlane
from devkit.extender import ExtenderProcess, gpufrag_scheduler_config
from devkit.node import BUSYBOX_IMAGE, Node
from devkit.procs import ComponentProcess, wait_until
from devkit.stack import bound_node
from gpufrag.conventions import (
    ANNOTATION_GPU_INDICES,
    DEFAULT_NAMES,
    HINTS_CONFIGMAP,
    HINTS_NAMESPACE,
    RESOURCE_GPU,
    RESOURCE_GPU_MILLI,
    SCHEDULER_NAME,
)
from node.agent.cgroup import pod_uid_for_pid
from node.deviceplugin.config import ANNOTATION_GPU_ALLOCATED
from tests import skips
from tests.e2e.node.conftest import (
    GPU_ENV_COMMAND,
    container_environment,
    logged_events,
    wait_registered,
)
from tests.records import place_as_the_extender, publish_test_key
from tests.webhooks import recommendation, registered_webhook

UUIDS = ("GPU-9a7e0c11-0000-4000-8000-00000000000a", "GPU-9a7e0c11-0000-4000-8000-00000000000b")
A100_BYTES = 85_899_345_920  # 81920 MiB
ROOT = Path(__file__).resolve().parents[3]
# This checkout's code (``-m`` from the repository root), not whatever the installed entry
# point's environment would import.
GPUFRAG = (sys.executable, "-m", "gpufrag.cli")


def write_recording(path: Path, *, lost: tuple[int, ...] = ()) -> None:
    """The two recorded GPUs; those in ``lost`` fail their memory read (NVML's GpuIsLost)."""
    devices: list[dict[str, Any]] = []
    for index, uuid in enumerate(UUIDS):
        device: dict[str, Any] = {"name": "NVIDIA A100-SXM4-80GB", "uuid": uuid,
                                  "memory_total": A100_BYTES,
                                  "samples": [{"gpu": 0, "memory_used": 0}]}
        if index in lost:
            device["errors"] = {"nvmlDeviceGetMemoryInfo": "NVMLError_GpuIsLost"}
        devices.append(device)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"devices": devices}))
    tmp.replace(path)  # one rename: the plugin never reads half a file


@dataclass
class Plugin:
    """The running plugin (JSON log lines) and the recording it follows."""

    component: ComponentProcess
    recording: Path

    def write_recording(self, *, lost: tuple[int, ...] = ()) -> None:
        write_recording(self.recording, lost=lost)

    def log(self) -> str:
        return self.component.log_path.read_text()

    def events(self, name: str) -> int:
        """How many times the plugin logged ``name``."""
        return logged_events(self.component.log_path, name)


@pytest.fixture(scope="module")
def plugin(node: Node, node_plane: ControlPlane,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plugin]:
    folder = tmp_path_factory.mktemp("device-plugin")
    log_path, recording = folder / "device-plugin.log", folder / "nvml.json"
    write_recording(recording)
    publish_test_key(kubernetes.client.CoreV1Api(node_plane.api_client()))
    with log_path.open("ab") as out:
        process = subprocess.Popen(
            [*GPUFRAG, "device-plugin",
             f"--node-name={node.name}", f"--socket-dir={node.device_plugin_dir}",
             f"--nvml-recording={recording}", "--health-interval-s=0.5",
             f"--kubeconfig={node_plane.kubeconfig_path}", "--metrics-port=0"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "GPUFRAG_LOG_FORMAT": "json"})
    running = Plugin(ComponentProcess("device-plugin", process, log_path, 0), recording)
    try:
        wait_registered(log_path, process)
        yield running
    finally:
        running.component.stop()


def _core(plane: ControlPlane) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(plane.api_client())


def _allocatable(core: kubernetes.client.CoreV1Api, node: Node) -> tuple[int, int]:
    """(whole GPUs, milli-GPU) the kubelet offers now (healthy devices only)."""
    alloc = core.read_node(node.name).status.allocatable or {}
    return (int(parse_quantity(alloc.get(RESOURCE_GPU, "0"))),
            int(parse_quantity(alloc.get(RESOURCE_GPU_MILLI, "0"))))


def _wait_allocatable(core: kubernetes.client.CoreV1Api, node: Node, plugin: Plugin,
                      want: tuple[int, int], what: str) -> None:
    try:
        wait_until(lambda: True if _allocatable(core, node) == want else None, timeout_s=60,
                   what=what)
    except Exception:
        print(plugin.log()[-6000:])
        raise


def _gpu_pod(name: str, resource: str, count: str) -> dict[str, Any]:
    """A pod asking ``count`` of ``resource``, whose container prints its GPU environment,
    then sleeps: for gpufrag-scheduler to place, or for :func:`_placed` to bind with a record
    as gpufrag-scheduler's bind does."""
    limits = {resource: count}
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"schedulerName": SCHEDULER_NAME, "terminationGracePeriodSeconds": 1,
                 "containers": [{
                     "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                     "command": ["/bin/sh", "-c", GPU_ENV_COMMAND],
                     "resources": {"limits": limits, "requests": limits}}]}}
    # The dev plane runs no node-lifecycle controller, so nothing lifts the not-ready taint
    # admission put on the new Node (devkit/controlplane.py); the kubelet says it is Ready.
    pod["spec"]["tolerations"] = [{"key": NOT_READY_TAINT, "operator": "Exists",
                                   "effect": "NoSchedule"}]
    return pod


def _placed(core: kubernetes.client.CoreV1Api, namespace: str, name: str, resource: str,
            count: str, node: Node, gpus: str) -> None:
    """The pod bound to ``node`` with GPUs ``gpus`` recorded (and signed), as gpufrag-scheduler's
    bind leaves it (tests/records.py)."""
    place_as_the_extender(core, namespace, _gpu_pod(name, resource, count), node.name, gpus)


def _settled(core: kubernetes.client.CoreV1Api, namespace: str, name: str,
             plugin: Plugin) -> kubernetes.client.V1Pod:
    def done() -> kubernetes.client.V1Pod | None:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase in ("Running", "Failed") else None

    try:
        pod: kubernetes.client.V1Pod = wait_until(done, timeout_s=60,
                                                  what=f"pod {name} to be admitted or refused")
    except Exception:
        print(plugin.log()[-6000:])
        raise
    return pod


def _given(pod: kubernetes.client.V1Pod) -> dict[str, list[str]]:
    """What the plugin recorded it gave each container (its allocation mark)."""
    given: dict[str, list[str]] = json.loads(
        (pod.metadata.annotations or {}).get(ANNOTATION_GPU_ALLOCATED, "{}"))
    return given


def test_pods_placed_by_gpufrag_scheduler_get_exactly_the_gpus_it_chose(
        node: Node, node_plane: ControlPlane, node_namespace: str, plugin: Plugin,
        tmp_path: Path) -> None:
    """kube-scheduler with the extender places a whole-GPU pod and two shares on this node's
    two GPUs; the kubelet admits them and each container's environment names exactly the GPU
    the extender recorded. The shares end up together on the GPU the whole pod left."""
    core = _core(node_plane)
    _wait_allocatable(core, node, plugin, (2, 2000), "both GPUs in the Node's allocatable")
    extender = ExtenderProcess(node_plane, tmp_path / "extender.log").start()
    chosen: dict[str, int] = {}
    try:
        node_plane.start_scheduler("gpufrag", gpufrag_scheduler_config(extender.url))
        for name, resource, count in (("whole", RESOURCE_GPU, "1"),
                                      ("share-1", RESOURCE_GPU_MILLI, "300"),
                                      ("share-2", RESOURCE_GPU_MILLI, "300")):
            core.create_namespaced_pod(node_namespace, _gpu_pod(name, resource, count))
            try:
                assert bound_node(core, node_namespace, name) == node.name
            except TimeoutError:
                status = core.read_namespaced_pod(name, node_namespace).status
                print(status.conditions, extender.log_path.read_text()[-3000:],
                      node_plane.schedulers["gpufrag"].log_tail())
                raise
            annotations = core.read_namespaced_pod(name, node_namespace).metadata.annotations
            chosen[name] = int(annotations[ANNOTATION_GPU_INDICES])
    finally:
        node_plane.stop_scheduler("gpufrag")
        extender.stop()
    assert chosen["share-1"] == chosen["share-2"] != chosen["whole"], chosen
    for name, index in chosen.items():
        pod = _settled(core, node_namespace, name, plugin)
        assert pod.status.phase == "Running", (name, pod.status.reason, pod.status.message)
        assert wait_until(lambda n=name: _given(core.read_namespaced_pod(n, node_namespace))
                          or None, timeout_s=20, what=f"{name}'s allocation mark") == {
            "main": [UUIDS[index]]}
        if node.runtime == "containerd":
            assert container_environment(node, node_namespace, name)["NVIDIA_VISIBLE_DEVICES"] == \
                UUIDS[index]


def _running_shares(core: kubernetes.client.CoreV1Api, namespace: str, node: Node,
                    plugin: Plugin, names: tuple[str, ...]) -> dict[str, kubernetes.client.V1Pod]:
    """Pods asking 300 milli each, all recorded on GPU 1, once they run."""
    for name in names:
        _placed(core, namespace, name, RESOURCE_GPU_MILLI, "300", node, "1")
    running = {}
    for name in names:
        pod = _settled(core, namespace, name, plugin)
        assert pod.status.phase == "Running", (name, pod.status.reason, pod.status.message)
        running[name] = pod
    return running


def test_two_share_pods_on_one_gpu_get_the_same_uuid(
        node: Node, node_plane: ControlPlane, node_namespace: str, plugin: Plugin) -> None:
    core = _core(node_plane)
    _wait_allocatable(core, node, plugin, (2, 2000), "both GPUs in the Node's allocatable")
    for name in _running_shares(core, node_namespace, node, plugin, ("share-a", "share-b")):
        assert wait_until(lambda n=name: _given(core.read_namespaced_pod(n, node_namespace))
                          or None, timeout_s=20, what=f"{name}'s allocation mark") == {
            "main": [UUIDS[1]]}
        if node.runtime == "containerd":
            env = container_environment(node, node_namespace, name)
            assert env["NVIDIA_VISIBLE_DEVICES"] == UUIDS[1], env
            assert (env["GPUFRAG_GPU_MILLI"], env["GPUFRAG_GPU_MEMORY_LIMIT_MIB"]) == (
                "300", str(81_920 * 300 // 1000)), env


def test_an_unhealthy_gpu_is_reported_and_gets_no_new_pod(
        node: Node, node_plane: ControlPlane, node_namespace: str, plugin: Plugin) -> None:
    core = _core(node_plane)
    _wait_allocatable(core, node, plugin, (2, 2000), "both GPUs healthy to start with")
    plugin.write_recording(lost=(0,))
    try:
        # ListAndWatch reports GPU 0's devices Unhealthy; the kubelet offers only GPU 1.
        _wait_allocatable(core, node, plugin, (1, 1000), "GPU 0 out of the Node's allocatable")
        _placed(core, node_namespace, "on-lost-gpu", RESOURCE_GPU, "1", node, "0")
        pod = _settled(core, node_namespace, "on-lost-gpu", plugin)
        # A healthy GPU was free (GPU 1), but the extender chose GPU 0: no container gets a GPU
        # it was not given, so admission fails, with the plugin's reason in the pod's status.
        assert pod.status.phase == "Failed", (pod.status.phase, pod.status.message)
        assert pod.status.reason == "UnexpectedAdmissionError", pod.status
        assert "unhealthy" in (pod.status.message or ""), pod.status.message
        assert UUIDS[0] in (pod.status.message or ""), pod.status.message
        events = core.list_namespaced_event(
            node_namespace, field_selector="involvedObject.name=on-lost-gpu").items
        assert any("unhealthy" in (e.message or "") for e in events), \
            [(e.reason, e.message) for e in events]
    finally:
        plugin.write_recording()
    _wait_allocatable(core, node, plugin, (2, 2000), "GPU 0 back once it reads again")


def test_the_plugin_registers_again_after_a_kubelet_restart(
        node: Node, node_plane: ControlPlane, node_namespace: str, plugin: Plugin) -> None:
    core = _core(node_plane)
    _wait_allocatable(core, node, plugin, (2, 2000), "both GPUs advertised before the restart")
    registered = plugin.events("registered")
    assert registered >= 2  # whole GPUs and shares
    node.restart_kubelet()
    # The new kubelet removed the plugin's sockets; the plugin serves fresh ones and registers.
    wait_until(lambda: True if plugin.events("kubelet_restarted") else None, timeout_s=30,
               what="the plugin to notice the kubelet restart")
    wait_until(lambda: True if plugin.events("registered") >= registered + 2 else None,
               timeout_s=30, what="the plugin to register both resources again")
    _wait_allocatable(core, node, plugin, (2, 2000), "both GPUs advertised again")
    _placed(core, node_namespace, "after-restart", RESOURCE_GPU, "1", node, "0")
    pod = _settled(core, node_namespace, "after-restart", plugin)
    assert pod.status.phase == "Running", (pod.status.reason, pod.status.message)
    assert _given(core.read_namespaced_pod("after-restart", node_namespace)) == {
        "main": [UUIDS[0]]}
    if node.runtime == "containerd":
        assert container_environment(node, node_namespace, "after-restart")[
            "NVIDIA_VISIBLE_DEVICES"] == UUIDS[0]


def _pids_of(uid: str) -> list[int]:
    """The host pids of a pod's processes, found the way the agent finds a pod from a pid."""
    return sorted(int(p.name) for p in Path("/proc").iterdir()
                  if p.name.isdigit() and pod_uid_for_pid(int(p.name)) == uid)


def test_the_agent_reports_a_real_pod_over_its_share(
        node: Node, node_plane: ControlPlane, node_namespace: str, plugin: Plugin,
        tmp_path: Path) -> None:
    """``gpufrag agent --once`` on this node: NVML is recorded (there is no GPU), but the
    processes it lists are the share pods' real container processes, so the pid -> cgroup ->
    pod mapping reads the kubelet's real cgroups; the pod holding more than its share gets a
    GPUMemoryOverShare Event, its neighbour within its share none."""
    if node.runtime != "containerd":
        skips.skip(skips.NO_CONTAINERS, f"the {node.runtime} runtime: {node.runtime_note}")
    core = _core(node_plane)
    _wait_allocatable(core, node, plugin, (2, 2000), "both GPUs in the Node's allocatable")
    uids = {name: pod.metadata.uid for name, pod in _running_shares(
        core, node_namespace, node, plugin, ("greedy", "modest")).items()}
    pids = {name: wait_until(lambda u=uid: _pids_of(u) or None, timeout_s=20,
                             what=f"the processes of pod {name}")[0]
            for name, uid in uids.items()}
    share_mib = 81_920 * 300 // 1000
    recording = tmp_path / "agent-nvml.json"
    recording.write_text(json.dumps({"devices": [
        {"name": "NVIDIA A100-SXM4-80GB", "uuid": uuid, "memory_total": A100_BYTES,
         "samples": [{"gpu": 10, "memory_used": 40_000 * 1024 * 1024 if i else 0}],
         "processes": [{"pid": pids["greedy"], "used_bytes": (share_mib + 1000) * 1024 * 1024},
                       {"pid": pids["modest"], "used_bytes": 10_000 * 1024 * 1024}]
         if i else [{"pid": os.getpid(), "used_bytes": 2_000 * 1024 * 1024}]}  # no pod's
        for i, uuid in enumerate(UUIDS)]}))
    agent = subprocess.run(
        [*GPUFRAG, "agent", "--once",
         f"--node-name={node.name}", f"--kubeconfig={node_plane.kubeconfig_path}",
         f"--nvml-recording={recording}", "--share-intervals=1", "--metrics-port=0"],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)
    assert agent.returncode == 0, agent.stdout + agent.stderr
    events = [e for e in core.list_namespaced_event(node_namespace).items
              if e.reason == "GPUMemoryOverShare"]
    assert [(e.involved_object.name, e.involved_object.uid) for e in events] == [
        ("greedy", uids["greedy"])], agent.stdout + agent.stderr
    assert f"hold {share_mib + 1000} MiB, more than its share of {share_mib} MiB" in \
        events[0].message, events[0].message
    # This test's own process, "on" GPU 0, runs in no pod: a stray, reported on the Node.
    strays = [e for e in core.list_namespaced_event("default").items
              if e.reason == "GPUProcessWithoutPod" and f"process {os.getpid()} " in e.message]
    assert [(e.involved_object.kind, e.involved_object.name) for e in strays] == [
        ("Node", node.name)], agent.stdout + agent.stderr
    assert "holds 2000 MiB on GPU 0" in strays[0].message and "runs in no pod" in \
        strays[0].message
    # ... and carried in the usage annotation, so gpufrag inspect shows it under GPU 0.
    shown = subprocess.run(
        [*GPUFRAG, "inspect", f"--kubeconfig={node_plane.kubeconfig_path}",
         f"--node={node.name}", "-o", "json"],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)
    assert shown.returncode == 0, shown.stderr
    inspected = json.loads(shown.stdout)
    assert inspected["nodes"][0]["gpus"][0]["strays"] == [
        {"pid": os.getpid(), "used_mib": 2000, "reason": "no_pod"}], shown.stdout
    assert [(s["node"], s["gpu"], s["pid"]) for s in inspected["strays"]] == [
        (node.name, 0, os.getpid())]


def test_a_pod_of_the_default_scheduler_gets_the_gpu_the_kubelet_chose(
        node: Node, node_plane: ControlPlane, node_namespace: str, plugin: Plugin) -> None:
    """The cluster's default kube-scheduler (no extender, so no gpu-indices record) places a
    whole-GPU pod: the plugin does not refuse it but gives the container the device the
    kubelet chose, as NVIDIA's plugin would, and marks it."""
    core = _core(node_plane)
    _wait_allocatable(core, node, plugin, (2, 2000), "both GPUs in the Node's allocatable")
    choices = plugin.events("kubelet_choice")
    body = _gpu_pod("default-scheduled", RESOURCE_GPU, "1")
    del body["spec"]["schedulerName"]  # the default scheduler's
    body["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node.name]}]}]}}}
    core.create_namespaced_pod(node_namespace, body)
    assert bound_node(core, node_namespace, "default-scheduled") == node.name
    pod = _settled(core, node_namespace, "default-scheduled", plugin)
    status, meta = pod.status, pod.metadata
    assert status is not None and meta is not None
    assert status.phase == "Running", (status.reason, status.message)
    assert ANNOTATION_GPU_INDICES not in (meta.annotations or {})
    given = wait_until(lambda: _given(core.read_namespaced_pod("default-scheduled",
                                                               node_namespace)) or None,
                       timeout_s=20, what="the allocation mark")
    assert list(given) == ["main"] and len(given["main"]) == 1 and given["main"][0] in UUIDS
    assert plugin.events("kubelet_choice") == choices + 1
    if node.runtime == "containerd":
        assert container_environment(node, node_namespace, "default-scheduled")[
            "NVIDIA_VISIBLE_DEVICES"] == given["main"][0]


def _whole_gpu_deployment(name: str, mode: str, history: str, replicas: int
                          ) -> dict[str, Any]:
    """``replicas`` asking one whole GPU each, whose workload carries a day's recommendation
    (8,192 MiB: 100 milli of these 80 GiB GPUs) and right-sizing ``mode``."""
    template = _gpu_pod(name, RESOURCE_GPU, "1")
    template["metadata"] = {"labels": {"app": name}}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "annotations": {
                DEFAULT_NAMES.annotation_rightsizing_mode: mode,
                DEFAULT_NAMES.annotation_gpu_recommendation: history}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": template["metadata"], "spec": template["spec"]}}}


def _replicas(core: kubernetes.client.CoreV1Api, namespace: str, app: str, count: int,
              plugin: Plugin) -> list[kubernetes.client.V1Pod]:
    def running() -> list[kubernetes.client.V1Pod] | None:
        pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
        ok = [p for p in pods if p.status.phase == "Running"]
        return ok if len(ok) == count else None

    try:
        found: list[kubernetes.client.V1Pod] = wait_until(
            running, timeout_s=90, what=f"{count} running replicas of {app}")
    except Exception:
        print(plugin.log()[-6000:])
        raise
    return found


def test_a_whole_gpu_deployment_in_auto_mode_runs_two_replicas_on_one_gpu(
        node: Node, node_plane: ControlPlane, node_namespace: str, plugin: Plugin,
        tmp_path: Path) -> None:
    """Right-sizing's whole-GPU path, all real: the webhook admits each replica of an ``auto``
    Deployment asking ``nvidia.com/gpu: 1`` as a 100-milli share (its workload has a day of
    history), kube-scheduler with the extender puts both on one GPU, and the device plugin
    hands each container that GPU with its memory limit. The same Deployment in ``recommend``
    mode keeps whole GPUs."""
    core = _core(node_plane)
    apps = kubernetes.client.AppsV1Api(node_plane.api_client())
    _wait_allocatable(core, node, plugin, (2, 2000), "both GPUs in the Node's allocatable")
    history = recommendation(8192, 81_920, hours=24, now=time.time())
    extender = ExtenderProcess(node_plane, tmp_path / "extender.log").start()
    try:
        node_plane.start_scheduler("gpufrag", gpufrag_scheduler_config(extender.url))
        with registered_webhook(node_plane, node_namespace, tmp_path / "pki"):
            apps.create_namespaced_deployment(
                node_namespace, _whole_gpu_deployment("sized", "auto", history, 2))
            shared = _replicas(core, node_namespace, "sized", 2, plugin)
            gpus = set()
            for pod in shared:
                limits = pod.spec.containers[0].resources.limits
                assert RESOURCE_GPU not in limits and limits[RESOURCE_GPU_MILLI] == "100"
                gpus.add(pod.metadata.annotations[ANNOTATION_GPU_INDICES])
                if node.runtime == "containerd":
                    env = container_environment(node, node_namespace, pod.metadata.name)
                    assert (env["GPUFRAG_GPU_MILLI"], env["GPUFRAG_GPU_MEMORY_LIMIT_MIB"]) == (
                        "100", str(81_920 * 100 // 1000)), env
            assert len(gpus) == 1, gpus  # both replicas share one GPU
            # recommend mode: admitted as asked, a whole GPU (the other one).
            apps.create_namespaced_deployment(
                node_namespace, _whole_gpu_deployment("kept", "recommend", history, 1))
            (kept,) = _replicas(core, node_namespace, "kept", 1, plugin)
            assert kept.spec.containers[0].resources.limits[RESOURCE_GPU] == "1"
            assert DEFAULT_NAMES.annotation_rightsizing_change not in kept.metadata.annotations
            assert kept.metadata.annotations[ANNOTATION_GPU_INDICES] not in gpus
    finally:
        node_plane.stop_scheduler("gpufrag")
        extender.stop()


def test_a_replica_over_its_share_raises_its_workload_and_the_next_is_admitted_raised(
        node: Node, node_plane: ControlPlane, node_namespace: str, plugin: Plugin,
        tmp_path: Path) -> None:
    """The guard against running out, all real: an ``auto`` Deployment's replica admitted at a
    100-milli share (8,192 MiB) holds 12,000 MiB; ``gpufrag agent --once`` reads it through the
    kubelet's real cgroups and publishes it, one ``gpufrag defrag`` cycle raises the workload to
    1.2 x that use (a ``GPUShareRaised`` Event on the Deployment), and the replica that replaces
    it is admitted by the webhook with the raised share and handed that memory limit. The
    cool-off is 0 here so the raise itself admits the next replica; the default (a day) admits
    it as its template asks (tests/defrag/rightsizing/test_recommender.py)."""
    if node.runtime != "containerd":
        skips.skip(skips.NO_CONTAINERS, f"the {node.runtime} runtime: {node.runtime_note}")
    core = _core(node_plane)
    apps = kubernetes.client.AppsV1Api(node_plane.api_client())
    _wait_allocatable(core, node, plugin, (2, 2000), "both GPUs in the Node's allocatable")
    node_plane.ensure_namespace(HINTS_NAMESPACE)  # where the cycle records its state,
    with suppress(kubernetes.client.ApiException):
        core.create_namespaced_config_map(HINTS_NAMESPACE, {"metadata": {"name": HINTS_CONFIGMAP}})
    extender = ExtenderProcess(node_plane, tmp_path / "extender.log").start()
    try:
        node_plane.start_scheduler("gpufrag", gpufrag_scheduler_config(extender.url))
        with registered_webhook(node_plane, node_namespace, tmp_path / "pki"):
            apps.create_namespaced_deployment(node_namespace, _whole_gpu_deployment(
                "guarded", "auto", recommendation(8192, 81_920, hours=24, now=time.time()), 1))
            (first,) = _replicas(core, node_namespace, "guarded", 1, plugin)
            assert first.spec.containers[0].resources.limits[RESOURCE_GPU_MILLI] == "100"
            gpu = int(first.metadata.annotations[ANNOTATION_GPU_INDICES])
            pid = wait_until(lambda: _pids_of(first.metadata.uid) or None, timeout_s=20,
                             what="the replica's processes")[0]
            used_mib = 12_000  # past its 8,192 MiB share
            recording = tmp_path / "agent-nvml.json"
            recording.write_text(json.dumps({"devices": [
                {"name": "NVIDIA A100-SXM4-80GB", "uuid": uuid, "memory_total": A100_BYTES,
                 "samples": [{"gpu": 10, "memory_used": used_mib * 1024 * 1024 if i == gpu
                              else 0}],
                 "processes": [{"pid": pid, "used_bytes": used_mib * 1024 * 1024}]
                 if i == gpu else []} for i, uuid in enumerate(UUIDS)]}))
            agent = subprocess.run(
                [*GPUFRAG, "agent", "--once", f"--node-name={node.name}",
                 f"--kubeconfig={node_plane.kubeconfig_path}", f"--nvml-recording={recording}",
                 "--share-intervals=1", "--metrics-port=0"],
                capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)
            assert agent.returncode == 0, agent.stdout + agent.stderr
            cycle = subprocess.run(
                [*GPUFRAG, "defrag", f"--kubeconfig={node_plane.kubeconfig_path}",
                 f"--namespaces={node_namespace}", "--rightsizing-oom-cooloff-s=0",
                 "--output=json"],
                capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
            assert cycle.returncode == 0, cycle.stdout + cycle.stderr
            deployment = apps.read_namespaced_deployment("guarded", node_namespace)
            rec = parse_recommendation(deployment.metadata.annotations[
                DEFAULT_NAMES.annotation_gpu_recommendation])["*"]
            assert rec.raised_mib == used_mib * 6 // 5, cycle.stdout
            raised = [e for e in core.list_namespaced_event(node_namespace).items
                      if e.reason == EVENT_REASON_RAISED]
            assert [(e.involved_object.kind, e.involved_object.name) for e in raised] == [
                ("Deployment", "guarded")], cycle.stdout
            # The next replica: admitted at the raised share, handed at least the raise.
            core.delete_namespaced_pod(first.metadata.name, node_namespace,
                                       grace_period_seconds=0)
            wait_until(lambda: not [p for p in core.list_namespaced_pod(
                node_namespace, label_selector="app=guarded").items
                if p.metadata.uid == first.metadata.uid], timeout_s=60,
                what="the first replica gone")
            (second,) = _replicas(core, node_namespace, "guarded", 1, plugin)
            milli = int(second.spec.containers[0].resources.limits[RESOURCE_GPU_MILLI])
            assert milli == milli_for(rec.memory_mib, 81_920) and milli > 100, milli
            change = json.loads(second.metadata.annotations[
                DEFAULT_NAMES.annotation_rightsizing_change])
            assert (change["to"], change["memory_mib"]) == (milli, rec.memory_mib), change
            env = container_environment(node, node_namespace, second.metadata.name)
            assert int(env["GPUFRAG_GPU_MEMORY_LIMIT_MIB"]) >= rec.raised_mib, env
    finally:
        node_plane.stop_scheduler("gpufrag")
        extender.stop()
