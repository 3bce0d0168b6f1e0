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
from gpufrag.records import RecordSigner, gpu_indices_text
from scheduler.core.feasibility import explain
from scheduler.core.fragmentation import SpecKey, TargetWorkload, fragmentation_ratio, warm_up
from scheduler.core.mig import MigWorkload
from scheduler.core.placement import Decision
from scheduler.core.preemption import VictimInputs, choose_victims, victim_inputs
from scheduler.core.state import IntArray, pod_key
from scheduler.core.types import MILLI_PER_GPU, PodRequest
from scheduler.extender.config import ExtenderConfig
from scheduler.extender.migscoring import NOT_MIG_NODE, MigScorer, mig_workload, shortfall
from scheduler.extender.scoring import UNKNOWN, FilterVerdicts, Priorities, Scorer
from scheduler.extender.wire import (
    MAX_NAME_LISTS,
    NameChunks,
    NameSet,
    NodeJson,
    NodeVictims,
    encode_reason,
)
from scheduler.kube.binder import Binder, BindError
from scheduler.kube.cache import ClusterCache
from scheduler.kube.convert import (
    UnsupportedRequest,
    device_gap,
    device_plugin_annotations,
    key_of,
    mig_request,
    owner_uid,
    pod_from_k8s,
    uid_of,
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
# A preempt answers within this long whatever it is sent (the shipped httpTimeout is 2 s): the
# nodes it had no time to search keep kube-scheduler's own victims, what kube-scheduler does
# without the extender.
PREEMPT_BUDGET_S = 1.0
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
                 binder: Binder | None = None, clock: Clock = time.time,
                 on_ready: Callable[[], None] | None = None) -> None:
        self.cache = cache
        # Signs the GPU record of each bind, for gpufrag's device plugin (gpufrag.records);
        # None: no record is signed (a snapshot, another device plugin, or the key is not had
        # yet: scheduler.kube.recordkeys.SignerBootstrap sets it).
        self.signer: RecordSigner | None = None
        # Whether a GPU bind needs a signed record (a cluster runtime with gpufrag's device
        # plugin): then, until the key is had, a GPU pod's bind is refused with the reason (it
        # stays pending and kube-scheduler retries) instead of binding a record the device
        # plugin will refuse, which fails the pod at the node and loops its controller.
        self.signing_required = False
        self.on_ready = on_ready
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
        # Deciding filters answered for pods the watch has not seen (nothing assumed for them).
        self.unassumed_decisions = 0
        self.watch_waits_timed_out = 0  # filters whose pod the watch had not shown in time
        self._cached_requests = cache.names == config.names
        # NodeNames set (the wire's key) -> (its rows, all of them known, state.index size).
        self._rows_by_list: dict[NameSet, tuple[IntArray, bool, int]] = {}
        self.scorer = self._make_scorer(self.workload)
        # MIG pods' target workload: the profiles the pods seen ask (None: none yet).
        self.mig_workload: MigWorkload | None = None
        self.mig_scorer = MigScorer(cache.mig, self.scorer, None, encode_reason)
        self.refresh_workload(force=True)
        self._workload_after_sync = False
        if cache.synced:  # built from a full state already
            self._settle()

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
        changes = self.cache.pod_changes
        changed = changes - self._workload_changes
        due = now - self._workload_at >= self.config.workload.refresh_s and changed > 0
        fraction = self.config.workload.change_fraction
        burst = fraction > 0 and changed >= max(1.0, fraction * len(self.cache.pods))
        if not (force or due or burst):
            return False
        if self._fixed_workload is not None and not force:
            # A configured workload stays; the MIG one (never configured) follows the pods.
            with self.cache.lock:
                self._set_mig_workload(self.scorer)
            self._workload_at, self._workload_changes = now, changes
            log.info("MIG target workload set", mig_profiles=self._mig_profiles())
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
            self._set_mig_workload(scorer)
        self._workload_at, self._workload_changes = now, changes
        log.info("target workload set", specs=len(workload.gpu_spec),
                 source="config" if self._fixed_workload is not None else "pods seen",
                 mig_profiles=self._mig_profiles())
        return True

    def _mig_profiles(self) -> dict[str, float]:
        """The MIG target workload for the log: profile -> popularity ({}: none seen yet)."""
        found = self.mig_workload.popularity if self.mig_workload is not None else {}
        return {p: round(v, 3) for p, v in sorted(found.items())}

    def _set_mig_workload(self, scorer: Scorer) -> None:
        """The MIG target workload from the profiles the pods seen ask, and a MIG scorer for
        it (:mod:`scheduler.extender.migscoring`); the one there keeps its verdicts when the
        workload is the same (they do not depend on the scorer, whose blend settings come
        from the configuration). Call with the cache's lock held."""
        workload = mig_workload(self.cache.mig.profile_counts())
        if workload == self.mig_workload:
            self.mig_scorer.scorer = scorer
        else:
            self.mig_scorer = MigScorer(self.cache.mig, scorer, workload, encode_reason)
        self.mig_workload = workload

    def maintain(self) -> None:
        """Periodic upkeep (the runtime's maintenance thread): expire assumptions, refresh the
        target workload (at once after the first sync, then every ``workload.refresh_s``)."""
        self.cache.expire(self.clock())
        if self.cache.synced and not self._workload_after_sync:
            self.refresh_workload(force=True)
            self._settle()
        else:
            self.refresh_workload()

    def _settle(self) -> None:
        """Turn ready, once the state has synced and the target workload reflects it (after
        ``on_ready``, the server's last step before it takes requests): first compile the
        fragmentation kernel (:func:`scheduler.core.fragmentation.warm_up`) for the very array
        types the verbs pass, then score the whole state once. Compiling takes 1-2 s, and done
        on the first filter instead it would run past kube-scheduler's ``httpTimeout`` for that
        pod: with ``ignorable: true`` kube-scheduler then places it without the extender. The
        MIG nodes' layouts are worked out here too, for the same reason."""
        started = time.perf_counter()
        warm_up()
        ratio = self.fragmentation_ratio()
        with self.cache.lock:
            mig_nodes = self.cache.mig.warm(self.cache.state, self.clock())
        log.info("scoring warmed up", seconds=round(time.perf_counter() - started, 3),
                 fragmentation_ratio=round(ratio, 4), mig_nodes=mig_nodes)
        if self.on_ready is not None:
            self.on_ready()
        self._workload_after_sync = True

    @property
    def ready(self) -> bool:
        """The state has synced and the target workload reflects it."""
        return self._workload_after_sync

    # ------------------------------------------------------------------ helpers
    def _pod(self, obj: Obj) -> PodRequest:
        if not isinstance(obj, Mapping):
            raise BadInput("Pod must be an object", field="Pod")
        if self._cached_requests:  # the watch's conversion of this very pod, when it has one
            return self.cache.request_of(obj)
        return pod_from_k8s(obj, self.config.names)

    def _rows(self, names: Sequence[str], name_set: NameSet | None = None) -> IntArray:
        """State rows of ``names`` (``UNKNOWN`` where the state has no such node); call with
        the cache's lock held. ``name_set``: the wire's key for the list (see
        ``wire.NameLists``), under which the rows are kept — a name's row never changes once
        it has one, so they stay right until a name still unknown may have become known (a
        node was added)."""
        if name_set is not None:
            kept = self._rows_by_list.get(name_set)
            if kept is not None and (kept[1] or kept[2] == len(self.cache.state.index)):
                return kept[0]
        if isinstance(names, NameChunks):  # too long to hold whole: a chunk at a time
            return np.concatenate([np.zeros(0, np.int64), *(
                self._lookup(chunk, first) for first, chunk in names.chunks())])
        rows = self._lookup(names)
        if name_set is not None:
            if name_set not in self._rows_by_list and len(self._rows_by_list) >= MAX_NAME_LISTS:
                del self._rows_by_list[next(iter(self._rows_by_list))]
            all_known = not rows.size or bool(rows.min() != UNKNOWN)
            self._rows_by_list[name_set] = (rows, all_known, len(self.cache.state.index))
        return rows

    def _lookup(self, names: Sequence[str], first: int = 0) -> IntArray:
        """The common case — every name known — is one C-level lookup; names are checked
        only otherwise (``first``: the index of ``names[0]`` in the request's list)."""
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
                               field=f"NodeNames[{first + i}]")
        return np.array([index.get(n, UNKNOWN) for n in names], np.int64)

    def fragmentation_ratio(self) -> float:
        with self.cache.lock:
            return fragmentation_ratio(self.cache.state, self.workload)

    # ------------------------------------------------------------------ verbs
    def filter(self, pod_obj: Obj, names: Sequence[str],
               name_set: NameSet | None = None) -> FilterVerdicts:
        """The nodes among ``names`` that pass (``filter.answer``: the decision, or every node
        the pod fits) and, when the pod fits none, why each fails. ``name_set``: the wire's
        key for the list, when it has one (see :meth:`_rows`).

        The cache's :class:`~scheduler.kube.bypass.BypassWatch` hears of the request before
        anything can make it wait and of the nodes passed once they are known, so that a GPU
        pod kube-scheduler binds meanwhile, or elsewhere, is reported as placed without the
        extender."""
        try:
            key = key_of(pod_obj)
        except BadInput:
            return self._filter(pod_obj, names, name_set)
        bypass = self.cache.bypass
        bypass.asked(key)
        passed: IntArray | None = None
        try:
            verdicts = self._filter(pod_obj, names, name_set)
            passed = verdicts.rows[verdicts.passed]
            return verdicts
        finally:
            bypass.answered(key, uid_of(pod_obj), passed)

    def _filter(self, pod_obj: Obj, names: Sequence[str],
                name_set: NameSet | None) -> FilterVerdicts:
        try:
            pod = self._pod(pod_obj)
        except UnsupportedRequest as e:  # fits no node, ever: say why on each
            return self._unplaceable(str(e), names)
        if pod.gpu_memory_mib and not pod.gpu_milli:  # a memory share with no carrier?
            gap = device_gap(pod_obj, self.config.names)
            if gap is not None:
                return self._unplaceable(gap, names)
        ask = mig_request(pod_obj)
        if self.config.filter.answer == "decide" and (pod.wants_gpu or ask):
            self._await_watch(pod, pod_obj)
        with self.cache.lock, self.cache.reservations.lifted_for(pod_obj):
            rows = self._rows(names, name_set)
            self.node_json.sync(self.cache.state.names)
            if ask:  # MIG instances: judged on the nodes' instances, not their GPUs
                if self.config.filter.answer == "decide":
                    decided = self._decide(pod, pod_obj, rows, ask)
                    if decided is not None:
                        return decided
                return self.mig_scorer.filter(self.cache.state, pod, ask, rows, self.clock())
            if not pod.wants_gpu:  # not ours to judge: every node passes
                return FilterVerdicts(rows, np.ones(len(names), np.bool_),
                                      np.zeros(0, np.int64), [], np.zeros(0, np.bool_), [])
            if self.config.filter.answer == "decide":
                decided = self._decide(pod, pod_obj, rows)
                if decided is not None:
                    return decided
            return self.scorer.filter(self.cache.state, pod, rows)

    def _await_watch(self, pod: PodRequest, pod_obj: Obj) -> None:
        """In a burst kube-scheduler's informer is ahead of the watch: a decision for a pod
        the watch has not shown yet would hold nothing, and the next pod's decision could take
        the same GPU (a refused bind, a worse layout). Wait for the watch to show it, at most
        ``filter.await_watch_s`` (counted when that runs out)."""
        await_s = self.config.filter.await_watch_s
        if await_s > 0 and not self.cache.await_pod(pod_key(pod), uid_of(pod_obj), await_s):
            self.watch_waits_timed_out += 1

    def _decide(self, pod: PodRequest, pod_obj: Obj, rows: IntArray,
                ask: Mapping[str, int] | None = None) -> FilterVerdicts | None:
        """The best ``filter.nodes`` rows as the only ones passing, the best one's GPUs assumed
        at once; None when the pod fits none of them (the caller explains every failure).

        A pod filtered again (a new scheduling cycle: its bind failed, or kube-scheduler tries
        its nominated node) first loses the assumption of its previous decision, so the new one
        is made against the cluster without it. A pod asking MIG instances (``ask``) is ranked
        by the MIG scorer and assumed on the node without GPUs (its instances count as in use
        there through the MIG book). Call with the cache's lock held."""
        state = self.cache.state
        key = pod_key(pod)
        if key in self.cache.decided:
            self.cache.forget(key)
        if key in state.pods:  # bound or being bound: the bind's assumption stands
            return None
        now = self.clock()
        hinted = self.cache.hints.nodes_for(owner_uid(pod_obj), now)
        if ask:
            chosen = self.mig_scorer.decide(state, pod, ask, rows, now, hinted,
                                            self.config.filter.nodes)
        else:
            chosen = self.scorer.decide(state, pod, rows, now, hinted,
                                        self.config.filter.nodes)
        if chosen.size == 0:
            return None
        row = int(chosen[0])
        decision = (Decision(row, state.names[row], (), 0.0) if ask else
                    self.scorer.place_on(state, pod, row))
        if decision is None:  # pragma: no cover - decide ranks only rows the pod fits
            return None
        if self._known_pending(key, pod_obj):
            self.cache.assume(pod, decision.row, decision.gpus, decided=True)
        else:
            self.unassumed_decisions += 1
        passed = rows == chosen[0] if chosen.size == 1 else np.isin(rows, chosen)
        return FilterVerdicts(rows, passed, np.zeros(0, np.int64), [], np.zeros(0, np.bool_),
                              [], decided=decision.node)

    def _known_pending(self, key: str, pod_obj: Obj) -> bool:
        """The watch has seen this pod, pending, with this UID: a decision may hold GPUs for
        it. A pod the cluster does not have (made up by whoever can reach the verb port, or
        not yet seen by the watch ``filter.await_watch_s`` after the filter came) is answered
        all the same but holds nothing, so a flood of such filters cannot take every free GPU
        for the assume TTL; its bind, if it is real, assumes and re-checks the GPUs then. Call
        with the cache's lock held."""
        return self.cache.known_pending(key, uid_of(pod_obj))

    def _unplaceable(self, reason: str, names: Sequence[str]) -> FilterVerdicts:
        """Every node fails, unresolvable, with ``reason`` (a request the extender cannot
        place anywhere, such as an unmapped GPU resource)."""
        with self.cache.lock:
            rows = self._rows(names)
            self.node_json.sync(self.cache.state.names)
        n = len(names)
        return FilterVerdicts(rows, np.zeros(n, np.bool_), np.arange(n, dtype=np.int64),
                              [reason] * n, np.ones(n, np.bool_), [encode_reason(reason)] * n)

    def prioritize(self, pod_obj: Obj, names: Sequence[str],
                   name_set: NameSet | None = None) -> tuple[Priorities, str]:
        """Scores in request order and the top node's name ('' when none / a CPU-only pod)."""
        try:
            pod = self._pod(pod_obj)
        except UnsupportedRequest:  # filtered out everywhere; neutral here
            with self.cache.lock:
                rows = self._rows(names)
            return Priorities(rows, np.zeros(len(names), np.int64), -1), ""
        ask = mig_request(pod_obj)
        now = self.clock()
        owner = owner_uid(pod_obj)
        with self.cache.lock, self.cache.reservations.lifted_for(pod_obj):
            rows = self._rows(names, name_set)
            self.node_json.sync(self.cache.state.names)
            if not (pod.wants_gpu or ask):  # neutral: every node the same
                return Priorities(rows, np.zeros(len(names), np.int64), -1), ""
            # A node the filter decided (and assumed) on stays the top one: the state now
            # holds the pod there, which would otherwise count against that very node.
            decided = self.cache.assumed_node(pod_key(pod))
            hinted = (frozenset((decided,)) if decided else
                      self.cache.hints.nodes_for(owner, now))
            result = (self.mig_scorer.prioritize(self.cache.state, pod, ask, rows, now, hinted)
                      if ask else
                      self.scorer.prioritize(self.cache.state, pod, rows, now, hinted))
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
        deadline = time.monotonic() + PREEMPT_BUDGET_S
        unsearched = 0
        for node, candidates in victims.items():
            if time.monotonic() >= deadline:  # out of time: kube-scheduler's own choice
                chosen[node] = (list(candidates.uids), candidates.num_pdb_violations)
                unsearched += 1
                continue
            # The lock only while one node's inputs are copied; the search runs without it,
            # so filters are never queued behind a preempt.
            with self.cache.lock:
                found = self._victim_inputs(pod, node, candidates)
            if found is None:
                continue
            inputs, uid_of, unknown = found
            subset = choose_victims(inputs)
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
        if unsearched:
            log.warning("preempt cut short", nodes=len(victims), unsearched=unsearched,
                        budget_s=PREEMPT_BUDGET_S,
                        effect="those nodes keep kube-scheduler's own victims")
        return chosen

    def _victim_inputs(self, pod: PodRequest, node: str, candidates: NodeVictims
                       ) -> tuple[VictimInputs, dict[str, str], list[str]] | None:
        """One node's search inputs, the candidates' UIDs by key and the UIDs of those the
        state does not hold (kept: their eviction may be what kube-scheduler needs for a
        resource the extender does not track); None for a node the state does not know or the
        pod can never fit. Call with the cache's lock held."""
        state = self.cache.state
        row = state.index.get(node)
        if row is None:
            return None
        by_uid = {self.cache.pods[k].uid: k for k in state.pods_on_node[row]
                  if k in self.cache.pods}
        keys: list[str] = []
        uid_of: dict[str, str] = {}
        unknown: list[str] = []
        for key, uid in zip(candidates.keys, candidates.uids, strict=True):
            key = key or by_uid.get(uid, "")
            if key in state.pods:
                keys.append(key)
                uid_of[key] = uid
            else:
                unknown.append(uid)
        inputs = victim_inputs(state, self.workload, pod, row, keys)
        return None if inputs is None else (inputs, uid_of, unknown)

    def _check_scheduler(self, key: str, actual: str) -> None:
        """Refuse a pod that is not ours to schedule (``actual``: its spec.schedulerName).

        ``/bind`` creates Bindings with the extender's service account, which may bind any pod
        in the cluster; checking that the pod asked for this scheduler keeps a caller that can
        reach the port (or a misconfigured second scheduler) from placing other schedulers'
        pods. An empty schedulerName is what the API server defaults to
        ``default-scheduler``."""
        actual = actual or API_DEFAULT_SCHEDULER
        expected = self.config.names.scheduler_name
        if actual != expected:
            raise BindRefused(f"pod {key} has spec.schedulerName {actual!r}, not {expected!r} "
                              "(names.scheduler_name): the gpufrag extender binds only the pods "
                              "of its own scheduler")

    def _bind_subject(self, namespace: str, name: str,
                      uid: str) -> tuple[PodRequest, str, str, Mapping[str, int]]:
        """The request of the pod to bind, its controlling owner's UID, its UID (which GPU
        reservations it may use) and the MIG instances it asks, once it is known to be this
        scheduler's.

        From the cache when it holds this very pod (same UID, which kube-scheduler always
        sends): the watch keeps its spec.schedulerName and request, and a pod's spec cannot
        change those once created. From the API server otherwise (the watch has not shown the
        pod yet, it was re-created under the same name, or no UID was given)."""
        key = f"{namespace}/{name}"
        with self.cache.lock:
            known = self.cache.pods.get(key)
        if known is not None and known.node:
            raise BindRefused(f"pod {key} is already bound to {known.node}")
        if known is not None and uid and known.uid == uid:
            self._check_scheduler(key, known.scheduler_name)
            return known.request, known.owner, known.uid, self.cache.mig.asks.get(key, {})
        assert self.binder is not None
        try:
            obj = self.binder.read_pod(namespace, name)
        except BindError as e:
            raise BindRefused(str(e)) from None
        if obj is None:
            raise BindRefused(f"pod {key} not found")
        spec = obj.get("spec")
        actual = spec.get("schedulerName") if isinstance(spec, Mapping) else None
        self._check_scheduler(key, actual if isinstance(actual, str) else "")
        try:
            return (pod_from_k8s(obj, self.config.names), owner_uid(obj), uid_of(obj),
                    mig_request(obj))
        except BadInput as e:
            raise BindRefused(f"pod {key} cannot be read: {e}") from None

    def _device_plugin_annotations(self, request: PodRequest, gpus: tuple[int, ...],
                                   node: str, row: int, namespace: str, name: str, uid: str
                                   ) -> dict[str, str]:
        """What ``names.device_plugin``'s device plugin reads, besides the GPU indices: for
        gpufrag's own, the signed record of them (bound to the pod's UID and node).

        HAMi's are written per container, so that mode reads the pod (and the node, for its
        GPUs' UUIDs) from the API server; the bind is otherwise served from the cache."""
        names = self.config.names
        if not request.wants_gpu:
            return {}
        if names.device_plugin == "gpufrag":
            if self.signer is None:
                if self.signing_required:
                    raise BindRefused(
                        f"pod {namespace}/{name} is not bound yet: the extender has no GPU-record "
                        f"signing key yet (Secret {names.hints_namespace}/"
                        f"{names.record_key_secret}; see the extender's 'record key "
                        f"unavailable' log line), and gpufrag's device plugin honours only "
                        f"signed records; the pod stays pending and is retried")
                return {}
            return {names.annotation_gpu_record: self.signer.sign(
                uid=uid, node=node, gpus_text=gpu_indices_text(gpus))}
        assert self.binder is not None
        node_obj = pod_obj = None
        if names.device_plugin == "hami":
            node_obj = self.binder.read_node(node)
            pod_obj = self.binder.read_pod(namespace, name)
            if pod_obj is None:
                raise BindRefused(f"pod {namespace}/{name} not found")
        with self.cache.lock:
            gpu_memory_mib = int(self.cache.state.gpu_memory_mib[row])
        return device_plugin_annotations(names, request, gpus, node=node,
                                         gpu_memory_mib=gpu_memory_mib, node_obj=node_obj,
                                         now_ns=int(self.clock() * 1e9), pod_obj=pod_obj)

    def _check_mig_fits(self, key: str, ask: Mapping[str, int], node: str) -> None:
        """Refuse the bind of a MIG pod to a node without free instances of what it asks (the
        filter's rule; the device plugin would leave the pod without its instance). Call
        with the cache's lock held."""
        layout = self.cache.mig.layout(self.cache.state, node, self.clock(), key)
        short = (NOT_MIG_NODE, True) if layout is None else shortfall(layout, ask)
        if short is not None:
            raise BindRefused(f"pod {key} does not fit node {node} now: {short[0]}")

    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindOutcome:
        """Bind with the GPUs decided at filter (``filter.answer: decide``, the assumption made
        then) or, without one, choose the GPUs on ``node`` now and count the placement at once.

        Refused (:class:`BindRefused`, nothing written) when the pod is bound already, gone,
        unreadable, not of this scheduler (``names.scheduler_name``), or does not fit."""
        if self.binder is None:
            raise BindRefused("binding is disabled in this extender (bind.enabled: false)")
        key = f"{namespace}/{name}"
        request, owner, subject_uid, ask = self._bind_subject(namespace, name, uid)
        # The Binding carries the UID kube-scheduler decided for (a pod re-created under the
        # same name meanwhile is refused by the API server, not bound by a stale decision);
        # the pod's own UID only when kube-scheduler sent none.
        uid = uid or subject_uid
        with self.cache.lock, self.cache.reservations.lifted_for_pod(key, owner, subject_uid):
            state = self.cache.state
            row = state.index.get(node)
            if row is None or not state.active[row]:
                raise BindRefused(f"node {node} is not known to the gpufrag extender")
            current = state.pods.get(key)
            assumed = key in self.cache.assumed
            if current is not None and key in self.cache.decided and current.node != node:
                # Decided (at filter) elsewhere, bound here: the decision no longer holds.
                self.cache.forget(key)
                current = None
            if current is not None and assumed and current.node == node:
                gpus = current.gpus  # the filter's decision, or a retried bind: same answer
                self.cache.confirm(key)
            elif current is not None:
                raise BindRefused(f"pod {key} is already placed on {current.node}")
            elif ask:
                self._check_mig_fits(key, ask, node)
                self.cache.mig.set_ask(key, ask)  # held there from now (a pod not yet seen)
                gpus = ()
                self.cache.assume(request, row, gpus)
            else:
                decision = self.scorer.place_on(state, request, row)
                if decision is None:
                    reason = explain(state, request, row).reason or "does not fit"
                    raise BindRefused(f"pod {key} does not fit node {node} now: {reason}")
                gpus = decision.gpus
                self.cache.assume(request, row, gpus)
        try:
            extra = self._device_plugin_annotations(request, gpus, node, row, namespace, name,
                                                    uid)
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
