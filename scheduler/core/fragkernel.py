"""The compiled forms of FGD's fragmentation, for the hot path of replays and scoring.

FGD evaluates F for every candidate (node, GPU) of every pod; in numpy each call costs tens of
microseconds of array set-up for a handful of rows, which is most of a replay's time. A kernel
computes the same thing row by row in one compiled loop, in exactly the floating-point order of
:func:`scheduler.core.fragmentation.fragmentation_in_spec_order` (spec by spec into seven
categories, then the categories in order; no fast-math, no fused multiply-add), so every engine
gives bit-equal results and the choice of engine never changes a decision
(``tests/scheduler/core/test_fragkernel.py``).

Two engines, the first one available wins:

- ``c``: ``_fragkernel.c``, compiled when gpufrag is installed (``setup.py``; optional, so an
  install without a C compiler still succeeds). It imports in well under a millisecond.
- ``numba``: :func:`_frag_rows` below, compiled on first use and cached on disk. Importing numba
  and loading the cached kernel costs ~0.45 s of a fresh process (and ~120 MiB), which is why
  the C engine exists (``benchmarks/whatif_first_run.py`` measures both).

``GPUFRAG_KERNEL=c|numba|numpy`` in the environment (read once, at first use) pins one engine;
``numpy`` (or the older ``GPUFRAG_NO_JIT=1``) turns the kernels off and callers use the numpy
form. :func:`compiled` returns None when no kernel is available or allowed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from gpufrag.errors import BadInput

Kernel = Callable[..., None]

try:  # built at install (setup.py); absent where no C compiler was there. Imports in microseconds.
    from scheduler.core._fragkernel import frag_before_after as _c_before_after
    from scheduler.core._fragkernel import frag_rows as _c_frag_rows
except ImportError:
    _c_frag_rows = None  # type: ignore[assignment]  # the absent engine
    _c_before_after = None  # type: ignore[assignment]

_kernels: dict[str, Kernel | None] = {}  # engine -> its kernel, None when not installed
# The engine compiled() answers with and its kernel, chosen once: compiled() runs on every
# fragmentation call of the hot path, so it must be one lookup.
_in_use: list[tuple[str, Kernel | None]] = []


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


ENGINES = ("c", "numba")


def _load(engine: str) -> Kernel | None:
    if engine == "c":
        return _c_frag_rows
    try:
        import numba  # third-party, imported on first use only (see the module docstring)
    except ImportError:
        return None
    try:
        compiled_rows: Kernel = numba.njit(cache=True, nogil=True)(_frag_rows)
    except RuntimeError:  # no writable cache location anywhere: compile each start
        compiled_rows = numba.njit(nogil=True)(_frag_rows)
    return compiled_rows


def kernel(engine: str) -> Kernel | None:
    """One engine's kernel (``"c"`` or ``"numba"``), or None when it is not installed."""
    if engine not in ENGINES:
        raise ValueError(f"unknown fragmentation engine {engine!r}; one of {', '.join(ENGINES)}")
    if engine not in _kernels:
        _kernels[engine] = _load(engine)
    return _kernels[engine]


def _choose() -> str:
    wanted = os.environ.get("GPUFRAG_KERNEL", "").strip().lower()
    if wanted == "numpy" or os.environ.get("GPUFRAG_NO_JIT", "") not in ("", "0"):
        return "numpy"
    if wanted:
        if wanted not in ENGINES:
            raise BadInput(f"GPUFRAG_KERNEL={wanted!r}: choose c, numba or numpy")
        if kernel(wanted) is None:
            # Asked for by name: running another engine instead would be silently slower (a
            # filter past kube-scheduler's timeout); refuse, saying what is there.
            there = [name for name in ENGINES if kernel(name) is not None] + ["numpy"]
            raise BadInput(f"GPUFRAG_KERNEL={wanted!r}: that engine is not installed here; "
                           f"installed: {', '.join(there)} (unset GPUFRAG_KERNEL to take the "
                           f"fastest installed)")
        return wanted
    return next((name for name in ENGINES if kernel(name) is not None), "numpy")


def use(name: str) -> None:
    """Pin the engine :func:`compiled` uses from now on (``c``, ``numba`` or ``numpy``), as
    ``GPUFRAG_KERNEL`` does at start; for tests and benchmarks that compare engines."""
    chosen = None if name == "numpy" else kernel(name)
    if name != "numpy" and chosen is None:
        raise ValueError(f"fragmentation engine {name!r} is not installed here")
    _in_use[:] = [(name, chosen)]


def engine() -> str:
    """The engine :func:`compiled` uses: ``c``, ``numba`` or ``numpy`` (no kernel)."""
    if not _in_use:
        use(_choose())
    return _in_use[0][0]


def compiled() -> Kernel | None:
    """The preferred kernel (see the module docstring), or None: use the numpy form."""
    if not _in_use:
        use(_choose())
    return _in_use[0][1]


def compiled_before_after() -> Kernel | None:
    """The C engine's fused "F before and after one pod" (``frag_before_after`` in
    ``_fragkernel.c``) when the C engine is in use, else None: callers compose the same
    figures from :func:`compiled`'s rows. A score call on a few rows is mostly array set-up,
    which the fused call does without (about 40% of a replay's time)."""
    if not _in_use:
        use(_choose())
    return _c_before_after if _in_use[0][0] == "c" else None
