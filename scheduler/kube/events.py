"""Warning Events on Kubernetes objects: the one home of the core/v1 Event body gpufrag writes,
and of its deduplication by (object, reason) within a window.

Four components put Events on objects: the extender (objects it cannot read, pods placed
without it: :mod:`scheduler.kube.skipreport`), the node agent (memory growth, over a share, GPU
processes of no pod, GPUs given other than recorded), the device plugin (an allocation it
refuses) and the defrag controller's right-sizing (a workload's share raised). Each builds its
body with :func:`warning_event` and creates it with its own client and RBAC.

**Deduplication lives in the Event's name**, ``<object>.<16 hex digits>`` of a hash of the
object (kind, UID or namespace/name), the reason (with ``about`` where one object has several
things to report under one reason) and the window (``floor(now / window_s)``):
a second report of the same object and reason in the same window -- from the same process,
another replica, or a restarted one (the defrag controller is a CronJob: every cycle is a new
process) -- is refused by the API server with 409 AlreadyExists, which every writer takes as
"already reported" (:func:`is_duplicate`). Nothing is remembered on the client. client-go's
recorder aggregates similar Events on the client instead; it does not exist in Python, and
its state would not survive a CronJob's cycle anyway. Windows are wall-clock buckets, so a
report just before a bucket ends and one just after it may both be written: at most two per
window. The default window is the API server's default Event TTL (``--event-ttl``, 1 h), so
an object that keeps the problem keeps one live Event.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from scheduler.kube.errors import ApiError

DEFAULT_WINDOW_S: Final = 3600.0
EVENT_MESSAGE_CHARS: Final = 1024  # the events.k8s.io limit on a note
EVENT_INSTANCE_CHARS: Final = 128  # the limit on reportingInstance
# Events about a cluster-scoped object (a Node) go to this namespace, as the kubelet's do.
CLUSTER_EVENT_NAMESPACE: Final = "default"
HTTP_CONFLICT: Final = 409
WARNING: Final = "Warning"

_NOT_IN_A_NAME = re.compile(r"[^a-z0-9.-]+")


@dataclass(frozen=True, slots=True)
class Involved:
    """The object an Event is about (``involvedObject``); ``namespace`` empty for a
    cluster-scoped one."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = "v1"

    def reference(self) -> dict[str, str]:
        ref = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            ref["namespace"] = self.namespace
        if self.uid:
            ref["uid"] = self.uid
        return ref

    @property
    def identity(self) -> str:
        return f"{self.kind}/{self.uid or f'{self.namespace}/{self.name}'}"


def event_name(involved: Involved, reason: str, *, now_s: float,
               window_s: float = DEFAULT_WINDOW_S, about: str = "") -> str:
    """``<object>.<16 hex digits>``: one name per object, reason (and ``about``) and window,
    always a valid DNS subdomain of at most 253 characters."""
    prefix = _NOT_IN_A_NAME.sub("-", involved.name.lower())[:200].strip(".-") or "object"
    window = math.floor(now_s / window_s)
    digest = hashlib.sha256(
        f"{involved.identity}/{reason}/{about}/{window}".encode()).hexdigest()
    return f"{prefix}.{digest[:16]}"


def warning_event(involved: Involved, *, reason: str, message: str, component: str,
                  instance: str, now_s: float, host: str = "", about: str = "",
                  window_s: float = DEFAULT_WINDOW_S, event_type: str = WARNING
                  ) -> tuple[str, dict[str, Any]]:
    """The namespace and body (the API's JSON shape) of a core/v1 Event (a Warning unless
    ``event_type`` says otherwise) on ``involved``, named by :func:`event_name`. ``about``
    tells apart what one object can have several of under one reason (a Node's stray
    processes: each its own Event); leave it empty for one Event per object and reason."""
    namespace = involved.namespace or CLUSTER_EVENT_NAMESPACE
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_s))
    source = {"component": component, **({"host": host} if host else {})}
    return namespace, {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name(involved, reason, now_s=now_s, window_s=window_s,
                                        about=about),
                     "namespace": namespace},
        "involvedObject": involved.reference(),
        "type": event_type, "reason": reason,
        "message": message[:EVENT_MESSAGE_CHARS],
        "source": source,
        "reportingComponent": component,
        "reportingInstance": instance[:EVENT_INSTANCE_CHARS],
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


def create_event(core: CoreV1Api, namespace: str, body: Mapping[str, Any], *,
                 timeout_s: float) -> bool:
    """Create the Event :func:`warning_event` built; False when the API server already has it
    (this object and reason were reported in this window). Any other failure raises what the
    client raises, for the caller's own error mapping (RBAC, retries)."""
    try:
        # The client takes the API's JSON shape as well as its models; its stubs name only the
        # model.
        core.create_namespaced_event(namespace, cast(Any, body), _request_timeout=timeout_s)
    except ApiException as e:
        if e.status == HTTP_CONFLICT:
            return False
        raise
    return True


def is_duplicate(error: ApiError | None) -> bool:
    """The API refused an Event as already there: this object and reason were reported in this
    window (by this process or another)."""
    return error is not None and error.status == HTTP_CONFLICT


__all__ = ["CLUSTER_EVENT_NAMESPACE", "DEFAULT_WINDOW_S", "EVENT_INSTANCE_CHARS",
           "EVENT_MESSAGE_CHARS", "HTTP_CONFLICT", "WARNING", "Involved", "create_event",
           "event_name", "is_duplicate", "warning_event"]
