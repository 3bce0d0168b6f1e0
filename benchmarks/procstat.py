"""CPU time of a running process, read from Linux's /proc: how the benchmarks put a CPU cost
next to each figure they measure (per request, per pod), for processes they did not start in
their own interpreter."""

from __future__ import annotations

import math
import os

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, *, descendants: bool = False) -> float:
    """User + system CPU of process ``pid`` so far, NaN when it cannot be read (gone, or not
    Linux). With ``descendants``, plus that of its live descendants (a forked worker,
    say); one that exits between being listed and being read counts 0."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    total = (int(fields[11]) + int(fields[12])) / _TICKS
    if descendants:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            children = []
        for child in children:
            spent = cpu_seconds(child, descendants=True)
            total += 0.0 if math.isnan(spent) else spent
    return total


def thread_cpu_seconds(pid: int, tid: int) -> float:
    """User + system CPU of one thread ``tid`` of process ``pid`` (NaN when unreadable): how
    the serving benchmark tells the event loop's CPU (the main thread, ``tid == pid``) from the
    model's compute threads."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / _TICKS
