"""The event-driven replay: days of a cluster on a simulated clock, through the cluster's code.

What happens, and whose code does it:

- **Pods arrive** at their trace times and are placed by the scheduler's policy through the
  core's ``choose`` (``scheduler.core.placement``), the call the extender makes; model replicas
  get the extender's blend of that policy with model-version affinity
  (``scheduler.policies.affinity``). A placed pod **runs for its trace lifetime** (deletion -
  creation) from the moment it is placed, then leaves (``departures=False``: never).
- **Unschedulable pods wait** as kube-scheduler keeps them: in the unschedulable set until an
  event that could help them (a pod leaving a node they would now fit, a defrag move off it),
  then in the backoff queue for ``backoff_initial_s x 2^(attempts-1)`` capped at
  ``backoff_max_s`` (kube-scheduler's ``podInitialBackoffSeconds`` 1 and
  ``podMaxBackoffSeconds`` 10); pods unschedulable for ``unschedulable_flush_s`` (its
  ``podMaxInUnschedulablePodsDuration``, 5 min; checked every 30 s) are retried regardless.
- **The defrag CronJob** runs every ``defrag_interval_min``: the planner
  (``defrag.controller.planner.plan``) with the configured budgets, carried out by the
  controller's own executor with its dry-run writer, so every replacement lands where planned
  (as in ``gpufrag whatif --defrag``). This replay leaves out what the dry-run writer skips:
  the controller's reservations and the scheduler's turn between an eviction and the bind
  (:mod:`simulations.reservations`), and right-sizing (:mod:`simulations.rightsizing`); the
  defrag what-if replays those, on a static cluster.
- **Model Deployments** (:mod:`simulations.autoscale`) serve the GenAI demand curve, scaled by
  the HPA rules of ``manifests/``, optionally pre-warmed. A new replica is ready after a start
  time drawn from the GenAI trace's base-model loads: from the fast group when its model version
  is warm on the node (a replica of it runs there, or left less than ``warm_window_s`` ago),
  otherwise from the slow group (a cold start).

Every figure is integrated event by event (GPU-hours, pending pod-seconds) or sampled every
``sample_s`` (fragmentation, idle ratio, replicas). With ``departures=False``, no defrag, no serving
and the static replay's pod order, the replay makes exactly the static replay's decisions and
``as_replay_result`` gives exactly its numbers (``tests/simulations/test_events.py``).

``device_mode`` (a keyword of :class:`EventReplay`, not a sweep knob) says who picks the GPU
inside the chosen node, as in the static replay (:data:`~scheduler.core.gpus.DEVICE_MODES`):
with departures, DRA's first fit meets the holes they leave (docs/dra.md). Defrag moves still
land on the planner's GPUs.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from defrag.controller.config import DefragConfig, Limits
from defrag.controller.executor import DryRunActions, Executor
from defrag.controller.measure import UsageTable, measure
from defrag.controller.metrics import CycleMetrics
from defrag.controller.model import PodInfo, Snapshot
from defrag.controller.planner import plan
from gpufrag.errors import BadInput
from scheduler.core.feasibility import feasible_mask
from scheduler.core.fragmentation import TargetWorkload, node_fragmentation
from scheduler.core.gpus import DEVICE_MODES, gpus_for
from scheduler.core.placement import (
    Decision,
    ScoreCache,
    best_index,
    choose,
    rank_candidates,
)
from scheduler.core.policy import Policy
from scheduler.core.state import ClusterState, pod_key
from scheduler.core.types import MILLI_PER_GPU, NodeSpec, PodRequest
from scheduler.policies import ALL_POLICY_NAMES, BASELINE_NAMES, POLICY_NAMES, make_policy
from scheduler.policies.affinity import AffinityParams, blended_key
from simulations.autoscale import Hpa, HpaSpec, Load, Signals, prewarm_minimum
from simulations.defrag_whatif import SilentLog, sampler, with_gpu_memory
from simulations.genai import ServingTrace
from simulations.replay import ReplayResult, tie_order
from simulations.timed import TimedPod

FloatArray = npt.NDArray[np.float64]
FLUSH_PERIOD_S = 30.0  # kube-scheduler checks the unschedulable set this often
HPA_SYNC_S = 15.0  # kube-controller-manager's --horizontal-pod-autoscaler-sync-period
SERVING_NAMESPACE = "serving"
SERVING_MODEL = "genai"
MAX_HOURS = 24 * 366

# Event kinds, in the order events of one instant are handled: leaving first (room for what
# arrives at the same second), measuring last (what the instant ends with).
DEPART, READY, ARRIVE, RETRY, SERVING, DEFRAG, SAMPLE, FLUSH = range(8)


@dataclass(frozen=True, slots=True)
class EventConfig:
    """The knobs of one run; every field is a knob a sweep grid may name."""

    policy: str = "fgd"
    seed: int = 42
    hours: float = 24.0
    departures: bool = True
    # kube-scheduler's queue
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 10.0
    unschedulable_flush_s: float = 300.0
    # the extender's blend (scheduler/extender/config.py ScoreWeights) and the affinity rules
    policy_weight: float = 1.0
    affinity_weight: float = 0.5
    warm_window_s: float = 1800.0
    max_replicas_per_node: int = 0
    # the defrag CronJob (0 minutes: off); its planner's policy ("": the scheduler's, or fgd
    # when that is random, which cannot predict a landing)
    defrag_interval_min: float = 15.0
    threshold: float = 0.25
    max_evictions_total: int = 10
    max_evictions_per_node: int = 2
    defrag_policy: str = ""
    # model Deployments and their HPA
    serving: bool = True
    serving_models: int = 8
    serving_peak_rps: float = 4000.0
    service_ms: float = 10.0
    slo_ms: float = 200.0
    hpa_min_replicas: int = 2
    hpa_max_replicas: int = 20
    prewarm_s: float = 0.0
    replica_cpu_milli: int = 8000
    replica_memory_mib: int = 32768
    replica_gpu_milli: int = 1000
    # measuring
    sample_s: float = 300.0
    coverage: float = 0.95

    def validate(self) -> EventConfig:
        """Raise ``BadInput`` naming the first bad knob; return self."""
        def need(ok: bool, knob: str, what: str) -> None:
            if not ok:
                raise BadInput(f"{getattr(self, knob)!r}: {what}", field=knob)

        need(self.policy in ALL_POLICY_NAMES, "policy",
             f"choose from {','.join(ALL_POLICY_NAMES)}")
        need(self.defrag_policy in ("", *POLICY_NAMES) and self.defrag_policy != "random",
             "defrag_policy", f"'' or one of {','.join(p for p in POLICY_NAMES if p != 'random')}")
        need(0 <= self.seed < 2**63, "seed", "must be in 0..2^63-1")
        need(0 < self.hours <= MAX_HOURS, "hours", f"must be in (0, {MAX_HOURS}]")
        need(0 < self.backoff_initial_s <= self.backoff_max_s, "backoff_initial_s",
             "must be > 0 and <= backoff_max_s")
        need(self.backoff_max_s <= 3600, "backoff_max_s", "must be <= 3600")
        need(self.unschedulable_flush_s > 0, "unschedulable_flush_s", "must be > 0")
        for knob in ("policy_weight", "affinity_weight", "warm_window_s", "prewarm_s"):
            need(getattr(self, knob) >= 0, knob, "must be >= 0")
        need(self.policy_weight + self.affinity_weight > 0, "policy_weight",
             "policy_weight and affinity_weight cannot both be 0")
        need(self.max_replicas_per_node >= 0, "max_replicas_per_node", "must be >= 0 (0: none)")
        need(self.defrag_interval_min >= 0, "defrag_interval_min", "must be >= 0 (0: off)")
        need(1 <= self.serving_models <= 1000, "serving_models", "must be in 1..1000")
        for knob in ("serving_peak_rps", "service_ms", "slo_ms"):
            need(getattr(self, knob) > 0, knob, "must be > 0")
        need(1 <= self.hpa_min_replicas <= self.hpa_max_replicas <= 10_000, "hpa_min_replicas",
             "must be in 1..hpa_max_replicas (<= 10000)")
        need(self.replica_cpu_milli >= 0 and self.replica_memory_mib >= 0, "replica_cpu_milli",
             "replica_cpu_milli and replica_memory_mib must be >= 0")
        need(1 <= self.replica_gpu_milli <= MILLI_PER_GPU, "replica_gpu_milli",
             "must be in 1..1000 (one GPU or a share of one)")
        need(self.sample_s >= 1, "sample_s", "must be >= 1 second")
        need(0 <= self.threshold < 1, "threshold", "not a ratio in [0, 1); e.g. 0.25 for 25%")
        for knob in ("max_evictions_total", "max_evictions_per_node"):
            need(getattr(self, knob) >= 0, knob, "must be >= 0 (0: plan nothing)")
        self.defrag().validate()  # the controller's own checks, as `gpufrag defrag` runs them
        return self

    def defrag(self) -> DefragConfig:
        """The controller's settings for this run (one budget for both namespaces)."""
        total = self.max_evictions_total
        planner = self.defrag_policy or ("fgd" if self.policy in ("random", *BASELINE_NAMES)
                                         else self.policy)
        return DefragConfig(threshold=self.threshold, policy=planner, coverage=self.coverage,
                            limits=Limits(per_node=self.max_evictions_per_node,
                                          per_namespace=total, total=total), dry_run=True)

    @classmethod
    def knobs(cls) -> dict[str, type]:
        """Knob name -> its type (bool, int, float or str), for grids and flags."""
        kinds = {"bool": bool, "int": int, "float": float, "str": str}
        return {f.name: kinds[str(f.type)] for f in fields(cls)}


@dataclass
class Deployment:
    """One model version's Deployment: its replicas (oldest first), load and HPA."""

    version: str
    share: float
    load: Load
    hpa: Hpa
    replicas: list[str] = field(default_factory=list)
    ready: set[str] = field(default_factory=set)
    made: int = 0
    busy: float = 0.0


@dataclass
class Sample:
    t_s: float
    allocated_gpus: float
    used_gpus: float
    frag_ratio: float
    idle_ratio: float
    pending_pods: int
    replicas: int
    ready_replicas: int
    cold_starts: int
    evictions: int
    over_slo: float


@dataclass
class TimelineResult:
    """One run: totals, per-sample series and, when asked, the static replay's per-arrival view."""

    config: EventConfig
    workload: str
    capacity_gpus: float
    totals: dict[str, float]
    samples: list[Sample]
    seconds: float
    cpu_seconds: float
    per_arrival: tuple[FloatArray, FloatArray, FloatArray, FloatArray] | None = None
    placements: dict[str, tuple[str, tuple[int, ...]]] | None = None

    def series(self, name: str) -> FloatArray:
        return np.array([getattr(s, name) for s in self.samples], np.float64)

    def as_replay_result(self) -> ReplayResult:
        """The static replay's result for this run's arrivals (needs ``record_arrivals``)."""
        if self.per_arrival is None:
            raise ValueError("run with record_arrivals=True to compare with the static replay")
        arrived, allocated, frag, free = self.per_arrival
        capacity = round(self.capacity_gpus * MILLI_PER_GPU)
        scale = 100.0 / capacity if capacity else 0.0
        ratio = np.divide(frag, free, out=np.zeros_like(frag), where=free != 0)
        placed = int(self.totals["placed_arrivals"])
        return ReplayResult(
            policy=self.config.policy, seed=self.config.seed, capacity_milli=capacity,
            arrived_pct=arrived * scale, allocation_pct=allocated * scale,
            frag_amount_pct=frag * scale, frag_ratio_pct=ratio * 100.0,
            placed=placed, failed=int(self.totals["arrivals"]) - placed,
            failed_gpu_milli=int(self.totals["failed_gpu_milli"]))

    def as_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload, "config": {f.name: getattr(self.config, f.name)
                                                  for f in fields(self.config)},
            "capacity_gpus": self.capacity_gpus, "seconds": round(self.seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "totals": self.totals,
            "samples": {name: [round(float(getattr(s, name)), 6) for s in self.samples]
                        for name in Sample.__dataclass_fields__},
        }


@dataclass
class _Waiting:
    """A pod the scheduler has not placed: when it arrived and how often it was tried."""

    pod: PodRequest
    life_s: float | None
    arrived_s: float
    attempts: int = 0
    last_attempt_s: float = 0.0
    in_backoff: bool = False


def backoff_s(attempts: int, initial_s: float, max_s: float) -> float:
    """kube-scheduler's backoff after ``attempts`` failed attempts: doubling, capped."""
    return min(initial_s * 2.0 ** min(attempts - 1, 64), max_s)


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if len(values) else 0.0


class EventReplay:
    """One run of the event-driven replay (see the module docstring)."""

    def __init__(self, nodes: Sequence[NodeSpec], timed: Sequence[TimedPod],
                 config: EventConfig, *, serving_trace: ServingTrace | None = None,
                 memory_fractions: FloatArray | None = None, target: TargetWorkload | None = None,
                 workload: str = "trace", record_arrivals: bool = False,
                 default_gpu_gib: int = 32, device_mode: str = "policy") -> None:
        self.config = config.validate()
        if device_mode not in DEVICE_MODES:
            raise ValueError(f"unknown device mode {device_mode!r}; choose from "
                             f"{', '.join(DEVICE_MODES)}")
        self.device_choice, scored_on = DEVICE_MODES[device_mode]
        self.workload = workload
        self.timed = list(timed)
        self.state = ClusterState(with_gpu_memory(nodes, default_gpu_gib))
        state = self.state
        state.set_tie_order(tie_order(state.size, config.seed))
        requests = [t.pod for t in self.timed]
        self.target = target or TargetWorkload.from_pods(
            requests or [self._replica_request("x", "x")], coverage=config.coverage)
        self.policy: Policy = make_policy(config.policy, workload=self.target, seed=config.seed,
                                          device_choice=scored_on)
        self.cache = ScoreCache(self.policy) if self.policy.node_local else None
        self.affinity = AffinityParams(warm_window_s=config.warm_window_s,
                                       max_replicas_per_node=config.max_replicas_per_node)
        self.defrag_config = config.defrag()
        self.planner_policy: Policy = (
            self.policy if self.defrag_config.policy == config.policy
            else make_policy(self.defrag_config.policy, workload=self.target, seed=config.seed))
        self.rows = state.active_rows()
        self.capacity_milli = state.total_gpu_milli
        self.frag = node_fragmentation(state, self.target, self.rows)
        self.frag_total = float(self.frag.sum())
        self.free_total = int(state.gpu_free_total(self.rows).sum())
        self.usage = UsageTable(state)
        n = state.size
        self.usage.known[:n] = np.arange(state.gpu_width)[None, :] < state.gpu_count[:n, None]
        self.draw_memory = sampler(memory_fractions, config.seed)
        self.serving_trace = serving_trace
        rng = np.random.default_rng(config.seed + 101)
        self.rng = rng
        duty = serving_trace.duty if serving_trace is not None else np.array([0.3])
        self.duty = duty
        # the clock and the queue
        self.now = 0.0
        self.end = config.hours * 3600.0
        self.events: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.infos: dict[str, PodInfo] = {}
        self.waiting: dict[str, _Waiting] = {}
        self.unschedulable: dict[str, None] = {}  # keys, in the order they became unschedulable
        self.by_shape: dict[tuple[object, ...], dict[str, None]] = {}
        self.life: dict[str, float | None] = {}
        self.busy_of: dict[str, float] = {}
        self.placed_at: dict[str, float] = {}
        self.deployment_of: dict[str, Deployment] = {}
        self.deployments: list[Deployment] = []
        # what is measured
        self.record_arrivals = record_arrivals
        self.arrivals: list[tuple[float, float, float, float]] = []
        self.arrived_milli = 0
        self.counts: dict[str, float] = dict.fromkeys(
            ("arrivals", "placed_arrivals", "failed_gpu_milli", "departures", "attempts",
             "evictions", "defrag_cycles", "planned_moves", "cold_starts", "cold_start_s",
             "warm_starts", "warm_start_s", "requests", "over_slo", "scale_ups", "scale_downs",
             "alloc_milli_s", "busy_milli_s", "pending_pod_s"), 0.0)
        self.waits: list[float] = []
        self.samples: list[Sample] = []
        self.trace_busy_milli = 0.0
        self.serving_busy_milli = 0.0
        self.last_t = 0.0

    # ------------------------------------------------------------------ the clock
    def push(self, t: float, kind: int, payload: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, payload))

    def _advance(self, t: float) -> None:
        dt = t - self.last_t
        if dt > 0:
            c = self.counts
            c["alloc_milli_s"] += (self.capacity_milli - self.free_total) * dt
            c["busy_milli_s"] += (self.trace_busy_milli + self.serving_busy_milli) * dt
            c["pending_pod_s"] += len(self.waiting) * dt
            self.last_t = t
        self.now = t

    # ------------------------------------------------------------------ placement
    def _decide(self, pod: PodRequest) -> Decision | None:
        """The core's choice; for a model replica, the extender's blend with affinity.

        The blend is the extender's (``scheduler.policies.affinity.blended_key``), ties by the
        core's fixed order."""
        config = self.config
        if not pod.model or config.affinity_weight == 0:
            return choose(self.state, self.policy, pod, None, self.cache,  # all rows: incremental
                          self.device_choice)
        state = self.state
        candidates, scores = rank_candidates(state, self.policy, pod, self.rows, self.cache)
        if candidates.size == 0:
            return None
        key = blended_key(state, pod, candidates, scores.score, self.affinity, self.now,
                          policy_weight=config.policy_weight,
                          affinity_weight=config.affinity_weight)
        i = best_index(state, candidates, key)
        row = int(candidates[i])
        gpus = gpus_for(state, pod, row, int(scores.share_gpu[i]), self.device_choice)
        return Decision(row=row, node=state.names[row], gpus=gpus, score=float(key[i]))

    def _refrag(self, row: int) -> None:
        new = float(node_fragmentation(self.state, self.target, np.array([row]))[0])
        self.frag_total += new - self.frag[row]
        self.frag[row] = new

    def _place(self, key: str, pod: PodRequest, decision: Decision, *,
               running: bool = False) -> None:
        """Account a placement; ``running``: a replica already up when the window opens."""
        state = self.state
        row = decision.row
        deployment = self.deployment_of.get(key)
        warm = deployment is not None and self._warm(pod, row)
        placement = state.place(pod, row, decision.gpus, check=False)
        self.free_total -= pod.gpu_demand_milli
        self._refrag(row)
        used = None
        if pod.wants_gpu:
            used = float(self.draw_memory(1)[0]) * pod.gpu_milli / MILLI_PER_GPU * float(
                state.gpu_memory_mib[row])
        self.usage.add(placement, row, used)
        owner = f"owner-{key}" if deployment is None else f"deployment-{deployment.version}"
        self.infos[key] = PodInfo(key=key, request=pod, uid=key, node=placement.node,
                                  owner_kind="ReplicaSet", owner_uid=owner, owner_name=owner)
        waiting = self.waiting.pop(key)
        self.waits.append(self.now - waiting.arrived_s)
        self.placed_at[key] = self.now
        if deployment is None:
            busy = pod.gpu_demand_milli * float(self.duty[self.rng.integers(self.duty.size)])
            self.busy_of[key] = busy
            self.trace_busy_milli += busy
            life = waiting.life_s
            if life is not None and self.config.departures:
                self.push(self.now + life, DEPART, key)
        elif running:
            deployment.ready.add(key)
        else:
            self._start_replica(key, warm)

    def _remove(self, key: str) -> None:
        """Take a placed pod off its node (it left, or its Deployment scaled down)."""
        state = self.state
        placement = state.pods[key]
        row = state.index[placement.node]
        self.usage.move(placement, row, row, ())
        self.usage.forget(key)
        state.remove_pod(key, now=self.now)
        self.free_total += placement.pod.gpu_demand_milli
        self._refrag(row)
        self.infos.pop(key, None)
        self.trace_busy_milli -= self.busy_of.pop(key, 0.0)
        self._wake([row])

    # ------------------------------------------------------------------ the scheduling queue
    def _enqueue(self, key: str, pod: PodRequest, life_s: float | None) -> None:
        self.waiting[key] = _Waiting(pod, life_s, self.now)
        self._attempt(key)

    def _attempt(self, key: str) -> bool:
        waiting = self.waiting[key]
        waiting.attempts += 1
        waiting.last_attempt_s = self.now
        waiting.in_backoff = False
        self.counts["attempts"] += 1
        decision = self._decide(waiting.pod)
        if decision is not None:
            self._place(key, waiting.pod, decision)
            return True
        self.unschedulable[key] = None
        self.by_shape.setdefault(waiting.pod.shape, {})[key] = None
        return False

    def _backoff(self, key: str) -> None:
        """Move an unschedulable pod to the backoff queue: retried when its backoff ends."""
        waiting = self.waiting[key]
        del self.unschedulable[key]
        group = self.by_shape[waiting.pod.shape]
        del group[key]
        if not group:
            del self.by_shape[waiting.pod.shape]
        waiting.in_backoff = True
        c = self.config
        delay = backoff_s(waiting.attempts, c.backoff_initial_s, c.backoff_max_s)
        self.push(max(self.now, waiting.last_attempt_s + delay), RETRY, key)

    def _wake(self, rows: Sequence[int]) -> None:
        """kube-scheduler's queueing hint for freed room: unschedulable pods that would fit
        on one of ``rows`` now go to the backoff queue."""
        if not self.by_shape:
            return
        where = np.array(rows, np.int64)
        for shape in list(self.by_shape):
            group = self.by_shape[shape]
            first = self.waiting[next(iter(group))].pod
            if feasible_mask(self.state, first, where).any():
                for key in list(group):
                    self._backoff(key)

    def _flush(self) -> None:
        """Pods unschedulable longer than ``unschedulable_flush_s`` are retried regardless."""
        limit = self.now - self.config.unschedulable_flush_s
        for key in list(self.unschedulable):
            if self.waiting[key].last_attempt_s > limit:
                break
            self._backoff(key)

    # ------------------------------------------------------------------ serving
    def _replica_request(self, version: str, name: str) -> PodRequest:
        c = self.config
        return PodRequest(name=name, namespace=SERVING_NAMESPACE, cpu_milli=c.replica_cpu_milli,
                          memory_mib=c.replica_memory_mib, num_gpu=1,
                          gpu_milli=c.replica_gpu_milli, model=SERVING_MODEL,
                          model_version=version)

    def _warm(self, pod: PodRequest, row: int) -> bool:
        """The model version runs on ``row`` or left it within the warm window."""
        version = (pod.model, pod.model_version)
        running = self.state.replicas.get(version)
        if running is not None and running[row] > 0:
            return True
        left = self.state.model_last_seen.get(version, {}).get(row)
        return left is not None and self.now - left <= self.config.warm_window_s

    def _start_replica(self, key: str, warm: bool) -> None:
        trace = self.serving_trace
        assert trace is not None
        pool = trace.warm_start_s if warm else trace.cold_start_s
        start = float(pool[self.rng.integers(pool.size)])
        kind = "warm" if warm else "cold"
        self.counts[f"{kind}_starts"] += 1
        self.counts[f"{kind}_start_s"] += start
        self.push(self.now + start, READY, key)

    def _new_replica(self, deployment: Deployment, *, ready: bool = False) -> None:
        name = f"{deployment.version.lower()}-{deployment.made:05d}"
        deployment.made += 1
        pod = self._replica_request(deployment.version, name)
        key = pod_key(pod)
        deployment.replicas.append(key)
        self.deployment_of[key] = deployment
        self.waiting[key] = _Waiting(pod, None, self.now)
        if ready:  # the Deployment's replicas when the window opens: already running
            decision = self._decide(pod)
            if decision is not None:
                self._place(key, pod, decision, running=True)
                return
            self.unschedulable[key] = None
            self.by_shape.setdefault(pod.shape, {})[key] = None
            self.waiting[key].attempts = 1
            return
        self._attempt(key)

    def _drop_replica(self, deployment: Deployment) -> None:
        """ReplicaSet's choice when scaling down: unscheduled, then not ready, then newest."""
        def rank(key: str) -> tuple[int, int]:
            order = deployment.replicas.index(key)
            if key in self.waiting:
                return (0, -order)
            return (1 if key not in deployment.ready else 2, -order)

        key = min(deployment.replicas, key=rank)
        deployment.replicas.remove(key)
        deployment.ready.discard(key)
        del self.deployment_of[key]
        if key in self.waiting:
            waiting = self.waiting.pop(key)
            if key in self.unschedulable:
                del self.unschedulable[key]
                group = self.by_shape[waiting.pod.shape]
                del group[key]
                if not group:
                    del self.by_shape[waiting.pod.shape]
            self.waits.append(self.now - waiting.arrived_s)
        else:
            self._remove(key)

    def _serving_tick(self) -> None:
        trace = self.serving_trace
        assert trace is not None
        c = self.config
        scale = c.serving_peak_rps / (trace.peak_rps or 1.0)
        total_rps = trace.rps_at(self.now) * scale
        ahead_rps = trace.rps_at(self.now + c.prewarm_s) * scale if c.prewarm_s > 0 else 0.0
        busy_milli = 0.0
        for d in self.deployments:
            rps = total_rps * d.share
            ready = len(d.ready)
            signals: Signals = d.load.step(rps, ready, HPA_SYNC_S)
            self.counts["requests"] += signals.requests
            self.counts["over_slo"] += signals.over_slo
            d.busy = signals.busy
            busy_milli += ready * c.replica_gpu_milli * signals.busy
            if ready:  # pods that are not ready report no metrics
                d.hpa.observe(self.now, signals)
            floor = None
            if c.prewarm_s > 0:
                floor = prewarm_minimum(ahead_rps * d.share, c.service_ms,
                                        d.hpa.spec.utilisation_target)
            current = len(d.replicas)
            wanted = d.hpa.desired(self.now, current, ready, signals, floor)
            if wanted > current:
                self.counts["scale_ups"] += 1
                for _ in range(wanted - current):
                    self._new_replica(d)
            elif wanted < current:
                self.counts["scale_downs"] += 1
                for _ in range(current - wanted):
                    self._drop_replica(d)
        self.serving_busy_milli = busy_milli

    # ------------------------------------------------------------------ defrag
    def _defrag(self) -> None:
        pending = [PodInfo(key=k, request=w.pod, uid=k, running=False, owner_kind="ReplicaSet",
                           owner_uid=f"owner-{k}") for k, w in self.waiting.items()]
        snapshot = Snapshot(state=self.state, pods=self.infos, pending=pending, usage=self.usage)
        the_plan = plan(snapshot, self.planner_policy, self.target, self.defrag_config)
        self.counts["defrag_cycles"] += 1
        self.counts["planned_moves"] += len(the_plan.moves)
        if not the_plan.moves:
            return
        before = {m.pod: self.state.index[m.source] for m in the_plan.moves}
        report = Executor(DryRunActions(SilentLog()), self.defrag_config,
                          CycleMetrics(dry_run=True), clock=lambda: self.now,
                          log=SilentLog()).run(the_plan, snapshot, self.target)
        self.counts["evictions"] += report.evicted
        freed: list[int] = []
        for result in report.results:
            move = result.move
            placement = self.state.pods.get(move.pod)
            if placement is None:
                continue
            src, dst = before[move.pod], self.state.index[placement.node]
            self._refrag(src)
            self._refrag(dst)
            freed.append(src)
            self.infos[move.pod] = replace(self.infos[move.pod], node=placement.node)
            deployment = self.deployment_of.get(move.pod)
            if deployment is not None:  # the replacement replica starts again on dst
                deployment.ready.discard(move.pod)
                version = (SERVING_MODEL, deployment.version)
                others = self.state.replicas.get(version)
                left = self.state.model_last_seen.get(version, {})
                warm = (others is not None and others[dst] > 1) or (
                    dst in left and self.now - left[dst] <= self.config.warm_window_s)
                self._start_replica(move.pod, warm)
        if freed:
            self._wake(freed)

    # ------------------------------------------------------------------ sampling
    def _sample(self) -> None:
        summary = measure(self.state, self.usage, self.target).summary
        replicas = sum(len(d.replicas) for d in self.deployments)
        ready = sum(len(d.ready) for d in self.deployments)
        self.samples.append(Sample(
            t_s=self.now,
            allocated_gpus=(self.capacity_milli - self.free_total) / MILLI_PER_GPU,
            used_gpus=(self.trace_busy_milli + self.serving_busy_milli) / MILLI_PER_GPU,
            frag_ratio=self.frag_total / self.free_total if self.free_total else 0.0,
            idle_ratio=summary.idle_ratio, pending_pods=len(self.waiting),
            replicas=replicas, ready_replicas=ready,
            cold_starts=int(self.counts["cold_starts"]),
            evictions=int(self.counts["evictions"]), over_slo=self.counts["over_slo"]))

    # ------------------------------------------------------------------ the run
    def run(self) -> TimelineResult:
        started, cpu_started = time.perf_counter(), time.process_time()
        c = self.config
        for timed in self.timed:
            if timed.arrive_s < self.end:
                life = (None if timed.leave_s is None
                        else max(timed.leave_s - timed.arrive_s, 0.0))
                self.push(timed.arrive_s, ARRIVE, (timed.pod, life))
        if c.serving and self.serving_trace is not None:
            versions, shares = self.serving_trace.top(c.serving_models)
            spec = HpaSpec(min_replicas=c.hpa_min_replicas, max_replicas=c.hpa_max_replicas,
                           p99_target_ms=c.slo_ms)
            self.deployments = [Deployment(v, float(s), Load(c.service_ms, c.slo_ms), Hpa(spec))
                                for v, s in zip(versions, shares, strict=True)]
            self.push(0.0, SERVING)
        if c.defrag_interval_min > 0:
            self.push(c.defrag_interval_min * 60.0, DEFRAG)
        self.push(0.0, SAMPLE)
        self.push(FLUSH_PERIOD_S, FLUSH)
        serving_started = False
        while self.events:
            t, kind, _, payload = heapq.heappop(self.events)
            if t > self.end:
                break
            self._advance(t)
            if kind == ARRIVE:
                pod, life = payload
                self.counts["arrivals"] += 1
                self.arrived_milli += pod.gpu_demand_milli
                key = pod_key(pod)
                self._enqueue(key, pod, life)
                if key not in self.waiting:
                    self.counts["placed_arrivals"] += 1
                else:
                    self.counts["failed_gpu_milli"] += pod.gpu_demand_milli
                if self.record_arrivals:
                    self.arrivals.append((self.arrived_milli,
                                          self.capacity_milli - self.free_total,
                                          self.frag_total, self.free_total))
            elif kind == DEPART:
                self.counts["departures"] += 1
                self._remove(payload)
            elif kind == RETRY:
                waiting = self.waiting.get(payload)
                if waiting is not None and waiting.in_backoff:
                    self._attempt(payload)
            elif kind == READY:
                deployment = self.deployment_of.get(payload)
                if deployment is not None and payload in self.state.pods:
                    deployment.ready.add(payload)
            elif kind == SERVING:
                if not serving_started:  # the window opens on running Deployments
                    serving_started = True
                    for d in self.deployments:
                        for _ in range(c.hpa_min_replicas):
                            self._new_replica(d, ready=True)
                self._serving_tick()
                self.push(t + HPA_SYNC_S, SERVING)
            elif kind == DEFRAG:
                self._defrag()
                self.push(t + c.defrag_interval_min * 60.0, DEFRAG)
            elif kind == SAMPLE:
                self._sample()
                self.push(t + c.sample_s, SAMPLE)
            elif kind == FLUSH:
                self._flush()
                self.push(t + FLUSH_PERIOD_S, FLUSH)
        self._advance(self.end)
        if not self.samples or self.samples[-1].t_s < self.end:
            self._sample()
        return self._result(time.perf_counter() - started, time.process_time() - cpu_started)

    def _result(self, seconds: float, cpu_seconds: float) -> TimelineResult:
        c = self.counts
        waits = self.waits + [self.end - w.arrived_s for w in self.waiting.values()]
        hours = 3600.0 * MILLI_PER_GPU
        allocated = c["alloc_milli_s"] / hours
        used = c["busy_milli_s"] / hours
        samples = self.samples
        totals = {
            **{k: c[k] for k in ("arrivals", "placed_arrivals", "failed_gpu_milli", "departures",
                                 "attempts", "evictions", "defrag_cycles", "planned_moves",
                                 "scale_ups", "scale_downs")},
            "gpu_hours_allocated": allocated,
            "gpu_hours_used": used,
            "used_of_allocated": used / allocated if allocated else 0.0,
            "mean_allocation_pct": (100.0 * c["alloc_milli_s"] / (self.capacity_milli
                                                                  * self.end)
                                    if self.capacity_milli else 0.0),
            "mean_frag_ratio": float(np.mean([s.frag_ratio for s in samples])),
            "mean_idle_ratio": float(np.mean([s.idle_ratio for s in samples])),
            "pending_pod_s": c["pending_pod_s"],
            "wait_p50_s": _percentile(waits, 50),
            "wait_p99_s": _percentile(waits, 99),
            "wait_max_s": max(waits, default=0.0),
            "pods_waited": sum(1 for w in waits if w > 0),
            "pending_at_end": len(self.waiting),
            "cold_starts": c["cold_starts"], "cold_start_s": c["cold_start_s"],
            "warm_starts": c["warm_starts"], "warm_start_s": c["warm_start_s"],
            "requests": c["requests"], "requests_over_slo": c["over_slo"],
            "over_slo_pct": 100.0 * c["over_slo"] / c["requests"] if c["requests"] else 0.0,
        }
        totals = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in totals.items()}
        per_arrival = None
        if self.record_arrivals:
            a = np.array(self.arrivals, np.float64).reshape(-1, 4)
            per_arrival = (a[:, 0], a[:, 1], a[:, 2], a[:, 3])
        placements = {k: (p.node, p.gpus) for k, p in self.state.pods.items()}
        return TimelineResult(config=self.config, workload=self.workload,
                              capacity_gpus=self.capacity_milli / MILLI_PER_GPU, totals=totals,
                              samples=samples, seconds=seconds, cpu_seconds=cpu_seconds,
                              per_arrival=per_arrival,
                              placements=placements if self.record_arrivals else None)


def run_events(nodes: Sequence[NodeSpec], timed: Sequence[TimedPod], config: EventConfig,
               **kwargs: Any) -> TimelineResult:
    """One run (see :class:`EventReplay` for the keyword arguments)."""
    return EventReplay(nodes, timed, config, **kwargs).run()


def knob_value(knob: str, text: str) -> object:
    """``text`` as the value of ``knob`` (BadInput naming the knob when it is not one)."""
    kinds = EventConfig.knobs()
    if knob not in kinds:
        raise BadInput(f"unknown knob {knob!r}; knobs are {', '.join(kinds)}", field=knob)
    kind = kinds[knob]
    text = text.strip()
    try:
        if kind is bool:
            lowered = text.lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                raise ValueError(text)
            return lowered in ("true", "1", "yes", "on")
        if kind is int:
            return int(text)
        if kind is float:
            value = float(text)
            if not math.isfinite(value):
                raise ValueError(text)
            return value
    except ValueError:
        raise BadInput(f"{text!r} is not a {kind.__name__}", field=knob) from None
    return text
