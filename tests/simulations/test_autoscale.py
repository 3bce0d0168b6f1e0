"""The HPA of manifests/ on a fake clock, and the fluid queue the Deployments run."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from simulations.autoscale import Hpa, HpaSpec, Load, Signals, prewarm_minimum

CALM = Signals(queue_per_pod=0.0, utilisation=0.5, p99_ms=100.0, requests=0, over_slo=0,
               busy=0.5)


def _signals(**overrides: float) -> Signals:
    return replace(CALM, **overrides)


def _drive(hpa: Hpa, replicas: int, signals: Signals, until_s: float,
           start_s: float = 0.0) -> list[tuple[float, int]]:
    """Run the HPA every 15 s; every replica is ready at once. Returns (t, replicas) changes."""
    changes = []
    t = start_s
    while t <= until_s:
        hpa.observe(t, signals)
        wanted = hpa.desired(t, replicas, replicas, signals)
        if wanted != replicas:
            changes.append((t, wanted))
            replicas = wanted
        t += 15.0
    return changes


def test_queue_depth_above_50_per_pod_scales_up_at_most_double_or_plus_4_a_minute() -> None:
    hpa = Hpa(HpaSpec())
    changes = _drive(hpa, 2, _signals(queue_per_pod=500.0), 45.0)
    # wants 2 x 10 = 20; first step limited to max(2 x 2, 2 + 4) = 6, then nothing more within
    # the 60 s period.
    assert changes == [(0.0, 6)]
    later = _drive(hpa, 6, _signals(queue_per_pod=500.0), 120.0, start_s=60.0)
    assert later[:2] == [(60.0, 12), (120.0, 20)]


def test_utilisation_must_stay_above_80_percent_for_2_minutes() -> None:
    hpa = Hpa(HpaSpec(min_replicas=4))
    busy = _signals(utilisation=1.0, p99_ms=100.0)
    # the 5-minute average climbs from 0.5; its minimum over 2 minutes follows behind
    _drive(hpa, 4, CALM, 600.0)
    changes = _drive(hpa, 4, busy, 1200.0, start_s=615.0)
    first = changes[0][0]
    assert first - 615.0 >= 120.0  # not before the reading has been high for 2 minutes
    assert changes[0][1] == 5  # ceil(4 x ~1.0 / 0.8)


def test_p99_above_200ms_for_1_minute_scales_up() -> None:
    hpa = Hpa(HpaSpec())
    changes = _drive(hpa, 2, _signals(p99_ms=400.0), 60.0)
    assert changes and changes[0][1] == 4  # ceil(2 x 400 / 200)


def test_within_tolerance_nothing_changes() -> None:
    hpa = Hpa(HpaSpec())
    assert _drive(hpa, 4, _signals(p99_ms=210.0, utilisation=0.5), 600.0) == []


def test_scale_down_waits_10_minutes_and_sheds_10_percent_per_2_minutes() -> None:
    hpa = Hpa(HpaSpec())
    steady = _signals(utilisation=0.8, p99_ms=200.0)
    assert _drive(hpa, 20, steady, 900.0) == []
    idle = _signals(utilisation=0.0, p99_ms=50.0, queue_per_pod=0.0)
    changes = _drive(hpa, 20, idle, 2700.0, start_s=915.0)
    assert changes[0][0] >= 915.0 + 600.0  # the 600 s stabilisation window
    assert changes[0][1] == 18  # int(20 x 0.9)
    steps = [b - a for (a, _), (b, _) in itertools.pairwise(changes)]
    assert all(s >= 120.0 for s in steps)
    assert changes[-1][1] >= 2


def test_prewarming_sets_a_floor() -> None:
    hpa = Hpa(HpaSpec())
    floor = prewarm_minimum(rps_ahead=800.0, service_ms=10.0, utilisation_target=0.8)
    assert floor == 10
    hpa.observe(0.0, CALM)
    # below the minimum kube scales straight to it (no rate limit), as when minReplicas is raised
    assert hpa.desired(0.0, 2, 2, CALM, min_replicas=floor) == 10
    assert prewarm_minimum(0.0, 10.0, 0.8) == 0


def test_fluid_queue_backlog_and_slo() -> None:
    load = Load(service_ms=10.0, slo_ms=200.0)
    calm = load.step(rps=50.0, ready=1, step_s=15.0)  # rho 0.5
    assert calm.utilisation == pytest.approx(0.5)
    assert calm.p99_ms == pytest.approx(1000 * math.log(100) / 50)
    assert calm.over_slo == pytest.approx(750 * math.exp(-50 * 0.2))
    over = load.step(rps=300.0, ready=1, step_s=15.0)  # 3x overload: 3000 requests queue up
    assert load.backlog == pytest.approx(4500 - 1500)
    assert over.over_slo == over.requests and over.queue_per_pod > 50
    none = load.step(rps=10.0, ready=0, step_s=15.0)
    assert none.over_slo == none.requests == 150 and math.isinf(none.p99_ms)
