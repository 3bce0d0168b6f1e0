from __future__ import annotations

from typing import Any

import pytest

from node.agent.leakwatch import LeakSuspect, LeakWatch
from tests.node.agent.fakes import POD_A, POD_B

INTERVAL_S = 15.0


def feed(watch: LeakWatch, series: list[int], *, start: float = 0.0) -> list[list[LeakSuspect]]:
    """Observe POD_A at the given MiB, one reading per interval; what fired at each."""
    return [watch.observe({POD_A: mib}, start + i * INTERVAL_S) for i, mib in enumerate(series)]


def test_fires_once_when_the_streak_reaches_n_intervals() -> None:
    watch = LeakWatch(interval_s=INTERVAL_S, threshold_mib=100, intervals=3)
    fired = feed(watch, [1000, 1200, 1400, 1600, 1800, 2000])
    assert [len(f) for f in fired] == [0, 0, 0, 1, 0, 0]  # once per streak, not every interval
    (suspect,) = fired[3]
    assert suspect == LeakSuspect(pod=POD_A, start_mib=1000, current_mib=1600, intervals=3,
                                  window_s=45.0, threshold_mib=100)
    assert suspect.growth_mib == 600
    assert watch.suspected == {POD_A}


def test_message_carries_the_numbers() -> None:
    suspect = LeakSuspect(POD_A, start_mib=1000, current_mib=1600, intervals=3, window_s=45.0,
                          threshold_mib=100)
    message = suspect.message()
    for number in ("600 MiB", "1000 -> 1600 MiB", "3 consecutive intervals", "45 s", "100 MiB"):
        assert number in message


def test_growth_at_the_threshold_does_not_count() -> None:
    watch = LeakWatch(interval_s=INTERVAL_S, threshold_mib=100, intervals=2)
    assert not any(feed(watch, [1000, 1100, 1200, 1300]))
    assert watch.suspected == frozenset()


def test_a_flat_interval_ends_the_streak_and_the_next_streak_fires_again() -> None:
    watch = LeakWatch(interval_s=INTERVAL_S, threshold_mib=100, intervals=2)
    fired = feed(watch, [0, 200, 400, 400, 600, 800, 1000])
    assert [len(f) for f in fired] == [0, 0, 1, 0, 0, 1, 0]
    assert fired[5][0].start_mib == 400
    assert watch.suspected == {POD_A}


def test_suspicion_clears_when_growth_stops() -> None:
    watch = LeakWatch(interval_s=INTERVAL_S, threshold_mib=100, intervals=2)
    feed(watch, [0, 200, 400])
    assert watch.suspected == {POD_A}
    watch.observe({POD_A: 350}, 3 * INTERVAL_S)  # released some
    assert watch.suspected == frozenset()


def test_streak_that_never_reaches_n_does_not_fire() -> None:
    watch = LeakWatch(interval_s=INTERVAL_S, threshold_mib=100, intervals=3)
    assert not any(feed(watch, [0, 500, 1000, 1000, 1500, 2000, 2000]))


def test_pods_are_followed_separately_and_forgotten_when_gone() -> None:
    watch = LeakWatch(interval_s=INTERVAL_S, threshold_mib=100, intervals=2)
    watch.observe({POD_A: 0, POD_B: 0}, 0.0)
    watch.observe({POD_A: 200, POD_B: 0}, 15.0)
    fired = watch.observe({POD_A: 400, POD_B: 10}, 30.0)
    assert [s.pod for s in fired] == [POD_A]
    watch.observe({POD_B: 10}, 45.0)  # POD_A left
    assert watch.suspected == frozenset()
    # POD_A comes back (same UID): a new baseline, not growth from its old value.
    assert watch.observe({POD_A: 5000, POD_B: 10}, 60.0) == []


def test_a_missed_reading_spreads_growth_over_the_intervals_that_passed() -> None:
    watch = LeakWatch(interval_s=INTERVAL_S, threshold_mib=100, intervals=2)
    watch.observe({POD_A: 0}, 0.0)
    # 150 MiB over two intervals is 75 per interval: below the threshold.
    assert watch.observe({POD_A: 150}, 30.0) == []
    assert watch.observe({POD_A: 300}, 45.0) == []  # streak 1
    assert len(watch.observe({POD_A: 450}, 60.0)) == 1  # streak 2


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"interval_s": 0}, "interval_s"),
    ({"interval_s": 15, "threshold_mib": -1}, "threshold_mib"),
    ({"interval_s": 15, "intervals": 0}, "intervals"),
])
def test_bad_settings_are_refused(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        LeakWatch(**kwargs)
