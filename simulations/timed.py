"""Pods with arrival and departure times, for the event-driven replay.

Read from an openb pod list (``creation_time``, ``deletion_time``: seconds from the trace start,
see ``../shared/data/README.md``), or drawn by a seeded generator of the same shape when there is
no trace. The resource columns go through :func:`simulations.openb.load_pods` (every check the
static replay makes); the times through the same bounded reader, so a bad row is one
``BadInput`` naming file, row and field:

- ``creation_time`` is required and rows are in creation order (openb's files are): a trace out
  of order would replay a different history than the one it records, so it is refused rather
  than silently sorted;
- ``deletion_time`` is required and not before ``creation_time`` (a pod still running at the end
  of an export carries the export's end time);
- optional ``model`` / ``model_version`` columns label a pod as a model replica (the
  ``gpufrag.io/model`` labels); a version not among the known ones (the GenAI trace's) is an
  error, not a replica that never finds a warm node.

On its real timeline openb is light: its 8,152 pods hold at most ~66 GPUs at once on a 6,212-GPU
cluster (most live minutes, a few for months). ``window`` can superimpose time-shifted copies of
the trace, the way the static experiment resamples pods up to 130% of capacity: copy ``k`` is the
trace rotated by a seeded offset on the trace's own period, so arrival patterns and lifetimes
keep their shape while the load grows to ``--load`` x capacity on average.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpufrag.errors import BadInput
from scheduler.core.types import PodRequest
from simulations.openb import MAX_AMOUNT, amount, load_pods, read_rows
from simulations.synthetic import synthetic_pods
from simulations.workload import copy_named

TIME_COLUMNS = ("creation_time", "deletion_time")
# 10^12 s (~31,700 years): any trace's seconds fit, and sums stay exact in float64.
MAX_TIME_S = MAX_AMOUNT
# Superimposed copies at most: 1,000 copies of openb are ~8 million pods' worth of arrays.
MAX_COPIES = 1_000
# The synthetic workload: lifetimes lognormal with this median and sigma (openb's are heavier
# tailed still: median 9 min, but the long-lived pods hold most GPU-hours).
SYNTHETIC_MEDIAN_LIFE_S = 3600.0
SYNTHETIC_LIFE_SIGMA = 2.0


@dataclass(frozen=True, slots=True)
class TimedPod:
    """A pod and when it arrives and leaves (seconds on the replay's clock; ``None``: never)."""

    pod: PodRequest
    arrive_s: float
    leave_s: float | None


def load_timed_pods(path: str | Path, known_products: set[str] | None = None,
                    known_versions: set[str] | None = None) -> list[TimedPod]:
    """The pods of an openb pod list with their creation and deletion times."""
    path = Path(path)
    source = str(path)
    pods = load_pods(path, known_products)
    timed: list[TimedPod] = []
    previous = -1.0
    for i, (number, row) in enumerate(read_rows(path, TIME_COLUMNS)):
        created = float(amount(row, "creation_time", source, number, MAX_TIME_S))
        deleted = float(amount(row, "deletion_time", source, number, MAX_TIME_S))
        if created < previous:
            raise BadInput(f"creation_time {row['creation_time'].strip()} is before the previous "
                           f"row's {previous:g}; sort the trace by creation_time",
                           source=source, row=number, field="creation_time")
        if deleted < created:
            raise BadInput(f"deletion_time {row['deletion_time'].strip()} is before "
                           f"creation_time {row['creation_time'].strip()}", source=source,
                           row=number, field="deletion_time")
        previous = created
        pod = pods[i]
        model = (row.get("model") or "").strip()
        version = (row.get("model_version") or "").strip()
        if version and not model:
            raise BadInput("model_version without a model", source=source, row=number,
                           field="model")
        if version and known_versions is not None and version not in known_versions:
            shown = ",".join(sorted(known_versions)[:8]) + (
                ",..." if len(known_versions) > 8 else "")
            raise BadInput(f"unknown model version {version!r}; the GenAI trace has {shown}",
                           source=source, row=number, field="model_version")
        if model:
            pod = dataclasses.replace(pod, model=model, model_version=version)
        timed.append(TimedPod(pod, created, deleted))
    return timed


def mean_demand_milli(timed: Sequence[TimedPod], period_s: float) -> float:
    """GPU milli held on average over ``period_s`` by one copy of ``timed``."""
    if period_s <= 0:
        return 0.0
    held = sum(t.pod.gpu_demand_milli * ((t.leave_s if t.leave_s is not None else period_s)
                                         - t.arrive_s) for t in timed)
    return held / period_s


def trace_period(timed: Sequence[TimedPod]) -> float:
    """The period copies are rotated on: first to last creation, plus one second."""
    if not timed:
        return 1.0
    return max(t.arrive_s for t in timed) - min(t.arrive_s for t in timed) + 1.0


def copies_for_load(timed: Sequence[TimedPod], capacity_milli: int, load: float) -> int:
    """How many rotated copies bring the mean GPU demand to ``load`` x capacity (>= 1)."""
    one = mean_demand_milli(timed, trace_period(timed))
    if one <= 0:
        return 1
    wanted = math.ceil(load * capacity_milli / one)
    if wanted > MAX_COPIES:
        raise BadInput(f"--load {load:g} needs {wanted} copies of the trace (limit "
                       f"{MAX_COPIES}); its pods hold only {one / 1000:.1f} GPUs on average",
                       field="--load")
    return max(1, wanted)


def window(timed: Sequence[TimedPod], start_s: float, hours: float, *, copies: int = 1,
           seed: int = 0) -> list[TimedPod]:
    """The pods alive in ``[start_s, start_s + hours h)``, on a clock that starts at 0 there.

    Pods already running at ``start_s`` arrive at 0 (in creation order): the cluster as it was
    when the window opened. Copy 0 is the trace as it is; copy k >= 1 is rotated by a seeded
    offset on the trace's period (a pod pushed past the end comes round at the start), named
    ``<name>-c<k>``.
    """
    if not timed:
        return []
    end_s = start_s + hours * 3600.0
    base = min(t.arrive_s for t in timed)
    period = trace_period(timed)
    arrive = np.array([t.arrive_s - base for t in timed])
    life = np.array([(t.leave_s - t.arrive_s) if t.leave_s is not None else np.inf
                     for t in timed])
    offsets = np.concatenate([[0.0], np.random.default_rng(seed).uniform(0, period, copies - 1)])
    finite = life[np.isfinite(life)]
    back = math.ceil(float(finite.max(initial=0.0)) / period) if copies > 1 else 0
    taken = {t.pod.name for t in timed}
    picked: list[tuple[float, int, int, float, float | None]] = []
    for k, offset in enumerate(offsets):
        shifted = (arrive + offset) % period + base if k else arrive + base
        # A rotated copy repeats every period: earlier laps of long-lived pods reach in too.
        # (A pod that never leaves is counted on its own lap only.)
        laps = [shifted] if k == 0 else [shifted - j * period for j in range(back + 1)]
        for j, lap in enumerate(laps):
            leave = lap + life
            alive = np.flatnonzero((lap < end_s) & (leave > start_s)
                                   & (np.isfinite(life) if j else True))
            for i in alive.tolist():
                ends = float(leave[i])
                picked.append((max(float(lap[i]), start_s), k, i, float(lap[i]),
                               None if math.isinf(ends) else ends))
    picked.sort(key=lambda p: (p[0], p[3], p[1], p[2]))
    out: list[TimedPod] = []
    for at, k, i, _, left in picked:
        pod = timed[i].pod
        if k:
            pod = copy_named(pod, f"c{k}", taken)
        out.append(TimedPod(pod, at - start_s, None if left is None else left - start_s))
    return out


def synthetic_timed(capacity_milli: int, hours: float, load: float, seed: int) -> list[TimedPod]:
    """A seeded workload with the openb pod mix: Poisson arrivals at the rate that holds
    ``load`` x capacity on average, lognormal lifetimes; pods alive at 0 come from arrivals
    in the weeks before (the system is in its steady state when the window opens)."""
    rng = np.random.default_rng(seed + 11)
    shapes = synthetic_pods(2000, seed=seed)
    mean_demand = float(np.mean([p.gpu_demand_milli for p in shapes]))
    mean_life = SYNTHETIC_MEDIAN_LIFE_S * math.exp(SYNTHETIC_LIFE_SIGMA**2 / 2)
    rate = load * capacity_milli / (mean_demand * mean_life)  # arrivals per second
    warmup = SYNTHETIC_MEDIAN_LIFE_S * math.exp(3 * SYNTHETIC_LIFE_SIGMA)  # 99.9th percentile
    span = warmup + hours * 3600.0
    count = int(rng.poisson(rate * span))
    arrive = np.sort(rng.uniform(-warmup, hours * 3600.0, count))
    life = rng.lognormal(math.log(SYNTHETIC_MEDIAN_LIFE_S), SYNTHETIC_LIFE_SIGMA, count)
    keep = np.flatnonzero(arrive + life > 0)
    if keep.size == 0:
        return []
    pods = synthetic_pods(int(keep.size), seed=seed)
    return [TimedPod(dataclasses.replace(p, name=f"synth-timed-{j:06d}"),
                     max(float(arrive[i]), 0.0), float(arrive[i] + life[i]))
            for j, (p, i) in enumerate(zip(pods, keep.tolist(), strict=True))]


def static_order(pods: Sequence[PodRequest], spacing_s: float = 1.0) -> list[TimedPod]:
    """The static replay's arrivals on a clock: pod i at ``i x spacing_s``, never leaving."""
    return [TimedPod(p, i * spacing_s, None) for i, p in enumerate(pods)]
