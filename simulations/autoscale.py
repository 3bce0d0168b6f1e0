"""Model Deployments under load, and the HPA that scales them, on a simulated clock.

**Load.** Each Deployment serves one model version. Every ``step_s`` (the HPA's 15 s sync
period) it receives ``rps x step_s`` requests; each ready replica serves ``1000 / service_ms``
requests per second. Within a step the queue is fluid: what the ready replicas cannot serve
carries over as a backlog. Latency per replica is that of an M/M/1 queue at the replica's
utilisation ``rho`` (sojourn time exponential with rate ``mu - lambda``; p99 =
``ln(100) / (mu - lambda)``) plus the time to drain the backlog; a request is over the SLO when
that sum exceeds ``slo_ms``. The three signals the HPA reads are the ones the serving runtime
exports (``serving/``) and ``manifests/base/prometheus-adapter-rules.yaml`` turns into metrics:

- queue depth per pod: M/M/1's mean queue ``rho^2 / (1 - rho)`` plus the backlog per replica;
- GPU utilisation: ``rho`` averaged over 5 minutes, then its lowest value over the last
  2 minutes ("sustained", the adapter's ``min_over_time``);
- p99 latency: its lowest value over the last minute.

**HPA.** As ``manifests/base/serving-example.yaml`` configures it and kube-controller-manager
computes it: per metric ``desired = ceil(ready x value / target)`` (no change within the 10%
tolerance), the largest of the three; stabilised (the lowest recommendation of the last 60 s
when scaling up, the highest of the last 600 s when scaling down); limited per period (up: the
larger of +100% and +4 pods per 60 s; down: -10% per 120 s, rounded down as kube does); within
min and max replicas.
**Pre-warming** raises the minimum ahead of known demand: with a lead of ``prewarm_s``, the
minimum is the replicas the demand ``prewarm_s`` from now needs at the utilisation target.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

LN100 = math.log(100.0)
TOLERANCE = 0.1  # kube-controller-manager's --horizontal-pod-autoscaler-tolerance


@dataclass(frozen=True, slots=True)
class HpaSpec:
    """The HPA of ``manifests/base/serving-example.yaml``: bounds, targets, behaviour."""

    min_replicas: int = 2
    max_replicas: int = 20
    queue_target: float = 50.0
    utilisation_target: float = 0.8
    p99_target_ms: float = 200.0
    utilisation_window_s: float = 300.0
    utilisation_sustain_s: float = 120.0
    p99_sustain_s: float = 60.0
    up_window_s: float = 60.0
    down_window_s: float = 600.0
    up_percent: float = 100.0
    up_pods: int = 4
    up_period_s: float = 60.0
    down_percent: float = 10.0
    down_period_s: float = 120.0


@dataclass(frozen=True, slots=True)
class Signals:
    """One step's view of a Deployment: what its replicas see and what the HPA reads."""

    queue_per_pod: float
    utilisation: float
    p99_ms: float
    requests: float
    over_slo: float
    busy: float  # utilisation of each ready replica (0..1), for GPU-hours used


class Window:
    """``(t, value)`` readings of the last ``span_s`` seconds: their mean or minimum."""

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self.items: deque[tuple[float, float]] = deque()
        self.total = 0.0

    def add(self, t: float, value: float) -> None:
        self.items.append((t, value))
        self.total += value
        while self.items[0][0] <= t - self.span_s:
            self.total -= self.items.popleft()[1]

    def mean(self) -> float:
        return self.total / len(self.items) if self.items else 0.0

    def minimum(self) -> float:
        return min((v for _, v in self.items), default=0.0)


@dataclass
class Load:
    """The fluid queue of one Deployment."""

    service_ms: float
    slo_ms: float
    backlog: float = 0.0

    @property
    def mu(self) -> float:
        """Requests per second one replica serves."""
        return 1000.0 / self.service_ms

    def step(self, rps: float, ready: int, step_s: float) -> Signals:
        arrived = rps * step_s
        if ready <= 0:
            self.backlog += arrived
            return Signals(queue_per_pod=self.backlog, utilisation=1.0, p99_ms=math.inf,
                           requests=arrived, over_slo=arrived, busy=0.0)
        mu = self.mu
        rate = ready * mu
        before = self.backlog
        self.backlog = max(0.0, before + arrived - rate * step_s)
        wait_s = (before + self.backlog) / 2.0 / rate  # mean time to drain the backlog
        rho = min(rps / rate, 1.0)
        per_replica = (rate - rps) / ready  # mu - lambda of one replica
        if per_replica <= 0:  # overloaded: the backlog grows, every request waits for it
            p99_ms = 1000.0 * (self.backlog / rate + LN100 / mu)
            over = arrived
        else:
            p99_ms = 1000.0 * (wait_s + LN100 / per_replica)
            left = self.slo_ms / 1000.0 - wait_s
            over = arrived if left <= 0 else arrived * math.exp(-per_replica * left)
        # M/M/1's mean queue, at most a step's worth, plus the backlog per replica.
        queued = min(rho * rho / (1.0 - rho), mu * step_s) if rho < 1.0 else mu * step_s
        return Signals(queue_per_pod=queued + self.backlog / ready, utilisation=rho,
                       p99_ms=p99_ms, requests=arrived, over_slo=over, busy=rho)


@dataclass
class Hpa:
    """kube-controller-manager's HPA loop for one Deployment (see the module docstring)."""

    spec: HpaSpec
    readings: Window = field(init=False)  # utilisation, kept for the 5-minute average
    averages: Window = field(init=False)  # 5-minute averages, kept for the 2-minute minimum
    p99: Window = field(init=False)
    recommendations: deque[tuple[float, int]] = field(init=False)
    scale_events: deque[tuple[float, int]] = field(init=False)  # (t, replicas added (+/-))

    def __post_init__(self) -> None:
        self.readings = Window(self.spec.utilisation_window_s)
        self.averages = Window(self.spec.utilisation_sustain_s)
        self.p99 = Window(self.spec.p99_sustain_s)
        self.recommendations = deque()
        self.scale_events = deque()

    def observe(self, t: float, signals: Signals) -> None:
        self.readings.add(t, signals.utilisation)
        self.averages.add(t, self.readings.mean())
        self.p99.add(t, signals.p99_ms)

    def _raw(self, t: float, current: int, ready: int, signals: Signals) -> int:
        if ready == 0:
            return current  # no pod reports a metric: kube leaves the scale as it is
        spec = self.spec
        sustained_util = self.averages.minimum()
        sustained_p99 = self.p99.minimum()
        desired = 0
        for value, target in ((signals.queue_per_pod, spec.queue_target),
                              (sustained_util, spec.utilisation_target),
                              (sustained_p99, spec.p99_target_ms)):
            ratio = value / target
            if abs(ratio - 1.0) <= TOLERANCE:
                desired = max(desired, current)
            else:
                desired = max(desired, math.ceil(min(ready * ratio, 1e9)))
        return desired

    def _period_start(self, current: int, period_s: float, t: float) -> int:
        """Replicas at the start of the policy period: current, less what was added in it,
        plus what was removed (kube's periodStartReplicas)."""
        changed = sum(n for s, n in self.scale_events if s > t - period_s)
        return current - changed

    def desired(self, t: float, current: int, ready: int, signals: Signals,
                min_replicas: int | None = None) -> int:
        """The replica count the HPA sets at ``t`` (after ``observe``)."""
        spec = self.spec
        low = max(spec.min_replicas, min_replicas or 0)
        low = min(low, spec.max_replicas)
        raw = min(max(self._raw(t, current, ready, signals), low), spec.max_replicas)
        self.recommendations.append((t, raw))
        while self.recommendations and self.recommendations[0][0] <= t - spec.down_window_s:
            self.recommendations.popleft()
        up = raw
        for s, r in reversed(self.recommendations):
            if s <= t - spec.up_window_s:
                break
            up = min(up, r)
        down = max(r for _, r in self.recommendations)
        wanted = current
        if wanted < up:
            wanted = up
        if wanted > down:
            wanted = down
        if wanted > current:
            start = self._period_start(current, spec.up_period_s, t)
            limit = max(math.ceil(start * (1 + spec.up_percent / 100.0)), start + spec.up_pods)
            wanted = min(wanted, limit)
        elif wanted < current:
            start = self._period_start(current, spec.down_period_s, t)
            limit = int(start * (1 - spec.down_percent / 100.0))  # kube truncates here
            wanted = max(wanted, limit)
        wanted = min(max(wanted, low), spec.max_replicas)
        if wanted != current:
            self.scale_events.append((t, wanted - current))
        while self.scale_events and self.scale_events[0][0] <= t - max(spec.up_period_s,
                                                                       spec.down_period_s):
            self.scale_events.popleft()
        return wanted


def prewarm_minimum(rps_ahead: float, service_ms: float, utilisation_target: float) -> int:
    """Replicas the demand ``rps_ahead`` needs at the utilisation target."""
    if rps_ahead <= 0:
        return 0
    return math.ceil(rps_ahead * service_ms / 1000.0 / utilisation_target)
