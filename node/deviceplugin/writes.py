"""Every write the device plugin makes to the cluster.

Two writes, so its RBAC is short (``manifests/base/rbac-deviceplugin.yaml``):

- ``patch`` on ``pods``: the ``gpufrag.io/gpu-allocated`` annotation (a JSON merge patch that
  touches only that key, carrying the pod's UID so a pod re-created under the same name is never
  marked for its predecessor);
- ``create`` on ``events``: a Warning on a pod whose GPU annotation the plugin cannot honour
  (built and deduplicated by :mod:`scheduler.kube.events`).

(Its one read, list + watch of the pods on its node, is :mod:`node.deviceplugin.pods`.)
:class:`PodWriter` is the seam; tests record calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kubernetes.client import CoreV1Api

from gpufrag.records import allocated_text
from node.deviceplugin.matching import PodAsk
from scheduler.kube.errors import ApiError, api_errors
from scheduler.kube.events import Involved, create_event, warning_event

COMPONENT = "gpufrag-device-plugin"
REASON_REFUSED = "GPUAllocationRefused"


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

        def patch() -> None:
            # Any: with _preload_content=False the call returns the raw response.
            resp: Any = self._core.patch_namespaced_pod(
                pod.name, pod.namespace, body, _content_type="application/merge-patch+json",
                _request_timeout=self._timeout_s, _preload_content=False)
            try:
                resp.data  # noqa: B018  read to the end before the connection goes back
            finally:
                resp.release_conn()

        self._call(f"marking pod {pod.key} allocated ({key})", "patch pods", patch)

    def warn(self, pod: PodAsk, message: str, *, now: float) -> None:
        """A Warning on the pod, at most one per pod an hour (:mod:`scheduler.kube.events`:
        the kubelet may ask again for a pod it keeps admitting)."""
        namespace, body = warning_event(
            Involved("Pod", pod.name, pod.namespace, pod.uid), reason=REASON_REFUSED,
            message=message, component=COMPONENT, instance=f"{COMPONENT}-{self._node_name}",
            host=self._node_name, now_s=now)
        self._call(f"creating event {REASON_REFUSED} on pod {pod.key}", "create events",
                   lambda: create_event(self._core, namespace, body, timeout_s=self._timeout_s))

    @staticmethod
    def _call(what: str, verb: str, fn: Callable[[], object]) -> None:
        try:
            with api_errors(what):
                fn()
        except ApiError as exc:
            if exc.status in (401, 403):
                # The server's message says which: RBAC (no '{verb}') or the pod-write
                # admission policy (only gpu-allocated, only on its own node's pods).
                said = f": {exc.message}" if exc.message else ""
                raise PodWriteError(f"{what}: HTTP {exc.status}{said}; the device plugin's "
                                    f"ServiceAccount needs RBAC '{verb}', and the pod-write "
                                    f"policy lets it mark only pods on its own node (see "
                                    f"docs/deviceplugin.md, docs/security.md)",
                                    retryable=False) from None
            raise PodWriteError(str(exc), retryable=exc.retryable) from None
