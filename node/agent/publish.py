"""Every write the node agent makes to the cluster, and the rule for when to make it.

Two writes, so the agent's RBAC is short and obvious:

- ``patch`` on ``nodes`` (its own Node): the ``gpufrag.io/gpu-usage`` annotation, as a JSON
  merge patch that touches only that key;
- ``create`` on ``events`` (core/v1, in the pod's namespace, or ``default`` for the Node's):
  ``GPUMemoryGrowth``, ``GPUMemoryOverShare``, ``GPUAllocationMismatch`` and
  ``GPUProcessWithoutPod`` warnings, built and deduplicated (one per object and reason within
  :data:`EVENT_WINDOW_S`: a second one is refused as already there, which also covers a
  restarted agent) by :mod:`scheduler.kube.events`.

(Its one read, ``list`` on ``pods`` with ``fieldSelector=spec.nodeName``, lives with the pid ->
pod lookup in :mod:`node.agent.cgroup`.)

:class:`ClusterWriter` is the seam: :class:`KubeClusterWriter` talks to a real
``kubernetes.client.ApiClient``; :class:`LogOnlyWriter` (``--dry-run``) logs instead; tests
record calls. :class:`Publisher` decides *whether* to write (changed beyond tolerance, or the
last write is older than the refresh period) and is the same whichever writer it holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from kubernetes.client import ApiClient, CoreV1Api
from structlog.typing import FilteringBoundLogger

from gpufrag.conventions import ANNOTATION_GPU_USAGE
from gpufrag.gpu_usage import NodeGpuUsage
from node.agent.cgroup import PodRef
from scheduler.kube.errors import ApiError, api_errors
from scheduler.kube.events import (
    CLUSTER_EVENT_NAMESPACE,
    WARNING,
    Involved,
    create_event,
    warning_event,
)

COMPONENT = "gpufrag-agent"
# The agent's Event window: the isolation check's cooldown (node.agent.isolation), so a pod that
# flaps across its share still gets the one Event per cooldown that check decides on.
EVENT_WINDOW_S = 600.0
EVENT_REASON_GPU_MEMORY_GROWTH = "GPUMemoryGrowth"
# A GPU process that belongs to no live pod (a GPU's strays: gpufrag.gpu_usage), on the Node.
EVENT_REASON_GPU_PROCESS_WITHOUT_POD = "GPUProcessWithoutPod"
EVENT_REASON_GPU_MEMORY_OVER_SHARE = "GPUMemoryOverShare"
# The device plugin gave a pod GPUs other than its gpu-indices record (gpufrag.records).
EVENT_REASON_GPU_ALLOCATION_MISMATCH = "GPUAllocationMismatch"
EVENT_TYPE_WARNING = WARNING


class PublishError(RuntimeError):
    """A write failed. ``retryable`` says whether the next interval may succeed by itself;
    when False the message says what to fix (node name, RBAC)."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class ClusterWriter(Protocol):
    def patch_node_annotation(self, node: str, key: str, value: str) -> None: ...

    def create_pod_event(self, pod: PodRef, *, reason: str, message: str, event_type: str,
                         now: float) -> None: ...

    def create_node_event(self, *, reason: str, message: str, event_type: str,
                          now: float, about: str = "") -> None: ...


class KubeClusterWriter:
    """:class:`ClusterWriter` over a ``kubernetes.client.ApiClient`` (in-cluster or kubeconfig)."""

    def __init__(self, api_client: ApiClient, *, node_name: str, component: str = COMPONENT,
                 request_timeout_s: float = 10.0, event_window_s: float = EVENT_WINDOW_S) -> None:
        self._core = CoreV1Api(api_client)
        self._event_window_s = event_window_s
        self._node_name = node_name
        self._component = component
        self._request_timeout_s = request_timeout_s

    def patch_node_annotation(self, node: str, key: str, value: str) -> None:
        body = {"metadata": {"annotations": {key: value}}}
        with _api_errors(f"patching annotation {key} on node {node!r}", verb="patch nodes",
                         not_found=f"node {node!r} does not exist; check --node-name / NODE_NAME"):
            # Name the patch type: client releases differ in what they pick for a dict body.
            self._core.patch_node(node, body, _content_type="application/merge-patch+json",
                                  _request_timeout=self._request_timeout_s)

    def create_pod_event(self, pod: PodRef, *, reason: str, message: str, event_type: str,
                         now: float) -> None:
        self._create_event(
            Involved("Pod", pod.name, pod.namespace, pod.uid), reason=reason, message=message,
            event_type=event_type, now=now, what=f"pod {pod.namespace}/{pod.name}",
            not_found=f"namespace {pod.namespace!r} is gone")

    def create_node_event(self, *, reason: str, message: str, event_type: str,
                          now: float, about: str = "") -> None:
        self._create_event(
            # uid = the node's name, as the kubelet's node reference has it (kubectl describe
            # node finds the Event by it)
            Involved("Node", self._node_name, uid=self._node_name), reason=reason,
            message=message, event_type=event_type, now=now, about=about,
            what=f"node {self._node_name}",
            not_found=f"namespace {CLUSTER_EVENT_NAMESPACE!r} is gone")

    def _create_event(self, involved: Involved, *, reason: str, message: str,
                      event_type: str, now: float, what: str, not_found: str,
                      about: str = "") -> None:
        namespace, body = warning_event(
            involved, reason=reason, message=message, component=self._component,
            instance=f"{self._component}-{self._node_name}", host=self._node_name, now_s=now,
            about=about, event_type=event_type, window_s=self._event_window_s)
        with _api_errors(f"creating event {reason} on {what}", verb="create events",
                         not_found=not_found):
            create_event(self._core, namespace, body, timeout_s=self._request_timeout_s)


@contextmanager
def _api_errors(what: str, *, verb: str, not_found: str) -> Iterator[None]:
    """Map API failures (classified once, in :mod:`scheduler.kube.errors`) to
    :class:`PublishError`, with the fix in the message."""
    try:
        with api_errors(what):
            yield
    except ApiError as exc:
        if exc.status == 404:
            raise PublishError(f"{what}: {not_found}", retryable=False) from None
        if exc.status in (401, 403):
            # The server's message says which: RBAC (no '{verb}') or the node-write admission
            # policy (anything but this Node's usage annotation; docs/security.md).
            said = f": {exc.message}" if exc.message else ""
            raise PublishError(
                f"{what}: HTTP {exc.status}{said}; the agent's ServiceAccount needs RBAC "
                f"'{verb}', and the node-write policy lets it change only its own Node's usage "
                "annotation (see docs/agent.md, docs/security.md)",
                retryable=False,
            ) from None
        raise PublishError(str(exc), retryable=exc.retryable) from None


class LogOnlyWriter:
    """``--dry-run``: log what would be written; write nothing."""

    def __init__(self, log: FilteringBoundLogger) -> None:
        self._log = log

    def patch_node_annotation(self, node: str, key: str, value: str) -> None:
        self._log.info("dry_run_patch_node", node=node, key=key, bytes=len(value))

    def create_pod_event(self, pod: PodRef, *, reason: str, message: str, event_type: str,
                         now: float) -> None:
        self._log.info("dry_run_create_event", namespace=pod.namespace, pod=pod.name,
                       reason=reason, type=event_type, message=message)

    def create_node_event(self, *, reason: str, message: str, event_type: str,
                          now: float, about: str = "") -> None:
        self._log.info("dry_run_create_event", kind="Node", reason=reason, type=event_type,
                       message=message)


@dataclass(frozen=True, slots=True)
class PublishPolicy:
    """When a reading is worth a write: see :meth:`NodeGpuUsage.changed_beyond`."""

    tolerance_mib: int
    tolerance_pct: int
    refresh_s: float

    def reason(self, usage: NodeGpuUsage, last: NodeGpuUsage | None,
               last_at: float | None) -> str | None:
        """``"first"``, ``"changed"``, ``"refresh"``, or None to skip this write."""
        if last is None or last_at is None:
            return "first"
        if usage.changed_beyond(last, self.tolerance_mib, self.tolerance_pct):
            return "changed"
        if usage.timestamp - last_at >= self.refresh_s:
            return "refresh"
        return None


class Publisher:
    """Writes the node's usage annotation when :class:`PublishPolicy` says so."""

    def __init__(self, writer: ClusterWriter, policy: PublishPolicy, *,
                 annotation_key: str = ANNOTATION_GPU_USAGE) -> None:
        self._writer = writer
        self._policy = policy
        self._annotation_key = annotation_key
        self._last: NodeGpuUsage | None = None
        self._last_at: float | None = None

    @property
    def last_published_at(self) -> float | None:
        return self._last_at

    def publish(self, usage: NodeGpuUsage) -> str | None:
        """Write ``usage`` if due; returns why it was written, or None if skipped.

        On :class:`PublishError` nothing is remembered, so the next interval tries again.
        """
        reason = self._policy.reason(usage, self._last, self._last_at)
        if reason is None:
            return None
        self._writer.patch_node_annotation(usage.node, self._annotation_key, usage.to_json())
        self._last = usage
        self._last_at = usage.timestamp
        return reason

    def report_pod(self, pod: PodRef, reason: str, message: str, now: float) -> None:
        """A Warning Event on ``pod``: ``reason`` is one of the agent's pod Event reasons
        (``GPUMemoryGrowth``, ``GPUMemoryOverShare``, ``GPUAllocationMismatch``)."""
        self._writer.create_pod_event(pod, reason=reason, message=message,
                                      event_type=EVENT_TYPE_WARNING, now=now)

    def report_stray(self, message: str, now: float, *, about: str = "") -> None:
        """On the Node; ``about`` (the process and GPU) makes each stray its own Event."""
        self._writer.create_node_event(reason=EVENT_REASON_GPU_PROCESS_WITHOUT_POD,
                                       message=message, event_type=EVENT_TYPE_WARNING, now=now,
                                       about=about)
