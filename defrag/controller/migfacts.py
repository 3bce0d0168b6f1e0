"""Kubernetes objects -> the facts the MIG step plans from (:mod:`defrag.controller.migplan`).

Pure, like :mod:`defrag.controller.snapshot`: the cycle's own listing of Nodes and Pods, the
agent's fresh readings (``Snapshot.readings``) and the live reservations go in. A node is a
MIG node when GPU feature discovery labels it ``nvidia.com/mig.strategy=mixed``, when it
advertises ``nvidia.com/mig-<profile>`` instances, or when the agent reads a GPU of it in MIG
mode. Requests, offered instances and GPU labels are read with the extender's converters
(``scheduler.kube.convert``: ``mig_request``, ``mig_offers``, ``gpu_labels``), so a pod asks and a
node offers here exactly what they ask and offer the scheduler.

Drained means: no pod that is not finished is bound there asking any GPU resource (whole GPUs,
shares, MIG instances; a pod whose request cannot be read counts as asking), and the agent's
fresh reading shows no pod and no stray process on its GPUs. Memory alone does not make a GPU
busy: the driver holds some on an idle MIG instance.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from defrag.controller.migplan import LABEL_MIG_CONFIG_STATE, MigNodeFacts
from gpufrag.conventions import DEFAULT_NAMES, LABEL_MIG_CONFIG, KubeNames
from gpufrag.errors import BadInput
from gpufrag.gpu_usage import NodeGpuUsage
from scheduler.core.mig import mig_model
from scheduler.kube.convert import (
    LABEL_MIG_STRATEGY,
    MIG_STRATEGY_MIXED,
    gpu_labels,
    is_terminal,
    key_of,
    labels_of,
    mig_offers,
    mig_request,
    node_name_of,
    pod_from_k8s,
)
from scheduler.kube.reservations import Reservation

Obj = Mapping[str, Any]


@dataclass
class MigFacts:
    """The MIG nodes (each with what its bound pods ask), the instances pods not bound yet ask,
    and a line per pod whose MIG ask could not be read."""

    nodes: list[MigNodeFacts] = field(default_factory=list)
    pending: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _gpu_pods(pods: Iterable[Obj], names: KubeNames) -> dict[str, list[str]]:
    """node -> the pods bound there that ask a GPU resource (or whose ask is unreadable)."""
    found: dict[str, list[str]] = {}
    for obj in pods:
        node = node_name_of(obj)
        if not node or is_terminal(obj):
            continue
        try:
            asks = pod_from_k8s(obj, names).wants_gpu or bool(mig_request(obj))
        except BadInput:
            asks = True  # unreadable: take it as holding what it may hold
        if asks:
            found.setdefault(node, []).append(key_of(obj))
    return found


def _demand(pods: Iterable[Obj], facts: MigFacts) -> dict[str, dict[str, int]]:
    """node -> the instances its pods ask; the pending asks go to ``facts``."""
    bound: dict[str, dict[str, int]] = {}
    for obj in pods:
        if is_terminal(obj):
            continue
        try:
            asked = mig_request(obj)
        except BadInput as e:
            facts.problems.append(f"pod {key_of(obj)}: {e}")
            continue
        node = node_name_of(obj)
        into = bound.setdefault(node, {}) if node else facts.pending
        for profile, n in asked.items():
            into[profile] = into.get(profile, 0) + n
    return bound


def mig_facts(nodes: Sequence[Obj], pods: Sequence[Obj],
              readings: Mapping[str, NodeGpuUsage], reservations: Iterable[Reservation], *,
              cordoned: frozenset[str], now: float,
              names: KubeNames = DEFAULT_NAMES,
              dynamic: frozenset[str] = frozenset()) -> MigFacts:
    """The MIG step's facts of one cycle. ``readings``: the agent's fresh readings by node;
    ``reservations``: the GPUReservations read this cycle (expired ones hold nothing);
    ``cordoned``: the snapshot's cordoned nodes; ``dynamic``: nodes whose MIG GPUs the DRA
    driver cuts per claim (the snapshot's ``mig``), which no MIG manager relabel concerns:
    left out, even where the agent reads their instances."""
    facts = MigFacts()
    asks = _demand(pods, facts)
    busy_pods = _gpu_pods(pods, names)
    held: dict[str, list[str]] = {}
    for r in reservations:
        if r.expires > now:
            held.setdefault(r.node, []).append(r.name)
    for obj in nodes:
        labels = labels_of(obj)
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        reading = readings.get(name)
        offers = mig_offers(obj)
        agent_mig = reading is not None and any(g.mig_mode for g in reading.gpus)
        if not name or name in dynamic or not (
                labels.get(LABEL_MIG_STRATEGY) == MIG_STRATEGY_MIXED or offers or agent_mig):
            continue
        gpu = gpu_labels(labels, names)
        product, memory_mib, gpus = gpu.product, gpu.memory_mib, gpu.count
        if reading is not None and reading.gpus:
            product = product or reading.gpus[0].product
            memory_mib = memory_mib or reading.gpus[0].memory_total_mib
            gpus = gpus or len(reading.gpus)
        busy = list(busy_pods.get(name, ()))
        if reading is not None and any(g.pods or g.strays for g in reading.gpus):
            busy.append("the node agent sees GPU processes")
        facts.nodes.append(MigNodeFacts(
            name=name, model=mig_model(product, memory_mib), gpus=gpus,
            config=labels.get(LABEL_MIG_CONFIG, ""),
            config_state=labels.get(LABEL_MIG_CONFIG_STATE, ""), offers=offers,
            asks=asks.get(name, {}),
            busy=tuple(busy), cordoned=name in cordoned,
            reservations=tuple(sorted(held.get(name, ())))))
    return facts
