"""The filter verb: which of the nodes sent a pod fits, and why each other fails.

``filter.answer: feasible`` passes every node the pod fits; ``decide`` (the default) passes
only the best ``filter.nodes`` and assumes the best one's GPUs at once, so the next pod in a
burst is judged against the cluster with this one in it. Nodes the pod cannot fit carry the
core's reason and whether any eviction could help (kube-scheduler's unresolvable).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from gpufrag.errors import BadInput
from scheduler.core.placement import Decision
from scheduler.core.state import IntArray
from scheduler.extender.placement import Placement
from scheduler.extender.scoring import FilterVerdicts
from scheduler.extender.subject import PodIdentity, PodSubject
from scheduler.extender.wire import NameSet, encode_reason
from scheduler.kube.convert import Obj, UnsupportedRequest


class FilterVerb:
    def __init__(self, placement: Placement) -> None:
        self.placement = placement
        # Deciding filters answered for pods the watch has not seen (nothing assumed for them).
        self.unassumed_decisions = 0
        self.watch_waits_timed_out = 0  # filters whose pod the watch had not shown in time

    def __call__(self, pod_obj: Obj, names: Sequence[str],
                 name_set: NameSet | None = None) -> FilterVerdicts:
        """The nodes among ``names`` that pass (``filter.answer``: the decision, or every node
        the pod fits) and, when the pod fits none, why each fails. ``name_set``: the wire's
        key for the list, when it has one (see :meth:`Placement.rows`).

        The cache's :class:`~scheduler.kube.bypass.BypassWatch` hears of the request before
        anything can make it wait and of the nodes passed once they are known, so that a GPU
        pod kube-scheduler binds meanwhile, or elsewhere, is reported as placed without the
        extender."""
        try:
            identity = self.placement.pods.identify(pod_obj)
        except BadInput:  # read it whole all the same: the request's words say what is wrong
            return self._read(pod_obj, None, names, name_set)
        bypass = self.placement.cache.bypass
        bypass.asked(identity.key)
        passed: IntArray | None = None
        try:
            verdicts = self._read(pod_obj, identity, names, name_set)
            passed = verdicts.rows[verdicts.passed]
            return verdicts
        finally:
            bypass.answered(identity.key, identity.uid, passed)

    def _read(self, pod_obj: Obj, identity: PodIdentity | None, names: Sequence[str],
              name_set: NameSet | None) -> FilterVerdicts:
        try:
            pod = self.placement.pods.read(pod_obj, identity)
        except UnsupportedRequest as e:  # fits no node, ever: say why on each
            return self._unplaceable(str(e), names)
        return self._judge(pod, names, name_set)

    def _judge(self, pod: PodSubject, names: Sequence[str],
              name_set: NameSet | None = None) -> FilterVerdicts:
        """The filter of a pod read already."""
        if pod.device_gap is not None:  # a memory share no device plugin would hand a GPU
            return self._unplaceable(pod.device_gap, names)
        placement, cache = self.placement, self.placement.cache
        deciding = placement.config.filter.answer == "decide"
        if deciding and (pod.wants_placing or pod.dra):
            self._await_watch(pod)
            if pod.claims:  # what they ask, now that the watch has shown them
                pod = replace(pod, request=cache.claims_request(pod.request, pod.claims,
                                                                 pod.mapped),
                              mig=cache.claims_mig_ask(pod.claims) or pod.mig)
        scorer = placement.scorer_of(pod)
        with cache.lock, cache.reservations.lifted_for_pod(pod.key, pod.owner, pod.uid):
            rows = placement.rows(names, name_set)
            placement.node_json.sync(cache.state.names)
            if pod.mig:  # MIG instances: judged on the nodes' instances, not their GPUs
                if deciding:
                    decided = self._decide(pod, rows)
                    if decided is not None:
                        return decided
                return placement.mig_scorer.filter(cache.state, pod.request, pod.mig, rows,
                                                   placement.clock())
            if not pod.request.wants_gpu:  # not ours to judge: every node passes
                return FilterVerdicts(rows, np.ones(len(names), np.bool_),
                                      np.zeros(0, np.int64), [], np.zeros(0, np.bool_), [])
            if deciding:
                decided = self._decide(pod, rows)
                if decided is not None:
                    return decided
            return scorer.filter(cache.state, pod.request, rows)

    def _await_watch(self, pod: PodSubject) -> None:
        """In a burst kube-scheduler's informer is ahead of the watch: a decision for a pod
        the watch has not shown yet would hold nothing, and the next pod's decision could take
        the same GPU (a refused bind, a worse layout). Wait for the watch to show it, at most
        ``filter.await_watch_s`` (counted when that runs out)."""
        await_s = self.placement.config.filter.await_watch_s
        if await_s > 0 and not self.placement.cache.await_pod(pod.key, pod.uid, await_s,
                                                                pod.claims):
            self.watch_waits_timed_out += 1

    def _decide(self, pod: PodSubject, rows: IntArray) -> FilterVerdicts | None:
        """The best ``filter.nodes`` rows as the only ones passing, the best one's GPUs assumed
        at once; None when the pod fits none of them (the caller explains every failure).

        A pod filtered again (a new scheduling cycle: its bind failed, or kube-scheduler tries
        its nominated node) first loses the assumption of its previous decision, so the new one
        is made against the cluster without it. A pod asking MIG instances is ranked by the
        MIG scorer and assumed on the node without GPUs (its instances count as in use there
        through the MIG book). Call with the cache's lock held."""
        placement, cache = self.placement, self.placement.cache
        state = cache.state
        if pod.key in cache.decided:
            cache.forget(pod.key)
        if pod.key in state.pods:  # bound or being bound: the bind's assumption stands
            return None
        now = placement.clock()
        hinted = cache.hints.nodes_for(pod.owner, now)
        count = placement.config.filter.nodes
        scorer = placement.scorer_of(pod)
        chosen = (placement.mig_scorer.decide(state, pod.request, pod.mig, rows, now, hinted,
                                              count)
                  if pod.mig else
                  scorer.decide(state, pod.request, rows, now, hinted, count))
        if chosen.size == 0:
            return None
        row = int(chosen[0])
        decision = (Decision(row, state.names[row], (), 0.0) if pod.mig else
                    scorer.place_on(state, pod.request, row))
        if decision is None:  # pragma: no cover - decide ranks only rows the pod fits
            return None
        # Only a pod the watch has seen pending with this UID holds GPUs: one the cluster does
        # not have (made up by whoever can reach the verb port, or not yet seen by the watch
        # ``filter.await_watch_s`` after the filter came) is answered all the same but holds
        # nothing, so a flood of such filters cannot take every free GPU for the assume TTL;
        # its bind, if it is real, assumes and re-checks the GPUs then.
        if cache.known_pending(pod.key, pod.uid):
            cache.assume(pod.request, decision.row, decision.gpus, decided=True)
        else:
            self.unassumed_decisions += 1
        passed = rows == chosen[0] if chosen.size == 1 else np.isin(rows, chosen)
        return FilterVerdicts(rows, passed, np.zeros(0, np.int64), [], np.zeros(0, np.bool_),
                              [], decided=decision.node)

    def _unplaceable(self, reason: str, names: Sequence[str]) -> FilterVerdicts:
        """Every node fails, unresolvable, with ``reason`` (a request the extender cannot
        place anywhere, such as an unmapped GPU resource)."""
        placement, cache = self.placement, self.placement.cache
        with cache.lock:
            rows = placement.rows(names)
            placement.node_json.sync(cache.state.names)
        n = len(names)
        return FilterVerdicts(rows, np.zeros(n, np.bool_), np.arange(n, dtype=np.int64),
                              [reason] * n, np.ones(n, np.bool_), [encode_reason(reason)] * n)


__all__ = ["FilterVerb"]
