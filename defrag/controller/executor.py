"""Carry out a plan: every write to the cluster is in this module (descheduler's evictions/).

First the whole plan's capacity is held: one ``GPUReservation`` per move
(:mod:`scheduler.kube.reservations`) on its predicted node and GPUs, for the replacement only
(a new pod of the same owner), which the extender counts as taken for every other pod. A plan is
committed only when every move has its reservation (KAI's consolidation rule): if any creation
fails, the ones created are deleted again and nothing is evicted (the cycle stops, exit 1).
Then, for each move, in plan order:

1. write the placement hint (``names.hints_configmap``: owner UID -> ``[{"node", "expires"}]``) so
   the extender steers the replacement to the planned target;
2. evict the pod through the Eviction API (policy/v1), with the pod's UID as a precondition —
   the API server enforces PodDisruptionBudgets, and a 429 (budget spent) is a refusal that is
   counted and skipped, not a fault;
3. wait, for at most ``--bind-timeout-s``, for the owner's replacement pod to be bound;
4. check where it landed, remove the hint and the reservation, and update the model (the
   snapshot) so the next move — and the "after" figures — start from what really happened;
5. stop early when no node is triggered any more; skip a move whose source node's trigger has
   cleared.

Any other API error stops the cycle where it is (the report says what was done; the CLI exits
1). A rerun reads the live state again and plans from there, so cycles are idempotent; hints and
reservations a stopped cycle leaves behind expire on their own; the next cycle releases them
with every other stale reservation (:mod:`defrag.controller.ledger`) before it plans. The
reservations of moves not carried out (skipped, or after a stop) are deleted at once; the one
of a replacement that did not bind in time is left to its TTL (it may still bind).

``--dry-run`` swaps :class:`KubeActions` for :class:`DryRunActions` (nothing written; every
replacement "lands" where planned); the loop is the same code.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Protocol

import numpy as np
import orjson
import structlog
from kubernetes import client

from defrag.controller.config import DefragConfig
from defrag.controller.errors import ApiRefusal, CycleStopped, call_api, call_api_or_refusal
from defrag.controller.ledger import StaleReservation
from defrag.controller.measure import Summary, measure
from defrag.controller.metrics import CycleMetrics
from defrag.controller.migplan import Relabel
from defrag.controller.model import PodInfo, Snapshot, place_gpus
from defrag.controller.planner import Move, Plan
from defrag.controller.trigger import find_triggers, next_streaks
from gpufrag.conventions import (
    DEFAULT_NAMES,
    LABEL_MIG_CONFIG,
    KubeNames,
    encode_hint_entries,
    hints_from_configmap,
)
from gpufrag.errors import BadInput
from scheduler.core.fragmentation import TargetWorkload
from scheduler.kube import reservations as rsv
from scheduler.kube.convert import bound_gpus, owner_uid
from scheduler.kube.errors import api_error
from scheduler.kube.events import Involved, create_event, warning_event
from scheduler.kube.reservations import Reservation as Reservation

EvictionOutcome = Literal["evicted", "refused", "gone"]
Entries = dict[str, list[tuple[str, float]]]  # owner UID -> [(node, expires)]
# Labels a controller puts on every pod it creates: ReplicaSet, StatefulSet, Job.
OWNER_LABELS = ("pod-template-hash", "controller-revision-hash",
                "batch.kubernetes.io/controller-uid", "controller-uid")
Log = Any  # a structlog bound logger


@dataclass(frozen=True, slots=True)
class Landing:
    """Where an evicted pod's replacement was bound."""

    pod: str  # namespace/name of the replacement
    uid: str
    node: str
    gpus: tuple[int, ...] | None = None


class ClusterActions(Protocol):
    """The writes (and the one wait) a cycle performs; swapped whole for a dry run (and for
    the what-if's writer, which imports :class:`Reservation` from here: re-exported)."""

    @property
    def dry_run(self) -> bool: ...

    def prune_hints(self, now: float) -> int: ...

    def put_hint(self, owner_uid: str, node: str, expires: float) -> None: ...

    def remove_hint(self, owner_uid: str, node: str, expires: float) -> None: ...

    def owner_pods(self, pod: PodInfo) -> frozenset[str]: ...

    def evict(self, pod: PodInfo) -> EvictionOutcome: ...

    def await_replacement(self, pod: PodInfo, move: Move, known_uids: frozenset[str],
                          timeout_s: float) -> Landing | None: ...

    def save_state(self, text: str) -> None: ...

    def reserve(self, reservation: Reservation) -> None: ...

    def renew_reservation(self, name: str, expires: float) -> None: ...

    def release(self, name: str) -> None: ...

    def report_stale(self, stale: StaleReservation, *, released: bool, now: float) -> None: ...


# The Warning Event on a GPUReservation that holds capacity for nothing (ledger.REASONS).
EVENT_REASON_STALE_RESERVATION = "GPUReservationStale"
# The Normal Event on a drained MIG node whose nvidia.com/mig.config the MIG step set.
EVENT_REASON_MIG_RELABELLED = "MigLayoutChanged"
COMPONENT = "gpufrag-defrag"


class MigWriter(Protocol):
    """The MIG step's one write (:mod:`defrag.controller.migplan`): a drained node's
    ``nvidia.com/mig.config`` label, with a Node Event saying why. A protocol of its own, so
    the eviction writers of the what-if and the tests need not grow it."""

    def relabel_mig(self, relabel: Relabel, now: float) -> bool: ...


def stale_message(stale: StaleReservation, *, released: bool) -> str:
    """What the Event on a stale reservation says: why, and what this cycle did about it."""
    if released:
        done = "released by this cycle"
    elif not stale.managed:
        done = "kept: gpufrag defrag releases only the reservations it made"
    else:
        done = "kept: its owner's namespace is not one this cycle may move pods in"
    return f"holds GPU capacity for nothing ({stale.reason}): {stale.detail}; {done}"


# ------------------------------------------------------------------------------ dry run
class DryRunActions:
    """Writes nothing; every eviction "succeeds" and every replacement lands as planned."""

    dry_run = True

    def __init__(self, log: Log | None = None) -> None:
        self.log = log if log is not None else structlog.get_logger("defrag")
        self.written: list[tuple[str, str, str]] = []

    def prune_hints(self, now: float) -> int:
        return 0

    def put_hint(self, owner_uid: str, node: str, expires: float) -> None:
        self.written.append(("hint", owner_uid, node))
        self.log.info("dry run: would write placement hint", owner_uid=owner_uid, node=node)

    def remove_hint(self, owner_uid: str, node: str, expires: float) -> None:
        self.log.info("dry run: would remove placement hint", owner_uid=owner_uid, node=node)

    def owner_pods(self, pod: PodInfo) -> frozenset[str]:
        return frozenset()

    def evict(self, pod: PodInfo) -> EvictionOutcome:
        self.written.append(("evict", pod.key, pod.uid))
        self.log.info("dry run: would evict", pod=pod.key)
        return "evicted"

    def await_replacement(self, pod: PodInfo, move: Move, known_uids: frozenset[str],
                          timeout_s: float) -> Landing | None:
        return Landing(pod=move.pod, uid=pod.uid, node=move.target, gpus=move.target_gpus)

    def save_state(self, text: str) -> None:
        self.written.append(("state", "", text))
        self.log.info("dry run: would record the defrag state (cooldown, hysteresis)")

    def reserve(self, reservation: Reservation) -> None:
        self.written.append(("reserve", reservation.name, reservation.node))
        self.log.info("dry run: would reserve", reservation=reservation.name,
                      node=reservation.node, gpus=list(reservation.gpus))

    def renew_reservation(self, name: str, expires: float) -> None:
        pass

    def release(self, name: str) -> None:
        self.log.info("dry run: would release the reservation", reservation=name)

    def relabel_mig(self, relabel: Relabel, now: float) -> bool:
        self.written.append(("mig.config", relabel.node, relabel.config))
        self.log.info("dry run: would set the MIG layout", node=relabel.node,
                      label=LABEL_MIG_CONFIG, value=relabel.config, was=relabel.current,
                      reason=EVENT_REASON_MIG_RELABELLED)
        return True

    def report_stale(self, stale: StaleReservation, *, released: bool, now: float) -> None:
        self.log.info("dry run: would put an Event on the stale reservation",
                      reservation=stale.name, reason=EVENT_REASON_STALE_RESERVATION,
                      message=stale_message(stale, released=released))


# ------------------------------------------------------------------------------ the real one
class KubeActions:
    """Writes through the Kubernetes API: the hints ConfigMap and the Eviction API."""

    dry_run = False

    def __init__(self, api_client: Any, *, log: Log | None = None,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, poll_s: float = 1.0,
                 names: KubeNames = DEFAULT_NAMES) -> None:
        self._client = client
        self.names = names
        self.core: Any = client.CoreV1Api(api_client)  # bodies are passed as plain dicts
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.log = log if log is not None else structlog.get_logger("defrag")
        self.clock = clock
        self.sleep = sleep
        self.poll_s = poll_s
        self.hints_namespace = names.hints_namespace
        self.hints_name = names.hints_configmap

    # -- hints ----------------------------------------------------------------------------
    def _read_hints(self) -> dict[str, Any] | None:
        where = f"reading ConfigMap {self.hints_namespace}/{self.hints_name}"
        answer = call_api_or_refusal(where, lambda: self.core.read_namespaced_config_map(
            self.hints_name, self.hints_namespace, _preload_content=False), ok=(404,))
        if isinstance(answer, ApiRefusal):
            return None
        obj: dict[str, Any] = orjson.loads(answer.data)
        return obj

    def _update_hints(self, edit: Callable[[Entries], Entries], what: str) -> None:
        """Read-modify-write the hints ConfigMap with optimistic concurrency (retry on 409).
        Entries are read with the extender's own reader; keys it cannot read are kept as-is."""
        where = f"{what} in ConfigMap {self.hints_namespace}/{self.hints_name}"
        for _ in range(5):
            obj = self._read_hints()
            raw = dict((obj or {}).get("data") or {})
            hints, _problems = hints_from_configmap(obj)
            current = {owner: list(entries) for owner, entries in hints.by_owner.items()}
            edited = {owner: encode_hint_entries(entries)
                      for owner, entries in edit(current).items() if entries}
            data = {k: v for k, v in raw.items() if k not in hints.by_owner}
            data.update(edited)
            if obj is None:
                if not edited:
                    return
                body = {"apiVersion": "v1", "kind": "ConfigMap", "data": data, "metadata": {
                    "name": self.hints_name, "namespace": self.hints_namespace}}
                write = partial(self.core.create_namespaced_config_map, self.hints_namespace,
                                body)
            else:
                if data == raw:
                    return
                obj["data"] = data
                write = partial(self.core.replace_namespaced_config_map, self.hints_name,
                                self.hints_namespace, obj)
            if not isinstance(call_api_or_refusal(where, write, ok=(409,)), ApiRefusal):
                return
        raise CycleStopped(where, "the ConfigMap kept changing under us (5 conflicts)")

    def prune_hints(self, now: float) -> int:
        pruned = 0

        def edit(current: Entries) -> Entries:
            nonlocal pruned
            kept = {owner: [e for e in entries if e[1] > now] for owner, entries in current.items()}
            pruned = sum(len(v) for v in current.values()) - sum(len(v) for v in kept.values())
            return kept

        self._update_hints(edit, "pruning expired placement hints")
        return pruned

    def put_hint(self, owner_uid: str, node: str, expires: float) -> None:
        now = self.clock()

        def edit(current: Entries) -> Entries:
            entries = [e for e in current.get(owner_uid, []) if e[1] > now]
            current[owner_uid] = [*entries, (node, expires)]
            return current

        self._update_hints(edit, f"writing the placement hint for owner {owner_uid}")
        self.log.info("placement hint written", owner_uid=owner_uid, node=node,
                      expires=round(expires))

    def remove_hint(self, owner_uid: str, node: str, expires: float) -> None:
        def edit(current: Entries) -> Entries:
            current[owner_uid] = [e for e in current.get(owner_uid, [])
                                  if not (e[0] == node and abs(e[1] - expires) < 1e-3)]
            return current

        self._update_hints(edit, f"removing the placement hint for owner {owner_uid}")
        self.log.info("placement hint removed", owner_uid=owner_uid, node=node)

    # -- what one cycle leaves for the next (defrag.controller.convergence) ---------------
    def load_state(self) -> str | None:
        """The defrag state annotation on the hints ConfigMap (None: none yet, or no
        ConfigMap). Reading is safe in a dry run too."""
        obj = self._read_hints()
        annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
        value = annotations.get(self.names.annotation_defrag_state)
        return value if isinstance(value, str) else None

    def save_state(self, text: str) -> None:
        """Record the state with a merge patch of one annotation (``data`` is untouched). A
        hints ConfigMap that does not exist yet (an optional input: no hint written so far) is
        created with it, as a hint would create it; a run is never failed for its absence."""
        where = f"recording the defrag state on ConfigMap {self.hints_namespace}/{self.hints_name}"
        body = {"metadata": {"annotations": {self.names.annotation_defrag_state: text}}}
        answer = call_api_or_refusal(where, lambda: self.core.patch_namespaced_config_map(
            self.hints_name, self.hints_namespace, body), ok=(404,))
        if isinstance(answer, ApiRefusal):
            created = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                "name": self.hints_name, "namespace": self.hints_namespace,
                "annotations": body["metadata"]["annotations"]}}
            made = call_api_or_refusal(where, lambda: self.core.create_namespaced_config_map(
                self.hints_namespace, created), ok=(404, 409))
            if isinstance(made, ApiRefusal):  # the namespace is missing too, or a race
                self.log.warning("defrag state not recorded", reason=made.message,
                                 effect="the next cycle starts without this one's state")
                return
        self.log.info("defrag state recorded")

    # -- reservations ---------------------------------------------------------------------
    def _crd_missing(self, answer: ApiRefusal, doing: str) -> CycleStopped:
        """A 404 from the reservations API: the namespace, or else the CRD, is missing."""
        fix = (f"create namespace {self.hints_namespace} (the manifests do)"
               if f'"{self.hints_namespace}" not found' in answer.message else
               "is the GPUReservation CRD installed? manifests/base/crd-gpureservation.yaml")
        return CycleStopped(doing, f"HTTP 404: {answer.message} ({fix})", status=404)

    def reserve(self, reservation: Reservation) -> None:
        doing = f"creating GPUReservation {self.hints_namespace}/{reservation.name}"
        obj = rsv.body(reservation)
        answer = call_api_or_refusal(doing, lambda: self.custom.create_namespaced_custom_object(
            rsv.GROUP, rsv.VERSION, self.hints_namespace, rsv.PLURAL, obj), ok=(404, 409))
        if isinstance(answer, ApiRefusal) and answer.status == 404:
            raise self._crd_missing(answer, doing)
        if isinstance(answer, ApiRefusal):  # left by a cycle that stopped: ours, made anew
            call_api(doing, lambda: self.custom.patch_namespaced_custom_object(
                rsv.GROUP, rsv.VERSION, self.hints_namespace, rsv.PLURAL, reservation.name,
                {"spec": obj["spec"]}))
        self.log.info("capacity reserved", reservation=reservation.name, node=reservation.node,
                      gpus=list(reservation.gpus), gpu_milli=reservation.gpu_milli)

    def renew_reservation(self, name: str, expires: float) -> None:
        call_api(f"renewing GPUReservation {self.hints_namespace}/{name}",
                 lambda: self.custom.patch_namespaced_custom_object(
                     rsv.GROUP, rsv.VERSION, self.hints_namespace, rsv.PLURAL, name,
                     {"spec": {"expiresAt": rsv.rfc3339(expires)}}))

    def release(self, name: str) -> None:
        call_api_or_refusal(f"deleting GPUReservation {self.hints_namespace}/{name}",
                            lambda: self.custom.delete_namespaced_custom_object(
                                rsv.GROUP, rsv.VERSION, self.hints_namespace, rsv.PLURAL,
                                name), ok=(404,))
        self.log.info("reservation released", reservation=name)

    def report_stale(self, stale: StaleReservation, *, released: bool, now: float) -> None:
        """A Warning Event on the reservation, at most one an hour (:mod:`scheduler.kube.events`:
        every cycle is a new process, so the API server's 409 remembers the last one). Advice:
        a failure is logged and the cycle goes on."""
        namespace, body = warning_event(
            Involved(rsv.KIND, stale.name, self.hints_namespace, api_version=rsv.API_VERSION),
            reason=EVENT_REASON_STALE_RESERVATION, message=stale_message(stale, released=released),
            component=COMPONENT, instance=COMPONENT, now_s=now)
        try:
            create_event(self.core, namespace, body, timeout_s=10.0)
        except Exception as e:
            self.log.warning("stale reservation Event not written", reservation=stale.name,
                             error=str(api_error("creating an Event", e) or e))

    # -- MIG layouts ----------------------------------------------------------------------
    def relabel_mig(self, relabel: Relabel, now: float) -> bool:
        """Set the node's ``nvidia.com/mig.config`` (NVIDIA's MIG manager re-cuts its GPUs);
        a JSON patch that tests the label first, so a node someone relabelled since this cycle
        read it is left alone (422: logged, False). Then a Normal Event on the Node (advice:
        a failure is logged)."""
        path = "/metadata/labels/" + LABEL_MIG_CONFIG.replace("~", "~0").replace("/", "~1")
        ops = [{"op": "test", "path": path, "value": relabel.current}] if relabel.current else []
        ops.append({"op": "add", "path": path, "value": relabel.config})
        doing = f"setting {LABEL_MIG_CONFIG}={relabel.config} on node {relabel.node}"
        answer = call_api_or_refusal(doing, lambda: self.core.patch_node(
            relabel.node, ops, _content_type="application/json-patch+json"), ok=(404, 409, 422))
        if isinstance(answer, ApiRefusal):
            self.log.warning("MIG layout not set: the node changed or is gone", node=relabel.node,
                             status=answer.status, reason=answer.message)
            return False
        self.log.info("MIG layout set", node=relabel.node, label=LABEL_MIG_CONFIG,
                      value=relabel.config, was=relabel.current)
        namespace, body = warning_event(
            Involved("Node", relabel.node), reason=EVENT_REASON_MIG_RELABELLED,
            message=relabel.message(), component=COMPONENT, instance=COMPONENT, now_s=now,
            event_type="Normal")
        try:
            create_event(self.core, namespace, body, timeout_s=10.0)
        except Exception as e:
            self.log.warning("MIG layout Event not written", node=relabel.node,
                             error=str(api_error("creating an Event", e) or e))
        return True

    # -- pods -----------------------------------------------------------------------------
    def _owner_pods(self, pod: PodInfo) -> list[Mapping[str, Any]]:
        # Narrow the list with the label every replica of the owner carries (set by its
        # controller, so a replacement has it too); other labels may have been added later.
        selector = ",".join(f"{k}={pod.labels[k]}" for k in OWNER_LABELS if k in pod.labels)
        answer = call_api(f"listing pods of {pod.owner_kind}/{pod.owner_name}",
                            lambda: self.core.list_namespaced_pod(
                                pod.namespace, label_selector=selector or None,
                                _preload_content=False))
        items = orjson.loads(answer.data).get("items") or []
        return [p for p in items if _controller_uid(p) == pod.owner_uid]

    def owner_pods(self, pod: PodInfo) -> frozenset[str]:
        return frozenset(str((p.get("metadata") or {}).get("uid", ""))
                         for p in self._owner_pods(pod))

    def evict(self, pod: PodInfo) -> EvictionOutcome:
        c = self._client
        body = c.V1Eviction(
            metadata=c.V1ObjectMeta(name=pod.name, namespace=pod.namespace),
            delete_options=c.V1DeleteOptions(preconditions=c.V1Preconditions(uid=pod.uid)))
        evict = partial(self.core.create_namespaced_pod_eviction, pod.name, pod.namespace, body)
        answer = call_api_or_refusal(f"evicting pod {pod.key}", evict, ok=(404, 409, 429))
        if isinstance(answer, ApiRefusal):
            status = answer.status
            self.log.warning("eviction refused" if status == 429 else "pod already gone",
                             pod=pod.key, status=status, reason=answer.message)
            return "refused" if status == 429 else "gone"
        self.log.info("pod evicted", pod=pod.key, node=pod.node)
        return "evicted"

    def await_replacement(self, pod: PodInfo, move: Move, known_uids: frozenset[str],
                          timeout_s: float) -> Landing | None:
        deadline = self.clock() + timeout_s
        while True:
            fresh = [p for p in self._owner_pods(pod)
                     if str((p.get("metadata") or {}).get("uid", "")) not in known_uids
                     and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
            bound = sorted((p for p in fresh if (p.get("spec") or {}).get("nodeName")),
                           key=lambda p: str((p.get("metadata") or {})
                                             .get("creationTimestamp", "")))
            if bound:
                meta = bound[0].get("metadata") or {}
                return Landing(pod=f"{meta.get('namespace')}/{meta.get('name')}",
                               uid=str(meta.get("uid", "")), node=str(bound[0]["spec"]["nodeName"]),
                               gpus=bound_gpus(bound[0], self.names))
            if self.clock() >= deadline:
                return None
            self.sleep(self.poll_s)


def _controller_uid(obj: Mapping[str, Any]) -> str:
    """The controlling owner's UID ('' for a bare pod, or one whose owners cannot be read)."""
    try:
        return owner_uid(obj)
    except BadInput:
        return ""




# ------------------------------------------------------------------------------ the loop
@dataclass(frozen=True, slots=True)
class MoveResult:
    move: Move
    outcome: str  # landed | landed elsewhere | refused by PDB | pod gone | bind timeout
    landed_on: str = ""
    replacement: str = ""


@dataclass
class CycleReport:
    results: list[MoveResult] = field(default_factory=list)
    skipped: list[tuple[Move, str]] = field(default_factory=list)
    error: str | None = None
    # False when not every move's reservation could be made: the cycle stopped before any
    # eviction (KAI's consolidation rule).
    committed: bool = True
    stopped_early: str = ""
    before: Summary | None = None
    after: Summary | None = None
    # At the end of the cycle (hysteresis applied): nodes triggered on idle memory (latched for the
    # next cycle), and how many are triggered in all and for blocking.
    latched_after: frozenset[str] = frozenset()
    # ... and, per node, the cycles in a row towards its next change (the next cycle's streaks).
    streaks_after: dict[str, int] = field(default_factory=dict)
    waiting_after: int = 0  # nodes above the threshold, counting cycles before they turn on
    triggered_after: int = 0
    blocking_after: int = 0

    @property
    def moved_owners(self) -> frozenset[str]:
        """Owners whose pod was evicted this cycle (they start a cooldown)."""
        return frozenset(r.move.owner_uid for r in self.results
                         if r.outcome not in ("refused by PDB", "pod gone"))

    @property
    def evicted(self) -> int:
        return sum(1 for r in self.results if r.outcome not in ("refused by PDB", "pod gone"))

    @property
    def moved_nodes(self) -> list[tuple[str, str]]:
        """(source, node the replacement landed on, else the planned target) of every pod
        evicted this cycle: they start the node cooldown and spend the daily budget."""
        return [(r.move.source, r.landed_on or r.move.target) for r in self.results
                if r.outcome not in ("refused by PDB", "pod gone")]


class Executor:
    def __init__(self, actions: ClusterActions, config: DefragConfig, metrics: CycleMetrics,
                 *, clock: Callable[[], float] = time.time, log: Log | None = None) -> None:
        self.actions = actions
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.log = log if log is not None else structlog.get_logger("defrag")

    def run(self, plan: Plan, snapshot: Snapshot, workload: TargetWorkload) -> CycleReport:
        """Carry out ``plan`` on the cluster; ``snapshot`` follows what really happened."""
        report = CycleReport(before=plan.before)
        state = snapshot.state
        # Hysteresis within the cycle too: a node the plan found triggered on idle memory stays a
        # source until its idle ratio falls to --threshold-off (for --trigger-off-cycles).
        before = snapshot.latched_rows()
        fresh = frozenset(state.index[n] for n in plan.idle_nodes if n in state.index) - before
        latched = before | fresh
        # A node that turned on this cycle counts its cycles towards turning off from 0.
        streaks = {r: c for r, c in snapshot.streak_rows().items() if r not in fresh}
        triggers_now = functools.partial(find_triggers, streaks=streaks,
                                         on_cycles=self.config.trigger_on_cycles,
                                         off_cycles=self.config.trigger_off_cycles)
        held: dict[str, Reservation] = {}  # pod key -> the reservation not yet released
        try:
            pruned = self.actions.prune_hints(self.clock())
            if pruned:
                self.log.info("expired placement hints pruned", count=pruned)
            if plan.moves:
                try:
                    held = self._reserve_all(plan, snapshot)
                except CycleStopped:
                    report.committed = False
                    raise
            for i, move in enumerate(plan.moves):
                measurement = measure(state, snapshot.usage, workload)
                triggers = triggers_now(state, measurement, snapshot.pending,
                                        self.config.threshold, latched=latched,
                                        threshold_off=self.config.off_threshold)
                if not triggers.rows:
                    report.stopped_early = "no node is triggered any more"
                    for rest in plan.moves[i:]:
                        report.skipped.append((rest, "trigger cleared"))
                        self.metrics.skipped("trigger_cleared")
                    self.log.info("trigger cleared: stopping early", moves_left=len(plan.moves) - i)
                    break
                if state.index[move.source] not in triggers.rows:
                    report.skipped.append((move, "trigger cleared on the source node"))
                    self.metrics.skipped("trigger_cleared")
                    self.log.info("move skipped: source no longer triggered", pod=move.pod,
                                  source=move.source)
                    continue
                result = self._one(move, snapshot, held)
                report.results.append(result)
                if result.outcome == "bind timeout":
                    report.error = (f"the replacement of {move.pod} was not bound within "
                                    f"{self.config.bind_timeout_s:g}s; stopping (its hint "
                                    f"expires on its own)")
                    break
        except CycleStopped as e:
            report.error = str(e)
            self.metrics.failed("api_error")
            self.log.error("cycle stopped by an API error", error=str(e))
        # Moves not carried out (skipped, or after a stop) give their capacity back now.
        for reservation in held.values():
            try:
                self.actions.release(reservation.name)
                self.metrics.reservation("released")
            except CycleStopped as e:  # it expires on its own; say so
                report.error = report.error or str(e)
                self.log.warning("reservation left to expire", reservation=reservation.name,
                                 error=str(e))
        final = measure(state, snapshot.usage, workload)
        report.after = final.summary
        end = triggers_now(state, final, snapshot.pending, self.config.threshold,
                           latched=latched, threshold_off=self.config.off_threshold)
        report.latched_after = frozenset(state.names[r] for r in end.idle)
        ratio = np.nan_to_num(final.idle_ratio, nan=0.0)
        report.streaks_after = {
            state.names[r]: c for r, c in next_streaks(
                ratio, threshold=self.config.threshold, off=self.config.off_threshold,
                latched_before=latched, latched_after=end.idle, streaks=streaks).items()}
        report.triggered_after = len(end.rows)
        report.waiting_after = sum(1 for n in report.streaks_after
                                   if n not in report.latched_after)
        report.blocking_after = len(end.blocking)
        return report

    def _reserve_all(self, plan: Plan, snapshot: Snapshot) -> dict[str, Reservation]:
        """One reservation per move, or none at all: a failure deletes the ones made and
        stops the cycle before anything is evicted."""
        made: dict[str, Reservation] = {}
        expires = self.clock() + self.config.hint_ttl_s
        try:
            for move in plan.moves:
                pod = snapshot.pods[move.pod]
                reservation = reservation_for(move, self.actions.owner_pods(pod) | {pod.uid},
                                              expires)
                self.actions.reserve(reservation)
                made[move.pod] = reservation
                self.metrics.reservation("created")
        except CycleStopped as e:
            for reservation in made.values():
                try:
                    self.actions.release(reservation.name)
                    self.metrics.reservation("rolled_back")
                except CycleStopped as again:
                    self.log.warning("reservation left to expire", reservation=reservation.name,
                                     error=str(again))
            self.metrics.failed("reservation")
            raise CycleStopped(
                f"reserving capacity for all {len(plan.moves)} move(s) (nothing was evicted; "
                f"{len(made)} reservation(s) rolled back)", str(e), status=e.status) from None
        return made

    def _one(self, move: Move, snapshot: Snapshot,
             held: dict[str, Reservation] | None = None) -> MoveResult:
        pod = snapshot.pods[move.pod]
        log = self.log.bind(pod=move.pod, source=move.source, target=move.target)
        held = held if held is not None else {}
        reservation = held.get(move.pod)
        expires = self.clock() + self.config.hint_ttl_s
        self.actions.put_hint(move.owner_uid, move.target, expires)
        if reservation is not None:  # the TTL counts from the eviction, not from the plan
            self.actions.renew_reservation(reservation.name, expires)
        known = self.actions.owner_pods(pod) | {pod.uid}
        outcome = self.actions.evict(pod)
        if outcome != "evicted":
            self.actions.remove_hint(move.owner_uid, move.target, expires)
            self._release(held, move)
            self.metrics.refused("pdb" if outcome == "refused" else "gone")
            log.info("move not carried out", outcome=outcome)
            return MoveResult(move, "refused by PDB" if outcome == "refused" else "pod gone")
        self.metrics.evicted()
        landing = self.actions.await_replacement(pod, move, known, self.config.bind_timeout_s)
        if landing is None:
            self.metrics.failed("bind_timeout")
            log.error("replacement not bound in time", timeout_s=self.config.bind_timeout_s)
            held.pop(move.pod, None)  # it may still bind: the reservation runs to its TTL
            return MoveResult(move, "bind timeout")
        self.actions.remove_hint(move.owner_uid, move.target, expires)
        self._release(held, move)
        on_target = landing.node == move.target
        self.metrics.landed(on_target)
        (log.info if on_target else log.warning)(
            "replacement bound", replacement=landing.pod, node=landing.node,
            on_target=on_target)
        follow(snapshot, move, landing)
        return MoveResult(move, "landed" if on_target else "landed elsewhere", landing.node,
                          landing.pod)


    def _release(self, held: dict[str, Reservation], move: Move) -> None:
        reservation = held.pop(move.pod, None)
        if reservation is not None:
            self.actions.release(reservation.name)
            self.metrics.reservation("released")


def reservation_for(move: Move, existing_pods: frozenset[str], expires: float) -> Reservation:
    """The capacity ``move``'s replacement needs on its target: its (right-sized) share on the
    predicted GPUs, usable by a new pod of the same owner only."""
    suffix = "".join(c for c in move.uid.lower() if c.isascii() and c.isalnum())[:8] or "r"
    return Reservation(
        name=f"{move.name[: 253 - len(suffix) - 1]}-{suffix}", node=move.target,
        gpus=move.target_gpus, gpu_milli=move.new_milli or move.gpu_milli,
        owner_uid=move.owner_uid, owner_kind=move.owner_kind, owner_name=move.owner_name,
        namespace=move.namespace, existing_pods=existing_pods, expires=expires,
        replaces=move.pod)


def follow(snapshot: Snapshot, move: Move, landing: Landing) -> None:
    """Update the model: ``move``'s pod now runs where its replacement was bound."""
    state = snapshot.state
    old = state.pods.get(move.pod)
    if old is None:
        return
    src = state.index[old.node]
    row = state.index.get(landing.node)
    state.remove_pod(move.pod)
    if row is None:
        snapshot.usage.move(old, src, src, ())
        return
    # A right-sized replacement (the webhook in ``auto`` mode) reserves its new share.
    pod = (dataclasses.replace(old.pod, gpu_milli=move.new_milli) if move.new_milli
           else old.pod)
    if landing.node == move.target and landing.gpus is None:
        gpus = place_gpus(state, pod, row, move.target_gpus)
    else:
        gpus = place_gpus(state, pod, row, landing.gpus)
    # The replacement is a new pod: the trigger reads its peak from what it uses now, as the
    # planner's landing check predicted it (the old pod's peak would read the node too busy
    # this cycle and turn its trigger off, on again at the next).
    snapshot.usage.move(old, src, row, gpus, fresh=True)
    state.place(pod, row, gpus, check=False)
