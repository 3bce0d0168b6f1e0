"""The kubelet stand-in: bound pods become Running and Ready, deleted pods go away.

Fake GPU nodes have no kubelet, so this thread writes the two effects of one that tests and
Deployments, PDBs and evictions depend on.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any, Final

import kubernetes

from devkit.procs import ControlPlaneError, close_client

_MERGE_PATCH: Final = "application/merge-patch+json"
_STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"


# --------------------------------------------------------------------------------------------
# The pod completer (stands in for the kubelet)


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pending(pod: kubernetes.client.V1Pod) -> bool:
    return pod.status is None or pod.status.phase in (None, "Pending")


def running_status_patch(pod: kubernetes.client.V1Pod) -> dict[str, Any]:
    """The status a kubelet would report once every container of ``pod`` runs and is ready."""
    now = now_rfc3339()
    conditions = [{"type": t, "status": "True", "lastTransitionTime": now}
                  for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")]
    containers = [{"name": c.name, "image": c.image, "imageID": "", "ready": True, "started": True,
                   "restartCount": 0, "state": {"running": {"startedAt": now}}}
                  for c in (pod.spec.containers if pod.spec is not None else [])]
    return {"status": {"phase": "Running", "startTime": now, "hostIP": "127.0.0.1",
                       "conditions": conditions, "containerStatuses": containers}}


class PodCompleter:
    """Does what a kubelet's pods would visibly do, for every pod in the cluster.

    - A pod with a deletionTimestamp is deleted with grace period 0: without a kubelet to
      confirm the containers stopped, it would stay Terminating forever, and neither an eviction
      nor a Deployment roll-out would ever finish.
    - A pod bound to a node that is still Pending is marked Running and Ready, so Deployments
      count it available and PodDisruptionBudgets count it healthy.

    It lists, then watches from the list's resourceVersion, and relists when the watch expires.
    Errors are kept in :attr:`errors` (the last few) rather than raised: the thread must outlive
    a restarting API server, and tests can assert on it.
    """

    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        self._api_client = api_client  # its own: a watch holds a connection for seconds
        self._core = kubernetes.client.CoreV1Api(api_client)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pod-completer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            if not self._thread.is_alive():
                close_client(self._api_client)

    def _note(self, message: str) -> None:
        self.errors = [*self.errors[-19:], message]

    def _run(self) -> None:
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    pods = self._core.list_pod_for_all_namespaces(_request_timeout=10)
                    for pod in pods.items:
                        self.reconcile(pod)
                    resource_version = pods.metadata.resource_version if pods.metadata else None
                    if resource_version is None:
                        raise ControlPlaneError("pod list carried no resourceVersion")
                for event_type, pod in self._watch(resource_version):
                    if self._stop.is_set():
                        break
                    if pod.metadata is not None and pod.metadata.resource_version:
                        resource_version = pod.metadata.resource_version
                    if event_type in ("ADDED", "MODIFIED"):
                        self.reconcile(pod)
            except kubernetes.client.ApiException as e:
                if e.status == 410:  # watch too old: start over from a fresh list
                    resource_version = None
                else:
                    self._note(f"pod watch: HTTP {e.status} {e.reason}")
                    self._stop.wait(0.5)
            except Exception as e:  # connection refused while the API server stops, etc.
                if self._stop.is_set():
                    break
                self._note(f"pod watch: {e!r}")
                resource_version = None
                self._stop.wait(0.5)

    def _watch(self, resource_version: str) -> Iterator[tuple[str, kubernetes.client.V1Pod]]:
        """Pod events from ``resource_version`` on, for at most 2 s (a short server-side timeout
        bounds how long stop() waits for this thread)."""
        watch_class: Any = kubernetes.watch.Watch  # the watch module carries no type hints
        for event in watch_class().stream(
                self._core.list_pod_for_all_namespaces, resource_version=resource_version,
                timeout_seconds=2, allow_watch_bookmarks=True, _request_timeout=10):
            pod = event["object"]
            if isinstance(pod, kubernetes.client.V1Pod):  # BOOKMARKs arrive as plain dicts
                yield str(event["type"]), pod

    def reconcile(self, pod: kubernetes.client.V1Pod) -> None:
        """Move one pod one step the way its kubelet would."""
        meta = pod.metadata
        if meta is None or meta.name is None or meta.namespace is None:
            return
        try:
            if meta.deletion_timestamp is not None:
                self._core.delete_namespaced_pod(
                    meta.name, meta.namespace, grace_period_seconds=0,
                    body=kubernetes.client.V1DeleteOptions(
                        grace_period_seconds=0,
                        preconditions=kubernetes.client.V1Preconditions(uid=meta.uid)))
            elif pod.spec is not None and pod.spec.node_name and _pending(pod):
                self._core.patch_namespaced_pod_status(
                    meta.name, meta.namespace, running_status_patch(pod),
                    _content_type=_STRATEGIC_MERGE_PATCH)
        except kubernetes.client.ApiException as e:
            if e.status not in (404, 409):  # gone already, or a newer version of it exists
                self._note(f"{meta.namespace}/{meta.name}: HTTP {e.status} {e.reason}")


