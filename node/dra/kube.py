"""The driver's API calls: read claims, read and write this node's ResourceSlices.

Through the typed ``resource.k8s.io/v1`` client (``ResourceV1Api``), with bodies and answers as
plain dicts in the API's own field names (the client's public ``sanitize_for_serialization``),
so the pure modules (:mod:`node.dra.slices`, :mod:`node.dra.claims`) read and build what the
API server sees, with no model classes in between. Every failure becomes
:class:`scheduler.kube.errors.ApiError` (the one mapping of API failures).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes.client import CoreV1Api, ResourceV1Api

from node.dra.slices import Obj
from scheduler.kube.errors import api_errors

REQUEST_TIMEOUT_S = 10.0


class KubeClaims:
    """:class:`node.dra.service.ClaimSource` over a ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: Any, *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self._client = api_client
        self._resource = ResourceV1Api(api_client)
        self._timeout_s = timeout_s

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        with api_errors(f"reading ResourceClaim {namespace}/{name}"):
            claim = self._resource.read_namespaced_resource_claim(
                name, namespace, _request_timeout=self._timeout_s)
        found: dict[str, Any] = self._client.sanitize_for_serialization(claim)
        return found


class KubeSlices:
    """:class:`node.dra.publish.SliceApi` over a ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: Any, *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self._client = api_client
        # Any: the bodies are plain dicts, which the client serializes as they are, where its
        # annotations name the model classes.
        self._resource: Any = ResourceV1Api(api_client)
        self._timeout_s = timeout_s

    def list(self, *, driver: str, node_name: str) -> list[Obj]:
        with api_errors(f"listing ResourceSlices of driver {driver} on node {node_name}"):
            found = self._resource.list_resource_slice(
                field_selector=f"spec.driver={driver},spec.nodeName={node_name}",
                _request_timeout=self._timeout_s)
        items: list[Obj] = self._client.sanitize_for_serialization(found.items)
        return items

    def create(self, body: Obj) -> None:
        with api_errors(f"creating ResourceSlice {body['metadata']['name']}"):
            self._resource.create_resource_slice(body, _request_timeout=self._timeout_s)

    def replace(self, name: str, body: Obj) -> None:
        with api_errors(f"replacing ResourceSlice {name}"):
            self._resource.replace_resource_slice(name, body, _request_timeout=self._timeout_s)

    def delete(self, name: str) -> None:
        with api_errors(f"deleting ResourceSlice {name}"):
            self._resource.delete_resource_slice(name, _request_timeout=self._timeout_s)


def node_uid(api_client: Any, node_name: str) -> str:
    """The Node's UID, so the slice can name the Node as its owner."""
    with api_errors(f"reading Node {node_name}"):
        node = CoreV1Api(api_client).read_node(node_name, _request_timeout=REQUEST_TIMEOUT_S)
    return str(node.metadata.uid) if node.metadata is not None and node.metadata.uid else ""
