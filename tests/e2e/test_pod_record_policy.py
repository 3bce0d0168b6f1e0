"""Who may change gpufrag's GPU records on a pod, refused by the API server itself
(manifests/base/pod-record-policy.yaml, ValidatingAdmissionPolicies), with real tokens.

The extender, the node agent and the defrag controller count a bound pod's GPUs from its
``gpu-indices`` record; a tenant who may patch its own pods could otherwise rewrite it on the
running pod and make the GPU it really uses look free. The device plugin may mark only
``gpu-allocated``, and with a pod-bound token only on pods of its own node. An admin is
unaffected.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from devkit.stack import delete_nodes
from gpufrag import conventions as cv
from node.deviceplugin.config import Kind
from node.deviceplugin.matching import PodAsk
from node.deviceplugin.writes import KubePodWriter, PodWriteError
from tests.e2e.test_manifests import render
from tests.e2e.test_node_write_policy import MERGE_PATCH, POLICY_KINDS, refusal
from tests.e2e.test_rbac import NS, Clients, token_client
from tests.e2e.test_rbac import as_service_account as as_service_account  # the fixture
from tests.records import place_as_the_extender
from tests.tenants import tenant_client

pytestmark = pytest.mark.e2e

POLICIES = {"gpufrag-pod-records", "gpufrag-device-plugin-pod-writes"}
NODE_A, NODE_B = "records-gpu-a", "records-gpu-b"


def _annotate(client: kubernetes.client.ApiClient, namespace: str, name: str,
              annotations: dict[str, str | None], *, dry_run: bool = False) -> object:
    core: Any = kubernetes.client.CoreV1Api(client)
    return core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}},
                                     _content_type=MERGE_PATCH,
                                     **({"dry_run": "All"} if dry_run else {}))


@pytest.fixture(scope="module")
def pod_record_policy(control_plane: ControlPlane, as_service_account: Clients,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The base's pod-record policies, applied for real and enforced (a new policy takes
    effect once the API server has loaded it: wait until it refuses a tenant's dry run)."""
    docs = [d for d in render(control_plane, "base")
            if d["kind"] in POLICY_KINDS and d["metadata"]["name"] in POLICIES]  # type: ignore[index]
    assert len(docs) == 4, [d["metadata"] for d in docs]
    text = yaml.safe_dump_all(docs)
    control_plane.kubectl("apply", "-f", "-", input_text=text)
    for node in (NODE_A, NODE_B):
        control_plane.create_gpu_node(node, 2, "A10", 23_028)
    folder = tmp_path_factory.mktemp("records")
    probe_ns = control_plane.create_namespace(f"records-probe-{uuid.uuid4().hex[:6]}")
    probe = tenant_client(control_plane, probe_ns, folder)
    admin: Any = kubernetes.client.CoreV1Api(control_plane.api_client())
    admin.create_namespaced_pod(probe_ns, {"metadata": {"name": "probe"}, "spec": {
        "containers": [{"name": "c", "image": "gpufrag-e2e:none"}]}})

    def enforced() -> bool:
        answer = refusal(partial(_annotate, probe, probe_ns, "probe",
                                 {cv.ANNOTATION_GPU_INDICES: "1"}, dry_run=True))
        return answer is not None and answer[0] == 403
    wait_until(enforced, timeout_s=30, what="the API server to enforce the pod-record policy")
    yield folder
    control_plane.kubectl("delete", "-f", "-", input_text=text, check=False)
    admin.delete_namespace(probe_ns)
    delete_nodes(control_plane, [NODE_A, NODE_B])


def _bound_pod(control_plane: ControlPlane, namespace: str, name: str, node: str) -> Any:
    """A pod bound to ``node`` with GPU 0 recorded and signed, as the extender's bind leaves it."""
    core: Any = kubernetes.client.CoreV1Api(control_plane.api_client())
    place_as_the_extender(core, namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "gpufrag-e2e:none",
                                 "resources": {"limits": {cv.RESOURCE_GPU: "1"}}}]}}, node, "0")
    return core.read_namespaced_pod(name, namespace)


def test_a_tenant_cannot_move_or_drop_the_gpu_record_of_its_running_pod(
        control_plane: ControlPlane, namespace: str, pod_record_policy: Path) -> None:
    _bound_pod(control_plane, namespace, "mine", NODE_A)
    tenant = tenant_client(control_plane, namespace, pod_record_policy)
    bind_only = "only the bind of gpufrag-scheduler records the GPUs of a pod"
    for what, changes in {
            "moved to GPU 1": {cv.ANNOTATION_GPU_INDICES: "1"},
            "record dropped": {cv.ANNOTATION_GPU_RECORD: None},
            "indices dropped": {cv.ANNOTATION_GPU_INDICES: None},
            "allocation mark": {cv.ANNOTATION_GPU_ALLOCATED: '{"main": ["GPU-x"]}'}}.items():
        answer = refusal(partial(_annotate, tenant, namespace, "mine", changes))
        assert answer is not None and answer[0] == 403, (what, answer)
        assert "ValidatingAdmissionPolicy 'gpufrag-pod-records'" in answer[1], (what, answer)
        expected = bind_only if cv.ANNOTATION_GPU_ALLOCATED not in changes else \
            "only gpufrag-device-plugin marks what it gave a pod"
        assert expected in answer[1], (what, answer)
    # Its own annotations stay its own.
    _annotate(tenant, namespace, "mine", {"team.example/owner": "a"})
    core: Any = kubernetes.client.CoreV1Api(control_plane.api_client())
    annotations = core.read_namespaced_pod("mine", namespace).metadata.annotations
    assert annotations[cv.ANNOTATION_GPU_INDICES] == "0"
    assert annotations["team.example/owner"] == "a"
    # An admin is out of scope.
    _annotate(control_plane.api_client(), namespace, "mine", {cv.ANNOTATION_GPU_INDICES: "1"})


def test_the_device_plugin_marks_only_pods_of_its_own_node(
        control_plane: ControlPlane, namespace: str, pod_record_policy: Path) -> None:
    """With the token of its own pod on node A (extra authentication.kubernetes.io/node-name),
    the plugin marks a pod on A; a pod on B, and any other annotation, are refused."""
    on_a = _bound_pod(control_plane, namespace, "on-a", NODE_A)
    on_b = _bound_pod(control_plane, namespace, "on-b", NODE_B)
    admin: Any = kubernetes.client.CoreV1Api(control_plane.api_client())
    plugin_pod = f"plugin-{uuid.uuid4().hex[:6]}"
    created = admin.create_namespaced_pod(NS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": plugin_pod},
        "spec": {"serviceAccountName": "gpufrag-device-plugin", "nodeName": NODE_A,
                 "containers": [{"name": "plugin", "image": "gpufrag-e2e:none"}]}})
    try:
        client = token_client(control_plane, "gpufrag-device-plugin",
                              pod_record_policy / "device-plugin-a.kubeconfig",
                              bound_to={"kind": "Pod", "apiVersion": "v1", "name": plugin_pod,
                                        "uid": created.metadata.uid})
        writer = KubePodWriter(client, node_name=NODE_A)

        def ask(pod: Any) -> PodAsk:
            return PodAsk(namespace, pod.metadata.name, pod.metadata.uid, pod.spec.node_name,
                          "", "Pending", False, Kind.WHOLE, ())

        writer.mark_allocated(ask(on_a), cv.ANNOTATION_GPU_ALLOCATED, {"main": ("GPU-a0",)})
        assert json.loads(admin.read_namespaced_pod("on-a", namespace).metadata.annotations[
            cv.ANNOTATION_GPU_ALLOCATED]) == {"main": ["GPU-a0"]}
        with pytest.raises(PodWriteError, match="may change only pods on its own node"):
            KubePodWriter(client, node_name=NODE_B).mark_allocated(
                ask(on_b), cv.ANNOTATION_GPU_ALLOCATED, {"main": ("GPU-b0",)})
        assert cv.ANNOTATION_GPU_ALLOCATED not in (
            admin.read_namespaced_pod("on-b", namespace).metadata.annotations or {})
        refused = {
            # Refused by both policies; the API server names the first that refuses.
            "its record": ({cv.ANNOTATION_GPU_INDICES: "1"}, cv.ANNOTATION_GPU_INDICES),
            "another annotation": ({"team.example/owner": "x"},
                                   "may change only the annotation gpufrag.io/gpu-allocated"),
        }
        for what, (changes, message) in refused.items():
            answer = refusal(partial(_annotate, client, namespace, "on-a", changes))
            assert answer is not None and answer[0] == 403 and message in answer[1], (what,
                                                                                     answer)
    finally:
        admin.delete_namespaced_pod(plugin_pod, NS, grace_period_seconds=0)
