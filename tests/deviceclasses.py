"""The DeviceClass the e2e tests make for gpufrag's DRA driver, fresh each time."""

from __future__ import annotations

from contextlib import suppress

import kubernetes

from scheduler.kube.claims import gpu_selector


def create_device_class(resource: kubernetes.client.ResourceV1Api, name: str, *,
                        selector: str = "", **spec: str) -> None:
    """A DeviceClass ``name`` selecting ``selector`` (default: the driver's GPUs outside MIG
    mode, as the install's gpu.gpufrag.io does; ``spec``: more of its fields), replacing one a
    crashed run left."""
    with suppress(kubernetes.client.ApiException):
        resource.delete_device_class(name)
    resource.create_device_class({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
        "spec": {**spec, "selectors": [{"cel": {"expression": selector or gpu_selector()}}]}})
