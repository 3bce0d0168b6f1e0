"""GPU reservations: capacity the defrag controller holds for a replacement before it evicts.

The one home of the reservation contract. The defrag controller writes (``body``), the extender
reads (``reservation_from_k8s``) and honours (:class:`ReservationBook`). A reservation is an API
object, so it outlives any extender process: a restarted extender lists it again and holds the
capacity again.

The object (a ``GPUReservation``, group ``gpufrag.io``, namespaced; CRD in
``manifests/base/crd-gpureservation.yaml``; it lives in ``names.hints_namespace``)::

    apiVersion: gpufrag.io/v1alpha1
    kind: GPUReservation
    metadata: {name: web-7d4-x2k-9f3a, namespace: gpufrag-system}
    spec:
      node: gpu-7                 # where the replacement is predicted to land
      gpus: [0]                   # GPU indices on that node
      gpuMilli: 300               # share held on each of them (1000: whole GPUs)
      owner: {kind: ReplicaSet, name: web-7d4, uid: 0b9c..., namespace: serving}
      replaces: {name: web-7d4-x2k, uid: 5e1f...}  # the pod evicted for it (for people)
      existingPods: [5e1f..., a770...]            # the owner's pods when it was made
      expiresAt: "2026-12-01T12:30:00Z"

Who may use it: a pod of ``owner`` (same controller UID, so same template) in the owner's own
namespace that is not one of ``existingPods`` — i.e. the replacement the owner creates after the
eviction. Only the pod's *controller* reference counts, and only in ``owner.namespace``: anyone
with ``create pods`` in any namespace can write an ownerReference naming another tenant's
ReplicaSet UID (the API server does not check owner references; the garbage collector only
deletes such a pod later), so a reference from elsewhere is an ordinary pod's, logged and
counted (``refused``) when it names a live reservation's owner. For every other
pod the reserved share counts as taken, until a pod that may use it is bound on ``node`` (it is
released: the pod itself now holds the capacity; the controller deletes the object) or
``expiresAt`` passes (ignored from then on; the next defrag cycle deletes it).

How the extender counts it: each live reservation is a placement of its own in the cache's
``ClusterState`` (key ``<reservation>/<name>``, a namespace no pod can have), so filter,
prioritize, bind and preemption all see the share as taken without knowing about reservations.
For a pod that may use one, :meth:`ReservationBook.lifted_for` takes that placement out while
the pod is judged and puts it back afterwards, unless the pod was just placed on the reserved
node (then the reservation is used up). Every method is called with the cache's lock held.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import kubernetes
import structlog

from gpufrag.conventions import RESERVATION_PLACEMENT_NAMESPACE
from gpufrag.errors import BadInput
from scheduler.core.state import ClusterState
from scheduler.core.types import MAX_GPUS_PER_NODE, MILLI_PER_GPU, PodRequest
from scheduler.kube.convert import key_of, owner_uid, uid_of
from scheduler.kube.podwarning import EVENT_REASON_RESERVATION_REFUSED, PodWarning

GROUP = "gpufrag.io"
VERSION = "v1alpha1"
KIND = "GPUReservation"
PLURAL = "gpureservations"
API_VERSION = f"{GROUP}/{VERSION}"
# The namespace of a reservation's placement in ClusterState (no pod key can collide with it).
PLACEMENT_NAMESPACE = RESERVATION_PLACEMENT_NAMESPACE
MAX_EXISTING_PODS = 10_000
# The label the defrag controller lists (and prunes) its reservations by.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpufrag-defrag"

Obj = Mapping[str, Any]
log = structlog.get_logger("gpufrag.reservations")


@dataclass(frozen=True, slots=True)
class Reservation:
    name: str
    node: str
    gpus: tuple[int, ...]
    gpu_milli: int
    owner_uid: str
    owner_kind: str = ""
    owner_name: str = ""
    namespace: str = ""  # the owner's (and its pods')
    existing_pods: frozenset[str] = frozenset()
    expires: float = math.inf  # unix seconds
    replaces: str = ""  # namespace/name of the evicted pod

    @property
    def key(self) -> str:
        """Its placement's key in ClusterState."""
        return f"{PLACEMENT_NAMESPACE}/{self.name}"

    def request(self) -> PodRequest:
        """The placement that holds the share: GPUs only (kube-scheduler keeps CPU and memory
        for nobody; the extender is the one that judges GPUs)."""
        return PodRequest(name=self.name, namespace=PLACEMENT_NAMESPACE,
                          num_gpu=len(self.gpus), gpu_milli=self.gpu_milli)

    def admits(self, key: str, owner: str, uid: str) -> bool:
        """May the pod ``key`` (``namespace/name``) with this controller UID and UID use the
        reservation? Only a pod in the owner's own namespace (module docstring)."""
        return (self.names_owner(owner) and pod_namespace(key) == self.namespace
                and uid not in self.existing_pods)

    def names_owner(self, owner: str) -> bool:
        """The pod's controller reference names this reservation's owner (wherever the pod is:
        :meth:`admits` also checks the namespace)."""
        return bool(owner) and owner == self.owner_uid


def pod_namespace(key: str) -> str:
    """The namespace of a pod cache key (``namespace/name``; '' for a key without one)."""
    namespace, slash, _ = key.rpartition("/")
    return namespace if slash else ""


# ------------------------------------------------------------------------------ the object
def rfc3339(unix_s: float) -> str:
    return datetime.fromtimestamp(math.floor(unix_s), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float:
    """Unix seconds of an API time (``2026-12-01T12:30:00Z``); ValueError when it is not one."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def body(reservation: Reservation) -> dict[str, Any]:
    """The API object for ``reservation`` (what the defrag controller creates)."""
    pod_ns, _, pod_name = reservation.replaces.rpartition("/")
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": reservation.name, "labels": {
            MANAGED_BY_LABEL: MANAGED_BY,
            "gpufrag.io/owner-uid": reservation.owner_uid}},
        "spec": {
            "node": reservation.node, "gpus": list(reservation.gpus),
            "gpuMilli": reservation.gpu_milli,
            "owner": {"kind": reservation.owner_kind, "name": reservation.owner_name,
                      "uid": reservation.owner_uid, "namespace": reservation.namespace},
            "replaces": {"name": pod_name, "namespace": pod_ns},
            "existingPods": sorted(reservation.existing_pods),
            "expiresAt": rfc3339(reservation.expires),
        },
    }


def _field(mapping: Mapping[str, Any], key: str, kind: type | tuple[type, ...], path: str,
           source: str) -> Any:
    value = mapping.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BadInput(f"expected {getattr(kind, '__name__', 'a value')}, got {value!r}",
                       source=source, field=f"{path}.{key}")
    return value


def reservation_from_k8s(obj: Obj) -> Reservation:
    """Read a GPUReservation; :class:`BadInput` names the field (the CRD's schema refuses most
    of these at the API server already; this reader does not trust that)."""
    name = _name(obj)
    source = f"GPUReservation {name or '<unnamed>'}"
    if not name:
        raise BadInput("metadata.name is missing", source=source, field="metadata.name")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise BadInput("expected an object", source=source, field="spec")
    node = _field(spec, "node", str, "spec", source)
    gpus = _field(spec, "gpus", list, "spec", source)
    if not 1 <= len(gpus) <= MAX_GPUS_PER_NODE or not all(
            isinstance(g, int) and not isinstance(g, bool) and 0 <= g < MAX_GPUS_PER_NODE
            for g in gpus) or len(set(gpus)) != len(gpus):
        raise BadInput(f"expected 1..{MAX_GPUS_PER_NODE} distinct GPU indices, got {gpus!r}",
                       source=source, field="spec.gpus")
    milli = _field(spec, "gpuMilli", int, "spec", source)
    if not 1 <= milli <= MILLI_PER_GPU or (len(gpus) > 1 and milli != MILLI_PER_GPU):
        raise BadInput(f"{milli} must be 1..{MILLI_PER_GPU} (and {MILLI_PER_GPU} for several "
                       f"GPUs)", source=source, field="spec.gpuMilli")
    owner = _field(spec, "owner", Mapping, "spec", source)
    uid = _field(owner, "uid", str, "spec.owner", source)
    if not uid:
        raise BadInput("must not be empty", source=source, field="spec.owner.uid")
    owner_namespace = _field(owner, "namespace", str, "spec.owner", source)
    if not owner_namespace:  # only pods of this namespace may use it
        raise BadInput("must not be empty", source=source, field="spec.owner.namespace")
    existing = spec.get("existingPods") or []
    if not isinstance(existing, list) or len(existing) > MAX_EXISTING_PODS or not all(
            isinstance(u, str) for u in existing):
        raise BadInput(f"expected a list of at most {MAX_EXISTING_PODS} pod UIDs",
                       source=source, field="spec.existingPods")
    expires_text = _field(spec, "expiresAt", str, "spec", source)
    try:
        expires = parse_rfc3339(expires_text)
    except ValueError:
        raise BadInput(f"{expires_text!r} is not an RFC 3339 time, e.g. 2026-12-01T12:30:00Z",
                       source=source, field="spec.expiresAt") from None
    raw_replaces = spec.get("replaces")
    replaces: Mapping[str, Any] = raw_replaces if isinstance(raw_replaces, Mapping) else {}
    return Reservation(
        name=name, node=node, gpus=tuple(gpus), gpu_milli=milli, owner_uid=uid,
        owner_kind=str(owner.get("kind") or ""), owner_name=str(owner.get("name") or ""),
        namespace=owner_namespace, existing_pods=frozenset(existing),
        expires=expires,
        replaces=f"{replaces.get('namespace') or ''}/{replaces.get('name') or ''}")


# ------------------------------------------------------------------------------ the book
# Pods remembered as refused (logged once each); past this the memory starts again.
MAX_REFUSED_KEYS = 10_000

class BoundPod(Protocol):
    """What the book reads of a pod the cache knows (``scheduler.kube.cache.KnownPod``)."""

    @property
    def node(self) -> str: ...

    @property
    def uid(self) -> str: ...

    @property
    def owner(self) -> str: ...


class ReservationBook:
    """The live reservations, each held as a placement in ``state`` where its node exists."""

    def __init__(self, state: ClusterState, pods: Mapping[str, BoundPod], *,
                 clock: Callable[[], float]) -> None:
        self.state = state
        self.pods = pods
        self.clock = clock
        self.live: dict[str, Reservation] = {}
        self.taken: dict[str, Reservation] = {}  # pod key -> the reservation it was bound on
        self.skipped: dict[str, str] = {}  # reservation name -> why it is not honoured
        self.used = 0  # reservations released because a pod that may use them was bound
        self.expired = 0
        # Pods whose controller reference named a live reservation's owner from another
        # namespace (module docstring): by key, so each is logged once; the total is counted.
        self.refused = 0
        self._refused_keys: set[str] = set()
        self.on_refused: Callable[[PodWarning], None] | None = None

    def __len__(self) -> int:
        return len(self.live)

    @property
    def placed(self) -> int:
        return sum(1 for r in self.live.values() if r.key in self.state.pods)

    # -------------------------------------------------------------- placements
    def _place(self, r: Reservation) -> None:
        state = self.state
        if r.key in state.pods:
            return
        row = state.index.get(r.node)
        if row is None or not state.active[row]:
            return  # held once the node is known (node_added)
        count = int(state.gpu_count[row])
        if any(g >= count for g in r.gpus):
            self.skipped[r.name] = f"node {r.node} has {count} GPUs, reservation names {r.gpus}"
            log.warning("reservation not honoured", reservation=r.name,
                        reason=self.skipped[r.name])
            return
        self.skipped.pop(r.name, None)
        state.place(r.request(), row, r.gpus, check=False)

    def _unplace(self, r: Reservation) -> None:
        if r.key in self.state.pods:
            self.state.remove_pod(r.key)

    def _drop(self, name: str) -> Reservation | None:
        r = self.live.pop(name, None)
        if r is not None:
            self._unplace(r)
        self.skipped.pop(name, None)
        return r

    # -------------------------------------------------------------- the watch
    def upsert(self, r: Reservation) -> None:
        """A reservation was created or changed (and was read fine)."""
        old = self._drop(r.name)
        if r.expires <= self.clock() or any(t.name == r.name for t in self.taken.values()):
            return
        for key, pod in self.pods.items():  # used already (read after its replacement)
            if pod.node == r.node and r.admits(key, pod.owner, pod.uid):
                if old is None:
                    log.info("reservation already used", reservation=r.name, pod=key)
                return
        self.live[r.name] = r
        self._place(r)

    def delete(self, name: str) -> None:
        self._drop(name)
        for key in [k for k, r in self.taken.items() if r.name == name]:
            del self.taken[key]

    def replace(self, reservations: Iterable[Reservation]) -> None:
        """A full list: exactly these are live now."""
        listed = {r.name: r for r in reservations}
        for name in [n for n in self.live if n not in listed]:
            self._drop(name)
        self.taken = {k: r for k, r in self.taken.items() if r.name in listed}
        for r in listed.values():
            self.upsert(r)

    # -------------------------------------------------------------- the cache's hooks
    def node_added(self, node: str) -> None:
        for r in self.live.values():
            if r.node == node:
                self._place(r)

    def pod_bound(self, key: str, pod: BoundPod) -> None:
        """The watch shows ``pod`` bound: if it may use a reservation on its node, that one is
        used up (the pod holds the capacity now)."""
        if key in self.taken:
            del self.taken[key]  # the bind this extender made, confirmed
            return
        if not self.live or not pod.owner:
            return
        for r in self.live.values():
            if r.node == pod.node and r.admits(key, pod.owner, pod.uid):
                self._use(r, key)
                return

    def _refuse_foreign(self, key: str, owner: str, uid: str) -> None:
        """Note a pod whose controller reference names a live reservation's owner from outside
        the owner's namespace: it is judged as an ordinary pod (module docstring); logged and
        handed to ``on_refused`` (a Warning Event on the pod) once per pod."""
        foreign = [r for r in self.live.values()
                   if r.names_owner(owner) and pod_namespace(key) != r.namespace]
        if not foreign or key in self._refused_keys:
            return
        self._refused_keys.add(key)
        if len(self._refused_keys) > MAX_REFUSED_KEYS:
            self._refused_keys.clear()
        self.refused += 1
        reason = (f"its controller reference names the owner ({foreign[0].owner_kind or 'owner'} "
                  f"{foreign[0].owner_name or foreign[0].owner_uid}) of GPU reservation "
                  f"{foreign[0].name}, which only that owner's pods in namespace "
                  f"{foreign[0].namespace} may use: it is scheduled as an ordinary pod")
        log.warning("reservation refused", pod=key, reservation=foreign[0].name, reason=reason)
        if self.on_refused is not None:
            self.on_refused(PodWarning.on(key, uid, EVENT_REASON_RESERVATION_REFUSED,
                                          f"gpufrag extender: no reserved GPU for this pod: "
                                          f"{reason}"))

    def _use(self, r: Reservation, key: str) -> None:
        self._drop(r.name)
        self.used += 1
        log.info("reservation used", reservation=r.name, pod=key, node=r.node)

    def forgotten(self, key: str) -> None:
        """The bind of ``key`` failed: the reservation it used holds the capacity again."""
        r = self.taken.pop(key, None)
        if r is not None and r.expires > self.clock():
            self.live[r.name] = r
            self._place(r)

    def expire(self, now: float) -> list[str]:
        gone = [name for name, r in self.live.items() if r.expires <= now]
        for name in gone:
            self._drop(name)
            self.expired += 1
            log.info("reservation expired", reservation=name)
        return gone

    @contextlib.contextmanager
    def lifted_for(self, obj: Obj) -> Iterator[None]:
        """While the pod ``obj`` is judged, the reservations it may use are free for it."""
        if not self.live:
            yield
            return
        try:
            owner, uid, key = owner_uid(obj), uid_of(obj), key_of(obj)
        except BadInput:
            yield
            return
        with self.lifted_for_pod(key, owner, uid):
            yield

    @contextlib.contextmanager
    def lifted_for_pod(self, key: str, owner: str, uid: str) -> Iterator[None]:
        """:meth:`lifted_for` for a pod known by its cache key, owner UID and UID (the
        extender's bind, which has them from its cache without the object)."""
        if not self.live:
            yield
            return
        now = self.clock()
        mine = [r for r in self.live.values() if r.admits(key, owner, uid) and r.expires > now]
        if not mine and owner:
            self._refuse_foreign(key, owner, uid)
        for r in mine:
            self._unplace(r)
        try:
            yield
        finally:
            placed = self.state.pods.get(key)
            for r in mine:
                if r.name not in self.live:
                    continue
                if placed is not None and placed.node == r.node and key not in self.taken:
                    self._use(r, key)
                    self.taken[key] = r
                else:
                    self._place(r)


class ReservationSink:
    """The reflector's sink for GPUReservations: unreadable objects are logged and ignored
    (a reservation is a promise to one pod, never a reason to stop scheduling)."""

    def __init__(self, book: ReservationBook, lock: contextlib.AbstractContextManager[Any]
                 ) -> None:
        self.book = book
        self.lock = lock

    @staticmethod
    def _read(obj: Obj) -> Reservation | None:
        try:
            return reservation_from_k8s(obj)
        except BadInput as e:
            log.warning("reservation skipped", reason=str(e))
            return None

    def replace(self, objs: Iterable[Obj]) -> None:
        readable = [r for r in (self._read(o) for o in objs) if r is not None]
        with self.lock:
            self.book.replace(readable)

    def upsert(self, obj: Obj) -> None:
        r = self._read(obj)
        with self.lock:
            if r is None:
                name = _name(obj)
                if name:
                    self.book.delete(name)
                return
            self.book.upsert(r)

    def delete(self, obj: Obj) -> None:
        name = _name(obj)
        if name:
            with self.lock:
                self.book.delete(name)


def _name(obj: Obj) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else ""


def list_call(api_client: Any, namespace: str) -> Callable[..., Any]:
    """The list (and watch) call of GPUReservations in ``namespace``, for a Reflector."""
    custom = kubernetes.client.CustomObjectsApi(api_client)
    return functools.partial(custom.list_namespaced_custom_object, GROUP, VERSION, namespace,
                             PLURAL)


__all__ = ["API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION", "Reservation", "ReservationBook",
           "ReservationSink", "body", "list_call", "reservation_from_k8s"]
