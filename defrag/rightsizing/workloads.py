"""Pods -> their workload's controller, through the Kubernetes API (reads and the one write).

A workload is what a recommendation is kept for: the pod's controlling owner, except that a
ReplicaSet controlled by a Deployment stands for that Deployment (a Deployment's recommendation
survives its rollouts; the ReplicaSet of each revision is new). Supported kinds: Deployment,
ReplicaSet, StatefulSet, DaemonSet, Job. A bare pod, or one whose owner is another kind, has no
workload here: right-sizing leaves it alone.

The defrag controller resolves pods, patches the recommendation annotation
(:meth:`WorkloadClient.patch_annotation`: a merge patch of one key) and records a Warning Event
on a workload the right-sizing guard raised (:meth:`WorkloadClient.event`); the admission
webhook only reads. RBAC: ``get`` on those kinds; ``patch`` on them and ``create`` on events for
the controller.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kubernetes

from scheduler.kube.events import Involved, create_event, warning_event

SUPPORTED_KINDS = ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job")


@dataclass(frozen=True, slots=True)
class OwnerRef:
    kind: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Workload:
    kind: str
    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


def controller_ref(owner_references: Any) -> OwnerRef | None:
    """The ``controller: true`` owner in a pod's (or any object's) ownerReferences, as dicts
    (camelCase, from an AdmissionReview) or as client models."""
    for ref in owner_references or ():
        get = ref.get if isinstance(ref, Mapping) else (lambda k, r=ref: getattr(r, k, None))
        if get("controller"):
            return OwnerRef(str(get("kind") or ""), str(get("name") or ""), str(get("uid") or ""))
    return None


class WorkloadClient:
    """Reads controllers (and patches the recommender's annotation) with one ApiClient."""

    def __init__(self, api_client: Any, *, timeout_s: float = 5.0,
                 component: str = "gpufrag-defrag") -> None:
        self._apps = kubernetes.client.AppsV1Api(api_client)
        self._batch = kubernetes.client.BatchV1Api(api_client)
        self._core = kubernetes.client.CoreV1Api(api_client)
        self._component = component
        self._timeout_s = timeout_s

    def _api(self, kind: str) -> tuple[Any, str]:
        suffix = {"Deployment": "deployment", "ReplicaSet": "replica_set",
                  "StatefulSet": "stateful_set", "DaemonSet": "daemon_set", "Job": "job"}[kind]
        return (self._batch if kind == "Job" else self._apps), suffix

    def read(self, kind: str, namespace: str, name: str) -> Any | None:
        """The object, or None when it does not exist (404); other API errors raise."""
        api, suffix = self._api(kind)
        try:
            return getattr(api, f"read_namespaced_{suffix}")(
                name, namespace, _request_timeout=self._timeout_s)
        except kubernetes.client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def resolve(self, namespace: str, owner_references: Any) -> Workload | None:
        """The workload of a pod with these ownerReferences, or None (bare pod, unsupported
        kind, owner gone)."""
        ref = controller_ref(owner_references)
        if ref is None or ref.kind not in SUPPORTED_KINDS:
            return None
        obj = self.read(ref.kind, namespace, ref.name)
        if obj is None:
            return None
        if ref.kind == "ReplicaSet":
            parent = controller_ref(obj.metadata.owner_references)
            if parent is not None and parent.kind == "Deployment":
                deployment = self.read("Deployment", namespace, parent.name)
                if deployment is not None:
                    obj, ref = deployment, parent
        meta = obj.metadata
        return Workload(ref.kind, namespace, meta.name, meta.uid or ref.uid,
                        dict(meta.annotations or {}))

    def patch_annotation(self, workload: Workload, key: str, value: str) -> None:
        api, suffix = self._api(workload.kind)
        getattr(api, f"patch_namespaced_{suffix}")(
            workload.name, workload.namespace, {"metadata": {"annotations": {key: value}}},
            _request_timeout=self._timeout_s)

    def event(self, workload: Workload, reason: str, message: str) -> None:
        """A Warning Event on the workload's controller (``kubectl describe`` shows it), at
        most one per workload and reason an hour (:mod:`scheduler.kube.events`): every cycle
        is a new process, so the API server's 409 is what remembers the last one."""
        namespace, body = warning_event(
            Involved(workload.kind, workload.name, workload.namespace, workload.uid,
                     api_version="batch/v1" if workload.kind == "Job" else "apps/v1"),
            reason=reason, message=message, component=self._component,
            instance=self._component, now_s=time.time())
        create_event(self._core, namespace, body, timeout_s=self._timeout_s)
