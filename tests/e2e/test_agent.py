"""The node agent's cluster writes and pod listing against the real API server.

What a fake HTTP server could only assert about requests (merge patch of one annotation, an
Event on the pod, pods of this node only, errors that say what to fix) is checked here by what
the real API server stores and refuses.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
import structlog

from defrag.controller.inspect import main as inspect_main
from devkit.controlplane import ControlPlane
from devkit.procs import free_port, wait_until
from devkit.stack import delete_nodes
from gpufrag.conventions import (
    ANNOTATION_GPU_ALLOCATED,
    ANNOTATION_GPU_INDICES,
    ANNOTATION_GPU_USAGE,
    RESOURCE_GPU,
    RESOURCE_GPU_MEMORY_MIB,
    RESOURCE_GPU_MILLI,
)
from gpufrag.gpu_usage import GpuUsage, NodeGpuUsage, PodGpuUsage, parse
from gpufrag.nvml import MIB
from node.agent import cli as agent_cli
from node.agent.cgroup import KubePodLister, PodListError, PodRecord, PodRef
from node.agent.publish import (
    EVENT_REASON_GPU_ALLOCATION_MISMATCH,
    EVENT_REASON_GPU_MEMORY_GROWTH,
    EVENT_REASON_GPU_MEMORY_OVER_SHARE,
    EVENT_WINDOW_S,
    KubeClusterWriter,
    PublishError,
)

NODE = "agent-node-0"


@pytest.fixture(scope="module")
def node(control_plane: ControlPlane) -> Iterator[str]:
    control_plane.create_gpu_node(NODE, 2, "A10", 23_028, labels={"keep": "me"})
    yield NODE
    delete_nodes(control_plane, [NODE])


def _impersonating(plane: ControlPlane, user: str) -> kubernetes.client.ApiClient:
    """A client with exactly ``user``'s permissions (the admin may impersonate)."""
    client = plane.new_api_client()
    client.set_default_header("Impersonate-User", user)
    return client


def _bound_pod(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> PodRef:
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": name},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "x"}]}})
    pod = core.read_namespaced_pod(name, namespace)
    return PodRef(namespace, name, pod.metadata.uid)


def test_usage_annotation_is_merged_onto_the_node(control_plane: ControlPlane, node: str,
                                                  namespace: str) -> None:
    usage = NodeGpuUsage(node=node, timestamp=1_732_900_000.0, interval_s=15.0, gpus=(
        GpuUsage(index=0, uuid="GPU-0", product="NVIDIA A10", memory_used_mib=9_000,
                 memory_total_mib=23_028, utilization_pct=40,
                 pods=(PodGpuUsage(namespace, "llm-0", "uid-0", 8_500),)),
        GpuUsage(index=1, uuid="GPU-1", product="NVIDIA A10", memory_used_mib=0,
                 memory_total_mib=23_028, utilization_pct=0)))
    writer = KubeClusterWriter(control_plane.new_api_client(), node_name=node)
    writer.patch_node_annotation(node, ANNOTATION_GPU_USAGE, usage.to_json())
    stored = kubernetes.client.CoreV1Api(control_plane.api_client()).read_node(node)
    assert parse(stored.metadata.annotations[ANNOTATION_GPU_USAGE]) == usage
    assert stored.metadata.labels["keep"] == "me"  # a merge patch: nothing else touched


def test_leak_event_lands_on_the_pod(control_plane: ControlPlane, node: str,
                                     namespace: str) -> None:
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    pod = _bound_pod(core, namespace, "leaky")
    writer = KubeClusterWriter(control_plane.new_api_client(), node_name=node)
    writer.create_pod_event(pod, reason=EVENT_REASON_GPU_MEMORY_GROWTH,
                            message="GPU memory grew by 600 MiB", event_type="Warning",
                            now=1_732_900_000.5)
    (event,) = core.list_namespaced_event(namespace).items
    assert (event.involved_object.kind, event.involved_object.name,
            event.involved_object.uid) == ("Pod", "leaky", pod.uid)
    assert (event.reason, event.type, event.message) == (
        "GPUMemoryGrowth", "Warning", "GPU memory grew by 600 MiB")
    assert event.source.component == "gpufrag-agent" and event.source.host == node
    # The same pod and reason again within the window: the API server refuses the second Event
    # as already there (scheduler.kube.events), the writer takes that as reported, and the
    # pod keeps one Event. Another reason, or the next window, is a new one.
    writer.create_pod_event(pod, reason=EVENT_REASON_GPU_MEMORY_GROWTH,
                            message="GPU memory grew by 900 MiB", event_type="Warning",
                            now=1_732_900_000.5 + 60)
    assert len(core.list_namespaced_event(namespace).items) == 1
    writer.create_pod_event(pod, reason=EVENT_REASON_GPU_MEMORY_OVER_SHARE, message="over",
                            event_type="Warning", now=1_732_900_000.5 + 60)
    writer.create_pod_event(pod, reason=EVENT_REASON_GPU_MEMORY_GROWTH, message="later",
                            event_type="Warning", now=1_732_900_000.5 + EVENT_WINDOW_S)
    assert sorted(e.message for e in core.list_namespaced_event(namespace).items) == [
        "GPU memory grew by 600 MiB", "later", "over"]


def test_pod_lister_sees_only_this_nodes_pods(control_plane: ControlPlane, node: str,
                                              namespace: str) -> None:
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    mine = _bound_pod(core, namespace, "on-this-node")
    core.create_namespaced_pod(namespace, {"metadata": {"name": "unscheduled"}, "spec": {
        "schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]}})
    records = KubePodLister(control_plane.new_api_client(), node).list_pods()
    assert PodRecord(mine) in records
    assert all(r.ref.name != "unscheduled" for r in records)


def test_errors_say_what_to_fix(control_plane: ControlPlane, node: str) -> None:
    writer = KubeClusterWriter(control_plane.new_api_client(), node_name="no-such-node")
    with pytest.raises(PublishError, match="node 'no-such-node' does not exist") as missing:
        writer.patch_node_annotation("no-such-node", ANNOTATION_GPU_USAGE, "{}")
    assert not missing.value.retryable

    nobody = _impersonating(control_plane, "system:serviceaccount:default:nobody")
    with pytest.raises(PublishError, match=re.escape("needs RBAC 'patch nodes'")) as denied:
        KubeClusterWriter(nobody, node_name=node).patch_node_annotation(
            node, ANNOTATION_GPU_USAGE, "{}")
    assert not denied.value.retryable
    with pytest.raises(PublishError, match="'create events'"):
        KubeClusterWriter(nobody, node_name=node).create_pod_event(
            PodRef("default", "p", "u"), reason="GPUMemoryGrowth", message="m",
            event_type="Warning", now=1.0)
    with pytest.raises(PodListError, match=f"{node}.*HTTP 403"):
        KubePodLister(nobody, node).list_pods()


def test_unreachable_api_server_is_retryable(control_plane: ControlPlane) -> None:
    # Nothing listens on a fresh free port: what the agent sees while the API server restarts.
    configuration = kubernetes.client.Configuration(host=f"https://127.0.0.1:{free_port()}")
    configuration.verify_ssl = False
    configuration.retries = 0
    client = kubernetes.client.ApiClient(configuration)
    writer = KubeClusterWriter(client, node_name=NODE, request_timeout_s=2.0)
    with pytest.raises(PublishError) as caught:
        writer.patch_node_annotation(NODE, ANNOTATION_GPU_USAGE, "{}")
    assert caught.value.retryable


# -- the isolation check, end to end -------------------------------------------------------------

A100_BYTES = 85_899_345_920  # 81920 MiB


def test_a_pod_over_its_share_gets_one_event(control_plane: ControlPlane, node: str,
                                             namespace: str, tmp_path: Path) -> None:
    """``gpufrag agent`` as the DaemonSet runs it (its own main and loop, the real pod list
    and Event writes), on recorded NVML readings and a /proc whose cgroup files name the pods:
    the pod over its share gets one GPUMemoryOverShare Event, however long it stays over; its
    neighbour within its share gets none."""
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    uids = {}
    for name, requests in (("over", {RESOURCE_GPU_MILLI: "100"}),  # 8,192 MiB of 81,920
                           ("within", {RESOURCE_GPU_MEMORY_MIB: "12000"})):
        core.create_namespaced_pod(namespace, {
            "metadata": {"name": name, "annotations": {ANNOTATION_GPU_INDICES: "0"}},
            "spec": {"nodeName": node, "containers": [
                {"name": "c", "image": "x", "resources": {"limits": requests}}]}})
        uids[name] = core.read_namespaced_pod(name, namespace).metadata.uid
    for pid, name in ((4242, "over"), (5151, "within")):
        (tmp_path / "proc" / str(pid)).mkdir(parents=True)
        (tmp_path / "proc" / str(pid) / "cgroup").write_text(
            f"12:memory:/kubepods/burstable/pod{uids[name]}/0123abcd\n")
    recording = tmp_path / "nvml.json"
    recording.write_text(json.dumps({"devices": [{
        "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-e2e00000-0000-4000-8000-000000000000",
        "memory_total": A100_BYTES, "samples": [{"gpu": 40, "memory_used": 21_000 * MIB}],
        "processes": [{"pid": 4242, "used_bytes": 9_000 * MIB},
                      {"pid": 5151, "used_bytes": 11_000 * MIB}]}]}))
    stop = threading.Event()
    codes: list[int] = []
    argv = [f"--node-name={node}", f"--kubeconfig={control_plane.kubeconfig_path}",
            f"--nvml-recording={recording}", f"--proc-root={tmp_path / 'proc'}",
            "--interval-s=0.2", "--share-intervals=2", "--metrics-port=0", "--log-level=error"]
    thread = threading.Thread(target=lambda: codes.append(agent_cli.main(argv, stop=stop)))
    thread.start()

    def over_share_events() -> list[kubernetes.client.CoreV1Event]:
        return [e for e in core.list_namespaced_event(namespace).items
                if e.reason == EVENT_REASON_GPU_MEMORY_OVER_SHARE]

    try:
        (event,) = wait_until(lambda: over_share_events() or None, timeout_s=30,
                              what="the agent's GPUMemoryOverShare Event")
        reported_at = time.time()

        def read_since() -> bool:
            # The agent republishes its (unchanged) reading every 4 intervals: a timestamp a
            # second past the Event means five more readings, all over its share.
            annotations = core.read_node(node).metadata.annotations or {}
            usage = parse(annotations[ANNOTATION_GPU_USAGE])
            return usage.timestamp > reported_at + 1.0

        wait_until(read_since, timeout_s=30, what="more readings after the Event")
    finally:
        stop.set()
        thread.join(30)
        structlog.reset_defaults()
    assert codes == [0]
    assert (event.involved_object.name, event.involved_object.uid, event.type) == (
        "over", uids["over"], "Warning")
    assert "hold 9000 MiB, more than its share of 8192 MiB (100 milli-GPU of 81920 MiB)" in \
        event.message, event.message
    assert [e.involved_object.name for e in over_share_events()] == ["over"]


# -- the ledger against reality: strays and allocations, agent and inspect ------------------------

GPU_UUIDS = ("GPU-e2e00000-0000-4000-8000-00000000000a", "GPU-e2e00000-0000-4000-8000-00000000000b")


def test_a_swapped_allocation_and_a_stray_reach_events_and_inspect(
        control_plane: ControlPlane, node: str, namespace: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``gpufrag agent --once`` twice (two processes, as after a restart) on recorded NVML: a
    pod whose device-plugin mark names GPU 1 while gpu-indices records GPU 0 (what a swap of
    two identical pods leaves) gets one GPUAllocationMismatch Event, the restart's repeat
    refused by the API server; its neighbour, given what was recorded, none; a process in no
    pod on GPU 1 is carried in the usage annotation; ``gpufrag inspect`` against the same API
    server marks the pod MISALLOCATED and the process STRAY."""
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    for name, recorded, given in (("swapped", "0", GPU_UUIDS[1]), ("aligned", "1", GPU_UUIDS[1])):
        core.create_namespaced_pod(namespace, {
            "metadata": {"name": name, "annotations": {
                ANNOTATION_GPU_INDICES: recorded,
                ANNOTATION_GPU_ALLOCATED: json.dumps({"c": [given]})}},
            "spec": {"nodeName": node, "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {RESOURCE_GPU: "1"}}}]}})
    (tmp_path / "proc").mkdir()  # pid 7070 has no cgroup file here: a process in no pod
    recording = tmp_path / "nvml.json"
    recording.write_text(json.dumps({"devices": [
        {"name": "NVIDIA A10", "uuid": uuid, "memory_total": 23_028 * MIB,
         "samples": [{"gpu": 0, "memory_used": 512 * MIB * i}],
         "processes": [{"pid": 7070, "used_bytes": 512 * MIB}] if i else []}
        for i, uuid in enumerate(GPU_UUIDS)]}))
    argv = [f"--node-name={node}", f"--kubeconfig={control_plane.kubeconfig_path}",
            f"--nvml-recording={recording}", f"--proc-root={tmp_path / 'proc'}", "--once",
            "--metrics-port=0", "--log-level=error"]
    try:
        assert agent_cli.main(argv) == 0
        assert agent_cli.main(argv) == 0  # a restarted agent says it again: refused as there
    finally:
        structlog.reset_defaults()
    events = [e for e in core.list_namespaced_event(namespace).items
              if e.reason == EVENT_REASON_GPU_ALLOCATION_MISMATCH]
    assert [(e.involved_object.name, e.type) for e in events] == [("swapped", "Warning")]
    assert events[0].message.startswith("its containers got GPU(s) 1 but gpu-indices records 0")
    assert inspect_main(["--kubeconfig", str(control_plane.kubeconfig_path), "--node", node,
                         "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(m["pod"], m["reason"], m["recorded"], m["given"])
            for m in data["misallocated_pods"]] == [(f"{namespace}/swapped", "other_gpus", [0],
                                                     [1])]
    (shown,) = data["nodes"]
    assert shown["gpus"][1]["strays"] == [{"pid": 7070, "used_mib": 512, "reason": "no_pod"}]
    assert [h.get("misallocated") for h in shown["gpus"][0]["holders"]
            if h.get("pod") == f"{namespace}/swapped"] == ["other_gpus"]
