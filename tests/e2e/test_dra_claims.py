"""Pods that ask ``gpufrag.io/gpu-milli``, ``gpufrag.io/gpu-memory-mib`` or ``nvidia.com/gpu``
keep working unchanged in a namespace with DRA delivery: the webhook (``/mutate-dra``,
registered as the dra-claims component registers it: failurePolicy Fail, sideEffects
NoneOnDryRun, namespaces labelled ``gpufrag.io/delivery=dra``) moves each ask into a claim
made from a ResourceClaimTemplate it creates; kube-controller-manager's resourceclaim
controller makes the claim, kube-scheduler's allocator allocates it on the devices of the
driver's ResourceSlices (published on fake nodes as ``node.dra.slices`` builds them) and the
pod binds. A pod of an unlabelled namespace is not touched; a template someone made under the
webhook's name with another spec refuses the pod; a dry run makes no template.

The nodes have no kubelet, so the pods are bound and allocated but never run (the driver's
NodePrepareResources on a real node: tests/e2e/node/test_dra_plugin.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from defrag.admission.server import AdmissionServer
from defrag.admission.templates import TemplateClient
from defrag.admission.toclaims import DEVICE_CLASS, Shape, template_for
from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from devkit.stack import GROUP_LABEL, delete_nodes
from gpufrag.conventions import DEFAULT_NAMES as NAMES
from gpufrag.conventions import DELIVERY_DRA
from node.dra.slices import build_slice
from node.gpus import Gpu
from scheduler.kube.claims import DRIVER_NAME, claimed_gpus
from tests.deviceclasses import create_device_class
from tests.tenants import tenant_client
from tests.webhooks import registered_webhook

GROUP = "dra-claims"
PRODUCT, GPU_MEMORY_MIB, GPUS = "A100", 81_920, 2
ApiException = kubernetes.client.ApiException


@pytest.fixture
def plain_namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = control_plane.create_namespace(f"e2e-plain-{uuid.uuid4().hex[:8]}")
    yield name
    kubernetes.client.CoreV1Api(control_plane.api_client()).delete_namespace(name)


@pytest.fixture
def dra_nodes(control_plane: ControlPlane) -> Iterator[list[str]]:
    """Two GPU nodes the device plugin has left (no GPU allocatable) with the driver's slices,
    and the driver's DeviceClass, as the dra component installs it."""
    client = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    nodes = [f"{GROUP}-{i}" for i in range(2)]
    for name in nodes:
        control_plane.create_gpu_node(name, 0, PRODUCT, GPU_MEMORY_MIB, labels={
            GROUP_LABEL: GROUP, NAMES.label_delivery: DELIVERY_DRA})
    create_device_class(resource, DEVICE_CLASS)
    try:
        for name in nodes:
            uid = core.read_node(name).metadata.uid
            gpus = [Gpu(i, f"GPU-{name}-{i}", PRODUCT, GPU_MEMORY_MIB) for i in range(GPUS)]
            resource.create_resource_slice(build_slice(name, DRIVER_NAME, gpus, {},
                                                       node_uid=uid))
        yield nodes
    finally:
        delete_nodes(control_plane, nodes)  # their slices go with them (owned by the Node)
        resource.delete_device_class(DEVICE_CLASS)


@pytest.fixture
def webhook(control_plane: ControlPlane, namespace: str, plain_namespace: str,
            tmp_path: Path) -> Iterator[AdmissionServer]:
    """The DRA rule for the test's two namespaces, of which only ``namespace`` is labelled:
    the selector is the component's (the delivery label), narrowed to them."""
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    core.patch_namespace(namespace, {"metadata": {"labels": {
        NAMES.label_delivery: DELIVERY_DRA}}})
    selector = {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In",
         "values": [namespace, plain_namespace]},
        {"key": NAMES.label_delivery, "operator": "In", "values": [DELIVERY_DRA]}]}
    templates = TemplateClient(control_plane.new_api_client(), timeout_s=2.0)
    with registered_webhook(control_plane, namespace, tmp_path / "pki", templates=templates,
                            selector=selector) as server:
        yield server


def _pod(name: str, resources: dict[str, str], group: str = GROUP) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "nodeSelector": {GROUP_LABEL: group},
                     "containers": [{"name": "main", "image": "gpufrag-e2e:none",
                                     "resources": {"requests": {"cpu": "100m", **resources},
                                                   "limits": resources}}]}}


ASKS = {  # pod -> (its ask, the template's shape)
    "share": ({NAMES.gpu_milli: "250"}, Shape(1, 250)),
    "memory": ({NAMES.gpu_memory: "10240"}, Shape(1, 1, 10240)),
    "whole": ({NAMES.gpu: "1"}, Shape(1)),
}


def test_gpu_asks_in_a_dra_namespace_become_claims_that_are_allocated_and_bound(
        control_plane: ControlPlane, namespace: str, plain_namespace: str,
        dra_nodes: list[str], webhook: AdmissionServer) -> None:
    client = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    try:
        for name, (ask, _) in ASKS.items():
            core.create_namespaced_pod(namespace, _pod(name, ask))

        def allocated() -> dict[str, tuple[Any, dict[str, Any]]] | None:
            found = {}
            for pod in core.list_namespaced_pod(namespace).items:
                statuses = pod.status.resource_claim_statuses or []
                if not pod.spec.node_name or len(statuses) != 1:
                    return None
                claim = client.sanitize_for_serialization(
                    resource.read_namespaced_resource_claim(statuses[0].resource_claim_name,
                                                            namespace))
                if not (claim.get("status") or {}).get("allocation"):
                    return None
                found[pod.metadata.name] = (pod, claim)
            return found if len(found) == len(ASKS) else None

        found = wait_until(allocated, timeout_s=90, what="the converted pods bound and allocated")
        for name, (pod, claim) in found.items():
            ask, shape = ASKS[name]
            template = template_for(shape)
            (entry,) = pod.spec.resource_claims
            assert entry.resource_claim_template_name == template.name, name
            (container,) = pod.spec.containers
            assert [c.name for c in container.resources.claims] == [entry.name], name
            assert not set(ask) & set(container.resources.requests or {}), name
            assert not set(ask) & set(container.resources.limits or {}), name
            # Made from the template by the controller-manager, allocated by the scheduler.
            assert claim["metadata"]["ownerReferences"][0]["name"] == name
            (gpu,) = claimed_gpus(claim, driver=DRIVER_NAME) or ()
            assert gpu.pool == pod.spec.node_name, name
            assert (gpu.milli, gpu.memory_mib) == (shape.milli, shape.memory_mib), name
        made = {t.metadata.name for t in
                resource.list_namespaced_resource_claim_template(namespace).items}
        assert made == {template_for(shape).name for _, shape in ASKS.values()}

        # The same asks in a namespace without the label: not sent to the webhook, unchanged.
        ask = ASKS["share"][0]
        plain = core.create_namespaced_pod(plain_namespace, _pod("plain", ask, group="none"))
        assert plain.spec.resource_claims is None
        assert plain.spec.containers[0].resources.limits == ask

        # A dry run answers the converted pod and makes no template.
        dry = core.create_namespaced_pod(namespace, _pod("dry", {NAMES.gpu_milli: "400"}),
                                         dry_run="All")
        dry_template = template_for(Shape(1, 400)).name
        assert dry.spec.resource_claims[0].resource_claim_template_name == dry_template
        with pytest.raises(ApiException) as gone:
            resource.read_namespaced_resource_claim_template(dry_template, namespace)
        assert gone.value.status == 404

        metric = webhook.metrics.registry.get_sample_value
        assert metric("gpufrag_admission_dra_conversions_total",
                      {"result": "converted"}) == len(ASKS) + 1
        assert metric("gpufrag_admission_dra_templates_made_total") == len(ASKS)
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        core.delete_collection_namespaced_pod(plain_namespace, grace_period_seconds=0)


def test_a_template_made_under_the_webhooks_name_with_another_spec_refuses_the_pod(
        control_plane: ControlPlane, namespace: str, webhook: AdmissionServer,
        tmp_path: Path) -> None:
    """A namespace user (the built-in ``edit`` role) may create ResourceClaimTemplates; one
    that took the name the webhook gives a shape, with a selector pinning one device, would
    steer every such pod's ask."""
    resource = kubernetes.client.ResourceV1Api(control_plane.api_client())
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    tenant = kubernetes.client.ResourceV1Api(tenant_client(control_plane, namespace, tmp_path))
    template = template_for(Shape(1, 300))
    steered = template.body(namespace)
    steered["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": f'device.attributes["{DRIVER_NAME}"].index == 0'}}]
    tenant.create_namespaced_resource_claim_template(namespace, steered)
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(namespace, _pod("steered", {NAMES.gpu_milli: "300"}))
    assert refused.value.status == 409
    assert (f"ResourceClaimTemplate {namespace}/{template.name} exists with a spec other"
            in refused.value.body)
    assert webhook.metrics.registry.get_sample_value(
        "gpufrag_admission_dra_conversions_total", {"result": "template_conflict"}) == 1
    # Deleted, the webhook makes its own and the pod is admitted.
    resource.delete_namespaced_resource_claim_template(template.name, namespace)
    try:
        admitted = core.create_namespaced_pod(namespace, _pod("steered", {NAMES.gpu_milli: "300"}))
        assert admitted.spec.resource_claims[0].resource_claim_template_name == template.name
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)


def test_while_the_webhook_is_down_pods_of_a_dra_namespace_are_refused_not_left_pending(
        control_plane: ControlPlane, namespace: str, webhook: AdmissionServer) -> None:
    """failurePolicy Fail (docs/dra.md): admitted unconverted, the pod would ask resources no
    DRA node advertises and stay pending; refused, its controller retries."""
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    webhook.stop()
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(namespace, _pod("unserved", {NAMES.gpu_milli: "250"}))
    assert refused.value.status == 500
    assert 'failed calling webhook "claims.gpufrag.io"' in json.loads(
        refused.value.body)["message"]
    assert not core.list_namespaced_pod(namespace).items
