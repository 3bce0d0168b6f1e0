"""MIG nodes as the extender sees them: which instances each GPU carries, and which are in use.

Static MIG with NVIDIA's device plugin (``mixed`` strategy): a node advertises
``nvidia.com/mig-<profile>: N`` allocatable per profile, and GPU feature discovery labels it
(``nvidia.com/gpu.product``, ``nvidia.com/gpu.memory`` in MiB, ``nvidia.com/gpu.count``,
``nvidia.com/mig.strategy``, ``nvidia.com/mig.config``). Where the instances sit and which are
in use comes, in this order, from:

1. the node agent's usage annotation (``gpufrag.io/gpu-usage``), whose GPUs in MIG mode list
   their instances (profile, start slice, pods): exact positions and use, while the reading is
   fresh. Read through a :data:`MigReader` the caller supplies (the annotation's schema lives
   with the agent, a layer above this one); pods placed since the reading are added to it;
2. otherwise the allocatable counts, placed by a deterministic legal packing
   (:func:`scheduler.core.mig.pack_instances`; an approximation, since NVIDIA's MIG manager
   lets NVML choose positions), with as many instances of each profile in use as the pods
   bound or assumed on the node ask (:func:`scheduler.core.mig.mark_in_use`).

Dynamic MIG with gpufrag's DRA driver (docs/dra.md): a node's ResourceSlices publish every
legal placement of its MIG GPUs as a partition (:func:`scheduler.kube.claims.slice_mig_gpus`),
and an instance is made when kube-scheduler allocates one to a claim. Such a node's layout
(:func:`dynamic_layout`) is the partitions the claims of the pods bound or assumed there were
allocated, in use, and every legal placement overlapping none of them, free; a pod assumed
before its allocation shows holds the placement DRA's first fit will take
(:func:`scheduler.core.mig.dynamic_instances`). Its pods ask through claims of a profile's
class (:func:`scheduler.kube.claims.partitions_asked`).

The allocatable counts stay the truth of how many instances there are (the kubelet admits a
pod against them); they and the GPU labels are read by the converters
(:func:`scheduler.kube.convert.mig_offers`, :func:`~scheduler.kube.convert.gpu_labels`), the
same reading defrag's MIG step makes. This module is the extender's side only: where the
instances sit and which are in use, kept in the cache.

:class:`MigBook` holds what the Node objects say and the profiles each pod asks; the pods on
a node are the cache's ``ClusterState`` placements (bound and assumed), where a MIG pod is
placed for its CPU and memory only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufrag.conventions import (
    DEFAULT_NAMES,
    LABEL_GPU_COUNT,
    LABEL_MIG_CONFIG,
    SCHEDULER_NAME,
    KubeNames,
)
from scheduler.core.mig import (
    MIG_MODELS,
    SLICES,
    MigGpuModel,
    MigInstance,
    dynamic_instances,
    mark_in_use,
    mig_model,
    pack_instances,
)
from scheduler.core.state import ClusterState, IntArray
from scheduler.kube.claims import MigPartition, SliceMigGpu
from scheduler.kube.convert import (
    LABEL_MIG_STRATEGY,
    MIG_RESOURCE_PREFIX,
    MIG_STRATEGY_MIXED,
    Obj,
    advertised_count,
    annotations_of,
    gpu_labels,
    labels_of,
    mig_offers,
)

MAX_MIG_GPUS = 16


@dataclass(frozen=True, slots=True)
class AgentMig:
    """What the agent's reading says of a node's MIG GPUs: each instance (``in_use`` when a
    pod runs on it or anything holds its memory) and until when the reading is fresh."""

    instances: tuple[MigInstance, ...]
    fresh_until: float


# The annotation's text -> its MIG instances (None: no MIG GPU in it, or unreadable).
MigReader = Callable[[str], AgentMig | None]


def no_agent(_text: str) -> AgentMig | None:
    """The reader where the agent's annotations are not read: the labels decide."""
    return None


@dataclass(frozen=True, slots=True)
class MigNodeSpec:
    """A node's MIG side as its Node object says: ``model`` is None for a product the MIG
    table lacks (its instances are counted, never scored); ``packed`` the counts' positions
    by the packing rule and ``unplaced`` those it found none for."""

    name: str
    model: MigGpuModel | None
    gpus: int
    allocatable: Mapping[str, int]
    packed: tuple[MigInstance, ...]
    unplaced: Mapping[str, int]
    config: str = ""
    agent: AgentMig | None = None
    # Dynamic MIG (DRA partitions): the MIG GPUs' indices; instances are made per claim.
    gpu_indices: tuple[int, ...] = ()
    dynamic: bool = False


def dynamic_spec(name: str, gpus: Sequence[SliceMigGpu]) -> MigNodeSpec | None:
    """The MIG side of a node whose driver's slices publish partitions of ``gpus`` (dynamic
    MIG), or None when none is published or the MIG table lacks its product. The GPUs of the
    first one's family count (a node's GPUs are one product). ``allocatable``: every
    placement of each profile, as the slices publish them."""
    ordered = sorted(gpus, key=lambda g: g.index)
    model = mig_model(ordered[0].product, ordered[0].memory_mib) if ordered else None
    if model is None:
        return None
    indices = tuple(g.index for g in ordered if mig_model(g.product, g.memory_mib) == model)
    allocatable = {p.name: len(p.starts) * len(indices) for p in model.profiles}
    return MigNodeSpec(name, model, len(indices), allocatable, (), {}, gpu_indices=indices,
                       dynamic=True)


def dynamic_layout(spec: MigNodeSpec, held: Iterable[MigPartition],
                   asked: Mapping[str, int]) -> MigLayout:
    """A dynamic MIG node's instances (module docstring): ``held``, the partitions its pods'
    claims were allocated there, and ``asked``, the instances its pods ask that no
    allocation names yet, in use; every other free legal placement free, counted in
    ``free`` (a profile's placements on one GPU never overlap one another)."""
    assert spec.model is not None  # dynamic_spec makes none without a model
    instances = dynamic_instances(spec.model, spec.gpu_indices,
                                  ((p.index, p.profile, p.start) for p in held), asked)
    free: dict[str, int] = {}
    for instance in instances:
        if not instance.in_use:
            free[instance.profile] = free.get(instance.profile, 0) + 1
    return MigLayout(spec, instances, free, _tally(instances), "claims")


def mig_node_from_k8s(obj: Obj, reader: MigReader = no_agent,
                      names: KubeNames = DEFAULT_NAMES) -> MigNodeSpec | None:
    """The MIG side of a Node, or None for a node advertising no ``nvidia.com/mig-*``
    instance. A count that does not read as a whole number counts as none (the kubelet would
    not advertise it). The GPUs in MIG mode are ``nvidia.com/gpu.count`` less the whole GPUs
    the node advertises (``mixed`` lists only GPUs not in MIG mode as ``names.gpu``)."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    counts = mig_offers(obj)
    if not isinstance(name, str) or not counts:
        return None
    labels = labels_of(obj)
    gpu = gpu_labels(labels, names)
    model = mig_model(gpu.product, gpu.memory_mib)
    # status.allocatable is a mapping here: the node offers MIG instances in it.
    whole = advertised_count(obj["status"]["allocatable"].get(names.gpu, "0"))
    gpus = gpu.count - whole
    if model is None:
        return MigNodeSpec(name, None, max(gpus, 0), counts, (), counts,
                           labels.get(LABEL_MIG_CONFIG, ""))
    if not 0 < gpus <= MAX_MIG_GPUS:  # no usable count: the fewest GPUs the packing needs
        gpus = _gpus_needed(model, counts)
    packed, unplaced = pack_instances(model, counts, gpus)
    text = annotations_of(obj).get(names.annotation_gpu_usage, "")
    return MigNodeSpec(name, model, gpus, counts, packed, unplaced,
                       labels.get(LABEL_MIG_CONFIG, ""), reader(text) if text else None)


def _gpus_needed(model: MigGpuModel, counts: Mapping[str, int]) -> int:
    slices = sum(n * p.slices for name, n in counts.items()
                 if (p := model.profile(name)) is not None)
    gpus = max(1, math.ceil(slices / SLICES))
    while gpus < MAX_MIG_GPUS and pack_instances(model, counts, gpus)[1]:
        gpus += 1
    return gpus


@dataclass(frozen=True, slots=True)
class MigLayout:
    """One node's instances now, with use (``source``: ``agent``, ``labels``, or ``claims``
    for dynamic MIG) and how many of each profile are free: allocatable minus in use (for
    dynamic MIG, the free placements)."""

    spec: MigNodeSpec
    instances: tuple[MigInstance, ...]
    free: Mapping[str, int]
    in_use: Mapping[str, int]
    source: str


def _tally(instances: Iterable[MigInstance]) -> dict[str, int]:
    tally: dict[str, int] = {}
    for instance in instances:
        if instance.in_use:
            tally[instance.profile] = tally.get(instance.profile, 0) + 1
    return tally


def layout_of(spec: MigNodeSpec, asked: Mapping[str, int], now: float) -> MigLayout:
    """``spec``'s instances given the profiles its bound and assumed pods ask (``asked``): the
    agent's when its reading is fresh (with pods it has not seen yet marked on its free
    instances), else the packing's with ``asked`` marked in use."""
    agent = spec.agent
    if agent is not None and now <= agent.fresh_until:
        seen = _tally(agent.instances)
        extra = {p: n - seen.get(p, 0) for p, n in asked.items() if n > seen.get(p, 0)}
        idle = [i for i in agent.instances if not i.in_use]
        marked = {(i.gpu, i.start): i for i in mark_in_use(idle, extra)}
        instances = tuple(marked.get((i.gpu, i.start), i) for i in agent.instances)
        source = "agent"
    else:
        instances = mark_in_use(spec.packed, asked)
        source = "labels"
    used = _tally(instances)
    in_use = {p: max(used.get(p, 0), asked.get(p, 0)) for p in {*used, *asked}}
    free = {p: max(n - in_use.get(p, 0), 0) for p, n in spec.allocatable.items()}
    return MigLayout(spec, instances, free, in_use, source)


@dataclass
class MigBook:
    """The MIG side of the cache: each MIG node's spec and the profiles each pod asks. Fed by
    :class:`~scheduler.kube.cache.ClusterCache` under its lock; read under it too.

    ``serial[row]`` changes whenever the spec of the node at that ``ClusterState`` row does
    (what the state's ``version`` is for its own columns), so a reader may keep what it worked
    out from a node until either moves."""

    reader: MigReader = no_agent
    names: KubeNames = DEFAULT_NAMES
    nodes: dict[str, MigNodeSpec] = field(default_factory=dict)
    asks: dict[str, Mapping[str, int]] = field(default_factory=dict)  # pod key -> profiles
    # Dynamic MIG (DRA): each node's spec from its slices; per pod, what its claims ask
    # (profiles) and the partitions they were allocated, as (node, placement).
    dynamic: dict[str, MigNodeSpec] = field(default_factory=dict)
    claim_asks: dict[str, Mapping[str, int]] = field(default_factory=dict)
    held: dict[str, tuple[tuple[str, MigPartition], ...]] = field(default_factory=dict)
    serial: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    # node -> what its spec was read from, so a status heartbeat is not read again
    _inputs: dict[str, tuple[object, ...]] = field(default_factory=dict)
    _changes: int = 0
    # node -> ((state version, serial, agent fresh), its layout then)
    _layouts: dict[str, tuple[tuple[int, int, bool], MigLayout]] = field(default_factory=dict)

    def apply_node(self, obj: Obj, name: str, row: int) -> None:
        """The Node ``name`` (at state row ``row``) was added or changed."""
        status = obj.get("status")
        alloc = status.get("allocatable") if isinstance(status, Mapping) else None
        if not isinstance(alloc, Mapping) or not any(
                str(r).startswith(MIG_RESOURCE_PREFIX) for r in alloc):
            self._drop_static(name, row)  # the common case, a node without MIG: nothing to read
            return
        inputs = (repr(alloc), repr(labels_of(obj)),
                  annotations_of(obj).get(self.names.annotation_gpu_usage, ""))
        if self._inputs.get(name) == inputs:
            return
        spec = mig_node_from_k8s(obj, self.reader, self.names)
        self._inputs[name] = inputs
        if spec is None:
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = spec
        self._changed(row)

    def delete_node(self, name: str, row: int | None) -> None:
        self._drop_static(name, row)
        if self.dynamic.pop(name, None) is not None and row is not None:
            self._changed(row)

    def _drop_static(self, name: str, row: int | None) -> None:
        self._inputs.pop(name, None)
        self._layouts.pop(name, None)
        if self.nodes.pop(name, None) is not None and row is not None:
            self._changed(row)

    def apply_dynamic(self, name: str, row: int, gpus: Sequence[SliceMigGpu]) -> None:
        """The driver's slices of node ``name`` (at state row ``row``) publish partitions of
        ``gpus`` (none: no dynamic MIG there)."""
        spec = dynamic_spec(name, gpus)
        if spec == self.dynamic.get(name):
            return
        if spec is None:
            self.dynamic.pop(name, None)
        else:
            self.dynamic[name] = spec
        self._layouts.pop(name, None)
        self._changed(row)

    def set_claims(self, key: str, ask: Mapping[str, int],
                   held: tuple[tuple[str, MigPartition], ...], index: Mapping[str, int],
                   node: str = "") -> None:
        """What the DRA pod ``key``'s claims ask (profiles) and were allocated ((node,
        placement)); ``node``: where the pod is placed now. The layouts of the nodes this
        changes (``index``: the state's rows) are worked out again."""
        before = self.held.get(key, ())
        if dict(self.claim_asks.get(key, {})) == dict(ask) and before == held:
            return
        if ask:
            self.claim_asks[key] = dict(ask)
        else:
            self.claim_asks.pop(key, None)
        if held:
            self.held[key] = held
        else:
            self.held.pop(key, None)
        for name in {node, *(n for n, _ in before), *(n for n, _ in held)}:
            row = index.get(name)
            if row is not None:
                self._changed(row)

    def ask_of(self, key: str) -> Mapping[str, int]:
        """The profiles the pod ``key`` asks: its claims' (DRA), else its containers'."""
        return self.claim_asks.get(key) or self.asks.get(key, {})

    def spec_of(self, name: str) -> MigNodeSpec | None:
        """``name``'s MIG side: the device plugin's (its Node says), else the DRA driver's."""
        return self.nodes.get(name) or self.dynamic.get(name)

    def _changed(self, row: int) -> None:
        self._grow(row + 1)
        self._changes += 1
        self.serial[row] = self._changes

    def _grow(self, size: int) -> None:
        if size > self.serial.shape[0]:
            grown = np.zeros(max(size, 2 * self.serial.shape[0]), np.int64)
            grown[: self.serial.shape[0]] = self.serial
            self.serial = grown

    def serials(self, rows: IntArray) -> IntArray:
        """``serial`` of each of ``rows`` (known rows; 0 for one never a MIG node's)."""
        if rows.size:
            self._grow(int(rows.max()) + 1)
        found: IntArray = self.serial[rows]
        return found

    def set_ask(self, key: str, ask: Mapping[str, int]) -> None:
        if ask:
            self.asks[key] = dict(ask)
        else:
            self.asks.pop(key, None)

    def asked_on(self, state: ClusterState, name: str, exclude: str = "") -> dict[str, int]:
        """The profiles the pods placed on ``name`` (bound or assumed) ask, summed; the pod
        ``exclude`` (a key) left out, so a pod assumed there never counts against itself."""
        row = state.index.get(name)
        total: dict[str, int] = {}
        if row is None:
            return total
        for key in state.pods_on_node[row]:
            if key == exclude:
                continue
            for profile, n in self.ask_of(key).items():
                total[profile] = total.get(profile, 0) + n
        return total

    def _dynamic_on(self, state: ClusterState, name: str, exclude: str = ""
                    ) -> tuple[list[MigPartition], dict[str, int]]:
        """The partitions the pods placed on ``name`` (``exclude`` left out) hold there, and
        what they ask beyond those (assumed, not allocated yet), by profile."""
        row = state.index.get(name)
        held: list[MigPartition] = []
        unplaced: dict[str, int] = {}
        for key in state.pods_on_node[row] if row is not None else ():
            if key == exclude:
                continue
            mine = [p for node, p in self.held.get(key, ()) if node == name]
            held.extend(mine)
            for profile, n in self.ask_of(key).items():
                left = n - sum(1 for p in mine if p.profile == profile)
                if left > 0:
                    unplaced[profile] = unplaced.get(profile, 0) + left
        return held, unplaced

    def _layout_of(self, spec: MigNodeSpec, state: ClusterState, name: str, now: float,
                   exclude: str = "") -> MigLayout:
        if spec.dynamic:
            return dynamic_layout(spec, *self._dynamic_on(state, name, exclude))
        return layout_of(spec, self.asked_on(state, name, exclude), now)

    def layout(self, state: ClusterState, name: str, now: float,
               exclude: str = "") -> MigLayout | None:
        """``name``'s instances now (None: not a MIG node), ``exclude`` as in
        :meth:`asked_on`. Kept per node until its state ``version`` or ``serial`` moves or
        its agent reading turns stale, unless ``exclude`` is placed there."""
        spec = self.spec_of(name)
        if spec is None:
            return None
        row = state.index.get(name)
        if row is None or (exclude and exclude in state.pods_on_node[row]):
            return self._layout_of(spec, state, name, now, exclude)
        fresh = spec.agent is not None and now <= spec.agent.fresh_until
        self._grow(row + 1)
        key = (int(state.version[row]), int(self.serial[row]), fresh)
        kept = self._layouts.get(name)
        if kept is not None and kept[0] == key:
            return kept[1]
        layout = self._layout_of(spec, state, name, now)
        self._layouts[name] = (key, layout)
        return layout

    def warm(self, state: ClusterState, now: float) -> int:
        """Work out every MIG node's layout now (the extender's warm-up, before it turns
        ready), so the first MIG pod's filter does not pay for all of them; returns how many."""
        names = {*self.nodes, *self.dynamic}
        for name in names:
            self.layout(state, name, now)
        return len(names)

    def profile_counts(self) -> dict[str, int]:
        """Instances asked by every pod seen, by profile: the MIG target workload's source."""
        total: dict[str, int] = {}
        for key in {*self.asks, *self.claim_asks}:
            for profile, n in self.ask_of(key).items():
                total[profile] = total.get(profile, 0) + n
        return total


def mig_resource(profile: str) -> str:
    """The device plugin's resource for ``profile``: ``nvidia.com/mig-3g.40gb``."""
    return MIG_RESOURCE_PREFIX + profile


def mig_resources() -> tuple[str, ...]:
    """Every ``nvidia.com/mig-<profile>`` resource of the MIG table, sorted: the names a
    kube-scheduler configuration's ``managedResources`` must list (``ignoredByScheduler:
    false``, so kube-scheduler counts them too) for MIG pods to reach the extender at all."""
    return tuple(sorted({mig_resource(p.name) for m in MIG_MODELS.values()
                         for p in m.profiles}))


def mig_pod_to_k8s(name: str, profiles: Mapping[str, int], *, namespace: str = "default",
                   node: str = "", cpu: str = "100m", scheduler_name: str = SCHEDULER_NAME,
                   ) -> dict[str, Any]:
    """A v1 Pod (JSON shape) asking ``profiles`` (profile -> instances) as the device plugin's
    ``nvidia.com/mig-<profile>`` limits, with UID ``uid-<name>``; bound to ``node`` when
    given. For snapshots, benchmarks and tests, as :func:`mig_node_to_k8s`."""
    limits = {mig_resource(p): str(n) for p, n in profiles.items()}
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "containers": [{"name": "main", "image": "main",
                        "resources": {"requests": {"cpu": cpu}, "limits": limits}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "status": {"phase": "Running" if node else "Pending"}}


def mig_node_to_k8s(name: str, product: str, gpu_memory_mib: int, gpus: int,
                    counts: Mapping[str, int], *, cpu_milli: int = 64_000,
                    memory_mib: int = 512 * 1024, config: str = "", whole_gpus: int = 0,
                    ) -> dict[str, Any]:
    """A v1 Node (JSON shape) as NVIDIA's GPU operator publishes a MIG node with the ``mixed``
    strategy: ``nvidia.com/mig-<profile>`` allocatable per profile (``whole_gpus`` not in MIG
    mode as ``nvidia.com/gpu``) and GPU feature discovery's labels, ``gpus`` counting every
    GPU. The inverse of :func:`mig_node_from_k8s`, for snapshots, benchmarks and tests."""
    labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": product,
              "nvidia.com/gpu.memory": str(gpu_memory_mib),
              LABEL_GPU_COUNT: str(gpus + whole_gpus), LABEL_MIG_STRATEGY: MIG_STRATEGY_MIXED,
              **{f"{mig_resource(p)}.count": str(n) for p, n in counts.items()}}
    if config:
        labels[LABEL_MIG_CONFIG] = config
    allocatable = {"cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi", "pods": "110",
                   **{mig_resource(p): str(n) for p, n in counts.items()}}
    if whole_gpus:
        allocatable["nvidia.com/gpu"] = str(whole_gpus)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"capacity": dict(allocatable), "allocatable": allocatable}}


__all__ = ["AgentMig", "MigBook", "MigLayout", "MigNodeSpec", "MigReader", "dynamic_layout",
           "dynamic_spec", "layout_of",
           "mig_node_from_k8s", "mig_node_to_k8s", "mig_pod_to_k8s", "mig_resource",
           "mig_resources", "no_agent"]
