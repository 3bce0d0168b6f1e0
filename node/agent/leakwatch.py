"""Spot pods whose GPU memory keeps growing: the usual sign of a leak (or an unbounded cache).

Pure: no clock, no I/O. The caller hands :meth:`LeakWatch.observe` each interval's per-pod
memory (summed over the pod's GPUs) together with the time of the reading, and gets back the
pods whose streak has just reached the limit, so an Event is raised once per streak rather than
every interval. :attr:`LeakWatch.suspected` is what the ``leak_suspected`` metric shows.

A streak is ``intervals`` consecutive readings in which the pod grew by more than
``threshold_mib`` per interval. When readings are further apart than one interval (a failed
read in between), the growth is spread over the intervals that passed, so a missed reading
neither starts nor breaks a streak on its own. A reading without growth above the threshold
ends the streak and clears the suspicion; the next streak may fire again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from node.agent.cgroup import PodRef

DEFAULT_THRESHOLD_MIB = 100
DEFAULT_INTERVALS = 3


@dataclass(frozen=True, slots=True)
class LeakSuspect:
    """A streak that just reached the limit, with the numbers for the Event message."""

    pod: PodRef
    start_mib: int
    current_mib: int
    intervals: int
    window_s: float
    threshold_mib: int

    @property
    def growth_mib(self) -> int:
        return self.current_mib - self.start_mib

    def message(self) -> str:
        return (
            f"GPU memory grew by {self.growth_mib} MiB ({self.start_mib} -> {self.current_mib} "
            f"MiB) over {self.intervals} consecutive intervals ({self.window_s:.0f} s), more than "
            f"{self.threshold_mib} MiB each: possible GPU memory leak"
        )


@dataclass(slots=True)
class _Track:
    last_mib: int
    last_at: float
    streak: int = 0
    streak_start_mib: int = 0
    streak_start_at: float = 0.0
    fired: bool = False


class LeakWatch:
    def __init__(self, *, interval_s: float, threshold_mib: int = DEFAULT_THRESHOLD_MIB,
                 intervals: int = DEFAULT_INTERVALS) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        if threshold_mib < 0:
            raise ValueError(f"threshold_mib must be >= 0, got {threshold_mib}")
        if intervals < 1:
            raise ValueError(f"intervals must be >= 1, got {intervals}")
        self.interval_s = interval_s
        self.threshold_mib = threshold_mib
        self.intervals = intervals
        self._tracks: dict[PodRef, _Track] = {}

    @property
    def suspected(self) -> frozenset[PodRef]:
        """Pods in a streak that has fired and not yet ended."""
        return frozenset(pod for pod, track in self._tracks.items() if track.fired)

    def observe(self, memory_by_pod: Mapping[PodRef, int], now: float) -> list[LeakSuspect]:
        """Take one interval's reading; returns the pods whose streak reached the limit now.

        Pods missing from ``memory_by_pod`` are forgotten (they left the GPU or the node).
        """
        fired: list[LeakSuspect] = []
        for pod in self._tracks.keys() - memory_by_pod.keys():
            del self._tracks[pod]
        for pod, memory_mib in memory_by_pod.items():
            track = self._tracks.get(pod)
            if track is None:
                self._tracks[pod] = _Track(last_mib=memory_mib, last_at=now)
                continue
            elapsed_intervals = max(1, round((now - track.last_at) / self.interval_s))
            growth_per_interval = (memory_mib - track.last_mib) / elapsed_intervals
            if growth_per_interval > self.threshold_mib:
                if track.streak == 0:
                    track.streak_start_mib = track.last_mib
                    track.streak_start_at = track.last_at
                track.streak += 1
                if track.streak >= self.intervals and not track.fired:
                    track.fired = True
                    fired.append(LeakSuspect(
                        pod=pod,
                        start_mib=track.streak_start_mib,
                        current_mib=memory_mib,
                        intervals=track.streak,
                        window_s=now - track.streak_start_at,
                        threshold_mib=self.threshold_mib,
                    ))
            else:
                track.streak = 0
                track.fired = False
            track.last_mib = memory_mib
            track.last_at = now
        return fired
