"""What the defrag controller knows about the cluster, in plain types.

The live controller builds these from Kubernetes objects (:mod:`defrag.controller.snapshot`);
the what-if builds them from a replayed trace. Neither the planner nor the measurements import the
Kubernetes client, so the simulator can run them as they run in the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from defrag.controller.measure import UsageTable
from gpufrag.gpu_usage import NodeGpuUsage
from scheduler.core.fragmentation import TargetWorkload
from scheduler.core.gpus import NO_GPU, gpus_for
from scheduler.core.mig import MigInstance
from scheduler.core.state import ClusterState, pod_key
from scheduler.core.types import MILLI_PER_GPU, PodRequest

# Controllers that recreate an evicted pod (elsewhere): the only owners whose pods may move.
MOVABLE_OWNERS = frozenset({"ReplicaSet", "StatefulSet", "Job"})


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"

    @property
    def repels(self) -> bool:
        """Keeps new pods off unless tolerated (PreferNoSchedule only discourages)."""
        return self.effect in ("NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # or Exists
    value: str = ""
    effect: str = ""  # "" tolerates every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True, slots=True)
class NodeConstraints:
    """What a pod demands of its node beyond resources: nodeSelector, required node affinity
    (OR of terms, each an AND of requirements) and the taints it tolerates. The placement core
    does not model these, so the planner filters targets with them."""

    selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[tuple[SelectorRequirement, ...], ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    def allows(self, labels: Mapping[str, str], taints: tuple[Taint, ...] = ()) -> bool:
        if any(labels.get(k) != v for k, v in self.selector):
            return False
        if self.affinity and not any(
                term and all(r.matches(labels) for r in term) for term in self.affinity):
            return False
        return all(any(t.tolerates(taint) for t in self.tolerations)
                   for taint in taints if taint.repels)


# How a pod gets its GPUs (PodInfo.delivery).
DELIVERY_DEVICE_PLUGIN = ""
DELIVERY_CLAIMS = "claims"
DELIVERY_DIRECT = "direct"


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A pod as the planner sees it: its request plus what decides whether it may move."""

    key: str  # namespace/name, as ClusterState keys it
    request: PodRequest
    uid: str = ""
    node: str = ""  # "" while pending
    owner_kind: str = ""  # kind of the controlling owner; "" for a bare pod
    owner_uid: str = ""
    owner_name: str = ""
    priority: int = 0
    opted_out: bool = False  # annotation gpufrag.io/defrag-movable: "false"
    running: bool = True
    deleting: bool = False
    scheduler_name: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    constraints: NodeConstraints = NodeConstraints()
    # A container of this right-sized pod (it carries the webhook's change annotation) ended
    # out of memory: the right-sizing guard raises its workload.
    out_of_memory: bool = False
    # When the pod started (unix s, its status.startTime; None: not known): its age decides
    # whether right-sizing alone may evict it (defrag.controller.rightsize.out_of_bounds).
    started_s: float | None = None
    # How it gets its GPUs (docs/dra.md): "" from the device plugin (its record), "claims"
    # through ResourceClaims made for it (from templates, or by kube-scheduler for a mapped
    # extended resource: a replacement gets new ones, allocated by DRA's first fit), "direct"
    # through a claim its spec names (the claim, and its devices, stay with the claim).
    delivery: str = ""  # DELIVERY_DEVICE_PLUGIN, DELIVERY_CLAIMS or DELIVERY_DIRECT

    @property
    def namespace(self) -> str:
        return self.request.namespace

    @property
    def name(self) -> str:
        return self.request.name


@dataclass(frozen=True, slots=True)
class SelectorRequirement:
    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return self.key not in labels or labels[self.key] not in self.values
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator in ("Gt", "Lt") and len(self.values) == 1:  # node affinity only
            try:
                have, bound = int(labels[self.key]), int(next(iter(self.values)))
            except (KeyError, ValueError):
                return False
            return have > bound if self.operator == "Gt" else have < bound
        return False  # an operator we do not know selects nothing (never a wrong match)


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A metav1.LabelSelector. ``None`` selects nothing; an empty selector selects every pod
    (policy/v1 semantics for PodDisruptionBudgets)."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[SelectorRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        return all(r.matches(labels) for r in self.match_expressions)


@dataclass(frozen=True, slots=True)
class Pdb:
    """A PodDisruptionBudget: its selector and how many more pods it lets go right now."""

    namespace: str
    name: str
    selector: LabelSelector | None
    disruptions_allowed: int

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def covers(self, pod: PodInfo) -> bool:
        return (self.selector is not None and pod.namespace == self.namespace
                and self.selector.matches(pod.labels))


@dataclass(frozen=True, slots=True)
class UsageNote:
    """Usage data that was ignored (stale, malformed, absent) and why: reported, never guessed."""

    node: str
    reason: str


MIG_FROM_CLAIMS = "claims"  # a DRA allocation names the partition (a claim's result)
MIG_FROM_AGENT = "agent"  # the node agent's fresh reading lists the instance


@dataclass(frozen=True, slots=True)
class HeldInstance:
    """A MIG instance on a node and the pods that hold it (keys; none: made and unused),
    with where it was read (:data:`MIG_FROM_CLAIMS`, :data:`MIG_FROM_AGENT`, or both)."""

    instance: MigInstance  # its GPU, profile and start; in_use when a pod holds it
    pods: tuple[str, ...]
    sources: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NodeMig:
    """A node's GPUs in MIG mode (index -> product) and the instances on them. ``dynamic``:
    the GPUs are the DRA driver's partitionable devices, whose instances are made per claim,
    so every placement not taken is free (docs/dra.md)."""

    gpus: Mapping[int, str]
    instances: tuple[HeldInstance, ...]
    dynamic: bool = False


@dataclass
class Snapshot:
    """One consistent reading of the cluster: the placement state (bound pods placed), the pods
    with their movability facts, pending pods, GPU memory in use, PDBs and any usage notes."""

    state: ClusterState
    pods: dict[str, PodInfo]
    pending: list[PodInfo]
    usage: UsageTable
    pdbs: list[Pdb] = field(default_factory=list)
    notes: list[UsageNote] = field(default_factory=list)
    taints: Mapping[str, tuple[Taint, ...]] = field(default_factory=dict)
    cordoned: frozenset[str] = frozenset()
    # What the last cycles left (defrag.controller.convergence): nodes whose idle trigger is
    # on (hysteresis) and owners still in cooldown.
    latched: frozenset[str] = frozenset()
    streaks: Mapping[str, int] = field(default_factory=dict)  # node -> cycles in a row
    cooling: frozenset[str] = frozenset()
    # Nodes a move took a pod off / landed a pod on within --node-cooldown-s: not a target /
    # not a source this cycle.
    gave_recently: frozenset[str] = frozenset()
    received_recently: frozenset[str] = frozenset()
    # The controller's evictions in the 24 hours before this cycle (the daily budget's spend).
    evicted_last_day: int = 0
    # Right-sizing: pod key -> the GPU share (milli) its replacement will be admitted with (its
    # workload is in ``auto`` mode and the recommendation is below what it reserves).
    rightsized: Mapping[str, int] = field(default_factory=dict)
    # Right-sizing: pod key -> (its workload, as "Kind/namespace/name", and whether right-sizing
    # may change what its replacements reserve: mode auto, one GPU). None: not known, and every
    # node counts as actionable (defrag.controller.actionable).
    sizable: Mapping[str, tuple[str, bool]] | None = None
    # The node agent's fresh readings by node (per pod, per GPU): what right-sizing learns from.
    readings: Mapping[str, NodeGpuUsage] = field(default_factory=dict)
    # Pods whose right-sizing alone pays an eviction (VPA's out-of-bounds rule,
    # defrag.controller.rightsize.out_of_bounds); the others' right-sized replacements count
    # only when the move packs. None: every right-sized pod (no rule applied).
    rightsize_evictable: frozenset[str] | None = None
    # Nodes with GPUs in MIG mode, and the instances pods hold there: from DRA allocations
    # (the claims' partitions) and the agent's fresh readings (defrag.controller.miginuse).
    mig: Mapping[str, NodeMig] = field(default_factory=dict)

    def latched_rows(self) -> frozenset[int]:
        index = self.state.index
        return frozenset(index[n] for n in self.latched if n in index)

    def streak_rows(self) -> dict[int, int]:
        index = self.state.index
        return {index[n]: c for n, c in self.streaks.items() if n in index}

    def pdbs_of(self, pod: PodInfo) -> list[Pdb]:
        return [b for b in self.pdbs if b.covers(pod)]

    def target_workload(self, coverage: float) -> TargetWorkload:
        """FGD's target workload: the most popular specs of the pods placed and pending
        (covering ``coverage`` of them); one whole GPU for a cluster that runs nothing."""
        requests = [p.pod for p in self.state.pods.values()] + [p.request for p in self.pending]
        if not requests:
            return TargetWorkload.from_specs([((0, 1, MILLI_PER_GPU, frozenset()), 1.0)])
        return TargetWorkload.from_pods(requests, coverage=coverage)


def snapshot_of_state(state: ClusterState, pod_used_mib: Mapping[str, float], *,
                      pending: tuple[PodRequest, ...] | list[PodRequest] = (),
                      owner_kind: str = "ReplicaSet", pdbs: list[Pdb] | None = None,
                      infos: Mapping[str, PodInfo] | None = None,
                      pod_peak_mib: Mapping[str, float] | None = None) -> Snapshot:
    """A snapshot of a simulated cluster: every GPU has a fresh reading; each placed pod uses
    ``pod_used_mib`` per GPU (pods missing there use what they reserve) and peaked at
    ``pod_peak_mib`` over the window (missing: at what it uses now); pods are movable
    ``owner_kind`` pods unless ``infos`` says otherwise (the what-if and tests build these)."""
    usage = UsageTable(state)
    n = state.size
    usage.known[:n] = np.arange(state.gpu_width)[None, :] < state.gpu_count[:n, None]
    usage.pod_used_mib.update({k: float(v) for k, v in pod_used_mib.items() if k in state.pods})
    usage.pod_peak_mib.update({k: float(v) for k, v in (pod_peak_mib or {}).items()
                               if k in state.pods})
    usage.recompute(state)
    given = dict(infos or {})
    pods: dict[str, PodInfo] = {}
    for key, placement in state.pods.items():
        pods[key] = given.get(key) or PodInfo(
            key=key, request=placement.pod, uid=key, node=placement.node,
            owner_kind=owner_kind, owner_uid=f"owner-{key}", owner_name=f"owner-{key}")
    waiting = [PodInfo(key=pod_key(p), request=p, uid=pod_key(p), running=False,
                       owner_kind=owner_kind, owner_uid=f"owner-{pod_key(p)}")
               for p in pending]
    return Snapshot(state=state, pods=pods, pending=waiting, usage=usage, pdbs=list(pdbs or []))


def place_gpus(state: ClusterState, pod: PodRequest, row: int,
                recorded: tuple[int, ...] | None) -> tuple[int, ...]:
    """The GPUs a bound pod holds: as recorded at bind (or seen by the agent) when that is
    consistent with the node, else the core's default rule, else the freest GPUs (the live
    cluster may be over-committed; it is the truth)."""
    count = int(state.gpu_count[row])
    if recorded is not None and len(recorded) == pod.num_gpu and len(set(recorded)) == len(
            recorded) and all(0 <= g < count for g in recorded):
        return recorded
    free = state.gpu_free[row, :count]
    if (pod.is_share and free.max(initial=0) >= pod.gpu_milli) or (
            not pod.is_share and int((free == 1000).sum()) >= pod.num_gpu):
        gpus = gpus_for(state, pod, row, NO_GPU)
        if len(gpus) == pod.num_gpu:
            return gpus
    order = sorted(range(count), key=lambda g: (-int(free[g]), g))
    return tuple(sorted(order[: pod.num_gpu]))
