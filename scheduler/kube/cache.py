"""The extender's picture of the cluster, kept current from watch events (or a snapshot).

``ClusterCache`` owns one ``ClusterState`` and everything needed to apply Kubernetes objects to
it: which pods are bound where (placed, ``check=False``: the live cluster is the truth even when
it over-commits), which are still pending (the bind verb needs their requests), which placements
the extender *assumed* at bind and the watch has not confirmed yet (they expire after a TTL),
and pods bound to a node the cache has not seen yet (the pod event raced the node event; they
are placed when the node arrives).

An object the converters cannot read (a quantity of 5,000 digits, a GPU count that is not a
whole number) is *skipped*: left out of the state, logged once, kept in ``skipped`` with the
reason until it is deleted, read fine or missing from a relist (that is what the
``skipped_objects`` gauge counts), and handed to ``on_skip`` each time it is read, so the
extender can put a Warning Event on it. ``on_skip`` runs on the watch thread under the lock: it
must not block (the runtime's listener only queues).

Concurrency: one re-entrant lock, ``lock``. Every public method takes it; request handlers hold
it while they read the state so a watch event never lands in the middle of a score. The
mutations are small (one object each), and relists apply their items in chunks, so requests
never wait long.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import orjson
import structlog

from gpufrag.conventions import (
    DEFAULT_NAMES,
    NO_HINTS,
    KubeNames,
    PlacementHints,
    hints_from_configmap,
)
from gpufrag.errors import BadInput
from scheduler.core.gpus import NO_GPU, gpus_for
from scheduler.core.state import ClusterState, pod_key
from scheduler.core.types import Placement, PodRequest
from scheduler.kube.bypass import BypassWatch
from scheduler.kube.claims import (
    DEVICE_CLASSES,
    HeldGpu,
    MigPartition,
    SliceGpus,
    SliceMigGpu,
    asking,
    gpus_held,
    holding,
    mapped_count,
    mapped_resource,
    partitions_asked,
    partitions_held,
    pod_claim_keys,
    slice_gpus,
    slice_mig_gpus,
    with_slice_gpus,
)
from scheduler.kube.convert import (
    bound_gpus,
    is_terminal,
    key_of,
    mig_request,
    node_from_k8s,
    node_name_of,
    owner_uid,
    pod_from_k8s,
    uid_of,
)
from scheduler.kube.mignodes import MigBook, MigReader, no_agent
from scheduler.kube.podwarning import EVENT_REASON_RECORD_CHANGED, PodWarning
from scheduler.kube.reservations import ReservationBook

Obj = Mapping[str, Any]
Clock = Callable[[], float]
RELIST_CHUNK = 500
# The kinds the cache reads, as metric label values (every one is reported, zero included).
SKIPPED_KINDS = ("node", "pod")

log = structlog.get_logger("gpufrag.cache")


@dataclass(frozen=True, slots=True)
class KnownPod:
    """A pod as last seen: its request, the node it is bound to ('' = pending), its UID, its
    controlling owner's UID (for placement hints) and its ``spec.schedulerName`` ('' when the
    object has none), which the bind verb checks without reading the pod again."""

    request: PodRequest
    node: str
    uid: str
    owner: str
    gpus: tuple[int, ...] | None
    scheduler_name: str = ""


@dataclass(frozen=True, slots=True)
class SkippedObject:
    """An object left out of the state because it could not be read: its Kubernetes kind
    (``Pod``, ``Node``), cache key (``namespace/name`` for a pod), namespace ('' for a node),
    name, UID ('' when it has none) and the converter's reason, which names the field and
    quotes the value. Enough to write an Event on it without the object itself."""

    kind: str
    key: str
    namespace: str
    name: str
    uid: str
    reason: str

    @property
    def label(self) -> str:
        """The kind as a metric label value: ``pod``, ``node``."""
        return self.kind.lower()


SkipListener = Callable[[SkippedObject], None]


class ClusterCache:
    def __init__(self, names: KubeNames = DEFAULT_NAMES, *, clock: Clock = time.time,
                 assume_ttl_s: float = 30.0, on_skip: SkipListener | None = None,
                 mig_reader: MigReader = no_agent, dra_driver: str = "",
                 dra_classes: Collection[str] = DEVICE_CLASSES) -> None:
        self.lock = threading.RLock()
        # Notified (with ``lock`` held) whenever the watch applies a pod: what
        # :meth:`await_pod` waits on.
        self._pod_applied = threading.Condition(self.lock)
        self.names = names
        self.clock = clock
        self.assume_ttl_s = assume_ttl_s
        self.state = ClusterState()
        self.pods: dict[str, KnownPod] = {}            # every non-terminal pod seen
        self.assumed: dict[str, float] = {}            # pod key -> deadline (clock seconds)
        self.decided: set[str] = set()                 # assumed at filter, not bound yet
        self.orphans: dict[str, set[str]] = {}         # node name -> keys of pods bound to it
        self.unaccounted: dict[str, str] = {}          # pod key -> why it is not in the state
        # "pod ns/name" | "node name" -> the object left out of the state, and why. Not
        # capped: each entry is smaller than the KnownPod a readable pod costs.
        self.skipped: dict[str, SkippedObject] = {}
        self.skips_total = dict.fromkeys(SKIPPED_KINDS, 0)  # objects newly skipped, by kind
        # Objects a full list dropped although no watch event had said they were gone, by kind
        # ("node", "pod"): what a missed DELETED would have left holding GPUs (drift).
        self.relist_dropped = {"node": 0, "pod": 0}
        # Watch events the cache failed to apply, by watched kind ("nodes", "pods", ...): each
        # ended its watch and a full list followed (scheduler.kube.watch.Reflector).
        self.apply_failures: dict[str, int] = {}
        # Bound pods whose GPU record changed after the bind (kept as bound; _record_changed).
        self.record_changes = 0
        self.on_skip = on_skip
        self.on_warning: Callable[[PodWarning], None] | None = None  # a pod's Warning Event
        self.hints: PlacementHints = NO_HINTS
        self.nodes_synced = False
        self.pods_synced = False
        self.pod_changes = 0                           # bumped on every change to the pod set
        # pod key -> (request_inputs of the object last converted, its request): a watch event
        # that changed nothing the request is made of (a bind, a status update, a deletion
        # mark) is not converted again, nor is the pod kube-scheduler sends to filter.
        self._requests: dict[str, tuple[bytes, PodRequest, dict[str, int]]] = {}
        # MIG nodes' instances and the MIG profiles each pod asks (scheduler.kube.mignodes);
        # ``mig_reader`` reads the agent's usage annotation for exact positions.
        self.mig = MigBook(mig_reader, names)
        # GPU reservations for defrag replacements (scheduler.kube.reservations).
        self.reservations = ReservationBook(self.state, self.pods, clock=clock)
        # GPU pods of this scheduler bound without the extender's say (scheduler.kube.bypass).
        self.bypass = BypassWatch(clock=clock)
        # DRA (docs/dra.md, "What reads claims"): with a driver name, a pod's GPUs are the ones
        # its ResourceClaims' allocations name for that driver, read by scheduler.kube.claims.
        # '' = off: claims are not read and pods are placed from their annotation record only.
        self.dra_driver = dra_driver
        # The DeviceClasses whose requests ask the driver's GPUs (what a claim not allocated
        # yet asks: scheduler.kube.claims.asked_gpus).
        self.dra_classes = frozenset(dra_classes)
        self.claims: dict[str, Obj] = {}               # "namespace/name" -> ResourceClaim
        self.claims_synced = not dra_driver
        # Of those classes, the ones mapping an extended resource (KEP-5004): class name ->
        # resource. A pod asking one is a DRA pod before its claim exists (mapped_count).
        self.mapped: dict[str, str] = {}
        self.device_classes_synced = not dra_driver
        # The driver's ResourceSlices: node -> slice name -> the GPUs it offers. A Node that
        # advertises no GPU (the device plugin left it) has these (claims.with_slice_gpus);
        # the last Node object of each node is kept to apply again when its slice changes.
        self.slices: dict[str, dict[str, SliceGpus]] = {}
        # node -> slice name -> the MIG GPUs it publishes partitions of (dynamic MIG:
        # the MIG book's layout of the node, scheduler.kube.mignodes).
        self.mig_slices: dict[str, dict[str, tuple[SliceMigGpu, ...]]] = {}
        self._slice_node: dict[str, str] = {}          # slice name -> its node
        self._node_objs: dict[str, Obj] = {}
        self.slices_synced = not dra_driver
        # pod key -> (its request before its claims, the keys of its claims, the whole GPUs
        # it asks through a mapped extended resource before its claim exists): what a
        # claim's change re-places the pod from.
        self._dra_pods: dict[str, tuple[PodRequest, tuple[str, ...], int]] = {}
        self._claim_users: dict[str, set[str]] = {}    # claim key -> keys of pods using it

    # ------------------------------------------------------------------ status
    @property
    def synced(self) -> bool:
        return (self.nodes_synced and self.pods_synced and self.claims_synced
                and self.slices_synced and self.device_classes_synced)

    def count_apply_failure(self, kind: str) -> None:
        """A watch event of ``kind`` failed to apply (its reflector relists)."""
        with self.lock:
            self.apply_failures[kind] = self.apply_failures.get(kind, 0) + 1

    def counts(self) -> dict[str, int]:
        with self.lock:
            pending = sum(1 for p in self.pods.values() if not p.node)
            return {"nodes": int(self.state.active[: self.state.size].sum()),
                    "pods_placed": (len(self.state.pods) - len(self.assumed)
                                    - self.reservations.placed),
                    "pods_pending": pending, "pods_assumed": len(self.assumed),
                    "pods_unaccounted": len(self.unaccounted) + sum(
                        len(v) for v in self.orphans.values())}

    def workload_pods(self) -> list[PodRequest]:
        """Every non-terminal pod seen (bound or pending) but those asking MIG instances (their
        target workload is :meth:`MigBook.profile_counts`): FGD's target workload source."""
        with self.lock:
            asks = self.mig.asks
            return [p.request for k, p in self.pods.items() if k not in asks]

    def skipped_counts(self) -> dict[str, int]:
        """Objects left out of the state now, by kind (``pod``, ``node``), zeros included."""
        with self.lock:
            counts = dict.fromkeys(SKIPPED_KINDS, 0)
            for skipped in self.skipped.values():
                counts[skipped.label] = counts.get(skipped.label, 0) + 1
            return counts

    def _skip(self, kind: str, obj: Obj, key: str, reason: str) -> None:
        """Leave ``obj`` out of the state. Logged (and counted) when it is newly skipped or
        for a new reason, not on every status update of the same object; ``on_skip`` hears
        of every read, so a report that failed can be tried again at the next one."""
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        namespace = meta.get("namespace") if kind == "Pod" else ""
        skipped = SkippedObject(
            kind=kind, key=key, namespace=namespace if isinstance(namespace, str) else "",
            name=_name_or_unknown(obj), uid=str(meta.get("uid") or ""), reason=reason)
        what = f"{skipped.label} {key}"
        if self.skipped.get(what) != skipped:
            if what not in self.skipped:
                self.skips_total[skipped.label] = self.skips_total.get(skipped.label, 0) + 1
            log.warning("object skipped", object=what, uid=skipped.uid, reason=reason)
        self.skipped[what] = skipped
        if self.on_skip is not None:
            try:
                self.on_skip(skipped)
            except Exception:  # a report that fails must not stop the watch
                log.exception("skip report failed", object=what)

    def _unskip(self, kind: str, keys: Iterable[str]) -> None:
        for key in keys:
            self.skipped.pop(f"{kind} {key}", None)

    # ------------------------------------------------------------------ nodes
    def apply_node(self, obj: Obj) -> None:
        """A Node was added or changed."""
        with self.lock:
            try:
                spec = node_from_k8s(obj, self.names)
            except BadInput as e:
                name = _name_or_unknown(obj)
                # A node that turned unreadable is gone from the state, not left at its old
                # capacity; its pods wait as orphans, as for a deleted node.
                self.delete_node(name)
                self._skip("Node", obj, name, str(e))
                return
            if self.dra_driver:
                self._node_objs[spec.name] = obj
                spec = with_slice_gpus(spec, self._slice_gpus(spec.name), self.names)
            row = self.state.index.get(spec.name)
            if row is not None and self.state.active[row] and self.state.node_spec(row) == spec:
                # A status heartbeat: nothing the state reads changed; the MIG side may have
                # (the agent's reading is an annotation).
                self.mig.apply_node(obj, spec.name, row)
                self._apply_dynamic_mig(spec.name, row)
                return
            self._unskip("node", [spec.name])
            row = self.state.add_node(spec)
            self.mig.apply_node(obj, spec.name, row)
            self._apply_dynamic_mig(spec.name, row)
            for key in sorted(self.orphans.pop(spec.name, set())):
                self._place_known(key)
            self.reservations.node_added(spec.name)

    def _apply_dynamic_mig(self, name: str, row: int) -> None:
        """The MIG book's dynamic side of ``name``: the MIG GPUs its slices publish."""
        if self.dra_driver:
            self.mig.apply_dynamic(name, row, [gpu for gpus in self.mig_slices.get(
                name, {}).values() for gpu in gpus])

    def delete_node(self, name: str) -> None:
        """A Node is gone; its pods wait as orphans until they are deleted or it returns."""
        with self.lock:
            self._unskip("node", [name])
            self._node_objs.pop(name, None)
            row = self.state.index.get(name)
            self.mig.delete_node(name, row)
            if row is None or not self.state.active[row]:
                return
            for placement in self.state.remove_node(name):
                key = pod_key(placement.pod)
                self.assumed.pop(key, None)
                self.decided.discard(key)
                known = self.pods.get(key)
                if known is not None and known.node == name:
                    self.orphans.setdefault(name, set()).add(key)

    def replace_nodes(self, objs: Iterable[Obj]) -> None:
        """A full list of Nodes (start-up or relist): apply each, drop the ones not listed."""
        listed: set[str] = set()
        for chunk in _chunks(objs, RELIST_CHUNK):
            with self.lock:
                for obj in chunk:
                    self.apply_node(obj)
                    listed.add(_name_or_unknown(obj))
        with self.lock:
            active = (self.state.names[int(row)] for row in self.state.active_rows())
            gone = [name for name in active if name not in listed]
            self._count_drift("node", gone)
            for name in gone:
                self.delete_node(name)
            self._unskip("node", [s.key for s in list(self.skipped.values())
                                  if s.kind == "Node" and s.key not in listed])
            self.nodes_synced = True

    def _count_drift(self, kind: str, gone: list[str]) -> None:
        """A full list found ``gone`` cached objects missing: after the first list, each is a
        deletion no watch event delivered (a watch gap that ended in a relist, or the periodic
        relist catching a missed event); counted and logged, then dropped by the caller."""
        if not gone:
            return
        self.relist_dropped[kind] += len(gone)
        log.warning("relist dropped objects the watch had not deleted", kind=kind,
                    count=len(gone), first=sorted(gone)[:5])

    # ------------------------------------------------------------------ pods
    def apply_pod(self, obj: Obj) -> None:
        """A Pod was added or changed."""
        with self.lock:
            try:
                key = key_of(obj)
            except BadInput as e:
                self._skip("Pod", obj, "<unnamed>", str(e))
                return
            if is_terminal(obj):
                self.delete_pod(key)
                return
            inputs = request_inputs(obj, self.names)
            memo = self._requests.get(key)
            if inputs is not None and memo is not None and memo[0] == inputs:
                request, ask = memo[1], memo[2]
            else:
                try:
                    request = pod_from_k8s(obj, self.names)
                    ask = mig_request(obj)
                except BadInput as e:
                    self._drop_pod(key)  # it may have been readable before
                    self._skip("Pod", obj, key, str(e))
                    return
                if inputs is not None:
                    self._requests[key] = (inputs, request, ask)
            known = KnownPod(request=request, node=node_name_of(obj), uid=uid_of(obj),
                             owner=owner_uid(obj), gpus=bound_gpus(obj, self.names),
                             scheduler_name=_scheduler_name(obj))
            if self.dra_driver:
                try:
                    claim_keys = self.pod_claims(obj)
                    mapped = self.mapped_ask(obj)
                except BadInput as e:
                    self._drop_pod(key)
                    self._skip("Pod", obj, key, str(e))
                    return
                if claim_keys or mapped:
                    self._set_dra_pod(key, request, claim_keys, mapped)
                    known = self._with_claims(key, known)
                    request = known.request
                else:
                    self._drop_dra_pod(key)
            self._unskip("pod", [key])
            self.mig.set_ask(key, ask)
            self._update_dra_mig(key)
            previous = self.pods.get(key)
            if (previous is not None and previous.node and previous.node == known.node
                    and key not in self._dra_pods  # its GPUs are its claims', not a record
                    and previous.uid == known.uid and previous.gpus is not None
                    and known.gpus != previous.gpus):
                known = self._record_changed(key, previous, known)
            self.pods[key] = known
            if previous != known:
                self.pod_changes += 1
                self._pod_applied.notify_all()
            if key in self._dra_pods:
                self._apply_dra_pod(key, previous)
                return
            if not known.node:
                # Pending. An assumed placement stays until the watch shows the binding or
                # the assumption expires (an update made before the bind lands here).
                if key in self.state.pods and key not in self.assumed:
                    self.state.remove_pod(key)
                return
            if (self.pods_synced and not (previous is not None and previous.node)
                    and request.wants_gpu and known.scheduler_name == self.names.scheduler_name):
                self.bypass.bound(key, known.uid, known.node, self.state.index.get(known.node))
            self.assumed.pop(key, None)  # bound: the watch confirms (or corrects) the guess
            self.decided.discard(key)
            self.reservations.pod_bound(key, known)
            current = self.state.pods.get(key)
            if current is not None:
                if (current.node == known.node and current.pod == request
                        and known.gpus in (None, current.gpus)):
                    return
                self.state.remove_pod(key)
            self._place_known(key)

    def _with_claims(self, key: str, known: KnownPod) -> KnownPod:
        """``known`` holding the GPUs its claims' allocations name on its node (a DRA pod has
        no annotation record); with none allocated there (yet, or any more), asking what its
        claims ask (:meth:`claims_request`) with no GPUs. A malformed claim holds nothing and
        is logged: the pod stays."""
        base, claim_keys, mapped = self._dra_pods[key]
        held = [gpu for gpu in self._allocated(key) if gpu.node == known.node]
        if not held:
            return replace(known, request=self.claims_request(base, claim_keys, mapped),
                           gpus=None)
        return replace(known, request=holding(base, held),
                       gpus=tuple(gpu.index for gpu in held))

    def _update_dra_mig(self, key: str) -> None:
        """What the DRA pod ``key``'s claims ask of MIG profiles' classes and were allocated
        of the driver's partitions, into the MIG book (nothing for a pod without claims, or
        one whose claim cannot be read: logged)."""
        found = self._dra_pods.get(key)
        if found is None and key not in self.mig.claim_asks and key not in self.mig.held:
            return  # the common case: no claims, and none before
        ask: dict[str, int] = {}
        held: tuple[tuple[str, MigPartition], ...] = ()
        if found is not None:
            claims = self._held_claims(found[1])
            try:
                ask = partitions_asked(claims, driver=self.dra_driver)
                held = tuple((p.pool, p.partition)
                             for p in partitions_held(claims, driver=self.dra_driver))
            except BadInput as e:
                log.warning("claim not read", pod=key, reason=str(e))
        placed = self.state.pods.get(key)
        self.mig.set_claims(key, ask, held, self.state.index,
                            placed.node if placed is not None else "")

    def _allocated(self, key: str) -> list[HeldGpu]:
        """What the DRA pod ``key``'s claims are allocated, on any node ([] none, or a claim
        that cannot be read: logged)."""
        claims = self._held_claims(self._dra_pods[key][1])
        try:
            return list(gpus_held(claims, driver=self.dra_driver))
        except BadInput as e:
            log.warning("claim not read", pod=key, reason=str(e))
            return []

    def pod_claims(self, obj: Obj) -> tuple[str, ...]:
        """The keys (``namespace/name``) of the ResourceClaims the pod ``obj`` uses, with DRA
        on; () when off. Raises :class:`BadInput` for a pod that cannot be read."""
        return pod_claim_keys(obj) if self.dra_driver else ()

    def _held_claims(self, claim_keys: Iterable[str]) -> list[tuple[str, Obj]]:
        """(key, ResourceClaim) of those of ``claim_keys`` the cache holds (call with the lock
        held): a claim not seen yet asks and holds nothing."""
        return [(k, self.claims[k]) for k in claim_keys if k in self.claims]

    def mapped_ask(self, obj: Obj) -> int:
        """The whole GPUs the pod ``obj`` asks through an extended resource one of the driver's
        DeviceClasses maps, before its claim exists (:func:`claims.mapped_count`); 0 with DRA
        off. Raises :class:`BadInput` for a pod that cannot be read."""
        if not self.dra_driver:
            return 0
        with self.lock:
            resources = set(self.mapped.values())
        return mapped_count(obj, resources)

    def claim_keys(self, key: str) -> tuple[str, ...]:
        """The claims of the pod ``key`` as the watch last showed it (() for none, or unseen)."""
        with self.lock:
            found = self._dra_pods.get(key)
            return found[1] if found is not None else ()

    def mapped_of(self, key: str) -> int:
        """The whole GPUs the pod ``key`` asked through a mapped extended resource, as the
        watch last showed it, before its claim existed (0 for none, or unseen)."""
        with self.lock:
            found = self._dra_pods.get(key)
            return found[2] if found is not None else 0

    def claims_request(self, request: PodRequest, claim_keys: Iterable[str],
                       mapped: int = 0) -> PodRequest:
        """``request`` asking the GPUs that the claims ``claim_keys`` (those the cache holds)
        ask of the driver's classes (``dra_classes``) and the ``mapped`` whole GPUs
        (:meth:`mapped_ask`), in place of any its containers ask; as it is when they ask none.
        A claim whose ask cannot be placed is logged and asks none: the pod is not the
        extender's to judge, and the allocator still places it."""
        with self.lock:
            claims = self._held_claims(claim_keys)
        try:
            return asking(request, claims, device_classes=self.dra_classes, mapped=mapped)
        except BadInput as e:
            log.warning("claim not read", pod=pod_key(request), reason=str(e))
            return request

    def claims_mig_ask(self, claim_keys: Iterable[str]) -> dict[str, int]:
        """The MIG instances the claims ``claim_keys`` (those the cache holds) ask through
        MIG profiles' classes, by profile ({}: none, or a claim whose ask cannot be placed:
        logged, and the allocator still places the pod)."""
        with self.lock:
            claims = self._held_claims(claim_keys)
        try:
            return partitions_asked(claims, driver=self.dra_driver)
        except BadInput as e:
            log.warning("claim not read", claims=[k for k, _ in claims], reason=str(e))
            return {}

    def _apply_dra_pod(self, key: str, previous: KnownPod | None) -> None:
        """Count the DRA pod ``key`` (:meth:`_place_dra`), with a bound pod's bookkeeping."""
        known = self.pods[key]
        if known.node:
            if (self.pods_synced and not (previous is not None and previous.node)
                    and known.request.wants_gpu
                    and known.scheduler_name == self.names.scheduler_name):
                self.bypass.bound(key, known.uid, known.node, self.state.index.get(known.node))
            self.decided.discard(key)  # bound: the watch confirms (or corrects) the guess
            self.reservations.pod_bound(key, known)
        self._place_dra(key)

    def _place_dra(self, key: str) -> None:
        """Where the DRA pod ``key``'s GPUs are counted (docs/dra.md, "What reads claims"):

        - its claims' allocation, once the watch shows it: on its node when it is bound, as
          an assumption on the allocation's node while it is pending (kube-scheduler writes
          the allocation before the binding);
        - until then, the placement the extender assumed when it decided or bound it (the GPU
          DRA's first fit takes, ``device_choice=FIRST_FIT``), for as long as that lives and
          its claims still ask GPUs;
        - otherwise none: a bound pod counts its CPU and memory only (its claim was deleted,
          or it was bound without the extender), a pending pod nothing.
        """
        known = self.pods[key]
        base = self._dra_pods[key][0]
        allocated = self._allocated(key)
        # MIG partitions hold no GPU of the state: the pod is placed for its CPU and memory,
        # and the MIG book counts the partitions (_update_dra_mig).
        nodes = {gpu.node for gpu in allocated} | {node for node, _ in self.mig.held.get(key, ())}
        current = self.state.pods.get(key)
        if len(nodes) == 1 and (not known.node or known.node in nodes):
            node = next(iter(nodes))
            request = holding(base, allocated) if allocated else base
            gpus = tuple(gpu.index for gpu in allocated)
            if known.node:  # bound and allocated: counted for real, no assumption left
                self.assumed.pop(key, None)
                self.decided.discard(key)
                if (current is not None and current.node == node and current.gpus == gpus
                        and current.pod == request):
                    return
                if current is not None:
                    self.state.remove_pod(key)
                self._place_known(key)
                return
            row = self.state.index.get(node)
            if row is None or not self.state.active[row]:
                return
            deadline = self.assumed.get(key, self.clock() + self.assume_ttl_s)
            if current is None or (current.node, current.gpus, current.pod) != (
                    node, gpus, request):
                if current is not None:
                    self.state.remove_pod(key)
                self.state.place(request, row, gpus, check=False)
            self.assumed[key] = deadline
            self.decided.discard(key)
            return
        if (key in self.assumed and current is not None
                and (known.request.wants_gpu or self.mig.ask_of(key))
                and (not known.node or current.node == known.node)):
            return  # the extender's assumption stands until the allocation shows
        if key in self.assumed:
            self.assumed.pop(key)
            self.decided.discard(key)
        if current is not None:
            self.state.remove_pod(key)
        if known.node:
            self._place_known(key, request=base, gpus=())

    # ------------------------------------------------------------------ device classes (DRA)
    def apply_device_class(self, obj: Obj) -> None:
        """A DeviceClass was added or changed: which extended resource it maps, if it is one
        of the driver's classes (``dra_classes``). Pods are read with the new mapping from
        their next event (a filter reads the pod it is sent)."""
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or name not in self.dra_classes:
            return
        with self.lock:
            try:
                resource = mapped_resource(obj)
            except BadInput as e:
                self._skip("DeviceClass", obj, name, str(e))
                resource = None
            if resource is None:
                self.mapped.pop(name, None)
            else:
                self.mapped[name] = resource

    def delete_device_class_object(self, obj: Obj) -> None:
        """A DeviceClass is gone: the resource it mapped asks no GPU of ours any more."""
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        with self.lock:
            if isinstance(name, str):
                self.mapped.pop(name, None)

    def replace_device_classes(self, objs: Iterable[Obj]) -> None:
        """A full list of DeviceClasses."""
        with self.lock:
            self.mapped.clear()
            for obj in objs:
                self.apply_device_class(obj)
            self.device_classes_synced = True

    # ------------------------------------------------------------------ slices (DRA)
    def _slice_gpus(self, node: str) -> SliceGpus | None:
        """The GPUs the driver's slices offer on ``node`` (the largest, if several)."""
        found = self.slices.get(node)
        return max(found.values(), key=lambda g: g.count) if found else None

    def apply_slice(self, obj: Obj) -> None:
        """A ResourceSlice was added or changed: its node is applied again."""
        with self.lock:
            name = _name_or_unknown(obj)
            try:
                found = slice_gpus(obj, driver=self.dra_driver)
                partitioned = slice_mig_gpus(obj, driver=self.dra_driver)
            except BadInput as e:
                log.warning("resource slice not read", slice=name, reason=str(e))
                found, partitioned = None, ()
            self._drop_slice(name)
            if found is not None:
                self.slices.setdefault(found.node, {})[name] = found
                if partitioned:
                    self.mig_slices.setdefault(found.node, {})[name] = partitioned
                self._slice_node[name] = found.node
                self._reapply_node(found.node)

    def delete_slice_object(self, obj: Obj) -> None:
        """A ResourceSlice is gone: its node has the GPUs its Node advertises."""
        with self.lock:
            self._drop_slice(_name_or_unknown(obj))

    def replace_slices(self, objs: Iterable[Obj]) -> None:
        """A full list of the driver's ResourceSlices."""
        with self.lock:
            listed: set[str] = set()
            for obj in objs:
                self.apply_slice(obj)
                listed.add(_name_or_unknown(obj))
            for name in [n for n in self._slice_node if n not in listed]:
                self._drop_slice(name)
            self.slices_synced = True

    def _drop_slice(self, name: str) -> None:
        node = self._slice_node.pop(name, None)
        if node is None:
            return
        found = self.slices.get(node, {})
        found.pop(name, None)
        if not found:
            self.slices.pop(node, None)
        partitioned = self.mig_slices.get(node, {})
        partitioned.pop(name, None)
        if not partitioned:
            self.mig_slices.pop(node, None)
        self._reapply_node(node)

    def _reapply_node(self, node: str) -> None:
        obj = self._node_objs.get(node)
        if obj is not None:
            self.apply_node(obj)

    # ------------------------------------------------------------------ claims (DRA)
    def apply_claim(self, obj: Obj) -> None:
        """A ResourceClaim was added or changed: the pods using it are placed again."""
        with self.lock, contextlib.suppress(BadInput):  # unnamed: no pod can name it
            key = key_of(obj)
            self.claims[key] = obj
            self._claim_changed(key)
            self._pod_applied.notify_all()  # a filter may wait for it (await_pod)

    def delete_claim_object(self, obj: Obj) -> None:
        """A ResourceClaim is gone: the GPUs it held are free."""
        with self.lock, contextlib.suppress(BadInput):
            key = key_of(obj)
            if self.claims.pop(key, None) is not None:
                self._claim_changed(key)

    def replace_claims(self, objs: Iterable[Obj]) -> None:
        """A full list of ResourceClaims: apply each, drop (and free) the ones not listed."""
        with self.lock:
            listed: set[str] = set()
            for obj in objs:
                self.apply_claim(obj)
                with contextlib.suppress(BadInput):
                    listed.add(key_of(obj))
            for key in [k for k in self.claims if k not in listed]:
                del self.claims[key]
                self._claim_changed(key)
            self.claims_synced = True

    def _set_dra_pod(self, key: str, request: PodRequest, claim_keys: tuple[str, ...],
                     mapped: int) -> None:
        previous = self._dra_pods.get(key)
        if previous is not None and previous[1] != claim_keys:
            self._drop_dra_pod(key)
        self._dra_pods[key] = (request, claim_keys, mapped)
        for claim_key in claim_keys:
            self._claim_users.setdefault(claim_key, set()).add(key)

    def _drop_dra_pod(self, key: str) -> None:
        found = self._dra_pods.pop(key, None)
        for claim_key in found[1] if found is not None else ():
            users = self._claim_users.get(claim_key)
            if users is not None:
                users.discard(key)
                if not users:
                    del self._claim_users[claim_key]

    def _claim_changed(self, claim_key: str) -> None:
        for key in sorted(self._claim_users.get(claim_key, ())):
            known = self.pods.get(key)
            if known is None:
                continue
            updated = self._with_claims(key, known)
            if updated != known:
                self.pods[key] = updated
                self.pod_changes += 1
            self._update_dra_mig(key)
            self._place_dra(key)

    def _record_changed(self, key: str, previous: KnownPod, known: KnownPod) -> KnownPod:
        """A bound pod's GPU record changed. Only the bind writes it, once: a later change is
        someone else's (a tenant moving its share in these books, so that the GPU it really
        uses looks free), so the GPUs it was bound with stay counted, and the change is
        logged, counted (``record_changes``) and reported on the pod (``on_warning``)."""
        self.record_changes += 1
        reason = (f"its {self.names.annotation_gpu_indices} changed after its bind, from "
                  f"{','.join(map(str, previous.gpus or ()))} to "
                  f"{'none' if known.gpus is None else ','.join(map(str, known.gpus))}; only "
                  f"{self.names.scheduler_name}'s bind records a pod's GPUs: the extender "
                  f"keeps counting the GPUs it was bound with")
        log.warning("pod record changed after bind", pod=key, uid=known.uid,
                    was=list(previous.gpus or ()), now=known.gpus)
        if self.on_warning is not None:
            try:
                self.on_warning(PodWarning.on(key, known.uid, EVENT_REASON_RECORD_CHANGED,
                                           f"gpufrag extender: {reason}"))
            except Exception:  # a report that fails must not stop the watch
                log.exception("record-change report failed", pod=key)
        return replace(known, gpus=previous.gpus)

    def known_pending(self, key: str, uid: str) -> bool:
        """The watch has seen the pod ``key`` pending, with this UID."""
        with self.lock:
            known = self.pods.get(key)
            return known is not None and not known.node and bool(known.uid) and known.uid == uid

    def await_pod(self, key: str, uid: str, timeout_s: float,
                  claims: Iterable[str] = ()) -> bool:
        """Wait at most ``timeout_s`` for the watch to show the pod ``key`` with this UID (it
        may be behind the API server: kube-scheduler's own informer saw the pod first), and
        the ResourceClaims ``claims`` (keys) it uses; True once it has. The lock is free while
        waiting, so the watch can apply them."""
        wanted = tuple(claims)
        with self._pod_applied:
            return self._pod_applied.wait_for(
                lambda: ((known := self.pods.get(key)) is not None and known.uid == uid
                         and all(k in self.claims for k in wanted)),
                timeout=timeout_s)

    def request_of(self, obj: Obj) -> PodRequest:
        """``pod_from_k8s(obj)``, without converting again when ``obj`` is made of the same
        inputs as the pod of its name last seen by the watch (the pod kube-scheduler sends to
        filter is that very object); raises what ``pod_from_k8s`` raises."""
        inputs = request_inputs(obj, self.names)
        if inputs is not None:
            meta = obj["metadata"]  # a dict: request_inputs checked
            name, namespace = meta.get("name"), meta.get("namespace") or ""
            if isinstance(name, str) and isinstance(namespace, str):
                with self.lock:
                    memo = self._requests.get(f"{namespace}/{name}" if namespace else name)
                if memo is not None and memo[0] == inputs:
                    return memo[1]
        return pod_from_k8s(obj, self.names)

    def _place_known(self, key: str, *, request: PodRequest | None = None,
                     gpus: tuple[int, ...] | None = None) -> None:
        """Place the bound pod ``key`` on its node: its request (or ``request``) on its
        recorded GPUs (or ``gpus``) where they make sense there, else the core's rule."""
        known = self.pods[key]
        if request is None:
            request, gpus = known.request, known.gpus
        self._drop_orphan(key)
        self.unaccounted.pop(key, None)
        row = self.state.index.get(known.node)
        if row is None or not self.state.active[row]:
            self.orphans.setdefault(known.node, set()).add(key)
            return
        found = self._valid_gpus(request, row, gpus)
        if found is None:
            found = self._default_gpus(request, row)
        if found is None:
            self.unaccounted[key] = (f"asks for {request.num_gpu} GPUs, node "
                                     f"{known.node} has {int(self.state.gpu_count[row])}")
            log.warning("pod not accounted", pod=key, reason=self.unaccounted[key])
            return
        self.state.place(request, row, found, check=False)

    def _valid_gpus(self, pod: PodRequest, row: int,
                    gpus: tuple[int, ...] | None) -> tuple[int, ...] | None:
        """The recorded GPU indices if they make sense on this node, else None."""
        if gpus is None or len(gpus) != pod.num_gpu or len(set(gpus)) != len(gpus):
            return None
        count = int(self.state.gpu_count[row])
        return gpus if all(0 <= g < count for g in gpus) else None

    def _default_gpus(self, pod: PodRequest, row: int) -> tuple[int, ...] | None:
        """The core's rule; where the node is over-committed (no GPU fits), the freest GPUs."""
        count = int(self.state.gpu_count[row])
        if pod.num_gpu > count:
            return None
        gpus = gpus_for(self.state, pod, row, NO_GPU)
        if len(gpus) == pod.num_gpu and NO_GPU not in gpus:
            return gpus
        free = self.state.gpu_free[row, :count]
        freest = np.argsort(-free, kind="stable")
        taken = [g for g in gpus if g != NO_GPU]
        taken += [int(g) for g in freest if int(g) not in taken][: pod.num_gpu - len(taken)]
        return tuple(taken)

    def _drop_orphan(self, key: str) -> None:
        for node, keys in list(self.orphans.items()):
            if key in keys:
                keys.discard(key)
                if not keys:
                    del self.orphans[node]

    def delete_pod(self, key: str) -> None:
        """A Pod is gone (or terminal); a model replica leaving is recorded for the warm window."""
        with self.lock:
            self._unskip("pod", [key])
            self._drop_pod(key)

    def _drop_pod(self, key: str) -> None:
        """Take the pod out of the state and every record but ``skipped``."""
        if self.pods.pop(key, None) is not None:
            self.pod_changes += 1
        self._requests.pop(key, None)
        self._drop_dra_pod(key)
        self.mig.set_ask(key, {})
        self.mig.set_claims(key, {}, (), self.state.index)
        self.assumed.pop(key, None)
        self.decided.discard(key)
        self.unaccounted.pop(key, None)
        self._drop_orphan(key)
        if key in self.state.pods:
            self.state.remove_pod(key, now=self.clock())

    def delete_pod_object(self, obj: Obj) -> None:
        try:
            key = key_of(obj)
        except BadInput:
            return
        self.delete_pod(key)

    def replace_pods(self, objs: Iterable[Obj]) -> None:
        """A full list of Pods: apply each, drop the ones not listed (assumed ones stay: the
        binding may not have reached this list yet; their TTL handles them)."""
        listed: set[str] = set()
        for chunk in _chunks(objs, RELIST_CHUNK):
            with self.lock:
                for obj in chunk:
                    self.apply_pod(obj)
                    with contextlib.suppress(BadInput):
                        listed.add(key_of(obj))
        with self.lock:
            gone = [k for k in self.pods if k not in listed]
            self._count_drift("pod", gone)
            for key in gone:
                self.delete_pod(key)
            self._unskip("pod", [s.key for s in list(self.skipped.values())
                                 if s.kind == "Pod" and s.key not in listed])
            self.pods_synced = True

    # ------------------------------------------------------------------ assumed placements
    def assume(self, pod: PodRequest, row: int, gpus: tuple[int, ...], *,
               decided: bool = False) -> Placement:
        """Count a placement the extender is binding now, or (``decided``) has decided on at
        filter, before the watch shows it; it lasts ``assume_ttl_s`` unless the watch shows
        the pod bound, or it is confirmed (:meth:`confirm`) or forgotten first."""
        with self.lock:
            placement = self.state.place(pod, row, gpus)
            key = pod_key(pod)
            self.assumed[key] = self.clock() + self.assume_ttl_s
            if decided:
                self.decided.add(key)
            return placement

    def confirm(self, key: str) -> None:
        """The bind of an assumed placement is being written: no longer a mere decision, and
        its TTL starts again, so the watch has the whole of it to show the binding."""
        with self.lock:
            if key in self.assumed:
                self.assumed[key] = self.clock() + self.assume_ttl_s
                self.decided.discard(key)

    def assumed_node(self, key: str) -> str:
        """The node of the pod's assumed placement ('' when it has none)."""
        with self.lock:
            if key not in self.assumed:
                return ""
            placement = self.state.pods.get(key)
            return placement.node if placement is not None else ""

    def forget(self, key: str) -> None:
        """Undo an assumption (the bind failed, or it expired). A DRA pod is counted again
        from what the watch shows of it (:meth:`_place_dra`)."""
        with self.lock:
            self.decided.discard(key)
            if self.assumed.pop(key, None) is not None and key in self.state.pods:
                self.state.remove_pod(key)
            self.reservations.forgotten(key)
            if key in self._dra_pods and key in self.pods:
                self._place_dra(key)

    def expire(self, now: float | None = None) -> list[str]:
        """Drop assumptions the watch never confirmed within the TTL; returns their keys."""
        with self.lock:
            at = self.clock() if now is None else now
            gone = [key for key, deadline in self.assumed.items() if deadline <= at]
            for key in gone:
                self.forget(key)
                log.warning("assumed placement expired", pod=key)
            self.reservations.expire(at)
            return gone

    # ------------------------------------------------------------------ hints
    def set_hints(self, configmap: Obj | None) -> None:
        hints, problems = hints_from_configmap(configmap)
        for problem in problems:
            log.warning("placement hint skipped", reason=problem)
        with self.lock:
            self.hints = hints

    # ------------------------------------------------------------------ snapshot
    def load(self, nodes: Iterable[Obj], pods: Iterable[Obj],
             hints: Obj | None = None, claims: Iterable[Obj] = (),
             slices: Iterable[Obj] = (), device_classes: Iterable[Obj] = ()) -> None:
        """Fill the cache from static objects (a snapshot file; with no ResourceClaims, DRA
        pods hold no GPUs, but the cache is synced)."""
        self.replace_device_classes(device_classes)
        self.replace_slices(slices)
        self.replace_nodes(nodes)
        self.replace_claims(claims)
        self.replace_pods(pods)
        self.set_hints(hints)


def request_inputs(obj: Obj, names: KubeNames) -> bytes | None:
    """Everything ``convert.pod_from_k8s`` reads from a pod, as bytes: two objects with equal
    inputs make equal requests, so an equal value lets the cache reuse the request it made.
    The fields, exactly as the object has them: name and namespace, the GPU-spec annotation
    and the model labels (``names``), each container's and init container's ``resources``, and
    ``spec.overhead``; not the rest of the metadata, so the GPU indices a bind adds do not
    count as a change. None (convert, and let the converter name what is wrong) when a part
    is not of the shape JSON gives it. ``tests/scheduler/kube/test_cache.py`` pins that a
    change to any of these fields is converted again."""
    meta, spec = obj.get("metadata"), obj.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return None
    annotations, labels = meta.get("annotations"), meta.get("labels")
    if annotations is None:
        annotations = {}
    if labels is None:
        labels = {}
    if not isinstance(annotations, dict) or not isinstance(labels, dict):
        return None
    parts: list[Any] = [meta.get("name"), meta.get("namespace"),
                        annotations.get(names.annotation_gpu_spec),
                        labels.get(names.label_model), labels.get(names.label_model_version),
                        spec.get("overhead")]
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        if containers is None:
            parts.append(None)
            continue
        if not isinstance(containers, list):
            return None
        resources: list[Any] = []
        for c in containers:
            if not isinstance(c, dict):
                return None
            resources.append(c.get("resources"))
        parts.append(resources)
    try:
        return orjson.dumps(parts)
    except (TypeError, orjson.JSONEncodeError):  # not JSON (an int past 64 bits): convert
        return None


def _scheduler_name(obj: Obj) -> str:
    spec = obj.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) else ""


def _name_or_unknown(obj: Obj) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) and name else "<unnamed>"


def _chunks(objs: Iterable[Obj], size: int) -> Iterable[list[Obj]]:
    chunk: list[Obj] = []
    for obj in objs:
        chunk.append(obj)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


__all__ = ["SKIPPED_KINDS", "ClusterCache", "KnownPod", "SkipListener", "SkippedObject",
           "request_inputs"]
