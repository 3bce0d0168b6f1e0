"""Keeping FGD's target workload current, and turning ready — never on the request path.

The target workload is the fixed specs of the configuration, or derived from the pods seen and
recomputed every ``workload.refresh_s`` (sooner after a burst of changes) by
:meth:`WorkloadUpkeep.maintain`, which the runtime's maintenance thread calls. MIG pods' target
workload (never configured) always follows the pods seen. A new workload means new scorers,
swapped into the :class:`~scheduler.extender.placement.Placement` under the cache's lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from scheduler.core.fragmentation import SpecKey, TargetWorkload, warm_up
from scheduler.core.gpus import DRA_DEVICE_MODE
from scheduler.core.types import MILLI_PER_GPU
from scheduler.extender.config import ExtenderConfig
from scheduler.extender.migscoring import MigScorer, mig_workload
from scheduler.extender.placement import Placement
from scheduler.extender.scoring import Scorer
from scheduler.extender.wire import encode_reason

# FGD needs a target workload before any pod has been seen: a spread of the common shapes
# (GPU shares of a quarter and a half, 1, 2, 4 and 8 whole GPUs), equally popular.
FALLBACK_SPECS: tuple[tuple[SpecKey, float], ...] = tuple(
    ((0, gpus, milli, frozenset()), 1.0)
    for gpus, milli in ((1, 250), (1, 500), (1, MILLI_PER_GPU), (2, MILLI_PER_GPU),
                        (4, MILLI_PER_GPU), (8, MILLI_PER_GPU)))

log = structlog.get_logger("gpufrag.extender")


def configured_workload(config: ExtenderConfig) -> TargetWorkload | None:
    """The configuration's fixed target workload (``workload.specs``), or None."""
    specs = config.workload.specs
    if not specs:
        return None
    return TargetWorkload.from_specs(
        ((s.cpu_milli, s.num_gpu, s.gpu_milli, frozenset(s.gpu_spec)), s.popularity)
        for s in specs)


def fallback_workload() -> TargetWorkload:
    return TargetWorkload.from_specs(FALLBACK_SPECS)


class WorkloadUpkeep:
    """Sets ``placement``'s target workloads at once (``fixed``: the configured one, else
    from the pods seen) and keeps them current; turns ready once the state has synced and the
    workload reflects it, after ``on_ready`` (the server's last step before it takes
    requests)."""

    def __init__(self, placement: Placement, fixed: TargetWorkload | None, *,
                 on_ready: Callable[[], None] | None = None) -> None:
        self.placement = placement
        self.on_ready = on_ready
        self._fixed = fixed
        self._at = -float("inf")
        self._changes = -1
        self._after_sync = False
        self.refresh_workload(force=True)
        if placement.cache.synced:  # built from a full state already
            self._settle()

    @property
    def ready(self) -> bool:
        """The state has synced and the target workload reflects it."""
        return self._after_sync

    def maintain(self) -> None:
        """Periodic upkeep (the runtime's maintenance thread): expire assumptions, refresh the
        target workload (at once after the first sync, then every ``workload.refresh_s``)."""
        cache = self.placement.cache
        cache.expire(self.placement.clock())
        if cache.synced and not self._after_sync:
            self.refresh_workload(force=True)
            self._settle()
        else:
            self.refresh_workload()

    def refresh_workload(self, *, force: bool = False) -> bool:
        """Recompute the target workload from the pods seen and swap in a scorer for it, when
        ``workload.refresh_s`` has passed and pods changed, or sooner when the pods changed by
        ``workload.change_fraction`` of their number (a burst of new shapes should not be
        placed against a stale workload); returns whether it did."""
        placement, cache = self.placement, self.placement.cache
        settings = placement.config.workload
        now = placement.clock()
        changes = cache.pod_changes
        changed = changes - self._changes
        due = now - self._at >= settings.refresh_s and changed > 0
        fraction = settings.change_fraction
        burst = fraction > 0 and changed >= max(1.0, fraction * len(cache.pods))
        if not (force or due or burst):
            return False
        if self._fixed is not None and not force:
            # A configured workload stays; the MIG one (never configured) follows the pods.
            with cache.lock:
                self._set_mig_workload(placement.scorer)
            self._at, self._changes = now, changes
            log.info("MIG target workload set", mig_profiles=self._mig_profiles())
            return False
        workload = self._fixed
        if workload is None:
            pods = cache.workload_pods()
            try:
                workload = TargetWorkload.from_pods(pods, settings.coverage)
            except ValueError:  # no pods, or none with a node-independent spec
                workload = fallback_workload()
        scorer = placement.scorer_for(workload)
        dra_scorer = (placement.scorer_for(workload, DRA_DEVICE_MODE)
                      if placement.dra_scorer is not None else None)
        with cache.lock:
            placement.set_workload(workload, scorer, dra_scorer)
            self._set_mig_workload(scorer)
        self._at, self._changes = now, changes
        log.info("target workload set", specs=len(workload.gpu_spec),
                 source="config" if self._fixed is not None else "pods seen",
                 mig_profiles=self._mig_profiles())
        return True

    def _mig_profiles(self) -> dict[str, float]:
        """The MIG target workload for the log: profile -> popularity ({}: none seen yet)."""
        workload = self.placement.mig_workload
        found = workload.popularity if workload is not None else {}
        return {p: round(v, 3) for p, v in sorted(found.items())}

    def _set_mig_workload(self, scorer: Scorer) -> None:
        """The MIG target workload from the profiles the pods seen ask, and a MIG scorer for
        it (:mod:`scheduler.extender.migscoring`); the one there keeps its verdicts when the
        workload is the same (they do not depend on the scorer, whose blend settings come
        from the configuration). Call with the cache's lock held."""
        placement = self.placement
        workload = mig_workload(placement.cache.mig.profile_counts())
        if workload == placement.mig_workload:
            placement.mig_scorer.scorer = scorer
        else:
            placement.mig_scorer = MigScorer(placement.cache.mig, scorer, workload,
                                             encode_reason)
        placement.mig_workload = workload

    def _settle(self) -> None:
        """Turn ready, once the state has synced and the target workload reflects it (after
        ``on_ready``, the server's last step before it takes requests): first compile the
        fragmentation kernel (:func:`scheduler.core.fragmentation.warm_up`) for the very array
        types the verbs pass, then score the whole state once. Compiling takes 1-2 s, and done
        on the first filter instead it would run past kube-scheduler's ``httpTimeout`` for that
        pod: with ``ignorable: true`` kube-scheduler then places it without the extender. The
        MIG nodes' layouts are worked out here too, for the same reason."""
        placement, cache = self.placement, self.placement.cache
        started = time.perf_counter()
        warm_up()
        ratio = placement.fragmentation_ratio()
        with cache.lock:
            mig_nodes = cache.mig.warm(cache.state, placement.clock())
        log.info("scoring warmed up", seconds=round(time.perf_counter() - started, 3),
                 fragmentation_ratio=round(ratio, 4), mig_nodes=mig_nodes)
        if self.on_ready is not None:
            self.on_ready()
        self._after_sync = True


__all__ = ["FALLBACK_SPECS", "WorkloadUpkeep", "configured_workload", "fallback_workload"]
