"""The planner: snapshot + the scheduler's policy + budgets -> a plan of moves. Pure.

Which pods: small (GPU shares, or at most ``--max-pod-gpus`` whole GPUs), movable pods (owned
by a ReplicaSet, StatefulSet or Job; not DaemonSet pods, not bare pods, not above
``--max-priority``, not opted out with ``gpufrag.io/defrag-movable: "false"``) on triggered nodes
that no move landed a pod on within ``--node-cooldown-s``.

Where to: the planner never decides placement itself. For each candidate it asks the core's
``choose`` — the same call the extender makes — where the evicted pod would land, on the state
with the pod's source node (and every node already being drained this cycle, or that gave a pod
within ``--node-cooldown-s``) excluded. FGD, the
scheduler's policy, lands a pod where fragmentation grows least, which is on fragmented nodes
whose leftovers it fills. The move is then measured with the core's fragmentation functions and
kept only if the cluster improves: fragmentation falls, or a whole GPU comes free, or a pending
pod blocked by stranded share would fit on the source afterwards, or a right-sized replacement
(``Snapshot.rightsized``: the share the admission webhook will give it) reserves less idle
memory — never by giving up a whole free GPU for nothing, and only when the gain reaches
``--min-gain-gpus`` (an eviction worth a hundredth of a GPU is not worth making).

In what order: greedily by gain per eviction, where gain is in GPUs:

    gain = −Δ fragmentation / 1000  +  net whole GPUs freed
           −Δ reserved-but-idle MiB / source GPU memory  +  pending pods unblocked

Scoring every pod with the policy would be slow on a large cluster, so candidates are first
ranked by what freeing their share does to the source node alone plus the share a right-sized
replacement gives back (one vectorised call), and only
the best ``evictions allowed x candidates_per_eviction`` are scored in full (the allowed: the
per-cycle total, or the day's budget left when smaller). A lazy-greedy queue then
re-scores a candidate only when the state changed since it was scored, so every kept move is
predicted on the state the moves before it leave behind — the order the executor follows.

The state and usage passed in are changed while planning and restored before ``plan`` returns.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from defrag.controller.actionable import not_actionable
from defrag.controller.budget import DailyBudget, EvictionBudget, running_gpu_pods
from defrag.controller.config import DefragConfig
from defrag.controller.measure import Summary, measure, node_idle_ratio
from defrag.controller.model import (
    DELIVERY_CLAIMS,
    DELIVERY_DIRECT,
    MOVABLE_OWNERS,
    NodeConstraints,
    Pdb,
    PodInfo,
    Snapshot,
)
from defrag.controller.trigger import Triggers, find_triggers
from gpufrag.conventions import RESERVATION_PLACEMENT_NAMESPACE
from scheduler.core.fragmentation import TargetWorkload, fragmentation_of, node_fragmentation
from scheduler.core.gpus import FIRST_FIT
from scheduler.core.placement import ScoreCache, choose
from scheduler.core.policy import Policy
from scheduler.core.state import BoolArray, IntArray
from scheduler.core.types import MILLI_PER_GPU, Placement, PodRequest

# The keys of the shares GPU reservations hold (hold_reservations puts them in the state).
HELD_SHARE_PREFIX = f"{RESERVATION_PLACEMENT_NAMESPACE}/"

# A fragmentation change smaller than this (milli-GPU) is rounding, not an improvement.
FRAG_EPSILON_MILLI = 1.0
NO_CONSTRAINTS = NodeConstraints()
# Re-scoring after earlier moves may take at most this many times the first round's scoring.
RESCORE_FACTOR = 3
# A move that would lift its target node, whose idle trigger is off, over the threshold.
TURNS_TARGET_ON = "it would turn its target node's idle trigger on"
# A move that would lift its target node, whose idle trigger is off, above --threshold-off.
INTO_THE_BAND = "it would lift its target node's idle ratio above --threshold-off"
# An idle-ratio change smaller than this is rounding, not a lift.
RATIO_EPSILON = 1e-9
# The skip reason of every pod on a node a move landed a pod on within --node-cooldown-s.
RECEIVED_RECENTLY = "node received a pod within --node-cooldown-s"
# A pod whose GPUs come through a ResourceClaim its spec names (not made from a template): the
# claim and its allocation outlive the pod, so its replacement can only land where it is.
NAMED_CLAIM = "its GPUs come through a ResourceClaim its spec names (the claim stays put)"
# The skip reason of every pod on a node whose idle memory right-sizing cannot reclaim.
NOT_ACTIONABLE = "source node not actionable (its idle memory is not right-sizable)"


@dataclass(frozen=True, slots=True)
class Move:
    """Evict ``pod`` from ``source``; its replacement is expected on ``target``/``target_gpus``."""

    pod: str  # namespace/name
    uid: str
    owner_kind: str
    owner_uid: str
    owner_name: str
    num_gpu: int
    gpu_milli: int
    source: str
    source_gpus: tuple[int, ...]
    target: str
    target_gpus: tuple[int, ...]
    frag_delta_milli: float  # change of cluster fragmentation (negative: it falls)
    idle_delta_mib: float  # change of reserved-but-idle GPU memory (negative: it falls)
    freed_gpus: int  # net whole GPUs freed
    unblocks: tuple[str, ...]  # pending pods that fit on the source afterwards
    gain: float
    reason: str  # why the source node was triggered
    pdb: str = ""
    new_milli: int = 0  # the replacement's share when right-sized (0: unchanged)

    @property
    def purposes(self) -> tuple[str, ...]:
        """What the move is for: ``idle`` (a right-sized replacement or a smaller GPU gives
        reserved-but-unused memory back), ``fragmentation`` (fragmentation falls or a whole GPU
        comes free), ``unblock`` (a pending pod fits afterwards)."""
        out = []
        if self.idle_delta_mib < 0:
            out.append("idle")
        if self.frag_delta_milli < -FRAG_EPSILON_MILLI or self.freed_gpus > 0:
            out.append("fragmentation")
        if self.unblocks:
            out.append("unblock")
        return tuple(out)

    def replacement(self, pod: PodRequest) -> PodRequest:
        """What ``pod``'s replacement asks for: its right-sized share when the move has one.
        This is also the capacity a reservation holds on ``target`` before the eviction."""
        return dataclasses.replace(pod, gpu_milli=self.new_milli) if self.new_milli else pod

    @property
    def namespace(self) -> str:
        return self.pod.split("/", 1)[0] if "/" in self.pod else ""

    @property
    def name(self) -> str:
        return self.pod.split("/", 1)[-1]

    def as_dict(self) -> dict[str, Any]:
        return {
            "pod": self.pod, "uid": self.uid, "owner": f"{self.owner_kind}/{self.owner_name}",
            "owner_uid": self.owner_uid, "num_gpu": self.num_gpu, "gpu_milli": self.gpu_milli,
            "source": self.source, "source_gpus": list(self.source_gpus),
            "target": self.target, "target_gpus": list(self.target_gpus),
            "frag_delta_gpus": round(self.frag_delta_milli / MILLI_PER_GPU, 4),
            "idle_delta_gib": round(self.idle_delta_mib / 1024.0, 3),
            "freed_gpus": self.freed_gpus, "unblocks": list(self.unblocks),
            "gain": round(self.gain, 4), "reason": self.reason, "pdb": self.pdb,
            "new_milli": self.new_milli or None, "purposes": list(self.purposes),
        }


@dataclass(frozen=True)
class Plan:
    moves: tuple[Move, ...]
    triggered: Mapping[str, str]  # node -> why it was triggered
    skipped: Mapping[str, int]  # reason -> candidate pods not moved for it
    before: Summary
    after: Summary  # predicted, if every move lands as planned
    unplaceable: tuple[str, ...]  # pending GPU pods that fit nowhere now
    scored: int  # candidate moves scored with the policy
    seconds: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)
    idle_nodes: frozenset[str] = frozenset()  # triggered on idle memory (hysteresis applied)
    # Triggered on idle memory that right-sizing cannot reclaim: node -> the workloads holding
    # it (defrag.controller.actionable); no pod is taken from these.
    not_actionable: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # The day's budget as this cycle saw it (None: no --max-evictions-per-day-pct).
    daily: DailyBudget | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "moves": [m.as_dict() for m in self.moves],
            "triggered": dict(sorted(self.triggered.items())),
            "skipped": dict(sorted(self.skipped.items(), key=lambda kv: (-kv[1], kv[0]))),
            "before": self.before.as_dict(), "predicted_after": self.after.as_dict(),
            "unplaceable_pending": list(self.unplaceable), "scored": self.scored,
            "not_actionable": {n: list(w) for n, w in sorted(self.not_actionable.items())},
            "daily_budget": None if self.daily is None else {
                "pct": self.daily.pct, "running_gpu_pods": self.daily.running,
                "allowed": self.daily.allowed, "spent": self.daily.spent,
                "left": self.daily.left},
            "seconds": round(self.seconds, 4),
        }


def movability(pod: PodInfo, config: DefragConfig) -> str | None:
    """Why ``pod`` may not be moved at all (None when it may)."""
    req = pod.request
    if not req.wants_gpu:
        return "no GPU"
    if pod.deleting:
        return "terminating"
    if not pod.running:
        return "not running"
    if pod.namespace in config.excluded_namespaces:
        return "namespace excluded"
    if config.namespaces and pod.namespace not in config.namespaces:
        return "namespace not selected (--namespaces)"
    if pod.owner_kind == "DaemonSet":
        return "DaemonSet pod"
    if not pod.owner_kind:
        return "bare pod (no controller)"
    if pod.owner_kind not in MOVABLE_OWNERS:
        return f"owner kind {pod.owner_kind} is not movable"
    if pod.opted_out:
        return "opted out (gpufrag.io/defrag-movable=false)"
    if pod.priority > config.max_priority:
        return "priority above --max-priority"
    if req.num_gpu > config.max_pod_gpus:
        return "more GPUs than --max-pod-gpus"
    if pod.delivery == DELIVERY_DIRECT:
        return NAMED_CLAIM
    return None


@dataclass(slots=True)
class _Scored:
    target: int
    target_gpus: tuple[int, ...]
    frag_delta: float
    idle_delta: float
    freed: int
    unblocks: tuple[str, ...]
    gain: float


@dataclass(slots=True)
class _Candidate:
    info: PodInfo
    row: int
    placement: Placement
    pdbs: tuple[Pdb, ...] | None = None  # looked up when first needed
    epoch: int = -1
    scored: _Scored | None = None


def plan(snapshot: Snapshot, policy: Policy, workload: TargetWorkload,
         config: DefragConfig, dra_policy: Policy | None = None) -> Plan:
    """The moves for one cycle. ``snapshot`` is left as it was given. ``dra_policy``: the
    policy as the extender scores pods whose GPUs come through claims (each node for the GPU
    DRA's first fit gives there: ``DRA_DEVICE_MODE``); ``policy`` when None. Either way such a
    pod's replacement is predicted on the GPU first fit takes, as kube-scheduler's allocator
    gives it."""
    started = time.perf_counter()
    planner = _Planner(snapshot, policy, workload, config, dra_policy)
    try:
        moves = planner.run()
        after = measure(snapshot.state, snapshot.usage, workload).summary
    finally:
        planner.revert()
    m = planner.measurement
    state = snapshot.state
    return Plan(
        moves=tuple(moves),
        triggered={state.names[r]: planner.triggers.reason(r, m)
                   for r in sorted(planner.triggers.rows)},
        skipped=dict(planner.skipped),
        before=m.summary,
        after=after,
        unplaceable=tuple(p.key for p in planner.triggers.unplaceable),
        scored=planner.scored,
        seconds=time.perf_counter() - started,
        idle_nodes=frozenset(state.names[r] for r in planner.triggers.idle),
        not_actionable={state.names[r]: w for r, w in sorted(planner.not_actionable.items())},
        daily=planner.daily,
    )


class _Planner:
    def __init__(self, snapshot: Snapshot, policy: Policy, workload: TargetWorkload,
                 config: DefragConfig, dra_policy: Policy | None = None) -> None:
        self.snapshot = snapshot
        self.state = snapshot.state
        self.usage = snapshot.usage
        self.policy = policy
        self.dra_policy = policy if dra_policy is None else dra_policy
        self.workload = workload
        self.config = config
        self.measurement = measure(self.state, self.usage, workload)
        self.triggers: Triggers = find_triggers(
            self.state, self.measurement, snapshot.pending, config.threshold,
            latched=snapshot.latched_rows(), threshold_off=config.off_threshold,
            streaks=snapshot.streak_rows(), on_cycles=config.trigger_on_cycles,
            off_cycles=config.trigger_off_cycles)
        # Idle-only triggered nodes whose idle memory no replacement gives back: no source.
        self.not_actionable = not_actionable(
            snapshot, (r for r in self.triggers.idle if r not in self.triggers.blocking))
        n = self.state.size
        self.frag = self.measurement.frag_milli.copy()
        self.allowed = workload.allowed(self.state)
        self.cache = ScoreCache(policy) if policy.node_local else None
        self.may_receive = self.state.active[:n].copy()
        # Cordoned nodes take no pod; nor does a node that gave one within --node-cooldown-s.
        for name in snapshot.cordoned | snapshot.gave_recently:
            if name in self.state.index:
                self.may_receive[self.state.index[name]] = False
        self.tainted = any(t.repels for ts in snapshot.taints.values() for t in ts)
        self._constraint_masks: dict[NodeConstraints, BoolArray] = {}
        self.may_give = np.ones(n, np.bool_)
        pct = config.max_evictions_per_day_pct
        self.daily = None if pct is None else DailyBudget(
            pct, running_gpu_pods(snapshot.pods.values()), snapshot.evicted_last_day)
        self.budget = EvictionBudget(config.limits, snapshot.pdbs, self.daily)
        self.skipped: Counter[str] = Counter()
        self.blocked_by = {r: list(p) for r, p in self.triggers.blocking.items()}
        self.unblocked: set[str] = set()
        self.applied: list[tuple[str, Placement, Placement]] = []
        self.epoch = 0
        self.scored = 0

    # ---------------------------------------------------------------- candidates
    def candidates(self) -> list[_Candidate]:
        state, pods, config = self.state, self.snapshot.pods, self.config
        out: list[_Candidate] = []
        for row in self.triggers.rows:
            if row in self.not_actionable and not config.move_not_actionable:
                self.skipped[NOT_ACTIONABLE] += len(state.pods_on_node[row])
                continue
            if state.names[row] in self.snapshot.received_recently:
                self.skipped[RECEIVED_RECENTLY] += len(state.pods_on_node[row])
                continue
            for key in state.pods_on_node[row]:
                if key.startswith(HELD_SHARE_PREFIX):
                    continue  # a reservation's held share: capacity, not a pod to move
                info = pods.get(key)
                reason = "unknown pod" if info is None else movability(info, config)
                if reason is None and info is not None and info.owner_uid in self.snapshot.cooling:
                    reason = "owner moved within --cooldown-s"
                if reason is not None or info is None:
                    self.skipped[reason or "unknown pod"] += 1
                    continue
                out.append(_Candidate(info, row, state.pods[key]))
        return out

    def prerank(self, cands: list[_Candidate]) -> list[_Candidate]:
        """Order by what removing each pod does to its source node alone (vectorised): the
        fragmentation it takes away there, the whole GPUs it frees and the share a right-sized
        replacement gives back. Ties by pod key, so equal inputs give equal plans."""
        if not cands:
            return cands
        state = self.state
        k = len(cands)
        rows = np.fromiter((c.row for c in cands), np.int64, k)
        milli = np.fromiter((c.placement.pod.gpu_milli for c in cands), np.int64, k)
        cpu = np.fromiter((c.placement.pod.cpu_milli for c in cands), np.int64, k)
        first = np.fromiter((c.placement.gpus[0] for c in cands), np.int64, k)
        free_after = state.gpu_free[rows].copy()
        idx = np.arange(k)
        free_after[idx, first] += milli
        freed = (free_after[idx, first] == MILLI_PER_GPU).astype(np.int64)
        for i, c in enumerate(cands):  # the other GPUs of multi-GPU pods (rare)
            for g in c.placement.gpus[1:]:
                free_after[i, g] += milli[i]
                freed[i] += int(free_after[i, g] == MILLI_PER_GPU)
        after = fragmentation_of(free_after, state.cpu_left[rows] + cpu, state.product[rows],
                                 self.workload, self.allowed)
        # A right-sized replacement gives back the share it no longer reserves (in GPUs, as
        # the score's idle memory term counts it), wherever it lands.
        rightsized = self.snapshot.rightsized
        evictable = self.snapshot.rightsize_evictable
        reclaim = np.fromiter((max(c.placement.pod.gpu_milli
                                   - rightsized.get(c.info.key, c.placement.pod.gpu_milli), 0)
                               if evictable is None or c.info.key in evictable else 0
                               for c in cands), np.int64, k)
        gain = (self.frag[rows] - after) / MILLI_PER_GPU + freed + reclaim / MILLI_PER_GPU
        keys = np.array([c.info.key for c in cands])
        order = np.lexsort((keys, -gain))
        return [cands[i] for i in order]

    # ---------------------------------------------------------------- scoring
    def pdbs(self, c: _Candidate) -> tuple[Pdb, ...]:
        if c.pdbs is None:
            c.pdbs = tuple(self.snapshot.pdbs_of(c.info))
        return c.pdbs

    def refusal(self, c: _Candidate) -> str | None:
        if not self.may_give[c.row]:
            return "source node received a pod this cycle"
        return self.budget.refusal(self.state.names[c.row], c.info.namespace, self.pdbs(c))

    def constraint_mask(self, constraints: NodeConstraints) -> BoolArray:
        """Rows whose labels and taints ``constraints`` accept (cached per distinct value)."""
        mask = self._constraint_masks.get(constraints)
        if mask is None:
            state = self.state
            if constraints == NO_CONSTRAINTS and not self.tainted:
                mask = np.ones(state.size, np.bool_)
            else:
                taints = self.snapshot.taints
                mask = np.array([constraints.allows(state.labels[r], taints.get(state.names[r], ()))
                                 for r in range(state.size)], np.bool_)
            self._constraint_masks[constraints] = mask
        return mask

    def score(self, c: _Candidate) -> _Scored | str:
        """Predict where ``c`` lands and what the move does, or say why it is not worth it."""
        self.scored += 1
        state = self.state
        src = c.row
        placement = state.pods[c.info.key]
        old_pod = placement.pod
        pod = self.replacement(c.info.key, old_pod)
        mask = self.may_receive & self.constraint_mask(c.info.constraints)
        mask[src] = False
        rows: IntArray = np.flatnonzero(mask).astype(np.int64)
        if c.info.delivery == DELIVERY_CLAIMS:  # new claims, allocated by first fit
            decision = choose(state, self.dra_policy, pod, rows, device_choice=FIRST_FIT)
        else:
            decision = choose(state, self.policy, pod, rows, self.cache)
        if decision is None:
            return "no node can take it"
        dst, dst_gpus = decision.row, decision.gpus
        src_mem = float(state.gpu_memory_mib[src])
        dst_mem = float(state.gpu_memory_mib[dst])
        if c.info.key in self.usage.pod_used_mib and dst_mem > 0:
            peak = self.usage.pod_peak(placement, src)
            if peak > pod.gpu_milli / 1000 * dst_mem:
                return "memory it used over the window would not fit its share of the target GPU"
        free_src = state.gpu_free[src].copy()
        free_src[list(placement.gpus)] += old_pod.gpu_milli
        free_dst = state.gpu_free[dst].copy()
        free_dst[list(dst_gpus)] -= pod.gpu_milli
        both = np.array([src, dst], np.int64)
        after = fragmentation_of(
            np.stack([free_src, free_dst]),
            np.array([state.cpu_left[src] + pod.cpu_milli, state.cpu_left[dst] - pod.cpu_milli]),
            state.product[both], self.workload, self.allowed)
        frag_delta = float(after.sum() - self.frag[src] - self.frag[dst])
        freed = (sum(1 for g in placement.gpus if free_src[g] == MILLI_PER_GPU)
                 - sum(1 for g in dst_gpus if state.gpu_free[dst, g] == MILLI_PER_GPU))
        idle_delta = round(self._idle_delta(placement, src, dst, dst_gpus, pod), 3) + 0.0
        unblocks = self._unblocks(src, free_src, pod)
        cuts_idle = pod.gpu_milli < old_pod.gpu_milli and idle_delta < 0
        # Under VPA's out-of-bounds rule (Snapshot.rightsize_evictable) the memory a right-sized
        # replacement gives back pays for the eviction only for pods far outside their
        # recommendation; the others move only when the move packs (it still gives it back).
        evictable = self.snapshot.rightsize_evictable
        idle_pays = evictable is None or c.info.key in evictable
        improves = ((frag_delta < -FRAG_EPSILON_MILLI or freed > 0 or bool(unblocks)
                     or (cuts_idle and idle_pays)) and (freed >= 0 or bool(unblocks)))
        gain = (-frag_delta / MILLI_PER_GPU + freed + len(unblocks)
                - (idle_delta / src_mem if src_mem > 0 and idle_pays else 0.0))
        if not improves or gain <= 0:
            return "no landing improves the cluster"
        if gain < self.config.min_gain_gpus:
            return "gain below --min-gain-gpus"
        if dst not in self.triggers.idle:
            refused = self._landing_refusal(placement, src, dst, dst_gpus, pod)
            if refused is not None:
                return refused
        return _Scored(dst, dst_gpus, frag_delta, idle_delta, freed, unblocks, gain)

    def _landing_refusal(self, placement: Placement, src: int, dst: int,
                         dst_gpus: tuple[int, ...], pod: PodRequest) -> str | None:
        """Why ``pod`` may not land on ``dst``, whose idle trigger is off, or None.

        Over ``--threshold`` it would turn the trigger on (TURNS_TARGET_ON). Between
        ``--threshold-off`` and ``--threshold`` the trigger stays off, but the hysteresis band
        is the node's margin against its own pods: their memory swings by tenths of the
        node's ratio within hours (the GenAI series), so a landing that lifts an off node into
        the band (or higher within it) hands that margin over, and the next swing turns the
        node on again less than a day after it went off: a flap of the controller's making
        (INTO_THE_BAND). A landing that lowers the node's ratio is always fine."""
        after = self._idle_ratio_with(placement, src, dst, dst_gpus, pod)
        if after > self.config.threshold:
            return TURNS_TARGET_ON
        if (after > self.config.off_threshold
                and after > node_idle_ratio(self.state, self.usage, dst) + RATIO_EPSILON):
            return INTO_THE_BAND
        return None

    def replacement(self, key: str, pod: PodRequest) -> PodRequest:
        """The pod its replacement will be: the share the webhook admits it with. That is
        usually smaller (right-sized; for a pod holding one whole GPU, a share of one), but may
        be larger than a right-sized pod holds now when the recommendation rose since (never
        above what its template asks)."""
        milli = self.snapshot.rightsized.get(key, 0)
        if pod.num_gpu == 1 and 0 < milli < MILLI_PER_GPU and milli != pod.gpu_milli:
            return dataclasses.replace(pod, gpu_milli=milli)  # a whole GPU may become a share
        return pod

    def _idle_ratio_with(self, placement: Placement, src: int, dst: int,
                         dst_gpus: tuple[int, ...], pod: PodRequest) -> float:
        """``dst``'s idle ratio once ``pod`` (``placement``'s replacement) is on ``dst_gpus``,
        over its GPUs with a reading. A move that lifts a node whose trigger is off over the
        threshold only makes the next cycle's source: the node flaps on again, and the pod
        may be moved twice. The replacement is a new pod: its peak over the window starts
        from what it uses now (the agent's window, like the recommender's, restarts with the
        pod), so right after landing it counts as idle all it reserves above that."""
        moved = (pod.gpu_milli / MILLI_PER_GPU * float(self.state.gpu_memory_mib[dst]),
                 self.usage.pod_used(placement, src))
        return node_idle_ratio(self.state, self.usage, dst, dict.fromkeys(dst_gpus, moved))

    def _idle_delta(self, placement: Placement, src: int, dst: int,
                     dst_gpus: tuple[int, ...], new_pod: PodRequest | None = None) -> float:
        """Change of Σ max(allocated − peak use over the window, 0) over the GPUs the move
        touches (the idle memory the trigger reads)."""
        state, usage = self.state, self.usage
        delta = 0.0
        for row, gpus, sign, pod in ((src, placement.gpus, -1.0, placement.pod),
                                     (dst, dst_gpus, 1.0, new_pod or placement.pod)):
            memory = float(state.gpu_memory_mib[row])
            moved_alloc = pod.gpu_milli / MILLI_PER_GPU * memory
            moved_peak = usage.pod_peak(placement, row)
            for g in gpus:
                if not usage.known[row, g]:
                    continue
                alloc = (MILLI_PER_GPU - float(state.gpu_free[row, g])) / MILLI_PER_GPU * memory
                peak = float(usage.peak_mib[row, g])
                before = max(alloc - peak, 0.0)
                after = max(alloc + sign * moved_alloc - (peak + sign * moved_peak), 0.0)
                delta += after - before
        return delta

    def _unblocks(self, src: int, free_src: np.ndarray, pod: PodRequest) -> tuple[str, ...]:
        """Pending pods held back by ``src`` that would fit there once ``pod`` left."""
        waiting = self.blocked_by.get(src)
        if not waiting:
            return ()
        state = self.state
        count = int(state.gpu_count[src])
        free = free_src[:count]
        cpu = int(state.cpu_left[src]) + pod.cpu_milli
        mem = int(state.mem_left[src]) + pod.memory_mib
        fit: list[str] = []
        for p in waiting:
            req = p.request
            if p.key in self.unblocked or req.cpu_milli > cpu or req.memory_mib > mem:
                continue
            if req.is_share:
                ok = bool((free >= req.gpu_milli).any())
            else:
                ok = int((free == MILLI_PER_GPU).sum()) >= req.num_gpu
            if ok:
                fit.append(p.key)
                # One freed spot lets one pending pod in; count the best one only.
                break
        return tuple(fit)

    # ---------------------------------------------------------------- the greedy loop
    def run(self) -> list[Move]:
        moves: list[Move] = []
        if self.budget.cap == 0:
            return moves
        ranked = self.prerank(self.candidates())
        first_round = max(16, self.budget.cap * self.config.candidates_per_eviction)
        heap: list[tuple[float, int, _Candidate]] = []
        seq = 0
        for i, c in enumerate(ranked):
            if self.scored >= first_round:
                self.skipped["not scored (candidate limit)"] += len(ranked) - i
                break
            if not self._score_into(c, heap, seq):
                continue
            seq += 1
        rescore_left = RESCORE_FACTOR * first_round
        while heap and not self.budget.exhausted:
            _, _, c = heapq.heappop(heap)
            refusal = self.refusal(c)
            if refusal is not None:
                self.skipped[refusal] += 1
                continue
            if c.epoch != self.epoch:
                if rescore_left <= 0:
                    self.skipped["not re-scored (candidate limit)"] += 1
                    continue
                rescore_left -= 1
                if self._score_into(c, heap, seq):
                    seq += 1
                continue
            moves.append(self.accept(c))
        for _, _, c in heap:
            self.skipped[self.refusal(c) or "lower gain than the moves kept"] += 1
        return moves

    def _score_into(self, c: _Candidate, heap: list[tuple[float, int, _Candidate]],
                    seq: int) -> bool:
        refusal = self.refusal(c)
        if refusal is not None:
            self.skipped[refusal] += 1
            return False
        scored = self.score(c)
        c.epoch = self.epoch
        if isinstance(scored, str):
            c.scored = None
            self.skipped[scored] += 1
            return False
        c.scored = scored
        heapq.heappush(heap, (-scored.gain, seq, c))
        return True

    def accept(self, c: _Candidate) -> Move:
        assert c.scored is not None
        s = c.scored
        state = self.state
        key = c.info.key
        old = state.pods[key]
        src = c.row
        self.usage.move(old, src, s.target, s.target_gpus)
        state.remove_pod(key)
        new_pod = self.replacement(key, old.pod)
        new = state.place(new_pod, s.target, s.target_gpus, check=False)
        both = np.array([src, s.target], np.int64)
        self.frag[both] = node_fragmentation(state, self.workload, both)
        self.may_receive[src] = False
        self.may_give[s.target] = False
        pdbs = self.pdbs(c)
        self.budget.take(state.names[src], c.info.namespace, pdbs)
        self.unblocked.update(s.unblocks)
        self.applied.append((key, old, new))
        self.epoch += 1
        return Move(
            pod=key, uid=c.info.uid, owner_kind=c.info.owner_kind, owner_uid=c.info.owner_uid,
            owner_name=c.info.owner_name, num_gpu=old.pod.num_gpu, gpu_milli=old.pod.gpu_milli,
            source=state.names[src], source_gpus=old.gpus, target=state.names[s.target],
            target_gpus=s.target_gpus, frag_delta_milli=s.frag_delta, idle_delta_mib=s.idle_delta,
            freed_gpus=s.freed, unblocks=s.unblocks, gain=s.gain,
            reason=self.triggers.reason(src, self.measurement),
            pdb=pdbs[0].key if pdbs else "",
            new_milli=new_pod.gpu_milli if new_pod.gpu_milli != old.pod.gpu_milli else 0,
        )

    def revert(self) -> None:
        """Undo every applied move, newest first: the snapshot is as it was given."""
        state = self.state
        for key, old, new in reversed(self.applied):
            self.usage.move(new, state.index[new.node], state.index[old.node], old.gpus)
            state.remove_pod(key)
            state.place(old.pod, old.node, old.gpus, check=False)
        self.applied.clear()


def apply_moves(snapshot: Snapshot, moves: list[Move] | tuple[Move, ...]) -> None:
    """Move pods in ``snapshot`` as planned (the what-if's and the dry run's "it landed")."""
    state = snapshot.state
    for move in moves:
        old = state.pods[move.pod]
        snapshot.usage.move(old, state.index[old.node], state.index[move.target],
                            move.target_gpus)
        state.remove_pod(move.pod)
        state.place(move.replacement(old.pod), move.target, move.target_gpus, check=False)
