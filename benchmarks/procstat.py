"""CPU time of a running process, read from Linux's /proc: how the benchmarks put a CPU cost
next to each figure they measure (per request, per pod), for processes they did not start in
their own interpreter."""

from __future__ import annotations

import math
import os
import sys

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


# Runs a module as ``python -m`` would, then writes its own peak RSS (VmHWM, KiB) to the file
# named first. Why not the rusage os.wait4 gives: a child's ru_maxrss keeps the high-water
# mark of the memory it was forked with (the parent's, shared until exec), so a small command
# started by a benchmark holding gigabytes reports gigabytes. VmHWM is the exec'd image's own.
_PEAK_RSS_RUNNER = (
    "import atexit, runpy, sys\n"
    "report = sys.argv.pop(1)\n"
    "def peak():\n"
    "    with open('/proc/self/status') as f:\n"
    "        hwm = next((l.split()[1] for l in f if l.startswith('VmHWM:')), 'nan')\n"
    "    with open(report, 'w') as out:\n"
    "        out.write(hwm)\n"
    "atexit.register(peak)\n"
    "module = sys.argv.pop(1)\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n")


def peak_rss_command(module: str, report: str) -> list[str]:
    """The command that runs ``python -m module`` (its arguments appended after) and writes
    its own peak RSS to ``report``; read it back with :func:`read_peak_rss_mib`."""
    return [sys.executable, "-c", _PEAK_RSS_RUNNER, report, module]


def read_peak_rss_mib(report: str) -> float:
    """The peak RSS (MiB) a :func:`peak_rss_command` wrote; NaN when it wrote none."""
    try:
        with open(report) as f:
            return int(f.read().strip()) / 1024
    except (OSError, ValueError):
        return math.nan
