"""Kubernetes objects (JSON dicts, as the API returns them) -> one defrag :class:`Snapshot`.

Pure: the caller lists Nodes, Pods and PodDisruptionBudgets (and, with ``--prometheus``, the
DCGM samples) and passes them in, so tests and the what-if can build snapshots without a
cluster. Resource requests, GPU indices and owners are read with ``scheduler.kube.convert``, the
same converters the extender uses; GPU usage with ``gpufrag.gpu_usage.parse``, the agent's own
schema. What cannot be used (an unreadable or stale usage reading, a pod with a malformed
request) is reported as a :class:`UsageNote` or a skipped pod, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from defrag.controller.measure import GpuKey, UsageTable
from defrag.controller.miginuse import mig_in_use
from defrag.controller.model import (
    DELIVERY_CLAIMS,
    DELIVERY_DEVICE_PLUGIN,
    DELIVERY_DIRECT,
    LabelSelector,
    NodeConstraints,
    Pdb,
    PodInfo,
    SelectorRequirement,
    Snapshot,
    Taint,
    Toleration,
    UsageNote,
    place_gpus,
)
from gpufrag.conventions import DEFAULT_NAMES, KubeNames
from gpufrag.errors import BadInput
from gpufrag.gpu_usage import NodeGpuUsage, parse
from scheduler.core.state import ClusterState
from scheduler.core.types import NodeSpec, PodRequest
from scheduler.kube.cache import KnownPod
from scheduler.kube.claims import (
    DRIVER_NAME,
    MigPartition,
    SliceGpus,
    SliceMigGpu,
    direct_claim_names,
    listed_pod_gpus,
    listed_pod_partitions,
    slice_gpus,
    slice_mig_gpus,
    with_slice_gpus,
)
from scheduler.kube.convert import (
    annotations_of,
    bound_gpus,
    controller_ref,
    is_terminal,
    key_of,
    labels_of,
    node_from_k8s,
    node_name_of,
    pod_from_k8s,
)
from scheduler.kube.reservations import ReservationBook, parse_rfc3339, reservation_from_k8s

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU's used framebuffer memory, as DCGM reports it through Prometheus."""

    node: str
    gpu: int
    used_mib: float
    timestamp: float
    namespace: str = ""
    pod: str = ""
    peak_mib: float | None = None  # the most it held over the window (None: not known)


@dataclass(frozen=True, slots=True)
class UsageSource:
    """Where used GPU memory comes from and when a reading counts as stale."""

    stale_intervals: float
    now: float
    dcgm: Sequence[GpuSample] | None = None  # None: read the agent's Node annotation
    dcgm_interval_s: float = 30.0


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata") or {}
    return meta if isinstance(meta, Mapping) else {}


def _pod_label(obj: Obj) -> str:
    """``pod namespace/name`` for a problem line (only built when there is a problem)."""
    meta = _meta(obj)
    return f"pod {meta.get('namespace')}/{meta.get('name')}"


def _spec(obj: Obj) -> Mapping[str, Any]:
    spec = obj.get("spec") or {}
    return spec if isinstance(spec, Mapping) else {}


def _requirements(items: object) -> tuple[SelectorRequirement, ...]:
    out = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, Mapping):
            values = item.get("values") or []
            out.append(SelectorRequirement(str(item.get("key", "")),
                                           str(item.get("operator", "")),
                                           frozenset(str(v) for v in values)))
    return tuple(out)


def selector_of(value: object) -> LabelSelector | None:
    """A metav1.LabelSelector; None when absent (selects nothing)."""
    if not isinstance(value, Mapping):
        return None
    labels = value.get("matchLabels") or {}
    return LabelSelector(
        match_labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping)
        else {},
        match_expressions=_requirements(value.get("matchExpressions")))


def pdb_from_k8s(obj: Obj) -> Pdb:
    meta = _meta(obj)
    status = obj.get("status") or {}
    allowed = status.get("disruptionsAllowed", 0) if isinstance(status, Mapping) else 0
    return Pdb(namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
               selector=selector_of(_spec(obj).get("selector")),
               disruptions_allowed=int(allowed) if isinstance(allowed, int) else 0)


def constraints_of(obj: Obj) -> NodeConstraints:
    """nodeSelector, required node affinity and tolerations: what the pod demands of a node
    beyond resources (the core does not model these; the planner must not pick a target the
    real scheduler would refuse)."""
    spec = _spec(obj)
    selector = spec.get("nodeSelector") or {}
    terms: list[tuple[SelectorRequirement, ...]] = []
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (node_affinity or {}).get("requiredDuringSchedulingIgnoredDuringExecution") \
        if isinstance(node_affinity, Mapping) else None
    if isinstance(required, Mapping):
        for term in required.get("nodeSelectorTerms") or []:
            if isinstance(term, Mapping):
                terms.append(_requirements(term.get("matchExpressions")))
    tolerations = []
    for t in spec.get("tolerations") or []:
        if isinstance(t, Mapping):
            tolerations.append(Toleration(
                key=str(t.get("key") or ""), operator=str(t.get("operator") or "Equal"),
                value=str(t.get("value") or ""), effect=str(t.get("effect") or "")))
    return NodeConstraints(
        selector=tuple(sorted((str(k), str(v)) for k, v in selector.items()))
        if isinstance(selector, Mapping) else (),
        affinity=tuple(terms), tolerations=tuple(tolerations))


def taints_of(obj: Obj) -> tuple[Taint, ...]:
    out = []
    for t in _spec(obj).get("taints") or []:
        if isinstance(t, Mapping):
            out.append(Taint(key=str(t.get("key") or ""), value=str(t.get("value") or ""),
                             effect=str(t.get("effect") or "")))
    return tuple(out)


def pod_info(obj: Obj, request: PodRequest, names: KubeNames = DEFAULT_NAMES) -> PodInfo:
    meta = _meta(obj)
    spec = _spec(obj)
    status = obj.get("status") or {}
    kind, uid, owner = controller_ref(obj)
    priority = spec.get("priority")
    movable = annotations_of(obj).get(names.annotation_defrag_movable, "")
    return PodInfo(
        key=f"{request.namespace}/{request.name}" if request.namespace else request.name,
        request=request, uid=str(meta.get("uid") or ""), node=node_name_of(obj),
        owner_kind=kind, owner_uid=uid, owner_name=owner,
        priority=priority if isinstance(priority, int) else 0,
        opted_out=movable.strip().lower() == "false",
        running=isinstance(status, Mapping) and status.get("phase") == "Running",
        deleting=bool(meta.get("deletionTimestamp")),
        scheduler_name=str(spec.get("schedulerName") or ""),
        labels=labels_of(obj), constraints=constraints_of(obj),
        out_of_memory=(names.annotation_rightsizing_change in annotations_of(obj)
                       and _ran_out_of_memory(status)),
        started_s=_start_time(status))


def _start_time(status: object) -> float | None:
    """The pod's ``status.startTime`` in unix seconds (None when absent or not a time)."""
    text = status.get("startTime") if isinstance(status, Mapping) else None
    if not isinstance(text, str):
        return None
    try:
        return parse_rfc3339(text)
    except ValueError:
        return None


def _ran_out_of_memory(status: object) -> bool:
    """A container's current or last state ended with reason OOMKilled (the kubelet's)."""
    if not isinstance(status, Mapping):
        return False
    for container in status.get("containerStatuses") or ():
        if not isinstance(container, Mapping):
            continue
        for state in ("state", "lastState"):
            ended = (container.get(state) or {}).get("terminated") or {}
            if isinstance(ended, Mapping) and ended.get("reason") == "OOMKilled":
                return True
    return False


def _usage_by_node(nodes: Iterable[Obj], source: UsageSource, notes: list[UsageNote],
                   names: KubeNames) -> dict[str, NodeGpuUsage]:
    """Fresh agent readings by node name; stale and unreadable ones become notes."""
    fresh: dict[str, NodeGpuUsage] = {}
    for obj in nodes:
        name = str(_meta(obj).get("name") or "")
        text = annotations_of(obj).get(names.annotation_gpu_usage)
        if text is None:
            continue
        try:
            reading = parse(text, source=f"node {name} annotation {names.annotation_gpu_usage}")
        except BadInput as e:
            notes.append(UsageNote(name, f"unreadable usage annotation: {e}"))
            continue
        if reading.is_stale(source.now, source.stale_intervals):
            notes.append(UsageNote(name, f"usage reading {reading.age_s(source.now):.0f}s old "
                                         f"(> {source.stale_intervals:g} x "
                                         f"{reading.interval_s:g}s): ignored"))
            continue
        fresh[name] = reading
    return fresh


def build_snapshot(nodes: Sequence[Obj], pods: Sequence[Obj], pdbs: Sequence[Obj],
                   source: UsageSource, names: KubeNames = DEFAULT_NAMES,
                   claims: Sequence[Obj] = (), slices: Sequence[Obj] = ()
                   ) -> tuple[Snapshot, list[str]]:
    """The snapshot, and a line per object that could not be read (skipped). A pod that uses
    ResourceClaims (``claims``, DRA) holds what their allocations name on its node, read by
    :func:`scheduler.kube.claims.listed_pod_gpus` as the extender reads them; a pending one
    asks what they ask. A node that advertises no GPU has those its ResourceSlice
    (``slices``, of gpufrag's driver) offers (:func:`scheduler.kube.claims.with_slice_gpus`).
    The MIG instances pods hold (their claims' partitions, the agent's readings) and the
    driver's MIG GPUs are the snapshot's ``mig`` (:mod:`defrag.controller.miginuse`)."""
    problems: list[str] = []
    notes: list[UsageNote] = []
    agent = _usage_by_node(nodes, source, notes, names) if source.dcgm is None else {}
    specs: list[NodeSpec] = []
    taints: dict[str, tuple[Taint, ...]] = {}
    cordoned: set[str] = set()
    offered, dynamic_mig = _slices_by_node(slices, problems)
    for obj in nodes:
        try:
            spec = node_from_k8s(obj, names)
        except BadInput as e:
            problems.append(f"node {_meta(obj).get('name')}: {e}")
            continue
        spec = with_slice_gpus(spec, offered.get(spec.name), names)
        reading = agent.get(spec.name)
        if spec.gpu_count and not spec.gpu_memory_mib and reading is not None and reading.gpus:
            spec = replace(spec, gpu_memory_mib=min(g.memory_total_mib for g in reading.gpus))
        specs.append(spec)
        taints[spec.name] = taints_of(obj)
        if _spec(obj).get("unschedulable"):
            cordoned.add(spec.name)
    state = ClusterState(specs)

    infos: dict[str, PodInfo] = {}
    pending: list[PodInfo] = []
    bound: list[tuple[PodInfo, int, tuple[int, ...] | None]] = []
    seen_on_gpu: dict[str, list[int]] = {}
    for reading in agent.values():
        for gpu in reading.gpus:
            for p in gpu.pods:
                seen_on_gpu.setdefault(p.uid, []).append(gpu.index)
    claims_by_key = _by_key(claims, problems)
    held_mig: dict[str, list[tuple[str, MigPartition]]] = {}
    for obj in pods:
        if is_terminal(obj):
            continue
        try:
            request = pod_from_k8s(obj, names)
            through_claims = listed_pod_gpus(obj, request, claims_by_key)
            delivery = (DELIVERY_DEVICE_PLUGIN if through_claims is None
                        else DELIVERY_DIRECT if direct_claim_names(obj) else DELIVERY_CLAIMS)
            partitions = (listed_pod_partitions(obj, claims_by_key)
                          if through_claims is not None else ())
        except BadInput as e:
            problems.append(f"{_pod_label(obj)}: {e}")
            continue
        if through_claims is not None:
            request = through_claims[0]
        try:
            info = pod_info(obj, request, names)
        except BadInput as e:
            # Its requests are readable, so it still holds them where it runs: keep it, as a
            # pod without owners (never moved), rather than leave its GPUs looking free.
            problems.append(f"{_pod_label(obj)}: {e}; kept as a pod without owners, never moved")
            meta = {k: v for k, v in _meta(obj).items() if k != "ownerReferences"}
            try:
                info = pod_info({**obj, "metadata": meta}, request, names)
            except BadInput:
                continue
        info = replace(info, delivery=delivery)
        if not info.node:
            if request.wants_gpu or info.scheduler_name == names.scheduler_name:
                pending.append(info)
            continue
        row = state.index.get(info.node)
        if row is None:
            continue  # bound to a node we were not shown (or that is gone)
        held_mig.setdefault(info.node, []).extend((info.key, p) for p in partitions)
        recorded = (bound_gpus(obj, names) if through_claims is None
                    else through_claims[1])
        if recorded is None and info.uid in seen_on_gpu:
            recorded = tuple(sorted(seen_on_gpu[info.uid]))
        bound.append((info, row, recorded))
    # Pods whose GPUs are known first, so the default rule only fills what is left.
    bound.sort(key=lambda b: b[2] is None)
    for info, row, recorded in bound:
        if info.key in state.pods:
            problems.append(f"pod {info.key}: listed twice")
            continue
        gpus = place_gpus(state, info.request, row, recorded) if info.request.wants_gpu else ()
        state.place(info.request, row, gpus, check=False)
        infos[info.key] = info

    usage = _usage_table(state, infos, agent, source, notes)
    key_by_uid = {i.uid: k for k, i in infos.items() if i.uid}
    mig = mig_in_use({n: g for n, g in dynamic_mig.items() if n in state.index},
                     {n: h for n, h in held_mig.items() if h}, agent, key_by_uid)
    snapshot = Snapshot(state=state, pods=infos, pending=pending, usage=usage,
                        pdbs=[pdb_from_k8s(p) for p in pdbs], notes=notes, taints=taints,
                        cordoned=frozenset(cordoned), readings=agent, mig=mig)
    return snapshot, problems


def _slices_by_node(slices: Sequence[Obj], problems: list[str]
                    ) -> tuple[dict[str, SliceGpus], dict[str, dict[int, SliceMigGpu]]]:
    """What gpufrag's driver's slices offer, by node: the GPUs (the largest slice, if a node
    has several) and the MIG GPUs whose partitions they publish, by index; an unreadable
    slice is a problem line."""
    found: dict[str, SliceGpus] = {}
    mig: dict[str, dict[int, SliceMigGpu]] = {}
    for obj in slices:
        try:
            gpus = slice_gpus(obj, driver=DRIVER_NAME)
            partitioned = slice_mig_gpus(obj, driver=DRIVER_NAME)
        except BadInput as e:
            problems.append(f"ResourceSlice {_meta(obj).get('name')}: {e}")
            continue
        for gpu in partitioned:
            mig.setdefault(gpu.node, {})[gpu.index] = gpu
        if gpus is not None and gpus.count > (
                found[gpus.node].count if gpus.node in found else -1):
            found[gpus.node] = gpus
    return found, mig


def _by_key(claims: Sequence[Obj], problems: list[str]) -> dict[str, Obj]:
    """ResourceClaims by ``namespace/name``; an unnamed one is a problem line."""
    found: dict[str, Obj] = {}
    for obj in claims:
        try:
            found[key_of(obj)] = obj
        except BadInput as e:
            problems.append(f"ResourceClaim {_meta(obj).get('name')}: {e}")
    return found


def _usage_table(state: ClusterState, infos: Mapping[str, PodInfo],
                 agent: Mapping[str, NodeGpuUsage], source: UsageSource,
                 notes: list[UsageNote]) -> UsageTable:
    gpu_used: dict[GpuKey, float] = {}
    gpu_peak: dict[GpuKey, float] = {}
    pod_sum: dict[str, float] = {}
    peak_sum: dict[str, float] = {}
    pod_count: dict[str, int] = {}
    if source.dcgm is None:
        key_by_uid = {i.uid: k for k, i in infos.items() if i.uid}
        for name, reading in agent.items():
            row = state.index.get(name)
            if row is None:
                continue
            for gpu in reading.gpus:
                gpu_used[(row, gpu.index)] = float(gpu.memory_used_mib)
                for p in gpu.pods:
                    key = key_by_uid.get(p.uid) or f"{p.namespace}/{p.name}"
                    pod_sum[key] = pod_sum.get(key, 0.0) + p.memory_used_mib
                    peak_sum[key] = peak_sum.get(key, 0.0) + p.window_peak_mib
                    pod_count[key] = pod_count.get(key, 0) + 1
    else:
        limit = source.stale_intervals * source.dcgm_interval_s
        stale: dict[str, float] = {}
        for s in source.dcgm:
            row = state.index.get(s.node)
            if row is None:
                continue
            age = source.now - s.timestamp
            if age > limit or not math.isfinite(s.used_mib):
                stale[s.node] = max(stale.get(s.node, 0.0), age)
                continue
            # Several series per GPU (one per pod label) carry the same GPU-wide figure.
            gpu_used[(row, s.gpu)] = max(gpu_used.get((row, s.gpu), 0.0), s.used_mib)
            if s.peak_mib is not None and math.isfinite(s.peak_mib):
                gpu_peak[(row, s.gpu)] = max(gpu_peak.get((row, s.gpu), 0.0), s.peak_mib)
        for node, age in sorted(stale.items()):
            notes.append(UsageNote(node, f"DCGM samples {age:.0f}s old (> "
                                         f"{source.stale_intervals:g} x "
                                         f"{source.dcgm_interval_s:g}s): ignored"))
    pod_used = {k: pod_sum[k] / pod_count[k] for k in pod_sum if k in state.pods}
    pod_peak = {k: peak_sum[k] / pod_count[k] for k in peak_sum if k in state.pods}
    return UsageTable.from_readings(state, gpu_used, pod_used, pod_peak, gpu_peak_mib=gpu_peak)


def hold_reservations(snapshot: Snapshot, objs: Iterable[Obj], now: float) -> list[str]:
    """Count the live GPUReservations (what earlier cycles hold for replacements not bound
    yet) as taken in ``snapshot``, exactly as the extender does (its own
    :class:`~scheduler.kube.reservations.ReservationBook`: expired ones and ones a bound pod
    already used hold nothing), so the planner does not plan a move into a held share. Their
    placements count as using all they hold (no idle memory). Returns a problem per unreadable
    one."""
    problems: list[str] = []
    readable = []
    for obj in objs:
        try:
            readable.append(reservation_from_k8s(obj))
        except BadInput as e:
            problems.append(str(e))
    if not readable:
        return problems
    pods = {key: KnownPod(info.request, info.node, info.uid, info.owner_uid, None)
            for key, info in snapshot.pods.items()}
    book = ReservationBook(snapshot.state, pods, clock=lambda: now)
    book.replace(readable)
    if book.placed:
        snapshot.usage.recompute(snapshot.state)
    return problems
