"""Filter and prioritize for pods asking MIG instances (``nvidia.com/mig-<profile>``).

Static MIG, NVIDIA's device plugin with the ``mixed`` strategy: a pod gets an instance of
exactly the profile it asks, and the plugin picks which one. Dynamic MIG, gpufrag's DRA
driver: a pod whose claims ask a profile's class is judged the same way, on the node's
partitions (every free legal placement, those its pods' claims were allocated in use:
:func:`scheduler.kube.mignodes.dynamic_layout`); kube-scheduler's first fit then picks the
placement. The nodes' instances and their
use come from :class:`scheduler.kube.mignodes.MigBook` (the agent's reading when fresh, else
the allocatable counts and the pods placed there).

- **Filter.** A node passes when it has, for every profile asked, at least as many free
  instances (allocatable minus in use) as asked. Failures are reasons, not errors: "not a MIG
  node", "no nvidia.com/mig-3g.40gb instance here" (unresolvable: no eviction makes one) and
  "no free nvidia.com/mig-3g.40gb instance (2 of 2 in use)" (an eviction could free one).
  GPU reservations (:mod:`scheduler.kube.reservations`) hold GPUs and shares of the
  ``ClusterState``, never MIG instances, so they do not enter here.
- **Score.** FGD over MIG (:func:`scheduler.core.mig.best_instances`): on each node, the
  least growth of F over its free instances of the profile, F counting the slices of the
  instances in use as taken, so a node's score says how usable its leftover positions stay
  if the layout advisor cuts them again. The policy key is −ΔF, exact (milli-GPU), blended
  with model-version affinity and scaled to 0..10 by the same :class:`Scorer` methods as
  every other pod. The device plugin picks the instance, so a node's score is for the best
  instance it offers.
- **Workload.** The profiles asked by the pods seen (bound and pending), by popularity; before
  any is seen, each node's family with its profiles equally popular
  (:func:`scheduler.core.mig.default_workload`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gpufrag.errors import BadInput
from gpufrag.gpu_usage import STALE_AFTER_INTERVALS, parse
from scheduler.core.fragmentation import FloatArray
from scheduler.core.mig import (
    MigGpuModel,
    MigInstance,
    MigWorkload,
    best_instances,
    default_workload,
    fragmentation_table,
)
from scheduler.core.state import BoolArray, ClusterState, IntArray, pod_key
from scheduler.core.types import PodRequest
from scheduler.extender.scoring import (
    MAX_CACHED_SHAPES,
    UNKNOWN,
    UNKNOWN_NODE_REASON,
    FilterVerdicts,
    Priorities,
    Render,
    Scorer,
    cap_reason,
)
from scheduler.kube.mignodes import AgentMig, MigBook, MigLayout, mig_resource
from scheduler.policies.affinity import at_cap

NOT_MIG_NODE = ("not a MIG node (it advertises no nvidia.com/mig-<profile> instance: MIG off, "
                "or not the device plugin's mixed strategy)")


def mig_workload(counts: Mapping[str, int]) -> MigWorkload | None:
    """The MIG target workload from the instances the pods seen ask, by profile (None: no pod
    asks one yet; each family's default applies)."""
    asked = [(p, n) for p, n in sorted(counts.items()) if n > 0]
    return MigWorkload.from_counts(asked) if asked else None


def shortfall(layout: MigLayout, ask: Mapping[str, int]) -> tuple[str, bool] | None:
    """Why ``ask`` does not fit ``layout`` now (and whether no eviction could change that),
    or None when it fits."""
    for profile in sorted(ask):
        have = layout.spec.allocatable.get(profile, 0)
        if not have:
            offered = ", ".join(sorted(layout.spec.allocatable)) or "none"
            config = f", mig.config {layout.spec.config}" if layout.spec.config else ""
            return (f"no {mig_resource(profile)} instance on this node (it offers "
                    f"{offered}{config})", True)
        if layout.free.get(profile, 0) < ask[profile] and layout.spec.dynamic:
            return (f"no free placement for {ask[profile]} {profile} partition(s) on its MIG "
                    f"GPUs ({layout.in_use.get(profile, 0)} in use)", False)
        if layout.free.get(profile, 0) < ask[profile]:
            used = layout.in_use.get(profile, 0)
            return (f"no free {mig_resource(profile)} instance ({used} of {have} in use"
                    f"{f', {ask[profile]} asked' if ask[profile] > 1 else ''})", False)
    return None


def _asked(ask: Mapping[str, int]) -> str:
    return ", ".join(f"{n} x {profile}" for profile, n in sorted(ask.items()))


@dataclass(frozen=True, slots=True)
class _Verdict:
    """One node for one ask: whether it fits, why not (and whether for good), its policy key
    (−ΔF, higher is better), and until when it holds (an agent reading's freshness)."""

    fits: bool
    reason: str = ""
    unresolvable: bool = False
    key: float = 0.0
    valid_until: float = math.inf


class _Shape:
    """Per state row, one ask's verdicts, kept until the row's state ``version`` or its MIG
    ``serial`` moves or the agent reading it read turns stale (like the core's ``ScoreCache``
    and the Scorer's verdicts): working a node's instances out costs tens of microseconds, and
    a filter asks about every node."""

    def __init__(self, size: int, render: Render) -> None:
        self.render = render
        self.state_seen = np.full(size, -1, np.int64)
        self.mig_seen = np.full(size, -1, np.int64)
        self.valid_until = np.full(size, -math.inf)
        self.fits = np.zeros(size, np.bool_)
        self.key = np.zeros(size, np.float64)
        self.unresolvable = np.zeros(size, np.bool_)
        self.reason = np.full(size, "", object)
        self.rendered = np.full(size, None, object)

    def grow(self, size: int) -> None:
        extra = size - self.state_seen.shape[0]
        if extra <= 0:
            return
        for name, fill in (("state_seen", -1), ("mig_seen", -1), ("valid_until", -math.inf),
                           ("fits", False), ("key", 0.0), ("unresolvable", False),
                           ("reason", ""), ("rendered", None)):
            current = getattr(self, name)
            setattr(self, name, np.concatenate([current, np.full(extra, fill, current.dtype)]))

    def keep(self, row: int, verdict: _Verdict, state_version: int, serial: int) -> None:
        self.state_seen[row], self.mig_seen[row] = state_version, serial
        self.valid_until[row] = verdict.valid_until
        self.fits[row], self.key[row] = verdict.fits, verdict.key
        self.unresolvable[row] = verdict.unresolvable
        self.reason[row] = verdict.reason
        self.rendered[row] = self.render(verdict.reason) if verdict.reason else None


class MigScorer:
    """Filter, rank and decide for MIG pods; built with the extender's :class:`Scorer` (for
    affinity and the 0..10 scaling) and the MIG target workload, so it is rebuilt whenever
    either is. Call with the cache's lock held."""

    def __init__(self, book: MigBook, scorer: Scorer, workload: MigWorkload | None,
                 render: Render = str) -> None:
        self.book = book
        self.scorer = scorer
        self.workload = workload
        self.render = render
        self._tables: dict[str, tuple[MigWorkload, tuple[float, ...]]] = {}
        self._shapes: dict[tuple[tuple[str, int], ...], _Shape] = {}

    def workload_for(self, model: MigGpuModel) -> tuple[MigWorkload, tuple[float, ...]]:
        """The workload a node of ``model`` is scored for, and F by taken mask under it."""
        found = self._tables.get(model.family)
        if found is None:
            workload = self.workload or default_workload(model)
            found = self._tables[model.family] = (workload,
                                                  fragmentation_table(model, workload))
        return found

    def _verdict(self, state: ClusterState, ask: Mapping[str, int], row: int, now: float,
                 exclude: str = "") -> _Verdict:
        layout = self.book.layout(state, state.names[row], now, exclude)
        if layout is None:
            return _Verdict(False, NOT_MIG_NODE, True)
        agent = layout.spec.agent
        valid_until = agent.fresh_until if layout.source == "agent" and agent else math.inf
        short = shortfall(layout, ask)
        if short is not None:
            return _Verdict(False, short[0], short[1], valid_until=valid_until)
        model = layout.spec.model
        fit = None if model is None else best_instances(
            model, layout.instances, ask, *self.workload_for(model))
        if fit is None and layout.spec.dynamic:  # free placements that overlap, for several
            return _Verdict(False, f"no placement for all of {_asked(ask)} at once on its "
                                   "MIG GPUs")
        # No model (a product the MIG table lacks) or no placed free instance (the packing
        # found no position for it): it fits by the counts, and ranks neutral.
        return _Verdict(True, key=-fit.delta_milli if fit is not None else 0.0,
                        valid_until=valid_until)

    def _verdicts(self, state: ClusterState, pod: PodRequest, ask: Mapping[str, int],
                  rows: IntArray, now: float) -> tuple[_Shape, _Verdict | None, int]:
        """The ask's cache, current for the known ``rows``; and where the pod itself is
        placed (assumed by a deciding filter) among them, that row's verdict without it."""
        shape_key = tuple(sorted(ask.items()))
        shape = self._shapes.get(shape_key)
        if shape is None:
            if len(self._shapes) >= MAX_CACHED_SHAPES:
                self._shapes.clear()
            shape = self._shapes[shape_key] = _Shape(state.cpu_cap.shape[0], self.render)
        shape.grow(state.cpu_cap.shape[0])
        known = rows[rows != UNKNOWN]
        serials = self.book.serials(known)
        stale = ((shape.state_seen[known] != state.version[known])
                 | (shape.mig_seen[known] != serials) | (shape.valid_until[known] < now))
        for row, serial in zip(known[stale].tolist(), serials[stale].tolist(), strict=True):
            shape.keep(row, self._verdict(state, ask, row, now), int(state.version[row]),
                       serial)
        own = state.pods.get(pod_key(pod))
        own_row = state.index.get(own.node, UNKNOWN) if own is not None else UNKNOWN
        if own_row == UNKNOWN or not bool(np.any(known == own_row)):
            return shape, None, UNKNOWN
        return shape, self._verdict(state, ask, own_row, now, pod_key(pod)), own_row

    def filter(self, state: ClusterState, pod: PodRequest, ask: Mapping[str, int],
               rows: IntArray, now: float) -> FilterVerdicts:
        shape, own, own_row = self._verdicts(state, pod, ask, rows, now)
        known = rows != UNKNOWN
        safe = np.where(known, rows, 0)
        passed = known & shape.fits[safe]
        reasons = shape.reason[safe]
        rendered = shape.rendered[safe]
        unresolvable = shape.unresolvable[safe]
        if own is not None:
            at = rows == own_row
            passed[at], reasons[at], unresolvable[at] = own.fits, own.reason, own.unresolvable
            rendered[at] = self.render(own.reason) if own.reason else None
        capped = passed & self._capped(state, pod, safe)
        for i in np.flatnonzero(capped).tolist():
            reasons[i] = cap_reason(state, pod, int(rows[i]),
                                    self.scorer.affinity.max_replicas_per_node)
            rendered[i] = self.render(reasons[i])
        passed &= ~capped
        unknown = np.flatnonzero(~known)
        reasons[unknown] = UNKNOWN_NODE_REASON
        rendered[unknown] = self.render(UNKNOWN_NODE_REASON)
        unresolvable = unresolvable & known & ~capped
        failed = np.flatnonzero(~passed)
        return FilterVerdicts(rows, passed, failed, reasons[failed].tolist(),
                              unresolvable[failed], rendered[failed].tolist())

    def _capped(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> BoolArray:
        if not (self.scorer.affinity.cap_is_hard and pod.model):
            return np.zeros(rows.size, np.bool_)
        found: BoolArray = at_cap(state, pod, rows, self.scorer.affinity)
        return found

    def ranked(self, state: ClusterState, pod: PodRequest, ask: Mapping[str, int],
               rows: IntArray, now: float) -> tuple[IntArray, FloatArray]:
        """The rows ``ask`` fits and their blended key (higher is better)."""
        shape, own, own_row = self._verdicts(state, pod, ask, rows, now)
        known = rows[rows != UNKNOWN]
        fits = shape.fits[known]
        keys = shape.key[known]
        if own is not None:
            at = known == own_row
            fits[at], keys[at] = own.fits, own.key
        return self.scorer.blend(state, pod, known[fits], keys[fits], now)

    def prioritize(self, state: ClusterState, pod: PodRequest, ask: Mapping[str, int],
                   rows: IntArray, now: float, hinted: frozenset[str] = frozenset(),
                   ) -> Priorities:
        candidates, key = self.ranked(state, pod, ask, rows, now)
        return self.scorer.priorities(state, rows, candidates, key, hinted)

    def decide(self, state: ClusterState, pod: PodRequest, ask: Mapping[str, int],
               rows: IntArray, now: float, hinted: frozenset[str] = frozenset(),
               count: int = 1) -> IntArray:
        candidates, key = self.ranked(state, pod, ask, rows, now)
        return self.scorer.best_rows(state, candidates, key, hinted, count)


def agent_mig(text: str) -> AgentMig | None:
    """The MIG instances of the agent's usage annotation (:mod:`gpufrag.gpu_usage`, the one
    schema), fresh until the agent would have published again
    (``STALE_AFTER_INTERVALS`` intervals); None when it lists no MIG GPU or does not read
    (the labels decide then). The instance's GPU is NVML's index, whole GPUs included."""
    try:
        usage = parse(text)
    except BadInput:
        return None
    instances = tuple(MigInstance(gpu.index, i.profile, i.start, i.in_use)
                      for gpu in usage.gpus for i in gpu.mig)
    if not instances:
        return None
    return AgentMig(instances, usage.timestamp + STALE_AFTER_INTERVALS * usage.interval_s)


__all__ = ["NOT_MIG_NODE", "MigScorer", "agent_mig", "mig_workload", "shortfall"]
