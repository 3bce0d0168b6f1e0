"""The device plugin driven by kubelet's own device manager, against a real API server.

Real components: ``gpufrag device-plugin`` runs as its own process (recorded NVML: this machine
has no GPU), the kubelet's device manager (``k8s.io/kubernetes/pkg/kubelet/cm/devicemanager``
v1.36.3, in ``devkit/tools/dpharness``) registers it over the real unix sockets, reads its
devices through ListAndWatch, and allocates as at admission and container start
(GetPreferredAllocation, Allocate, PreStartContainer); the pods the plugin matches, marks and
warns about live in a real kube-apiserver. What the harness does not have is a container
runtime: the envs and device nodes are checked as the kubelet hands them to the runtime.

Each test has a node of its own (its Node object, namespace, plugin process and kubelet device
manager), and starts only once the plugin has registered both resources with that kubelet: a
device manager that does not know a resource answers Allocate with nothing and never calls the
plugin, so a test that did not wait would check the harness's timing, not the plugin.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from gpufrag.conventions import (
    ANNOTATION_GPU_ALLOCATED,
    ANNOTATION_GPU_INDICES,
    DEFAULT_NAMES,
    RESOURCE_GPU,
    RESOURCE_GPU_MILLI,
)
from node.deviceplugin.config import Kind
from node.deviceplugin.devices import gpu_of
from node.deviceplugin.matching import PodAsk
from node.deviceplugin.pods import KubeNodePods, NodePods
from node.deviceplugin.writes import REASON_REFUSED, KubePodWriter
from tests.node.deviceplugin.harness import KubeletHarness
from tests.records import place_as_the_extender, publish_test_key

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
UUIDS = ("GPU-5a3c9f1e-7b2d-4c8e-9f01-23456789abcd", "GPU-0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6")
A100_BYTES = 85_899_345_920  # 81920 MiB


def recording(*, lost: tuple[int, ...] = ()) -> dict[str, Any]:
    """Two A100s; GPUs in ``lost`` answer every memory read with GpuIsLost."""
    return {"devices": [
        {"name": "NVIDIA A100-SXM4-80GB", "uuid": uuid_, "memory_total": A100_BYTES,
         "samples": [{"gpu": 0, "memory_used": 0}],
         **({"errors": {"nvmlDeviceGetMemoryInfo": "NVMLError_GpuIsLost"}} if i in lost else {})}
        for i, uuid_ in enumerate(UUIDS)]}


def write_recording(path: Path, *, lost: tuple[int, ...] = ()) -> None:
    """In one rename: the plugin, which re-reads the file, never sees half of it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(recording(lost=lost)))
    tmp.replace(path)


@dataclass
class Node:
    name: str
    plane: ControlPlane
    core: Any  # kubernetes.client.CoreV1Api (dict bodies; the models are not used)
    namespace: str
    socket_dir: Path
    work: Path
    recording: Path
    harness_binary: Path
    harness: KubeletHarness
    plugin: subprocess.Popen[bytes]

    def pod(self, name: str, *, gpus: str | None, whole: int = 0, milli: int = 0,
            containers: int = 1) -> dict[str, Any]:
        """A pod bound to this node. With ``gpus``, as the extender binds it: a Binding whose
        annotations (the signed record: tests/records.py) land with the node name in one
        write, so the plugin never sees the pod bound without its record; without, created
        bound (as another scheduler's bind leaves it)."""
        limits = {RESOURCE_GPU: str(whole)} if whole else {RESOURCE_GPU_MILLI: str(milli)}
        body = {"metadata": {"name": name},
                "spec": {"nodeName": self.name, "containers": [
                    {"name": f"c{i}", "image": "x", "resources": {"limits": limits}}
                    for i in range(containers)]}}
        if gpus is None:
            created = self.core.create_namespaced_pod(self.namespace, body)
        else:
            created = place_as_the_extender(self.core, self.namespace, body, self.name, gpus)
        return {"uid": created.metadata.uid, "name": name,
                "containers": {f"c{i}": {next(iter(limits)): whole or milli}
                               for i in range(containers)}}

    def admit(self, pod: dict[str, Any]) -> dict[str, Any]:
        """What the kubelet does with the pod: allocate, then start each container."""
        return self.harness.allocate(pod["uid"], pod["name"], pod["containers"],
                                     namespace=self.namespace)

    def mark(self, name: str) -> dict[str, list[str]]:
        pod = self.core.read_namespaced_pod(name, self.namespace)
        value = (pod.metadata.annotations or {}).get(ANNOTATION_GPU_ALLOCATED)
        return json.loads(value) if value else {}

    def reject(self, name: str) -> None:
        """What the kubelet does after a failed admission: the pod fails, and waits no more."""
        self.core.patch_namespaced_pod_status(name, self.namespace, {"status": {
            "phase": "Failed", "reason": "UnexpectedAdmissionError"}})

    def plugin_log(self) -> str:
        return (self.work / "plugin.log").read_text()


    def wait_registered(self, *, allocatable_gpus: int = 2, timeout_s: float = 30.0) -> None:
        """Until the kubelet's device manager lists both resources with the plugin's devices:
        what every Allocate here relies on."""
        self.harness.wait(RESOURCE_GPU, capacity=2, allocatable=allocatable_gpus,
                          timeout_s=timeout_s)
        self.harness.wait(RESOURCE_GPU_MILLI, capacity=2000,
                          allocatable=allocatable_gpus * 1000, timeout_s=timeout_s)


@pytest.fixture
def node(plane: ControlPlane, dpharness: Path) -> Iterator[Node]:
    """A GPU node of this test's own: no pod, plugin cache or kubelet books of another test's."""
    name = f"dp-{uuid.uuid4().hex[:8]}"
    plane.create_gpu_node(name, 2, "NVIDIA-A100-SXM4-80GB", 81_920)
    core = kubernetes.client.CoreV1Api(plane.api_client())
    namespace = plane.create_namespace(f"dp-{uuid.uuid4().hex[:8]}")
    # Short: a unix socket path must fit in 108 bytes.
    socket_dir = Path(tempfile.mkdtemp(prefix="dp-"))
    work = Path(tempfile.mkdtemp(prefix="dp-work-"))
    dev = work / "dev"  # the node's device nodes, as the plugin would see the host's /dev
    dev.mkdir()
    for device in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (dev / device).touch()
    rec = work / "recording.json"
    write_recording(rec)
    harness = KubeletHarness(dpharness, socket_dir, work / "harness.log")
    publish_test_key(core)
    env = {**os.environ, "NODE_NAME": name, "GPUFRAG_LOG_FORMAT": "json",
           "PYTHONPATH": str(ROOT)}
    with (work / "plugin.log").open("ab") as log:
        plugin = subprocess.Popen(
            [sys.executable, "-m", "gpufrag.cli", "device-plugin", f"--socket-dir={socket_dir}",
             f"--nvml-recording={rec}", f"--kubeconfig={plane.kubeconfig_path}",
             f"--dev-root={dev}", "--metrics-port=0", "--health-interval-s=0.2",
             "--watch-interval-s=0.2", "--log-level=debug"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT, env=env)
    state = Node(name, plane, core, namespace, socket_dir, work, rec, dpharness, harness, plugin)
    try:
        state.wait_registered()
        yield state
    finally:
        plugin.terminate()
        try:
            plugin.wait(timeout=15)
        except subprocess.TimeoutExpired:
            plugin.kill()
            plugin.wait()
        state.harness.stop()
        print((work / "plugin.log").read_text()[-6000:])
        core.delete_namespace(namespace, grace_period_seconds=0)
        core.delete_node(name)
        shutil.rmtree(socket_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def test_registers_and_advertises_each_gpu_by_uuid(node: Node) -> None:
    whole = node.harness.wait(RESOURCE_GPU, capacity=2, allocatable=2)
    share = node.harness.wait(RESOURCE_GPU_MILLI, capacity=2000, allocatable=2000)
    assert whole["healthy"][RESOURCE_GPU] == sorted(UUIDS)
    milli_ids = share["healthy"][RESOURCE_GPU_MILLI]
    assert len(milli_ids) == 2000
    assert {gpu_of(device) for device in milli_ids} == set(UUIDS)
    # The recorded inventory mode says so.
    assert '"event": "recorded_nvml"' in node.plugin_log()


def test_a_whole_gpu_pod_no_gpufrag_bind_placed_gets_the_gpu_the_kubelet_chose(
        node: Node) -> None:
    """As the default kube-scheduler binds it: no gpu-indices record. GetPreferredAllocation
    steers the kubelet to the lowest-index idle GPU (GPU 0; the lowest device ID would be
    GPU 1's), and the container gets exactly the device the kubelet then chose."""
    pod = node.pod("default-scheduled", gpus=None, whole=1)
    reply = node.admit(pod)
    assert reply["ok"], reply
    c0 = reply["containers"]["c0"]
    assert c0["device_ids"][RESOURCE_GPU] == [UUIDS[0]]
    assert c0["envs"]["NVIDIA_VISIBLE_DEVICES"] == UUIDS[0]
    assert [d["host_path"] for d in c0["devices"]] == ["/dev/nvidia0", "/dev/nvidiactl",
                                                       "/dev/nvidia-uvm"]
    assert node.mark("default-scheduled") == {"c0": [UUIDS[0]]}
    assert '"event": "kubelet_choice"' in node.plugin_log()
    # The pod ends: the kubelet's books and the plugin's cache let GPU 0 go.
    assert node.harness.call("release", pod_uid=pod["uid"])["ok"]
    node.reject("default-scheduled")


def test_whole_gpu_container_gets_exactly_the_gpu_the_extender_chose(node: Node) -> None:
    pod = node.pod("whole-1", gpus="1", whole=1)
    reply = node.admit(pod)
    assert reply["ok"], reply
    c0 = reply["containers"]["c0"]
    assert c0["envs"]["NVIDIA_VISIBLE_DEVICES"] == UUIDS[1]
    # GetPreferredAllocation steered the kubelet's own books to the same GPU.
    assert c0["device_ids"][RESOURCE_GPU] == [UUIDS[1]]
    assert [d["host_path"] for d in c0["devices"]] == ["/dev/nvidia1", "/dev/nvidiactl",
                                                       "/dev/nvidia-uvm"]
    assert node.mark("whole-1") == {"c0": [UUIDS[1]]}


def test_two_shares_land_on_the_gpu_the_extender_chose(node: Node) -> None:
    first = node.pod("share-a", gpus="0", milli=300)
    second = node.pod("share-b", gpus="0", milli=500)
    for pod, milli in ((first, 300), (second, 500)):
        reply = node.admit(pod)
        assert reply["ok"], reply
        envs = reply["containers"]["c0"]["envs"]
        assert envs["NVIDIA_VISIBLE_DEVICES"] == UUIDS[0]
        assert envs["GPUFRAG_GPU_MILLI"] == str(milli)
        assert envs["GPUFRAG_GPU_MEMORY_LIMIT_MIB"] == str(81_920 * milli // 1000)
        ids = reply["containers"]["c0"]["device_ids"][RESOURCE_GPU_MILLI]
        assert len(ids) == milli and {gpu_of(i) for i in ids} == {UUIDS[0]}
        assert node.mark(pod["name"]) == {"c0": [UUIDS[0]]}
    # 800 of GPU 0's 1000 devices are now the kubelet's to account for.
    devices = node.harness.call("devices")
    assert devices["allocatable"][RESOURCE_GPU_MILLI] == 2000


@pytest.mark.parametrize(("name", "gpus", "milli", "message"), [
    ("share-no-annotation", None, 100,
     f"asks {RESOURCE_GPU_MILLI} and has no {ANNOTATION_GPU_INDICES} annotation: a share "
     f"names no GPU"),
    ("bad-annotation", "zero", 0, "not comma-separated GPU indices"),
    ("missing-gpu", "7", 0, "GPU 7 does not exist on node {node}, which has 2"),
])
def test_missing_or_malformed_annotation_fails_allocate_with_an_event(
        node: Node, name: str, gpus: str | None, milli: int, message: str) -> None:
    message = message.format(node=node.name)
    pod = node.pod(name, gpus=gpus, whole=0 if milli else 1, milli=milli)
    reply = node.admit(pod)
    assert not reply["ok"] and reply["stage"] == "allocate"
    assert message in reply["error"], reply["error"]  # what the kubelet's event shows
    events = wait_until(lambda: [e for e in node.core.list_namespaced_event(
        node.namespace, field_selector=f"involvedObject.name={name}").items
        if e.reason == REASON_REFUSED] or None, timeout_s=10, what=f"an event on {name}")
    assert message in (events[0].message or "")
    assert node.mark(name) == {}
    node.reject(name)


def test_unhealthy_gpu_is_reported_and_no_new_pod_is_given_it(node: Node) -> None:
    write_recording(node.recording, lost=(0,))
    node.wait_registered(allocatable_gpus=1)
    pod = node.pod("onto-lost", gpus="0", milli=100)
    reply = node.admit(pod)
    assert not reply["ok"]
    assert f"GPU 0 ({UUIDS[0]}), chosen for it by the extender, is unhealthy" in reply["error"]
    node.reject("onto-lost")
    write_recording(node.recording)
    node.wait_registered()


def test_re_registers_after_the_kubelet_restarts(node: Node) -> None:
    node.harness.kill()  # a crashed kubelet: its socket stays until the new one cleans up
    node.harness = KubeletHarness(node.harness_binary, node.socket_dir, node.work / "harness.log")
    node.wait_registered()
    assert '"event": "kubelet_restarted"' in node.plugin_log()
    pod = node.pod("after-restart", gpus="0", whole=1)
    reply = node.admit(pod)
    assert reply["ok"], reply
    assert reply["containers"]["c0"]["envs"]["NVIDIA_VISIBLE_DEVICES"] == UUIDS[0]


def test_marks_written_back_to_back_all_land(node: Node) -> None:
    """Each write reads its answer to the end before its connection is reused."""
    writer = KubePodWriter(node.plane.new_api_client(), node_name=node.name)
    pods = [node.pod(f"mark-{i}", gpus="0", milli=10) for i in range(20)]
    for pod in pods:
        ask = PodAsk(node.namespace, pod["name"], pod["uid"], node.name, "", "Pending", False,
                     Kind.SHARE, ())
        writer.mark_allocated(ask, ANNOTATION_GPU_ALLOCATED, {"c0": (UUIDS[0],)})
    assert all(node.mark(p["name"]) == {"c0": [UUIDS[0]]} for p in pods)
    for pod in pods:
        node.reject(pod["name"])


def test_its_rbac_is_enough_for_every_read_and_write(node: Node) -> None:
    """As the manifests' ServiceAccount: list + watch the node's pods, mark one, warn on one."""
    node.plane.ensure_namespace("gpufrag-system")
    node.plane.kubectl("apply", "-f", str(ROOT / "manifests/base/rbac-deviceplugin.yaml"),
                       "-n", "gpufrag-system")
    client = node.plane.new_api_client()
    client.set_default_header(
        "Impersonate-User", "system:serviceaccount:gpufrag-system:gpufrag-device-plugin")
    pod = node.pod("rbac-0", gpus="1", milli=10)
    cache = NodePods(DEFAULT_NAMES, annotation_allocated=ANNOTATION_GPU_ALLOCATED)
    watcher = KubeNodePods(client, node.name, cache)
    watcher.relist()  # list
    watcher.start()  # list + watch
    try:
        wait_until(lambda: cache.synced.is_set() or None, timeout_s=10, what="the watch")
        ask = next(a for a in cache.asks() if a.name == "rbac-0")
        writer = KubePodWriter(client, node_name=node.name)
        writer.mark_allocated(ask, ANNOTATION_GPU_ALLOCATED, {"c0": (UUIDS[1],)})
        writer.warn(ask, "rbac check", now=1_767_225_600.0)
        assert watcher.last_error == ""
    finally:
        watcher.stop()
    assert node.mark(pod["name"]) == {"c0": [UUIDS[1]]}
    with pytest.raises(kubernetes.client.ApiException) as denied:  # and nothing more
        kubernetes.client.CoreV1Api(client).read_namespaced_pod(pod["name"], node.namespace)
    assert denied.value.status == 403
    node.reject(pod["name"])
