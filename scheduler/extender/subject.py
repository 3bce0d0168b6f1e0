"""The pod a verb is asked about, read once at the door into one typed value.

kube-scheduler sends the whole v1.Pod with each filter, prioritize and preempt. Everything a
verb needs from it — who it is (its ``namespace/name`` key, UID and controlling owner's UID)
and what it asks (its :class:`~scheduler.core.types.PodRequest`, the MIG instances it asks, and
why it would start without its GPU, if it would) — is read here, once, by :class:`PodReader`,
and the verbs then read the :class:`PodSubject` straight down instead of going back to the
object. What cannot be read raises :class:`~gpufrag.errors.BadInput` (the verb answers 400);
a request the extender can never place raises its subclass
:class:`~scheduler.kube.convert.UnsupportedRequest` (a verdict: each verb says what that means
for it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpufrag.conventions import KubeNames
from gpufrag.errors import BadInput
from scheduler.core.types import PodRequest
from scheduler.kube.cache import ClusterCache
from scheduler.kube.convert import (
    Obj,
    device_gap,
    key_of,
    mig_request,
    owner_uid,
    pod_from_k8s,
    uid_of,
)


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """Who a pod is: all that can be read without converting its request (and without the
    cache's lock, which the conversion may take)."""

    key: str    # ``namespace/name``: the key of the ClusterState, the cache and the bind
    uid: str    # '' when the object has none
    owner: str  # the controlling owner's UID ('' for a bare pod): reservations and hints


@dataclass(frozen=True, slots=True)
class PodSubject:
    """A pod as every verb judges it."""

    key: str
    uid: str
    owner: str
    request: PodRequest
    mig: Mapping[str, int]   # MIG instances asked, by profile ({}: none)
    device_gap: str | None   # why it would start without its GPU (names.gpu_memory alone)
    # The keys of the ResourceClaims it uses, with dra.enabled (() off or none): its GPUs
    # then come through them, chosen by DRA's first fit (docs/dra.md).
    claims: tuple[str, ...] = ()
    # Whole GPUs it asks through an extended resource a DeviceClass of the driver maps
    # (KEP-5004), before kube-scheduler made their claim (0: none).
    mapped: int = 0

    @property
    def wants_placing(self) -> bool:
        """It asks GPUs, shares of one or MIG instances: the extender's to judge."""
        return self.request.wants_gpu or bool(self.mig)

    @property
    def dra(self) -> bool:
        """Its GPUs, if any, come through DRA: its claims, or a mapped extended resource."""
        return bool(self.claims) or self.mapped > 0


class PodReader:
    """Reads a Pod object into a :class:`PodSubject` with the extender's names. The request
    is the watch's own conversion of that very pod when the cache converts with the same
    names (:meth:`ClusterCache.request_of`: kube-scheduler sends the object the watch saw)."""

    def __init__(self, cache: ClusterCache, names: KubeNames) -> None:
        self.names = names
        self.cache = cache
        self._request_of: Callable[[Obj], PodRequest] = (
            cache.request_of if cache.names == names else self._convert)

    def _convert(self, obj: Obj) -> PodRequest:
        return pod_from_k8s(obj, self.names)

    @staticmethod
    def identify(obj: Obj) -> PodIdentity:
        """The pod's identity alone (the filter tells the cache's bypass watch it is asked
        before anything can make it wait)."""
        if not isinstance(obj, Mapping):
            raise BadInput("Pod must be an object", field="Pod")
        return PodIdentity(key_of(obj), uid_of(obj), owner_uid(obj))

    def read(self, obj: Obj, identity: PodIdentity | None = None) -> PodSubject:
        """The whole subject (``identity``: read already). The request is read first, so
        a pod that is wrong in its name and elsewhere is answered in the request's words."""
        if not isinstance(obj, Mapping):
            raise BadInput("Pod must be an object", field="Pod")
        request = self._request_of(obj)
        claims = self.cache.pod_claims(obj)
        mapped = self.cache.mapped_ask(obj)
        mig = mig_request(obj)
        if claims or mapped:  # its GPUs, if any, are asked through them, not by its containers
            request = self.cache.claims_request(request, claims, mapped)
            mig = self.cache.claims_mig_ask(claims) or mig
        if identity is None:
            identity = self.identify(obj)
        # Only a memory share without a compute share can lack a device plugin's resource.
        gap = (device_gap(obj, self.names) if request.gpu_memory_mib and not request.gpu_milli
               else None)
        return PodSubject(identity.key, identity.uid, identity.owner, request, mig, gap,
                          claims, mapped)


__all__ = ["PodIdentity", "PodReader", "PodSubject"]
