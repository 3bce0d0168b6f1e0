"""The extender's three verbs on core types: filter, prioritize, bind (no HTTP here).

``Extender`` ties the cluster cache (kept current by the watch or loaded from a snapshot), the
scorer (policy + affinity + score cache) and the binder (the one writer) together, and keeps
FGD's target workload current: fixed specs from the configuration, or derived from the pods seen,
recomputed every ``workload.refresh_s`` by :meth:`maintain` — never on the request path.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from gpufrag.errors import BadInput
from scheduler.core.feasibility import explain
from scheduler.core.fragmentation import SpecKey, TargetWorkload, fragmentation_ratio
from scheduler.core.preemption import fewest_victims
from scheduler.core.state import IntArray
from scheduler.core.types import MILLI_PER_GPU, PodRequest
from scheduler.extender.config import ExtenderConfig
from scheduler.extender.scoring import UNKNOWN, FilterVerdicts, Priorities, Scorer
from scheduler.extender.wire import NodeJson, NodeVictims, encode_reason
from scheduler.kube.binder import Binder, BindError
from scheduler.kube.cache import ClusterCache
from scheduler.kube.convert import (
    UnsupportedRequest,
    device_plugin_annotations,
    owner_uid,
    pod_from_k8s,
)
from scheduler.policies import make_policy

Obj = Mapping[str, Any]
Clock = Callable[[], float]

# FGD needs a target workload before any pod has been seen: a spread of the common shapes
# (GPU shares of a quarter and a half, 1, 2, 4 and 8 whole GPUs), equally popular.
FALLBACK_SPECS: tuple[tuple[SpecKey, float], ...] = tuple(
    ((0, gpus, milli, frozenset()), 1.0)
    for gpus, milli in ((1, 250), (1, 500), (1, MILLI_PER_GPU), (2, MILLI_PER_GPU),
                        (4, MILLI_PER_GPU), (8, MILLI_PER_GPU)))

log = structlog.get_logger("gpufrag.extender")
# The scheduler the API server names in a pod created without spec.schedulerName.
API_DEFAULT_SCHEDULER = "default-scheduler"


class BindRefused(Exception):
    """The bind cannot be done; the message says why (it goes back in ``Error``)."""


@dataclass(frozen=True, slots=True)
class BindOutcome:
    node: str
    gpus: tuple[int, ...]


def _configured_workload(config: ExtenderConfig) -> TargetWorkload | None:
    specs = config.workload.specs
    if not specs:
        return None
    return TargetWorkload.from_specs(
        ((s.cpu_milli, s.num_gpu, s.gpu_milli, frozenset(s.gpu_spec)), s.popularity)
        for s in specs)


class Extender:
    def __init__(self, cache: ClusterCache, config: ExtenderConfig, *,
                 binder: Binder | None = None, clock: Clock = time.time) -> None:
        self.cache = cache
        self.config = config
        self.binder = binder
        self.clock = clock
        self._fixed_workload = _configured_workload(config)
        self.workload: TargetWorkload = self._fixed_workload or TargetWorkload.from_specs(
            FALLBACK_SPECS)
        self._workload_at = -float("inf")
        self._workload_changes = -1
        self._workload_after_sync = False
        self.node_json = NodeJson()
        self.scorer = self._make_scorer(self.workload)
        self.refresh_workload(force=True)
        self._workload_after_sync = cache.synced  # built from a full state already

    # ------------------------------------------------------------------ workload
    def _make_scorer(self, workload: TargetWorkload) -> Scorer:
        policy = make_policy(self.config.policy, workload=workload, seed=self.config.seed)
        return Scorer(policy, policy_weight=self.config.weights.policy,
                      affinity_weight=self.config.weights.affinity,
                      affinity=self.config.affinity, render=encode_reason)

    def refresh_workload(self, *, force: bool = False) -> bool:
        """Recompute the target workload from the pods seen and swap in a scorer for it, when
        ``workload.refresh_s`` has passed and pods changed, or sooner when the pods changed by
        ``workload.change_fraction`` of their number (a burst of new shapes should not be
        placed against a stale workload); returns whether it did."""
        now = self.clock()
        if self._fixed_workload is not None and not force:
            return False
        changes = self.cache.pod_changes
        changed = changes - self._workload_changes
        due = now - self._workload_at >= self.config.workload.refresh_s and changed > 0
        fraction = self.config.workload.change_fraction
        burst = fraction > 0 and changed >= max(1.0, fraction * len(self.cache.pods))
        if not (force or due or burst):
            return False
        workload = self._fixed_workload
        if workload is None:
            pods = self.cache.workload_pods()
            try:
                workload = TargetWorkload.from_pods(pods, self.config.workload.coverage)
            except ValueError:  # no pods, or none with a node-independent spec
                workload = TargetWorkload.from_specs(FALLBACK_SPECS)
        scorer = self._make_scorer(workload)
        with self.cache.lock:
            self.workload, self.scorer = workload, scorer
        self._workload_at, self._workload_changes = now, changes
        log.info("target workload set", specs=len(workload.gpu_spec),
                 source="config" if self._fixed_workload is not None else "pods seen")
        return True

    def maintain(self) -> None:
        """Periodic upkeep (the runtime's maintenance thread): expire assumptions, refresh the
        target workload (at once after the first sync, then every ``workload.refresh_s``)."""
        self.cache.expire(self.clock())
        if self.cache.synced and not self._workload_after_sync:
            self.refresh_workload(force=True)
            self._workload_after_sync = True
        else:
            self.refresh_workload()

    @property
    def ready(self) -> bool:
        """The state has synced and the target workload reflects it."""
        return self._workload_after_sync

    # ------------------------------------------------------------------ helpers
    def _pod(self, obj: Obj) -> PodRequest:
        if not isinstance(obj, Mapping):
            raise BadInput("Pod must be an object", field="Pod")
        return pod_from_k8s(obj, self.config.names)

    def _rows(self, names: Sequence[str]) -> IntArray:
        """State rows of ``names`` (``UNKNOWN`` where the state has no such node). The common
        case — every name known — is one C-level lookup; names are checked only otherwise."""
        index = self.cache.state.index
        if not names:
            return np.zeros(0, np.int64)
        try:
            found = operator.itemgetter(*names)(index)
            return np.array(found if len(names) > 1 else (found,), np.int64)
        except (KeyError, TypeError):
            pass
        for i, name in enumerate(names):
            if not isinstance(name, str) or not name:
                raise BadInput(f"node names must be non-empty strings, got {name!r}",
                               field=f"NodeNames[{i}]")
        return np.array([index.get(n, UNKNOWN) for n in names], np.int64)

    def fragmentation_ratio(self) -> float:
        with self.cache.lock:
            return fragmentation_ratio(self.cache.state, self.workload)

    # ------------------------------------------------------------------ verbs
    def filter(self, pod_obj: Obj, names: Sequence[str]) -> FilterVerdicts:
        try:
            pod = self._pod(pod_obj)
        except UnsupportedRequest as e:  # fits no node, ever: say why on each
            return self._unplaceable(str(e), names)
        with self.cache.lock:
            rows = self._rows(names)
            self.node_json.sync(self.cache.state.names)
            if not pod.wants_gpu:  # not ours to judge: every node passes
                return FilterVerdicts(rows, np.ones(len(names), np.bool_),
                                      np.zeros(0, np.int64), [], np.zeros(0, np.bool_), [])
            return self.scorer.filter(self.cache.state, pod, rows)

    def _unplaceable(self, reason: str, names: Sequence[str]) -> FilterVerdicts:
        """Every node fails, unresolvable, with ``reason`` (a request the extender cannot
        place anywhere, such as a MIG device)."""
        with self.cache.lock:
            rows = self._rows(names)
            self.node_json.sync(self.cache.state.names)
        n = len(names)
        return FilterVerdicts(rows, np.zeros(n, np.bool_), np.arange(n, dtype=np.int64),
                              [reason] * n, np.ones(n, np.bool_), [encode_reason(reason)] * n)

    def prioritize(self, pod_obj: Obj, names: Sequence[str]) -> tuple[Priorities, str]:
        """Scores in request order and the top node's name ('' when none / a CPU-only pod)."""
        try:
            pod = self._pod(pod_obj)
        except UnsupportedRequest:  # filtered out everywhere; neutral here
            with self.cache.lock:
                rows = self._rows(names)
            return Priorities(rows, np.zeros(len(names), np.int64), -1), ""
        now = self.clock()
        owner = owner_uid(pod_obj)
        with self.cache.lock:
            rows = self._rows(names)
            self.node_json.sync(self.cache.state.names)
            if not pod.wants_gpu:  # neutral: every node the same
                return Priorities(rows, np.zeros(len(names), np.int64), -1), ""
            hinted = self.cache.hints.nodes_for(owner, now)
            result = self.scorer.prioritize(self.cache.state, pod, rows, now, hinted)
            best = self.cache.state.names[result.best] if result.best >= 0 else ""
        return result, best

    def preempt(self, pod_obj: Obj,
                victims: Mapping[str, NodeVictims]) -> dict[str, tuple[list[str], int]]:
        """Per node, the UIDs of the fewest candidate victims whose eviction lets the pod fit
        a GPU there (ties: least fragmentation after), with kube-scheduler's PDB violation
        count capped at the set's size (it counted the candidates; without the PDBs the
        extender cannot recount a subset). Nodes where no subset helps are left out. A pod
        without a GPU request gets kube-scheduler's candidates back unchanged; a candidate
        the extender's state does not hold is kept (its eviction may be what kube-scheduler
        needs for a resource the extender does not track)."""
        try:
            pod = self._pod(pod_obj)
        except UnsupportedRequest:
            return {}
        if not pod.wants_gpu:
            return {n: (list(v.uids), v.num_pdb_violations) for n, v in victims.items()}
        chosen: dict[str, tuple[list[str], int]] = {}
        with self.cache.lock:
            state = self.cache.state
            for node, candidates in victims.items():
                row = state.index.get(node)
                if row is None:
                    continue
                by_uid = {self.cache.pods[k].uid: k for k in state.pods_on_node[row]
                          if k in self.cache.pods}
                keys: list[str] = []
                uid_of: dict[str, str] = {}
                unknown: list[str] = []  # UIDs of candidates the state does not hold
                for key, uid in zip(candidates.keys, candidates.uids, strict=True):
                    key = key or by_uid.get(uid, "")
                    if key in state.pods:
                        keys.append(key)
                        uid_of[key] = uid
                    else:
                        unknown.append(uid)
                subset = fewest_victims(state, self.workload, pod, row, keys)
                if subset is None:
                    continue
                if not subset:
                    # The pod fits the GPUs already: kube-scheduler wants these victims for
                    # something the extender does not count (pod count, host ports, ...).
                    # An empty list would make it refuse the whole preemption ("expected at
                    # least one victim pod on node"), so its own candidates go back as sent.
                    chosen[node] = (list(candidates.uids), candidates.num_pdb_violations)
                    continue
                uids = [uid_of[k] for k in subset] + unknown
                chosen[node] = (uids, min(candidates.num_pdb_violations, len(uids)))
        return chosen

    def _check_scheduler(self, key: str, obj: Obj) -> None:
        """Refuse a pod that is not ours to schedule.

        ``/bind`` creates Bindings with the extender's service account, which may bind any pod
        in the cluster; checking that the pod asked for this scheduler keeps a caller that can
        reach the port (or a misconfigured second scheduler) from placing other schedulers'
        pods. An empty schedulerName is what the API server defaults to
        ``default-scheduler``."""
        spec = obj.get("spec")
        actual = spec.get("schedulerName") if isinstance(spec, Mapping) else None
        if actual is None or actual == "":
            actual = API_DEFAULT_SCHEDULER
        expected = self.config.names.scheduler_name
        if actual != expected:
            raise BindRefused(f"pod {key} has spec.schedulerName {actual!r}, not {expected!r} "
                              "(names.scheduler_name): the gpufrag extender binds only the pods "
                              "of its own scheduler")

    def _device_plugin_annotations(self, request: PodRequest, gpus: tuple[int, ...],
                                   node: str, row: int, obj: Mapping[str, Any]
                                   ) -> dict[str, str]:
        """What ``names.device_plugin``'s device plugin reads, besides the GPU indices."""
        names = self.config.names
        if names.device_plugin == "gpufrag" or not request.wants_gpu:
            return {}
        assert self.binder is not None
        node_obj = self.binder.read_node(node) if names.device_plugin == "hami" else None
        with self.cache.lock:
            gpu_memory_mib = int(self.cache.state.gpu_memory_mib[row])
        return device_plugin_annotations(names, request, gpus, node=node,
                                         gpu_memory_mib=gpu_memory_mib, node_obj=node_obj,
                                         now_ns=int(self.clock() * 1e9), pod_obj=obj)

    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindOutcome:
        """Choose the GPUs on ``node``, count the placement at once, bind (with the GPUs).

        Refused (:class:`BindRefused`, nothing written) when the pod is bound already, gone,
        unreadable, not of this scheduler (``names.scheduler_name``), or does not fit."""
        if self.binder is None:
            raise BindRefused("binding is disabled in this extender (bind.enabled: false)")
        key = f"{namespace}/{name}"
        with self.cache.lock:
            known = self.cache.pods.get(key)
        if known is not None and known.node:
            raise BindRefused(f"pod {key} is already bound to {known.node}")
        # Always the pod as the API server has it now, not the cache's copy: the cache may be
        # behind (not seen yet, re-created), and it does not keep spec.schedulerName, which
        # decides whether this extender may bind the pod at all.
        try:
            obj = self.binder.read_pod(namespace, name)
        except BindError as e:
            raise BindRefused(str(e)) from None
        if obj is None:
            raise BindRefused(f"pod {key} not found")
        self._check_scheduler(key, obj)
        try:
            request = pod_from_k8s(obj, self.config.names)
        except BadInput as e:
            raise BindRefused(f"pod {key} cannot be read: {e}") from None
        with self.cache.lock:
            state = self.cache.state
            row = state.index.get(node)
            if row is None or not state.active[row]:
                raise BindRefused(f"node {node} is not known to the gpufrag extender")
            current = state.pods.get(key)
            if current is not None and key in self.cache.assumed and current.node == node:
                gpus = current.gpus  # kube-scheduler retrying the same bind: same answer
            elif current is not None:
                raise BindRefused(f"pod {key} is already placed on {current.node}")
            else:
                decision = self.scorer.place_on(state, request, row)
                if decision is None:
                    reason = explain(state, request, row).reason or "does not fit"
                    raise BindRefused(f"pod {key} does not fit node {node} now: {reason}")
                gpus = decision.gpus
                self.cache.assume(request, row, gpus)
        try:
            extra = self._device_plugin_annotations(request, gpus, node, row, obj)
            self.binder.bind(namespace, name, uid, node, gpus if request.wants_gpu else None,
                             **({"extra": extra} if extra else {}))
        except (BindError, UnsupportedRequest) as e:
            self.cache.forget(key)
            raise BindRefused(str(e)) from None
        except BaseException:
            self.cache.forget(key)  # whatever went wrong, the pod is not bound by us
            raise
        return BindOutcome(node, gpus)


__all__ = ["BindOutcome", "BindRefused", "Extender"]
