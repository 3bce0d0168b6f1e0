"""One extender, composed: the placement every verb judges against, one plugin per verb, and
the upkeep of the target workload. It holds no logic of its own: the app
(:mod:`scheduler.extender.app`) routes each verb's request to its plugin, and the runtime's
maintenance thread calls :meth:`Extender.maintain`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from scheduler.extender.config import ExtenderConfig
from scheduler.extender.placement import Clock, Placement
from scheduler.extender.upkeep import WorkloadUpkeep, configured_workload, fallback_workload
from scheduler.extender.verbs.bind import BindVerb
from scheduler.extender.verbs.filter import FilterVerb
from scheduler.extender.verbs.preempt import PreemptVerb
from scheduler.extender.verbs.prioritize import PrioritizeVerb
from scheduler.kube.binder import Binder
from scheduler.kube.cache import ClusterCache


class Extender:
    """The parts over ``cache`` (kept current by the watch, or loaded from a snapshot):
    ``binder`` is the one writer (None: ``bind.enabled: false``); ``on_ready`` runs once, just
    before the extender turns ready."""

    def __init__(self, cache: ClusterCache, config: ExtenderConfig, *,
                 binder: Binder | None = None, clock: Clock = time.time,
                 on_ready: Callable[[], None] | None = None) -> None:
        fixed = configured_workload(config)
        self.placement = Placement(cache, config, clock, fixed or fallback_workload())
        self.filter = FilterVerb(self.placement)
        self.prioritize = PrioritizeVerb(self.placement)
        self.preempt = PreemptVerb(self.placement)
        self.bind = BindVerb(self.placement, binder)
        # Last: built from a synced state, it turns ready at once (``on_ready`` runs then).
        self.upkeep = WorkloadUpkeep(self.placement, fixed, on_ready=on_ready)

    @property
    def ready(self) -> bool:
        """The state has synced and the target workload reflects it (``/readyz``)."""
        return self.upkeep.ready

    def maintain(self) -> None:
        """Periodic upkeep: :meth:`WorkloadUpkeep.maintain`."""
        self.upkeep.maintain()


__all__ = ["Extender"]
