"""The what-if's writer: the dry-run writer plus what a live cycle has that a dry run skips.

The controller's executor runs unchanged (:class:`defrag.controller.executor.Executor`); only
its writer is swapped, as ``--dry-run`` swaps it. This one adds:

- **Reservations before evictions** (KAI's consolidation rule), through the executor's own
  reservation protocol: the executor makes one :class:`~scheduler.kube.reservations.Reservation`
  per move (``reservation_for``) before the first eviction and commits the plan only if every
  one is made (``_reserve_all``: a refusal releases the ones made and nothing is evicted). Here
  ``reserve`` places the reservation's own placeholder (``Reservation.request()``, under its
  ``key``: the GPU share only, exactly what the extender's ``ReservationBook`` holds) on its
  node and GPUs in the ``ClusterState``, so the scheduler's ``choose`` counts it as taken for
  every other pod; it refuses (``CycleStopped``, as a failed creation) when the share no
  longer fits there. ``release`` takes it out: when its replacement binds into it, or when the
  cycle ends without carrying its move out.
- **The scheduler between an eviction and the bind**: once a pod is evicted its capacity is
  free, and the scheduler retries the pending pods before the replacement is bound — the window
  in which, without a reservation, another pod can take the spot (the eviction loop). The
  replacement then lands where it was planned if its spot is still free, else wherever the
  scheduler's policy puts it ("landed elsewhere"), or nowhere (the cycle stops, as a bind
  timeout stops a live one).

A reservation uses, as far as the idle measure is concerned, all it holds (no invented idle).
"""

from __future__ import annotations

from collections.abc import Callable

from defrag.controller.errors import CycleStopped
from defrag.controller.executor import DryRunActions, Landing, Reservation
from defrag.controller.model import PodInfo, Snapshot
from defrag.controller.planner import Move
from scheduler.core.placement import ScoreCache, choose
from scheduler.core.policy import Policy
from scheduler.core.state import PlacementError
from scheduler.core.types import PodRequest

# Retry the pending pods (the scheduler's queue), returning how many found a node.
PendingRetry = Callable[[], int]


class WhatIfActions(DryRunActions):
    """Writes nothing; holds reservations in the model and lets the scheduler run in the
    window between each eviction and its replacement's bind."""

    def __init__(self, snapshot: Snapshot, policy: Policy, cache: ScoreCache | None,
                 retry_pending: PendingRetry, *, reserving: bool = True,
                 log: object = None) -> None:
        super().__init__(log)
        self.snapshot = snapshot
        self.policy = policy
        self.cache = cache
        self.retry_pending = retry_pending
        self.reserving = reserving
        self.held: dict[str, Reservation] = {}  # name -> the reservation placed in the state
        self.reserved = 0  # reservations made this cycle
        self.placed_in_window = 0
        self.landed_elsewhere = 0

    # -- reservations (the executor's protocol) -----------------------------------------
    def reserve(self, reservation: Reservation) -> None:
        if not self.reserving:
            return
        state = self.snapshot.state
        try:
            placement = state.place(reservation.request(), reservation.node, reservation.gpus)
        except (PlacementError, KeyError) as e:
            raise CycleStopped(
                f"reserving {reservation.gpu_milli} milli on GPU(s) {list(reservation.gpus)} "
                f"of {reservation.node} for {reservation.replaces}", str(e)) from None
        # A held share uses, as far as the idle memory measure is concerned, all it holds.
        self.snapshot.usage.add(placement, state.index[reservation.node], None)
        self.held[reservation.name] = reservation
        self.reserved += 1

    def release(self, name: str) -> None:
        reservation = self.held.pop(name, None)
        if reservation is None:
            return  # never made, or released already (the live one answers 404: fine too)
        state = self.snapshot.state
        placement = state.pods[reservation.key]
        row = state.index[placement.node]
        self.snapshot.usage.move(placement, row, row, ())
        state.remove_pod(reservation.key)

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
        # The replacement binds into its reservation, if one is held for it.
        for name in [n for n, r in self.held.items() if r.replaces == move.pod]:
            self.release(name)
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
