"""GPU records that outlive what they were made for, found from one read of the cluster.

A ``GPUReservation`` holds GPU capacity for the replacement of an evicted pod until a pod of
its owner is bound on its node or it expires. Until then every other pod sees the share as
taken, so a reservation nobody can use any more blocks a GPU for nothing: the peers' trackers
are full of "a deleted pod's allocation blocked eight GPUs". This module names each such
record and why (:data:`REASONS`); ``gpufrag defrag`` releases the ones it made (the extender's
watch then frees the capacity) and ``gpufrag inspect`` shows them beside the GPU they hold.

Why each reason is safe to repair -- deleting a reservation never touches a pod, it only lets
other pods have the capacity:

- ``expired``: past ``expiresAt``, the extender ignores it already; deleting it is tidying.
- ``node_gone``: its node is not in the cluster, so no pod can ever use it there.
- ``owner_gone``: no pod of its owner (same controller UID in the owner's namespace) exists,
  pending or bound, and the reservation is older than ``grace_s``: the owner was deleted or
  scaled to zero after the eviction. The grace covers the moment between an eviction and
  the owner's controller creating the replacement (both pods are normally seen at once: the
  evicted one lingers while it terminates).
- ``unreadable``: the object cannot be read as a reservation (the extender skips it too).

A pod's own record can disagree with what it runs on, too: the device plugin's mark of the GPUs
each container got (``gpu-allocated``) naming GPUs its ``gpu-indices`` record does not
(:func:`misallocated_pods`, the rule in :func:`gpufrag.records.allocation_mismatch`). That one
has no safe repair here (the pod runs on the GPUs it got; only recreating it realigns them):
it is reported, by the node agent (metric, Event) and ``gpufrag inspect``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from defrag.controller.config import DefragConfig
from defrag.controller.model import PodInfo
from gpufrag.conventions import ANNOTATION_GPU_ALLOCATED, KubeNames
from gpufrag.errors import BadInput
from gpufrag.gpu_usage import NodeGpuUsage
from gpufrag.records import AllocationMismatch, allocation_mismatch, parse_allocated
from scheduler.kube import reservations as rsv
from scheduler.kube.convert import annotations_of, bound_gpus, is_terminal, labels_of

# How long a reservation with no pod of its owner is given before it counts as orphaned.
OWNER_GRACE_S: Final = DefragConfig().orphan_grace_s
REASONS: Final = ("expired", "node_gone", "owner_gone", "unreadable")

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class StaleReservation:
    """A reservation that holds capacity nobody can use, and why."""

    name: str
    reason: str  # one of REASONS
    detail: str  # for people: what was looked at
    node: str = ""
    namespace: str = ""  # the owner's; "" when unreadable
    managed: bool = False  # made by gpufrag-defrag (the only ones it deletes)


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _created(obj: Obj) -> float | None:
    text = _meta(obj).get("creationTimestamp")
    if not isinstance(text, str):
        return None
    try:
        return rsv.parse_rfc3339(text)
    except ValueError:
        return None


def stale_reservations(objs: Iterable[Obj], pods: Mapping[str, PodInfo],
                       nodes: Collection[str], now: float, *,
                       grace_s: float = OWNER_GRACE_S) -> list[StaleReservation]:
    """Each reservation among ``objs`` that holds capacity for nothing (``pods``: every
    non-terminal pod of the cluster, by key; ``nodes``: the names of the cluster's nodes)."""
    owners = {(info.request.namespace, info.owner_uid) for info in pods.values()
              if info.owner_uid}
    found: list[StaleReservation] = []
    for obj in objs:
        meta = _meta(obj)
        name = str(meta.get("name") or "")
        managed = False  # unknown while its labels cannot be read
        try:
            managed = labels_of(obj).get(rsv.MANAGED_BY_LABEL) == rsv.MANAGED_BY
            r = rsv.reservation_from_k8s(obj)
        except BadInput as e:
            found.append(StaleReservation(name, "unreadable", str(e), managed=managed))
            continue
        reason, detail = _why(r, obj, owners, nodes, now, grace_s)
        if reason:
            found.append(StaleReservation(r.name, reason, detail, node=r.node,
                                          namespace=r.namespace, managed=managed))
    return found


def _why(r: rsv.Reservation, obj: Obj, owners: Collection[tuple[str, str]],
         nodes: Collection[str], now: float, grace_s: float) -> tuple[str, str]:
    """(reason, detail) when ``r`` holds capacity for nothing; ("", "") while it may be used."""
    if r.expires <= now:
        return "expired", f"expired at {rsv.rfc3339(r.expires)}"
    if r.node not in nodes:
        return "node_gone", f"node {r.node} does not exist"
    if (r.namespace, r.owner_uid) in owners:
        return "", ""
    created = _created(obj)
    if created is None or now - created < grace_s:
        return "", ""
    owner = f"{r.owner_kind or 'owner'} {r.namespace}/{r.owner_name or r.owner_uid}"
    return "owner_gone", f"{owner} has no pod {int(now - created)} s after the reservation was made"


@dataclass(frozen=True, slots=True)
class MisallocatedPod:
    """A pod the device plugin gave GPUs its record does not name, on ``node``."""

    namespace: str
    name: str
    node: str
    mismatch: AllocationMismatch

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def misallocated_pods(pods: Iterable[Obj], readings: Mapping[str, NodeGpuUsage],
                      names: KubeNames) -> list[MisallocatedPod]:
    """Each live pod with a ``gpu-indices`` record and a readable device-plugin mark whose GPUs
    differ (:func:`gpufrag.records.allocation_mismatch`), on a node with a fresh agent reading
    (``readings``: what tells which UUID is which index there; without one nothing is said)."""
    found = []
    for obj in pods:
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        reading = readings.get(node)
        mark = annotations_of(obj).get(ANNOTATION_GPU_ALLOCATED)
        if reading is None or not isinstance(mark, str) or is_terminal(obj):
            continue
        recorded = bound_gpus(obj, names)
        try:
            given = parse_allocated(mark)
        except BadInput:
            continue  # the device plugin reports its own unreadable mark
        if recorded is None:
            continue
        mismatch = allocation_mismatch(recorded, given,
                                       {gpu.index: gpu.uuid for gpu in reading.gpus})
        if mismatch is not None:
            meta = obj.get("metadata") or {}
            found.append(MisallocatedPod(str(meta.get("namespace") or ""),
                                         str(meta.get("name") or ""), node, mismatch))
    return sorted(found, key=lambda m: (m.node, m.namespace, m.name))
