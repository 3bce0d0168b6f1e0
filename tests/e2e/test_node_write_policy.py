"""What gpufrag's ServiceAccounts may change on a Node, refused by the API server itself
(manifests/base/node-write-policy.yaml, ValidatingAdmissionPolicies), with real ServiceAccount
tokens and the components' own writers.

RBAC gives gpufrag-defrag and gpufrag-agent ``patch nodes`` cluster-wide; the policies leave the
defrag controller only the ``nvidia.com/mig.config`` label, the agent only its usage annotation
(and, with a pod-bound token, only its own Node). An admin is unaffected.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import kubernetes
import pytest
import yaml

from defrag.controller.executor import EVENT_REASON_MIG_RELABELLED, KubeActions
from defrag.controller.migplan import Relabel
from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from devkit.stack import delete_nodes
from gpufrag import conventions as cv
from node.agent.publish import KubeClusterWriter, PublishError
from scheduler.kube.events import CLUSTER_EVENT_NAMESPACE
from tests.e2e.test_manifests import render
from tests.e2e.test_rbac import NS, Clients, token_client
from tests.e2e.test_rbac import as_service_account as as_service_account  # the fixture

pytestmark = pytest.mark.e2e

POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
POLICIES = {"gpufrag-defrag-node-writes", "gpufrag-agent-node-writes"}
MIG_NODE = "policy-mig-0"
GPU_NODE = "policy-gpu-1"
MIG_LAYOUT = "all-1g.10gb"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


def refusal(call: Callable[[], object]) -> tuple[int, str] | None:
    """The status and message the API server refused ``call`` with; None if it was allowed."""
    try:
        call()
    except kubernetes.client.ApiException as e:
        return e.status, str(json.loads(e.body or "{}").get("message", e.body))
    return None


def label_patch(key: str, value: str) -> list[dict[str, str]]:
    """A JSON patch adding the label ``key``, as KubeActions.relabel_mig writes its label."""
    return [{"op": "add", "path": "/metadata/labels/" + key.replace("~", "~0").replace("/", "~1"),
             "value": value}]


def refuses_a_label(client: kubernetes.client.ApiClient, account: str) -> bool:
    """Whether ``account``'s policy refuses it a label (a dry run: nothing is written)."""
    core: Any = kubernetes.client.CoreV1Api(client)
    answer = refusal(lambda: core.patch_node(
        GPU_NODE, {"metadata": {"labels": {"gpufrag.io/probe": "x"}}}, dry_run="All",
        _content_type=MERGE_PATCH))
    return answer is not None and f"{account} may" in answer[1]


Refusals = dict[str, tuple[Callable[[], object], str]]


def assert_refused(policy: str, refused: Refusals) -> None:
    """Each call (what it tries -> (call, a part of the message)) is refused with a 403 by
    ``policy``, with that message."""
    for what, (call, message) in refused.items():
        answer = refusal(call)
        assert answer is not None, f"{policy} allowed {what}"
        assert answer[0] == 403 and message in answer[1], (what, answer)
        assert f"ValidatingAdmissionPolicy '{policy}'" in answer[1], (what, answer)


TAINT = {"spec": {"taints": [{"key": "gpufrag.io/test", "effect": "NoSchedule"}]}}


@pytest.fixture(scope="module")
def node_write_policy(control_plane: ControlPlane, as_service_account: Clients) -> Iterator[None]:
    """The base's node-write policies, applied for real and enforced (a new policy takes effect
    once the API server has loaded it: wait until each refuses a dry run it must refuse)."""
    docs = [d for d in render(control_plane, "base")
            if d["kind"] in POLICY_KINDS and d["metadata"]["name"] in POLICIES]  # type: ignore[index]
    assert len(docs) == 2 * len(POLICIES)  # each policy and its binding
    text = yaml.safe_dump_all(docs)
    control_plane.kubectl("apply", "-f", "-", input_text=text)
    control_plane.create_gpu_node(MIG_NODE, 1, "NVIDIA-A100-SXM4-80GB", 81_920,
                                  labels={cv.LABEL_MIG_CONFIG: MIG_LAYOUT})
    control_plane.create_gpu_node(GPU_NODE, 2, "A10", 23_028)
    for account in ("gpufrag-defrag", "gpufrag-agent"):
        wait_until(partial(refuses_a_label, as_service_account(account), account), timeout_s=30,
                   what=f"the API server to enforce {account}'s node-write policy")
    yield
    control_plane.kubectl("delete", "-f", "-", input_text=text, check=False)
    delete_nodes(control_plane, [MIG_NODE, GPU_NODE])


def node_labels(control_plane: ControlPlane, node: str) -> dict[str, str]:
    core: Any = kubernetes.client.CoreV1Api(control_plane.api_client())
    return dict(core.read_node(node).metadata.labels or {})


def node_annotations(control_plane: ControlPlane, node: str) -> dict[str, str]:
    core: Any = kubernetes.client.CoreV1Api(control_plane.api_client())
    return dict(core.read_node(node).metadata.annotations or {})


def test_defrag_sets_the_mig_layout_and_nothing_else(
        control_plane: ControlPlane, as_service_account: Clients,
        node_write_policy: None) -> None:
    client = as_service_account("gpufrag-defrag")
    relabel = Relabel(MIG_NODE, MIG_LAYOUT, "gpufrag-2x3g.40gb")
    assert KubeActions(client).relabel_mig(relabel, time.time())
    assert node_labels(control_plane, MIG_NODE)[cv.LABEL_MIG_CONFIG] == "gpufrag-2x3g.40gb"
    # ... and its Event on the Node, under the ClusterRole's events rule.
    admin: Any = kubernetes.client.CoreV1Api(control_plane.api_client())
    events = admin.list_namespaced_event(
        CLUSTER_EVENT_NAMESPACE, field_selector=f"involvedObject.name={MIG_NODE}").items
    assert [e.reason for e in events] == [EVENT_REASON_MIG_RELABELLED]
    # A label first set (no test op) is allowed as well.
    assert KubeActions(client).relabel_mig(Relabel(GPU_NODE, "", "all-disabled"), time.time())

    core: Any = kubernetes.client.CoreV1Api(client)
    only_label = "gpufrag-defrag may change only the label nvidia.com/mig.config on a Node"
    refused: Refusals = {
        "another label": (lambda: core.patch_node(
            MIG_NODE, label_patch("nvidia.com/gpu.product", "H100"),
            _content_type=JSON_PATCH), f"{only_label}: refused a change to the label(s) "
                                       f"nvidia.com/gpu.product of node {MIG_NODE}"),
        "the layout with another label": (lambda: core.patch_node(
            MIG_NODE, [*label_patch(cv.LABEL_MIG_CONFIG, "x"), *label_patch("a.io/b", "c")],
            _content_type=JSON_PATCH), "the label(s) a.io/b of node"),
        "removing the layout label": (lambda: core.patch_node(
            MIG_NODE, [{"op": "remove", "path": "/metadata/labels/nvidia.com~1mig.config"}],
            _content_type=JSON_PATCH), f"the label(s) {cv.LABEL_MIG_CONFIG} of node"),
        # A value no other test writes: an unchanged annotation is no change to refuse.
        "an annotation": (lambda: core.patch_node(
            MIG_NODE, {"metadata": {"annotations": {cv.ANNOTATION_GPU_USAGE: uuid.uuid4().hex}}},
            _content_type=MERGE_PATCH),
            f"gpufrag-defrag may change no annotation of a Node: refused a change to the "
            f"annotation(s) {cv.ANNOTATION_GPU_USAGE} of node {MIG_NODE}"),
        "a taint": (lambda: core.patch_node(MIG_NODE, TAINT, _content_type=MERGE_PATCH),
                    "gpufrag-defrag may not change the spec of a Node"),
        "unschedulable": (lambda: core.patch_node(
            MIG_NODE, {"spec": {"unschedulable": True}}, _content_type=MERGE_PATCH),
            "gpufrag-defrag may not change the spec of a Node"),
        "a finalizer": (lambda: core.patch_node(
            MIG_NODE, {"metadata": {"finalizers": ["gpufrag.io/held"]}},
            _content_type=MERGE_PATCH),
            "gpufrag-defrag may not change the finalizers or owner references of a Node"),
    }
    assert_refused("gpufrag-defrag-node-writes", refused)
    assert node_labels(control_plane, MIG_NODE)[cv.LABEL_MIG_CONFIG] == "gpufrag-2x3g.40gb"
    assert "a.io/b" not in node_labels(control_plane, MIG_NODE)


def test_agent_publishes_its_usage_and_nothing_else(
        control_plane: ControlPlane, as_service_account: Clients,
        node_write_policy: None) -> None:
    client = as_service_account("gpufrag-agent")
    writer = KubeClusterWriter(client, node_name=GPU_NODE)
    writer.patch_node_annotation(GPU_NODE, cv.ANNOTATION_GPU_USAGE, '{"gpus": []}')
    writer.patch_node_annotation(GPU_NODE, cv.ANNOTATION_GPU_USAGE, '{"gpus": [1]}')  # replaced
    assert node_annotations(control_plane, GPU_NODE)[cv.ANNOTATION_GPU_USAGE] == '{"gpus": [1]}'
    # A token bound to no pod names no node: any GPU node's annotation (as the RBAC test does).
    writer.patch_node_annotation(MIG_NODE, cv.ANNOTATION_GPU_USAGE, "{}")
    # The agent's error carries the policy's own message, naming the key it refused.
    with pytest.raises(PublishError, match=r"HTTP 403: .*gpufrag\.io/other.*node-write policy"):
        writer.patch_node_annotation(GPU_NODE, "gpufrag.io/other", "{}")

    core: Any = kubernetes.client.CoreV1Api(client)
    refused: Refusals = {
        "another annotation": (lambda: core.patch_node(
            GPU_NODE, {"metadata": {"annotations": {"gpufrag.io/other": "x"}}},
            _content_type=MERGE_PATCH),
            "gpufrag-agent may change only the annotation gpufrag.io/gpu-usage on a Node: "
            f"refused a change to the annotation(s) gpufrag.io/other of node {GPU_NODE}"),
        "removing its annotation": (lambda: core.patch_node(
            GPU_NODE, {"metadata": {"annotations": {cv.ANNOTATION_GPU_USAGE: None}}},
            _content_type=MERGE_PATCH), f"the annotation(s) {cv.ANNOTATION_GPU_USAGE} of node"),
        "a label": (lambda: core.patch_node(
            GPU_NODE, {"metadata": {"labels": {cv.LABEL_MIG_CONFIG: "all-3g.40gb"}}},
            _content_type=MERGE_PATCH),
            "gpufrag-agent may change no label of a Node: refused a change to the label(s) "
            f"{cv.LABEL_MIG_CONFIG} of node {GPU_NODE}"),
        "a taint": (lambda: core.patch_node(GPU_NODE, TAINT, _content_type=MERGE_PATCH),
                    "gpufrag-agent may not change the spec of a Node"),
    }
    assert_refused("gpufrag-agent-node-writes", refused)
    assert "gpufrag.io/other" not in node_annotations(control_plane, GPU_NODE)


def test_agent_with_a_pod_bound_token_writes_only_its_own_node(
        control_plane: ControlPlane, as_service_account: Clients, node_write_policy: None,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A pod's projected token carries its node's name (extra
    authentication.kubernetes.io/node-name); with it the agent may write only that Node."""
    admin: Any = kubernetes.client.CoreV1Api(control_plane.api_client())
    name = f"agent-{uuid.uuid4().hex[:6]}"
    pod = admin.create_namespaced_pod(NS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"serviceAccountName": "gpufrag-agent", "nodeName": GPU_NODE,
                 "containers": [{"name": "agent", "image": "gpufrag-e2e:none"}]}})
    try:
        client = token_client(control_plane, "gpufrag-agent",
                              tmp_path_factory.mktemp("bound") / "agent.kubeconfig",
                              bound_to={"kind": "Pod", "apiVersion": "v1", "name": name,
                                        "uid": pod.metadata.uid})
        auth: Any = kubernetes.client.AuthenticationV1Api(client)
        review = auth.create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        assert review.status.user_info.extra["authentication.kubernetes.io/node-name"] == [
            GPU_NODE]
        writer = KubeClusterWriter(client, node_name=GPU_NODE)
        writer.patch_node_annotation(GPU_NODE, cv.ANNOTATION_GPU_USAGE, '{"gpus": [2]}')
        assert node_annotations(control_plane, GPU_NODE)[cv.ANNOTATION_GPU_USAGE] == (
            '{"gpus": [2]}')
        core: Any = kubernetes.client.CoreV1Api(client)
        answer = refusal(lambda: core.patch_node(
            MIG_NODE, {"metadata": {"annotations": {cv.ANNOTATION_GPU_USAGE: "{}"}}},
            _content_type=MERGE_PATCH))
        assert answer is not None and answer[0] == 403, answer
        assert (f"gpufrag-agent may change only its own Node: the agent on node {GPU_NODE} was "
                f"refused a write to node {MIG_NODE}") in answer[1]
    finally:
        admin.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_an_admin_is_unaffected(control_plane: ControlPlane, node_write_policy: None) -> None:
    core: Any = kubernetes.client.CoreV1Api(control_plane.api_client())
    core.patch_node(MIG_NODE, {"metadata": {"labels": {"a.io/admin": "yes"},
                                            "annotations": {"a.io/admin": "yes"}},
                               **TAINT}, _content_type=MERGE_PATCH)
    node = core.read_node(MIG_NODE)
    assert node.metadata.labels["a.io/admin"] == node.metadata.annotations["a.io/admin"] == "yes"
    assert [t.key for t in node.spec.taints] == ["gpufrag.io/test"]
    core.patch_node(MIG_NODE, {"spec": {"taints": None}}, _content_type=MERGE_PATCH)
