"""Where every component's Prometheus registry comes from: one home for how gpufrag exports.

``prometheus_client`` adds a ``<name>_created`` gauge (the Unix time a counter, histogram or
summary was made) beside every such family. dcgm-exporter and the kubelet do not, it doubles
the series of every counter for a figure no dashboard or alert here reads, and promtool flags
the families. :func:`new_registry` switches them off for the process (the library's public
``disable_created_metrics``) before it hands out a registry, so no component can export them.

:class:`ThreadCPUCollector` is the CPU a process spends by thread, for a component whose
threads do different jobs (the extender's event loop, watches and bind threads).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator

import prometheus_client
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector


def new_registry() -> prometheus_client.CollectorRegistry:
    """A fresh registry whose counters, histograms and summaries carry no ``_created``."""
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream
    return prometheus_client.CollectorRegistry()


# A pool's threads are named PREFIX_N (concurrent.futures) or "Thread-N (target)" (threading):
# counted under one name each, so the series stay few whatever the pool's size.
_THREAD_NUMBER = re.compile(r"(_\d+|-\d+( \(.*\))?)$")


def thread_group(name: str) -> str:
    """The label a thread's CPU is counted under: its name less a pool's number."""
    return _THREAD_NUMBER.sub("", name) or name


class ThreadCPUCollector(Collector):
    """``gpufrag_thread_cpu_seconds_total{thread}``: the CPU each of the process's threads
    (grouped by :func:`thread_group`) has spent, so an operator sees where a component's CPU
    goes (the extender's event loop, its watches, its bind threads) without a profiler.

    Read from ``/proc/self/task/<tid>/stat`` at scrape time (clock ticks, 10 ms): a thread
    that ended between the listing and the read is left out, never a failed scrape. A thread
    that ends takes its seconds with it, so a group's total can fall (a counter reset, which
    ``rate()`` reads as one). Where there is no ``/proc`` the family is empty."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "gpufrag_thread_cpu_seconds",
            "CPU seconds (user + system) spent by this process's live threads, by thread "
            "name (a pool's threads under one name).", labels=["thread"])
        totals: dict[str, float] = {}
        for thread in threading.enumerate():
            seconds = _thread_cpu_seconds(thread.native_id)
            if seconds is not None:
                group = thread_group(thread.name)
                totals[group] = totals.get(group, 0.0) + seconds
        for group, seconds in sorted(totals.items()):
            family.add_metric([group], seconds)
        yield family


_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _thread_cpu_seconds(native_id: int | None) -> float | None:
    if native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the command's closing parenthesis: state is field 3, utime 14 and stime 15.
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
