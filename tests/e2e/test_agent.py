"""The node agent's cluster writes and pod listing against the real API server.

What a fake HTTP server could only assert about requests (merge patch of one annotation, an
Event on the pod, pods of this node only, errors that say what to fix) is checked here by what
the real API server stores and refuses.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import kubernetes
import pytest

from defrag.agent.cgroup import KubePodLister, PodListError, PodRecord, PodRef
from defrag.agent.publish import EVENT_REASON_GPU_MEMORY_GROWTH, KubeClusterWriter, PublishError
from defrag.agent.usage import GpuUsage, NodeGpuUsage, PodGpuUsage, parse
from devkit.controlplane import ControlPlane
from devkit.procs import free_port
from devkit.stack import delete_nodes
from gpufrag.conventions import ANNOTATION_GPU_USAGE

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
