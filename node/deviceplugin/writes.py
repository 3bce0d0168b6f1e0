"""Every write the device plugin makes to the cluster.

Two writes, so its RBAC is short (``manifests/base/rbac-deviceplugin.yaml``):

- ``patch`` on ``pods``: the ``gpufrag.io/gpu-allocated`` annotation (a JSON merge patch that
  touches only that key, carrying the pod's UID so a pod re-created under the same name is never
  marked for its predecessor);
- ``create`` on ``events``: a Warning on a pod whose GPU annotation the plugin cannot honour.

(Its one read, list + watch of the pods on its node, is :mod:`node.deviceplugin.pods`.)
:class:`PodWriter` is the seam; tests record calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client import CoreV1Api

from gpufrag.records import allocated_text
from node.deviceplugin.matching import PodAsk
from scheduler.kube.errors import ApiError, api_errors

COMPONENT = "gpufrag-device-plugin"
REASON_REFUSED = "GPUAllocationRefused"
_MAX_EVENT_PREFIX = 253 - 17  # "<pod>.<unix nanos in hex>", as client-go names events


class PodWriteError(RuntimeError):
    """A write failed; the message says what to fix where the caller can."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class PodWriter(Protocol):
    def mark_allocated(self, pod: PodAsk, key: str, given: Mapping[str, tuple[str, ...]]) -> None:
        ...

    def warn(self, pod: PodAsk, message: str, *, now: float) -> None: ...


class KubePodWriter:
    """:class:`PodWriter` over a ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: Any, *, node_name: str, request_timeout_s: float = 5.0) -> None:
        self._core = CoreV1Api(api_client)
        self._node_name = node_name
        self._timeout_s = request_timeout_s

    def mark_allocated(self, pod: PodAsk, key: str, given: Mapping[str, tuple[str, ...]]) -> None:
        body = {"metadata": {"uid": pod.uid, "annotations": {key: allocated_text(given)}}}
        self._call(f"marking pod {pod.key} allocated ({key})", "patch pods",
                   lambda: self._core.patch_namespaced_pod(
                       pod.name, pod.namespace, body,
                       _content_type="application/merge-patch+json",
                       _request_timeout=self._timeout_s, _preload_content=False))

    def warn(self, pod: PodAsk, message: str, *, now: float) -> None:
        at = datetime.fromtimestamp(now, tz=UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{pod.name[:_MAX_EVENT_PREFIX]}.{int(now * 1e9):x}",
                                         namespace=pod.namespace),
            involved_object=client.V1ObjectReference(api_version="v1", kind="Pod",
                                                     namespace=pod.namespace, name=pod.name,
                                                     uid=pod.uid),
            reason=REASON_REFUSED, message=message[:1024], type="Warning", count=1,
            first_timestamp=at, last_timestamp=at,
            source=client.V1EventSource(component=COMPONENT, host=self._node_name),
            reporting_component=COMPONENT, reporting_instance=f"{COMPONENT}-{self._node_name}",
        )
        self._call(f"creating event {REASON_REFUSED} on pod {pod.key}", "create events",
                   lambda: self._core.create_namespaced_event(
                       pod.namespace, event, _request_timeout=self._timeout_s,
                       _preload_content=False))

    @staticmethod
    def _call(what: str, verb: str, fn: Any) -> None:
        try:
            with api_errors(what):
                resp = fn()
                try:
                    resp.data  # noqa: B018  read to the end before the connection goes back
                finally:
                    resp.release_conn()
        except ApiError as exc:
            if exc.status in (401, 403):
                raise PodWriteError(f"{what}: HTTP {exc.status}; the device plugin's "
                                    f"ServiceAccount needs RBAC '{verb}' (see "
                                    f"docs/deviceplugin.md)", retryable=False) from None
            raise PodWriteError(str(exc), retryable=exc.retryable) from None
