"""The compiled form of FGD's fragmentation, for the hot path of replays and scoring.

FGD evaluates F for every candidate (node, GPU) of every pod; in numpy each call costs tens of
microseconds of array set-up for a handful of rows, which is most of a replay's time. This
kernel computes the same thing row by row in one compiled loop, in exactly the floating-point
order of :func:`scheduler.core.fragmentation.fragmentation_in_spec_order` (spec by spec into
seven categories, then the categories in order; no fast-math), so both give bit-equal results
and the choice of engine never changes a decision (``tests/scheduler/core/test_fragkernel.py``).

numba is imported, and the kernel compiled (cached on disk after the first time), on first
use, so commands that never score pay nothing; without numba, or with ``GPUFRAG_NO_JIT=1`` in
the environment (read once, at first use: benchmarks time both engines side by side),
:func:`compiled` returns None and callers use the numpy form.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

Kernel = Callable[..., None]

_state: dict[str, Kernel | None] = {}


def _frag_rows(free: Any, cpu_left: Any, product: Any, thresholds: Any, threshold_of: Any,
               cpu_milli: Any, num_gpu: Any, gpu_milli: Any, popularity: Any, allowed: Any,
               constrained: bool, out: Any) -> None:  # pragma: no cover - runs compiled
    rows, width = free.shape
    levels = thresholds.shape[0]
    specs = cpu_milli.shape[0]
    count = np.empty(levels, np.int64)
    fitted = np.empty(levels, np.int64)
    for r in range(rows):
        total = 0
        for g in range(width):
            total += free[r, g]
        for d in range(levels):
            c = 0
            s = 0
            t = thresholds[d]
            for g in range(width):
                f = free[r, g]
                if f >= t:
                    c += 1
                    s += f
            count[d] = c
            fitted[d] = s
        whole = float(total)
        lack_both = 0.0
        lack_gpu = 0.0
        lack_cpu = 0.0
        cpu_fits = 0.0
        cpu_lacks = 0.0
        no_access = 0.0
        cpu = cpu_left[r]
        for m in range(specs):
            p = popularity[m]
            cpu_ok = cpu >= cpu_milli[m]
            if gpu_milli[m] == 0:
                if cpu_ok:
                    cpu_fits += p * whole
                else:
                    cpu_lacks += p * whole
                continue
            if constrained and not allowed[m, product[r]]:
                no_access += p * whole
                continue
            d = threshold_of[m]
            host = count[d] >= num_gpu[m]
            if cpu_ok:
                if host:
                    lack_gpu += p * float(total - fitted[d])
                else:
                    lack_gpu += p * whole
            elif host:
                lack_cpu += p * whole
            else:
                lack_both += p * whole
        out[r] = lack_both + lack_gpu + lack_cpu + cpu_fits + cpu_lacks + no_access


def compiled() -> Kernel | None:
    """The compiled row kernel, or None when numba is not installed."""
    if "kernel" not in _state:
        if os.environ.get("GPUFRAG_NO_JIT", "") not in ("", "0"):
            _state["kernel"] = None
            return None
        try:
            import numba  # third-party, imported on first use only (see the module docstring)
        except ImportError:
            _state["kernel"] = None
        else:
            try:
                _state["kernel"] = numba.njit(cache=True, nogil=True)(_frag_rows)
            except RuntimeError:  # no writable cache location anywhere: compile each start
                _state["kernel"] = numba.njit(nogil=True)(_frag_rows)
    return _state["kernel"]
