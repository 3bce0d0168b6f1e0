"""The defrag controller's settings: one frozen dataclass, validated once at load.

Every knob is named with its unit and has the default a CronJob run uses. ``validate`` names the
exact flag that is wrong and quotes the bad value, so ``gpufrag defrag`` can exit 2 with one
line a person can act on; the planner and executor never re-check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from defrag.rightsizing.recommender import RightsizingConfig
from gpufrag.conventions import DEFAULT_NAMES, KubeNames
from gpufrag.errors import BadInput
from gpufrag.gpu_usage import STALE_AFTER_INTERVALS
from scheduler.policies import POLICY_NAMES

# Highest value a user-defined PriorityClass may take; system-critical classes sit above it
# (2,000,000,000 and up) and are therefore never moved by default.
USER_PRIORITY_MAX = 1_000_000_000
OUTPUTS = ("table", "json")
DEFAULT_HYSTERESIS = 0.10  # the trigger turns off at 15% with the default 25% (DESIGN.md)


@dataclass(frozen=True, slots=True)
class Limits:
    """Eviction budgets for one cycle (descheduler's per-node / per-namespace / total)."""

    per_node: int = 2
    per_namespace: int = 5
    total: int = 10


@dataclass(frozen=True, slots=True)
class DefragConfig:
    """What one defrag cycle may do and how it measures."""

    # Trigger: a node whose idle ratio is above this is a source of moves.
    threshold: float = 0.25
    # Hysteresis: a node triggered on idle memory stays triggered until its idle ratio falls to
    # this or below (None: threshold - DEFAULT_HYSTERESIS, at least 0).
    threshold_off: float | None = None
    # ... each for this many consecutive cycles: a node turns on after trigger_on_cycles
    # cycles above the threshold, and off after trigger_off_cycles at or below threshold_off
    # (1 and 1: the idle ratio is already a peak over the window, and the 10-point gap kept
    # every node from flapping in the what-if; docs/defrag.md).
    trigger_on_cycles: int = 1
    trigger_off_cycles: int = 1
    # Cooldown: an owner one of whose pods moved less than this long ago is not moved again.
    cooldown_s: float = 3600.0
    # Node cooldown: a node a move took a pod off less than this long ago is not a target, and
    # one a move landed a pod on is not a source (each such move undoes part of another: the
    # node flaps). A day: the idle ratio reads the peak over a window of a day or more, so a
    # landing's effect on it settles only after a day, and the GenAI series swing daily
    # (docs/defrag.md). 0: no node cooldown.
    node_cooldown_s: float = 86400.0
    limits: Limits = field(default_factory=Limits)
    # The daily budget (defrag.controller.budget): over any 24 hours, at most this share (%) of
    # the running GPU pods is evicted. None: no daily budget (the per-cycle limits only): a
    # percentage of a small or test cluster rounds to no eviction at all; a fleet sets it
    # (the waste loop's what-if and its targets use 1, issue 43's rate).
    max_evictions_per_day_pct: float | None = None
    # Pods whose priority is above this are never moved.
    max_priority: int = USER_PRIORITY_MAX
    # "Small" pods: GPU shares and pods of at most this many whole GPUs.
    max_pod_gpus: int = 1
    # The scheduler's placement policy: predicts where an evicted pod lands.
    policy: str = "fgd"
    # FGD target workload: the most popular pod specs covering this share of pods.
    coverage: float = 0.95
    # Usage older than this many publishing (or scrape) intervals is ignored and reported.
    stale_intervals: float = float(STALE_AFTER_INTERVALS)
    # Prometheus scrape interval of the DCGM exporter (staleness of --prometheus data).
    prometheus_interval_s: float = 30.0
    # The window DCGM's peak is read over (max_over_time): a day keeps the query cheap on a
    # large fleet; the agent's own window is 7 days.
    prometheus_peak_window_s: float = 86400.0
    # How long to wait for an evicted pod's replacement to be bound.
    bind_timeout_s: float = 180.0
    # Placement hints expire after this long even if nobody removes them.
    hint_ttl_s: float = 900.0
    # A GPU reservation with no pod of its owner this long after it was made holds capacity
    # for nothing; the cycle releases it (defrag.controller.ledger).
    orphan_grace_s: float = 120.0
    # How many candidate moves the planner scores with the policy, per allowed eviction.
    candidates_per_eviction: int = 8
    # A move is worth its eviction only if it gives back at least this many GPUs (the plan's
    # gain: fragmentation, whole GPUs freed, reserved-but-unused memory, pods unblocked).
    min_gain_gpus: float = 0.1
    # VPA's out-of-bounds rule: right-sizing is applied when pods restart (the webhook); a pod
    # is evicted for its right-sizing alone only when the share it holds is at least this many
    # times what its replacement would be admitted with ...
    rightsize_evict_ratio: float = 1.5
    # ... and it has not restarted for this long (its own rollouts right-size it first). Two
    # days: one day of hourly peaks makes a whole GPU's recommendation (the recommender's
    # whole_gpu_min_intervals), a second without a rollout says none is imminent.
    rightsize_min_age_s: float = 2 * 86400.0
    # Take pods from nodes whose idle memory no right-sizing reclaims (defrag.controller.
    # actionable) too: their moves then only cut fragmentation and free whole GPUs.
    move_not_actionable: bool = False
    # The MIG step (defrag.controller.migplan): at most this many drained MIG nodes get a new
    # nvidia.com/mig.config per cycle (0: the step only reports).
    max_mig_relabels: int = 1
    excluded_namespaces: frozenset[str] = frozenset({"kube-system"})
    # When not empty, only pods in these namespaces may move.
    namespaces: frozenset[str] = frozenset()
    dry_run: bool = False
    # The right-sizing recommender, run on the agent's per-pod readings every cycle.
    rightsizing: RightsizingConfig = field(default_factory=RightsizingConfig)
    # The shared names section (resource, label and annotation names; the hints ConfigMap).
    names: KubeNames = DEFAULT_NAMES

    @property
    def off_threshold(self) -> float:
        """The idle ratio at or below which a triggered node's trigger turns off."""
        if self.threshold_off is not None:
            return self.threshold_off
        return max(self.threshold - DEFAULT_HYSTERESIS, 0.0)

    def validate(self) -> DefragConfig:
        """Raise :class:`BadInput` naming the flag of the first bad value; return self."""
        if not 0.0 <= self.threshold < 1.0:
            raise BadInput(f"{self.threshold} is not a ratio in [0, 1); e.g. 0.25 for 25%",
                           field="--threshold")
        if self.threshold_off is not None and not 0.0 <= self.threshold_off <= self.threshold:
            raise BadInput(f"{self.threshold_off} is not a ratio in [0, --threshold "
                           f"{self.threshold}]; e.g. 0.2 with --threshold 0.25",
                           field="--threshold-off")
        for flag, cycles in (("--trigger-on-cycles", self.trigger_on_cycles),
                             ("--trigger-off-cycles", self.trigger_off_cycles)):
            if not 1 <= cycles <= 100:
                raise BadInput(f"{cycles} is not a number of cycles in 1..100", field=flag)
        if not self.cooldown_s >= 0:
            raise BadInput(f"{self.cooldown_s} must be >= 0 (0: no cooldown)",
                           field="--cooldown-s")
        if not 0.0 <= self.node_cooldown_s <= 7 * 86400.0:
            raise BadInput(f"{self.node_cooldown_s} is outside 0..604800 seconds (0: no node "
                           "cooldown; e.g. 86400, a day)", field="--node-cooldown-s")
        pct = self.max_evictions_per_day_pct
        if pct is not None and not 0.0 <= pct <= 100.0:
            raise BadInput(f"{pct} is outside 0..100 (% of the running GPU pods; e.g. 1)",
                           field="--max-evictions-per-day-pct")
        for flag, value in (("--max-evictions-per-node", self.limits.per_node),
                            ("--max-evictions-per-namespace", self.limits.per_namespace),
                            ("--max-evictions-total", self.limits.total)):
            if value < 0:
                raise BadInput(f"{value} is negative; use 0 to plan nothing", field=flag)
        if not 0 <= self.max_mig_relabels <= 1000:
            raise BadInput(f"{self.max_mig_relabels} is outside 0..1000 (0: report only)",
                           field="--max-mig-relabels")
        if not 1 <= self.max_pod_gpus <= 16:
            raise BadInput(f"{self.max_pod_gpus} is outside 1..16", field="--max-pod-gpus")
        if self.policy not in POLICY_NAMES:
            raise BadInput(f"unknown policy {self.policy!r}; choose from "
                           f"{', '.join(POLICY_NAMES)}", field="--policy")
        if self.policy == "random":
            raise BadInput("random cannot predict where a pod lands; use the scheduler's policy "
                           "(fgd by default)", field="--policy")
        if not 0.0 < self.coverage <= 1.0:
            raise BadInput(f"{self.coverage} is outside (0, 1]", field="--coverage")
        if self.stale_intervals <= 0:
            raise BadInput(f"{self.stale_intervals} must be > 0", field="--stale-intervals")
        if not self.prometheus_interval_s <= self.prometheus_peak_window_s <= 31 * 86400:
            raise BadInput(f"{self.prometheus_peak_window_s} must be between the scrape "
                           "interval and 31 days", field="--prometheus-peak-window-s")
        if self.prometheus_interval_s <= 0:
            raise BadInput(f"{self.prometheus_interval_s} must be > 0",
                           field="--prometheus-interval-s")
        if self.bind_timeout_s <= 0:
            raise BadInput(f"{self.bind_timeout_s} must be > 0", field="--bind-timeout-s")
        if self.hint_ttl_s < self.bind_timeout_s:
            raise BadInput(f"{self.hint_ttl_s} is shorter than --bind-timeout-s "
                           f"{self.bind_timeout_s}; a hint must outlive the wait",
                           field="--hint-ttl-s")
        if not 0.0 <= self.orphan_grace_s <= 86400.0:
            raise BadInput(f"{self.orphan_grace_s} is outside 0..86400 seconds",
                           field="--orphan-grace-s")
        if not 0.0 <= self.min_gain_gpus <= 100.0:
            raise BadInput(f"{self.min_gain_gpus} is outside 0..100 (GPUs per eviction; "
                           "e.g. 0.1)", field="--min-gain-gpus")
        if not 1.0 <= self.rightsize_evict_ratio <= 100.0:
            raise BadInput(f"{self.rightsize_evict_ratio} is outside 1..100 (held share over "
                           "the admitted one; e.g. 1.5)", field="--rightsize-evict-ratio")
        if not 0.0 <= self.rightsize_min_age_s <= 365 * 86400.0:
            raise BadInput(f"{self.rightsize_min_age_s} is outside 0..31536000 seconds",
                           field="--rightsize-min-age-s")
        if self.candidates_per_eviction < 1:
            raise BadInput(f"{self.candidates_per_eviction} must be >= 1",
                           field="--candidates-per-eviction")
        for name, problem in self.rightsizing.problems():
            raise BadInput(problem, field=f"--rightsizing-{name.replace('_', '-')}")
        return self


class AddsArguments(Protocol):
    """An argparse parser or argument group."""

    def add_argument(self, *args: Any, **kwargs: Any) -> Any: ...


def add_trigger_cycle_flags(parser: AddsArguments) -> None:
    """``--trigger-on-cycles`` and ``--trigger-off-cycles`` on an argparse parser or group:
    the one definition for ``gpufrag defrag`` and ``gpufrag whatif --defrag``."""
    d = DefragConfig()
    parser.add_argument("--trigger-on-cycles", type=int, default=d.trigger_on_cycles,
                        help="a node turns on after this many cycles in a row above "
                             f"--threshold (default: {d.trigger_on_cycles})")
    parser.add_argument("--trigger-off-cycles", type=int, default=d.trigger_off_cycles,
                        help="a triggered node turns off after this many cycles in a row at "
                             f"or below --threshold-off (default: {d.trigger_off_cycles})")
