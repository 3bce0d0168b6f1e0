"""The what-if's writer: the dry-run writer plus what a live cycle has that a dry run skips.

The controller's executor runs unchanged (:class:`defrag.controller.executor.Executor`); only
its writer is swapped, as ``--dry-run`` swaps it. This one adds:

- **Reservations before evictions** (KAI's consolidation rule): before the first eviction,
  every move's replacement capacity is held on its planned target — the pod the move's
  replacement will be (:meth:`defrag.controller.planner.Move.replacement`), on the target node
  and GPUs the planner predicted with the scheduler's policy. A held reservation is a
  placeholder in the ``ClusterState``, so the scheduler's own ``choose`` counts it as taken for
  every other pod. The plan is committed only when every reservation fits; otherwise nothing
  is evicted this cycle. A reservation is released when its replacement binds into it, or when
  the cycle ends without carrying its move out.
- **The scheduler between an eviction and the bind**: once a pod is evicted its capacity is
  free, and the scheduler retries the pending pods before the replacement is bound — the window
  in which, without a reservation, another pod can take the spot (the eviction loop). The
  replacement then lands where it was planned if its spot is still free, else wherever the
  scheduler's policy puts it ("landed elsewhere"), or nowhere (the cycle stops, as a bind
  timeout stops a live one).

A reservation uses, as far as the waste measure is concerned, all it holds (no invented waste).
"""

from __future__ import annotations

from collections.abc import Callable

from defrag.controller.executor import DryRunActions, Landing
from defrag.controller.model import PodInfo, Snapshot
from defrag.controller.planner import Move, Plan
from scheduler.core.placement import ScoreCache, choose
from scheduler.core.policy import Policy
from scheduler.core.state import PlacementError
from scheduler.core.types import Placement, PodRequest

RESERVATION_NAMESPACE = "gpufrag-reservations"
# Retry the pending pods (the scheduler's queue), returning how many found a node.
PendingRetry = Callable[[], int]


class WhatIfActions(DryRunActions):
    """Writes nothing; holds reservations in the model and lets the scheduler run in the
    window between each eviction and its replacement's bind."""

    def __init__(self, snapshot: Snapshot, policy: Policy, cache: ScoreCache | None,
                 retry_pending: PendingRetry, *, reserve: bool = True, log: object = None) -> None:
        super().__init__(log)
        self.snapshot = snapshot
        self.policy = policy
        self.cache = cache
        self.retry_pending = retry_pending
        self.reserve = reserve
        self.held: dict[str, Placement] = {}  # owner UID -> the placeholder on its target
        self.placed_in_window = 0
        self.landed_elsewhere = 0
        self.reservations_held = 0

    # -- reservations -------------------------------------------------------------------
    def hold_all(self, plan: Plan) -> bool:
        """Hold every move's reservation; all or nothing (False: none is held)."""
        if not self.reserve:
            return True
        state = self.snapshot.state
        for move in plan.moves:
            pod = state.pods[move.pod].pod
            request = move.replacement(pod)
            placeholder = PodRequest(
                f"{move.owner_uid or move.pod.replace('/', '.')}", namespace=RESERVATION_NAMESPACE,
                cpu_milli=request.cpu_milli, memory_mib=request.memory_mib,
                num_gpu=request.num_gpu, gpu_milli=request.gpu_milli,
                gpu_spec=request.gpu_spec)
            try:
                placement = state.place(placeholder, move.target, move.target_gpus)
            except PlacementError:
                self.release_all()
                return False
            self.snapshot.usage.add(placement, state.index[move.target], None)
            self.held[move.owner_uid] = placement
        self.reservations_held = len(self.held)
        return True

    def release(self, owner_uid: str) -> None:
        placement = self.held.pop(owner_uid, None)
        if placement is None:
            return
        state = self.snapshot.state
        row = state.index[placement.node]
        self.snapshot.usage.move(placement, row, row, ())
        state.remove_pod(f"{RESERVATION_NAMESPACE}/{placement.pod.name}")

    def release_all(self) -> None:
        for owner in list(self.held):
            self.release(owner)

    # -- the window between the eviction and the bind ----------------------------------
    def await_replacement(self, pod: PodInfo, move: Move, known_uids: frozenset[str],
                          timeout_s: float) -> Landing | None:
        snapshot = self.snapshot
        state = snapshot.state
        old = state.pods[move.pod]
        src = state.index[old.node]
        # The evicted pod is gone: its capacity is free for the scheduler's next pods.
        snapshot.usage.move(old, src, src, ())
        state.remove_pod(move.pod)
        self.placed_in_window += self.retry_pending()
        self.release(move.owner_uid)  # the replacement binds into its reservation, if held
        request = move.replacement(old.pod)
        landing: Landing | None
        if _fits(snapshot, request, state.index[move.target], move.target_gpus):
            landing = Landing(pod=move.pod, uid=pod.uid, node=move.target, gpus=move.target_gpus)
        else:
            decision = choose(state, self.policy, request, None, self.cache)
            landing = None if decision is None else Landing(
                pod=move.pod, uid=pod.uid, node=state.names[decision.row], gpus=decision.gpus)
            self.landed_elsewhere += landing is not None
        # Back in the model for the executor's own bookkeeping (it moves the pod to where
        # its replacement landed).
        again = state.place(old.pod, src, old.gpus, check=False)
        snapshot.usage.add(again, src, None)
        return landing


def _fits(snapshot: Snapshot, pod: PodRequest, row: int, gpus: tuple[int, ...]) -> bool:
    state = snapshot.state
    if state.cpu_left[row] < pod.cpu_milli or state.mem_left[row] < pod.memory_mib:
        return False
    return all(int(state.gpu_free[row, g]) >= pod.gpu_milli for g in gpus)
