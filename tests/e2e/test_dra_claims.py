"""Pods that ask ``gpufrag.io/gpu-milli``, ``gpufrag.io/gpu-memory-mib`` or ``nvidia.com/gpu``
keep working unchanged in a namespace with DRA delivery: the webhook (``/mutate-dra``,
registered as the dra-claims component registers it: failurePolicy Fail, sideEffects
NoneOnDryRun, namespaces labelled ``gpufrag.io/delivery=dra``) moves each ask into a claim
made from a ResourceClaimTemplate it creates; kube-controller-manager's resourceclaim
controller makes the claim, kube-scheduler's allocator allocates it on the devices of the
driver's ResourceSlices (published on fake nodes as ``node.dra.slices`` builds them) and the
pod binds. A pod asking ``nvidia.com/mig-3g.40gb`` gets a claim of the profile's class,
allocated on a partition of that profile of a fake node whose GPUs are in MIG mode (the
driver's partitionable devices); a profile the MIG table lacks is refused. A pod of an
unlabelled namespace is not touched; a template someone made under the webhook's name with
another spec refuses the pod; a dry run makes no template.

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
from node.dra.slices import build_slice, build_slices
from node.gpus import Gpu
from scheduler.kube.claims import (
    DRIVER_NAME,
    claimed_gpus,
    claimed_partitions,
    mig_class_name,
    mig_selector,
)
from scheduler.kube.mignodes import mig_resource
from tests.deviceclasses import create_device_class
from tests.tenants import tenant_client
from tests.webhooks import registered_webhook

GROUP = "dra-claims"
PRODUCT, GPU_MEMORY_MIB, GPUS = "A100", 81_920, 2
MIG_GROUP, MIG_PRODUCT, MIG_PROFILE = f"{GROUP}-mig", "NVIDIA A100-SXM4-80GB", "3g.40gb"
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
def mig_node(control_plane: ControlPlane) -> Iterator[str]:
    """A GPU node whose two A100 80GB GPUs are in MIG mode, with the driver's slices (a
    counter set of memory slices per GPU, a device per legal placement) and the class of
    ``MIG_PROFILE`` as the dra component installs it."""
    client = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    name, device_class = f"{MIG_GROUP}-0", mig_class_name(MIG_PROFILE)
    control_plane.create_gpu_node(name, 0, MIG_PRODUCT, GPU_MEMORY_MIB, labels={
        GROUP_LABEL: MIG_GROUP, NAMES.label_delivery: DELIVERY_DRA})
    create_device_class(resource, device_class, selector=mig_selector(MIG_PROFILE))
    try:
        uid = core.read_node(name).metadata.uid
        gpus = [Gpu(i, f"GPU-{name}-{i}", MIG_PRODUCT, GPU_MEMORY_MIB) for i in range(GPUS)]
        for body in build_slices(name, DRIVER_NAME, gpus, dict.fromkeys(range(GPUS), True),
                                 node_uid=uid):
            resource.create_resource_slice(body)
        yield name
    finally:
        delete_nodes(control_plane, [name])  # its slices go with it (owned by the Node)
        resource.delete_device_class(device_class)


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


def allocated_pods(client: Any, namespace: str, count: int
                   ) -> dict[str, tuple[Any, dict[str, Any]]] | None:
    """The ``count`` pods of ``namespace`` with their one claim each, once every one is bound
    and its claim allocated (None until then)."""
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    found = {}
    for pod in core.list_namespaced_pod(namespace).items:
        statuses = pod.status.resource_claim_statuses or []
        if not pod.spec.node_name or len(statuses) != 1:
            return None
        claim = client.sanitize_for_serialization(
            resource.read_namespaced_resource_claim(statuses[0].resource_claim_name, namespace))
        if not (claim.get("status") or {}).get("allocation"):
            return None
        found[pod.metadata.name] = (pod, claim)
    return found if len(found) == count else None


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
        found = wait_until(lambda: allocated_pods(client, namespace, len(ASKS)), timeout_s=90,
                           what="the converted pods bound and allocated")
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


def test_a_mig_ask_in_a_dra_namespace_becomes_a_claim_allocated_on_a_partition_of_its_profile(
        control_plane: ControlPlane, namespace: str, mig_node: str,
        webhook: AdmissionServer) -> None:
    client = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    ask = {mig_resource(MIG_PROFILE): "1"}
    template = template_for(Shape(1, profile=MIG_PROFILE))
    try:
        core.create_namespaced_pod(namespace, _pod("mig", ask, group=MIG_GROUP))
        found = wait_until(lambda: allocated_pods(client, namespace, 1), timeout_s=90,
                           what="the converted MIG pod bound and allocated")
        pod, claim = found["mig"]
        (entry,) = pod.spec.resource_claims
        assert entry.resource_claim_template_name == template.name
        (container,) = pod.spec.containers
        assert [c.name for c in container.resources.claims] == [entry.name]
        assert not set(ask) & set(container.resources.requests or {})
        assert not set(ask) & set(container.resources.limits or {})
        stored = resource.read_namespaced_resource_claim_template(template.name, namespace)
        (request,) = stored.spec.spec.devices.requests
        assert (request.exactly.device_class_name, request.exactly.count) == (
            mig_class_name(MIG_PROFILE), 1)
        # Made from the template by the controller-manager, allocated by the scheduler on a
        # partition of the profile, on the MIG node the pod is bound to.
        assert claim["metadata"]["ownerReferences"][0]["name"] == "mig"
        (partition,) = claimed_partitions(claim, driver=DRIVER_NAME)
        assert partition.pool == pod.spec.node_name == mig_node
        assert partition.partition.profile == MIG_PROFILE
        assert claimed_gpus(claim, driver=DRIVER_NAME) == ()

        # A profile no GPU of the table has: refused with the reason, no pod made.
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod(namespace, _pod("unknown", {"nvidia.com/mig-5g.99gb": "1"},
                                                       group=MIG_GROUP))
        assert refused.value.status == 422
        assert "'5g.99gb' is not a MIG profile of any GPU gpufrag knows" in json.loads(
            refused.value.body)["message"]
        assert [p.metadata.name for p in core.list_namespaced_pod(namespace).items] == ["mig"]
        metric = webhook.metrics.registry.get_sample_value
        assert metric("gpufrag_admission_dra_conversions_total", {"result": "converted"}) == 1
        assert metric("gpufrag_admission_dra_conversions_total",
                      {"result": "bad_request"}) == 1
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)


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
