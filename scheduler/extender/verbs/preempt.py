"""The preempt verb: of kube-scheduler's candidate victims on each node, the fewest whose
eviction lets the pod fit a GPU there (:mod:`scheduler.core.preemption`).

The search never holds the cache's lock (it copies one node's inputs under it), so filters are
never queued behind a preempt, and it answers within :data:`PREEMPT_BUDGET_S` whatever it is
sent.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import structlog

from scheduler.core.preemption import VictimInputs, choose_victims, victim_inputs
from scheduler.core.types import PodRequest
from scheduler.extender.placement import Placement
from scheduler.extender.wire import NodeVictims
from scheduler.kube.convert import Obj, UnsupportedRequest

log = structlog.get_logger("gpufrag.extender")
# A preempt answers within this long whatever it is sent (the shipped httpTimeout is 2 s): the
# nodes it had no time to search keep kube-scheduler's own victims, what kube-scheduler does
# without the extender.
PREEMPT_BUDGET_S = 1.0


class PreemptVerb:
    def __init__(self, placement: Placement) -> None:
        self.placement = placement

    def __call__(self, pod_obj: Obj, victims: Mapping[str, NodeVictims]
                 ) -> dict[str, tuple[list[str], int]]:
        """Per node, the UIDs of the fewest candidate victims whose eviction lets the pod fit
        a GPU there (ties: least fragmentation after), with kube-scheduler's PDB violation
        count capped at the set's size (it counted the candidates; without the PDBs the
        extender cannot recount a subset). Nodes where no subset helps are left out. A pod
        without a GPU request gets kube-scheduler's candidates back unchanged; a candidate
        the extender's state does not hold is kept (its eviction may be what kube-scheduler
        needs for a resource the extender does not track)."""
        try:
            request = self.placement.pods.read(pod_obj).request
        except UnsupportedRequest:
            return {}
        if not request.wants_gpu:
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
            with self.placement.cache.lock:
                found = self._victim_inputs(request, node, candidates)
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

    def _victim_inputs(self, request: PodRequest, node: str, candidates: NodeVictims
                       ) -> tuple[VictimInputs, dict[str, str], list[str]] | None:
        """One node's search inputs, the candidates' UIDs by key and the UIDs of those the
        state does not hold (kept: their eviction may be what kube-scheduler needs for a
        resource the extender does not track); None for a node the state does not know or the
        pod can never fit. Call with the cache's lock held."""
        cache = self.placement.cache
        state = cache.state
        row = state.index.get(node)
        if row is None:
            return None
        by_uid = {cache.pods[k].uid: k for k in state.pods_on_node[row] if k in cache.pods}
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
        inputs = victim_inputs(state, self.placement.workload, request, row, keys)
        return None if inputs is None else (inputs, uid_of, unknown)


__all__ = ["PREEMPT_BUDGET_S", "PreemptVerb"]
