"""The GPU right-sizing recommender: observed per-pod GPU memory -> a recommended share.

Pure (standard library, orjson, :mod:`gpufrag.gpu_usage`, :mod:`gpufrag`): no Kubernetes
client, no clock of its own (every function takes ``now``), so the defrag controller, the
admission webhook and the what-if all compute the same numbers.

How a recommendation is made (the Vertical Pod Autoscaler's memory recommender, for GPU memory):

1. **Samples.** Each agent reading (the Node annotation ``gpufrag.io/gpu-usage``) gives, per pod,
   its memory on each GPU it uses; a pod's sample is its largest per-GPU use (a share is per
   GPU) together with the smallest total memory of those GPUs (:func:`pod_samples`).
2. **History per workload** (:class:`WorkloadHistory`): a workload is the pod's controller (a
   Deployment for a ReplicaSet's pods, else the controlling owner) and, where the pods carry
   ``gpufrag.io/model-version``, that version. Samples are folded into one peak per
   ``interval_s`` (1 h): the largest any replica used in that interval, and how many samples
   it summarises. Intervals older than ``window_s`` (7 days) are dropped. A peak per interval
   keeps the history small enough to live in an annotation (at most window / interval
   entries), and the peak of the busiest replica is the conservative choice for a share every
   replica gets.
3. **Recommendation** (:func:`recommend`): target = the ``percentile`` (p95) of the interval
   peaks, plus ``headroom_fraction`` (15 %) of it, plus ``headroom_mib`` (256), then bounded by
   ``min_mib`` below and ``max_mib`` (0 = none) and the GPU's memory above. ``milli`` is the
   target as thousandths of the smallest GPU the workload was seen on (rounded up), so a
   replica placed on that GPU gets at least the target. ``peak_mib`` is the largest use seen in
   the window: the webhook never sets a share below it.
4. **Whole GPUs.** A single-GPU pod that asks one whole GPU may be admitted as a share of it
   (``whole_gpu``) only once the history holds ``whole_gpu_min_intervals`` intervals with
   readings (24: a day of hourly peaks, so a daily cycle has been seen): a share is then a
   bet on a longer record than a share shrunk from a share, which was already sized by hand.
   Multi-GPU pods are never shares. The decision is made here, once, and published with the
   recommendation, so the webhook, the controller's planner and the what-if read one answer.
5. **The guard against running out** (:class:`Raise`). A share can be too small. When a
   replica is seen above its share (the agent's reading over what it reserves) or a container
   of a right-sized pod ends out of memory, the controller raises the workload: the target
   becomes at least ``(1 + oom_bump_fraction)`` (1.2, VPA's rule) times the use that overran
   (``raised_mib``, kept for the window), and for ``oom_cooloff_s`` (a day, ``hold_until``)
   its new pods are admitted exactly as their template asks: whole GPUs stay whole, shares are
   not shrunk.

The annotation ``gpufrag.io/gpu-recommendation`` on the workload's controller carries, per model
version (``"*"`` for pods without one), the recommendation and the history it came from, so
the next cycle (a new CronJob run) continues where the last one stopped::

    {"version": 1, "recommendations": {"v2": {"memory_mib": 12544, "milli": 154,
      "peak_mib": 11800, "percentile_mib": 10683, "gpu_memory_mib": 81920, "samples": 96,
      "intervals": 24, "computed_at": 1767225600.0,
      "history": [[1767139200.0, 10400, 4], ...]}}}

Modes (``gpufrag.io/rightsizing-mode`` on the controller): ``off`` (no recommendation kept),
``recommend`` (the default: published, nothing changed), ``auto`` (published, and the
admission webhook sets new pods' share to it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from gpufrag.errors import BadInput
from gpufrag.gpu_usage import NodeGpuUsage
from gpufrag.jsondoc import versioned_object

SCHEMA_VERSION = 1
ANY_VERSION = "*"
MILLI_PER_GPU = 1000


class Mode(StrEnum):
    OFF = "off"
    RECOMMEND = "recommend"
    AUTO = "auto"


DEFAULT_MODE = Mode.RECOMMEND


def parse_mode(text: str | None) -> Mode:
    """The mode an annotation value names (None = unset = the default); BadInput otherwise."""
    if text is None:
        return DEFAULT_MODE
    try:
        return Mode(text.strip().lower())
    except ValueError:
        raise BadInput(f"{text!r} is not a right-sizing mode; use one of "
                       f"{', '.join(m.value for m in Mode)}", field="rightsizing-mode") from None


@dataclass(frozen=True, slots=True)
class RightsizingConfig:
    """The recommender's knobs (units in the names); :meth:`problems` names each bad field."""

    percentile: float = 0.95
    headroom_fraction: float = 0.15
    headroom_mib: int = 256
    min_mib: int = 256
    max_mib: int = 0  # 0: bounded only by the GPU's memory
    window_s: float = 7 * 86400.0
    interval_s: float = 3600.0
    whole_gpu_min_intervals: int = 24
    oom_bump_fraction: float = 0.2
    oom_cooloff_s: float = 86400.0

    def problems(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        if not 0.0 < self.percentile <= 1.0:
            found.append(("percentile", f"{self.percentile!r} must be in (0, 1], e.g. 0.95"))
        if not 0.0 <= self.headroom_fraction <= 10.0:
            found.append(("headroom_fraction", f"{self.headroom_fraction!r} must be in 0..10"))
        for name in ("headroom_mib", "min_mib", "max_mib"):
            if getattr(self, name) < 0:
                found.append((name, f"{getattr(self, name)!r} must be >= 0"))
        if self.max_mib and self.max_mib < self.min_mib:
            found.append(("max_mib", f"{self.max_mib} is below min_mib {self.min_mib}"))
        if not self.interval_s > 0:
            found.append(("interval_s", f"{self.interval_s!r} must be > 0"))
        if not self.window_s >= self.interval_s:
            found.append(("window_s", f"{self.window_s!r} must be >= interval_s"))
        if not 0.0 <= self.oom_bump_fraction <= 10.0:
            found.append(("oom_bump_fraction", f"{self.oom_bump_fraction!r} must be in 0..10"))
        if not 0.0 <= self.oom_cooloff_s <= 365 * 86400.0:
            found.append(("oom_cooloff_s", f"{self.oom_cooloff_s!r} must be in 0..31536000"))
        if self.whole_gpu_min_intervals < 1:
            found.append(("whole_gpu_min_intervals",
                          f"{self.whole_gpu_min_intervals!r} must be >= 1"))
        return found

    def validated(self) -> RightsizingConfig:
        for name, problem in self.problems():
            raise BadInput(problem, field=f"rightsizing.{name}")
        return self


@dataclass(frozen=True, slots=True)
class PodSample:
    """One pod's GPU memory in one agent reading (largest per-GPU use)."""

    namespace: str
    name: str
    uid: str
    memory_used_mib: int
    gpu_memory_mib: int
    timestamp: float


def pod_samples(usage: NodeGpuUsage) -> list[PodSample]:
    """Per pod on this node: its largest per-GPU memory and the smallest of those GPUs."""
    by_uid: dict[str, PodSample] = {}
    for gpu in usage.gpus:
        for pod in gpu.pods:
            seen = by_uid.get(pod.uid)
            used = pod.memory_used_mib if seen is None else max(seen.memory_used_mib,
                                                                 pod.memory_used_mib)
            total = gpu.memory_total_mib if seen is None else min(seen.gpu_memory_mib,
                                                                  gpu.memory_total_mib)
            by_uid[pod.uid] = PodSample(pod.namespace, pod.name, pod.uid, used, total,
                                        usage.timestamp)
    return sorted(by_uid.values(), key=lambda s: (s.namespace, s.name))


@dataclass(frozen=True, slots=True)
class IntervalPeak:
    start_s: float
    peak_mib: int
    samples: int


@dataclass(frozen=True, slots=True)
class WorkloadHistory:
    """Peaks per interval (oldest first) and the smallest GPU the workload was seen on."""

    intervals: tuple[IntervalPeak, ...] = ()
    gpu_memory_mib: int = 0

    def add(self, samples: Iterable[PodSample], now: float,
            config: RightsizingConfig) -> WorkloadHistory:
        """This history with ``samples`` folded in and intervals outside the window dropped."""
        fresh: dict[float, IntervalPeak] = {}
        gpu_mib = self.gpu_memory_mib
        for sample in samples:
            start = math.floor(sample.timestamp / config.interval_s) * config.interval_s
            old = fresh.get(start)
            fresh[start] = (IntervalPeak(start, sample.memory_used_mib, 1) if old is None else
                            IntervalPeak(start, max(old.peak_mib, sample.memory_used_mib),
                                         old.samples + 1))
            if sample.gpu_memory_mib > 0:
                gpu_mib = (sample.gpu_memory_mib if gpu_mib <= 0
                           else min(gpu_mib, sample.gpu_memory_mib))
        intervals = self.intervals
        oldest = now - config.window_s
        if not intervals or min(fresh, default=math.inf) >= intervals[-1].start_s:
            # Readings arrive in time order, each cycle's after the last: merge at the tail,
            # trim at the head (the history stays sorted), instead of re-sorting a week.
            merged = list(intervals)
            for start in sorted(fresh):
                new = fresh[start]
                if merged and merged[-1].start_s == start:
                    last = merged[-1]
                    new = IntervalPeak(start, max(last.peak_mib, new.peak_mib),
                                       last.samples + new.samples)
                    merged[-1] = new
                else:
                    merged.append(new)
            kept = tuple(p for p in merged if p.start_s + config.interval_s > oldest)
            return WorkloadHistory(kept, gpu_mib)
        peaks = {p.start_s: p for p in intervals}
        for start, new in fresh.items():
            old = peaks.get(start)
            peaks[start] = new if old is None else IntervalPeak(
                start, max(old.peak_mib, new.peak_mib), old.samples + new.samples)
        return WorkloadHistory(self.within(peaks.values(), now, config), gpu_mib)

    @staticmethod
    def within(peaks: Iterable[IntervalPeak], now: float,
               config: RightsizingConfig) -> tuple[IntervalPeak, ...]:
        oldest = now - config.window_s
        return tuple(sorted((p for p in peaks if p.start_s + config.interval_s > oldest),
                            key=lambda p: p.start_s))


@dataclass(frozen=True, slots=True)
class Recommendation:
    memory_mib: int
    milli: int
    peak_mib: int
    percentile_mib: int
    gpu_memory_mib: int
    samples: int
    intervals: int
    computed_at: float
    history: tuple[IntervalPeak, ...] = ()
    # A pod asking one whole GPU may be admitted as this share (enough history; see step 4).
    # Absent in older annotations: read as False, so they never turn a whole GPU into a share.
    whole_gpu: bool = False
    # The guard (step 5): the floor an overrun set and when, and until when new pods are
    # admitted as asked. 0 in older annotations: never raised.
    raised_mib: int = 0
    raised_at: float = 0.0
    hold_until: float = 0.0

    def held(self, now: float) -> bool:
        """New pods are admitted as their template asks (a cool-off after an overrun)."""
        return now < self.hold_until

    def why(self) -> str:
        raised = (f"; raised to at least {self.raised_mib} MiB after an overrun"
                  if self.raised_mib else "")
        return (f"percentile {self.percentile_mib} MiB + headroom = {self.memory_mib} MiB "
                f"({self.milli} milli of a {self.gpu_memory_mib} MiB GPU); peak "
                f"{self.peak_mib} MiB over {self.intervals} interval(s), {self.samples} "
                f"sample(s){raised}")


@dataclass(frozen=True, slots=True)
class Raise:
    """What the guard carries between cycles for one workload and version (step 5)."""

    raised_mib: int = 0
    raised_at: float = 0.0
    hold_until: float = 0.0

    @classmethod
    def of(cls, rec: Recommendation | None) -> Raise:
        return cls() if rec is None else cls(rec.raised_mib, rec.raised_at, rec.hold_until)

    def after_overrun(self, used_mib: int, now: float, config: RightsizingConfig) -> Raise:
        """This guard once a replica used ``used_mib`` past its share (or ran out) at ``now``."""
        floor = math.ceil(used_mib * (1.0 + config.oom_bump_fraction))
        return Raise(max(self.current(now, config), floor), now, now + config.oom_cooloff_s)

    def current(self, now: float, config: RightsizingConfig) -> int:
        """The floor still in force: a raise is kept for the window, like the history."""
        return self.raised_mib if self.raised_at + config.window_s > now else 0


def percentile(values: list[int], q: float) -> int:
    """The nearest-rank ``q`` quantile of ``values`` (non-empty): never below a value a
    fraction ``q`` of the samples reached, so p100 is the peak."""
    ordered = sorted(values)
    rank = max(math.ceil(q * len(ordered)), 1)
    return ordered[rank - 1]


def milli_for(memory_mib: int, gpu_memory_mib: int) -> int:
    """``memory_mib`` as thousandths of a GPU with ``gpu_memory_mib`` (rounded up, 1..1000)."""
    if gpu_memory_mib <= 0:
        return MILLI_PER_GPU
    return min(max(math.ceil(memory_mib * MILLI_PER_GPU / gpu_memory_mib), 1), MILLI_PER_GPU)


def recommend(history: WorkloadHistory, config: RightsizingConfig, now: float,
              guard: Raise | None = None) -> Recommendation | None:
    """The recommendation for ``history`` at ``now`` (at least what ``guard`` raised it to),
    or None with no sample in the window."""
    peaks = WorkloadHistory.within(history.intervals, now, config)
    if not peaks:
        return None
    values = [p.peak_mib for p in peaks]
    base = percentile(values, config.percentile)
    target = math.ceil(base * (1.0 + config.headroom_fraction)) + config.headroom_mib
    guard = guard or Raise()
    floor = guard.current(now, config)
    target = max(target, config.min_mib, floor)
    if config.max_mib:
        target = min(target, config.max_mib)
    if history.gpu_memory_mib > 0:
        target = min(target, history.gpu_memory_mib)
    return Recommendation(
        memory_mib=target, milli=milli_for(target, history.gpu_memory_mib),
        peak_mib=max(values), percentile_mib=base, gpu_memory_mib=history.gpu_memory_mib,
        samples=sum(p.samples for p in peaks), intervals=len(peaks), computed_at=now,
        history=peaks, whole_gpu=len(peaks) >= config.whole_gpu_min_intervals,
        raised_mib=floor, raised_at=guard.raised_at if floor else 0.0,
        hold_until=guard.hold_until)


# --------------------------------------------------------------- the controller's annotation


def version_key(model_version: str | None) -> str:
    return model_version or ANY_VERSION


def encode(recommendations: Mapping[str, Recommendation]) -> str:
    """The annotation value for ``recommendations`` (model version -> recommendation)."""
    doc = {"version": SCHEMA_VERSION, "recommendations": {
        key: {**{f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)
                 if f.name != "history"},
              "history": [[p.start_s, p.peak_mib, p.samples] for p in rec.history]}
        for key, rec in sorted(recommendations.items())}}
    return orjson.dumps(doc).decode()


_INT_FIELDS = ("memory_mib", "milli", "peak_mib", "percentile_mib", "gpu_memory_mib",
               "samples", "intervals")


def parse(text: str, *, source: str = "annotation gpufrag.io/gpu-recommendation"
          ) -> dict[str, Recommendation]:
    """Read an annotation value; BadInput names the JSON path of the first bad value."""
    doc = versioned_object(text, SCHEMA_VERSION, source=source)
    recs = doc.get("recommendations")
    if not isinstance(recs, dict):
        raise BadInput("expected an object", source=source, field="recommendations")
    out: dict[str, Recommendation] = {}
    for key, item in recs.items():
        out[str(key)] = _parse_one(item, f"recommendations.{key}", source)
    return out


def _parse_one(item: Any, path: str, source: str) -> Recommendation:
    if not isinstance(item, dict):
        raise BadInput("expected an object", source=source, field=path)
    values: dict[str, Any] = {}
    for name in _INT_FIELDS:
        value = item.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadInput(f"expected an integer >= 0, got {value!r}", source=source,
                           field=f"{path}.{name}")
        values[name] = value
    if values["milli"] > MILLI_PER_GPU:
        raise BadInput(f"{values['milli']} is above {MILLI_PER_GPU}", source=source,
                       field=f"{path}.milli")
    computed_at = item.get("computed_at")
    if not isinstance(computed_at, int | float) or isinstance(computed_at, bool) \
            or not math.isfinite(computed_at):
        raise BadInput(f"expected unix seconds, got {computed_at!r}", source=source,
                       field=f"{path}.computed_at")
    whole_gpu = item.get("whole_gpu", False)
    if not isinstance(whole_gpu, bool):
        raise BadInput(f"expected true or false, got {whole_gpu!r}", source=source,
                       field=f"{path}.whole_gpu")
    history = []
    raw = item.get("history", [])
    if not isinstance(raw, list):
        raise BadInput("expected an array", source=source, field=f"{path}.history")
    for i, entry in enumerate(raw):
        ok = (isinstance(entry, list) and len(entry) == 3
              and all(isinstance(v, int | float) and not isinstance(v, bool) for v in entry)
              and isinstance(entry[1], int) and isinstance(entry[2], int)
              and math.isfinite(entry[0]) and entry[1] >= 0 and entry[2] >= 1)
        if not ok:
            raise BadInput(f"expected [start_s, peak_mib, samples], got {entry!r}",
                           source=source, field=f"{path}.history[{i}]")
        history.append(IntervalPeak(float(entry[0]), entry[1], entry[2]))
    raised_mib = item.get("raised_mib", 0)
    if not isinstance(raised_mib, int) or isinstance(raised_mib, bool) or raised_mib < 0:
        raise BadInput(f"expected an integer >= 0, got {raised_mib!r}", source=source,
                       field=f"{path}.raised_mib")
    times: dict[str, float] = {}
    for name in ("raised_at", "hold_until"):
        value = item.get(name, 0.0)
        if not isinstance(value, int | float) or isinstance(value, bool) \
                or not math.isfinite(value) or value < 0:
            raise BadInput(f"expected unix seconds, got {value!r}", source=source,
                           field=f"{path}.{name}")
        times[name] = float(value)
    return Recommendation(**values, computed_at=float(computed_at),
                          history=tuple(sorted(history, key=lambda p: p.start_s)),
                          whole_gpu=whole_gpu, raised_mib=raised_mib,
                          raised_at=times["raised_at"], hold_until=times["hold_until"])


def update(text: str | None, samples_by_version: Mapping[str, list[PodSample]], now: float,
           config: RightsizingConfig, overruns: Mapping[str, int] | None = None
           ) -> tuple[str, dict[str, Recommendation]]:
    """Fold new samples into a controller's annotation (None or unreadable = start afresh).

    ``overruns``: per version, the most a replica used past its share (or ran out with) since
    the last cycle: the guard raises that version (step 5). Returns the new annotation value
    and the recommendations in it. A version whose samples all fell out of the window is
    dropped.
    """
    try:
        old = parse(text) if text else {}
    except BadInput:
        old = {}
    result: dict[str, Recommendation] = {}
    for key in sorted(set(old) | set(samples_by_version)):
        prev = old.get(key)
        history = (WorkloadHistory(prev.history, prev.gpu_memory_mib) if prev is not None
                   else WorkloadHistory())
        history = history.add(samples_by_version.get(key, ()), now, config)
        guard = Raise.of(prev)
        if overruns and key in overruns:
            guard = guard.after_overrun(overruns[key], now, config)
        rec = recommend(history, config, now, guard)
        if rec is not None:
            result[key] = rec
    return encode(result), result


def admitted_milli(recommendation: Recommendation, asked_milli: int) -> int:
    """The share a new pod asking ``asked_milli`` is admitted with in ``auto`` mode: the
    recommendation, never above what was asked, never below the peak seen in the window. The
    admission webhook applies it; the defrag controller plans right-sized moves with it."""
    floor = milli_for(recommendation.peak_mib, recommendation.gpu_memory_mib)
    return min(asked_milli, max(recommendation.milli, floor))


def whole_gpu_share(recommendation: Recommendation) -> int | None:
    """The share (milli) a pod asking one whole GPU is admitted with in ``auto`` mode, or None
    when it stays whole: too little history (``whole_gpu``), or a share that gives nothing
    back (the recommendation or the peak fills the GPU)."""
    if not recommendation.whole_gpu:
        return None
    milli = admitted_milli(recommendation, MILLI_PER_GPU)
    return milli if milli < MILLI_PER_GPU else None


def lookup(recommendations: Mapping[str, Recommendation],
           model_version: str | None) -> Recommendation | None:
    """The recommendation for a pod of ``model_version`` (its own, else the unversioned one)."""
    return recommendations.get(version_key(model_version)) or recommendations.get(ANY_VERSION)



def replacement_milli(recommendation: Recommendation, num_gpu: int, gpu_milli: int,
                      now: float) -> int | None:
    """The share a new pod asking ``num_gpu`` x ``gpu_milli`` is admitted with in ``auto``
    mode at ``now``, or None when right-sizing leaves it as asked (multi-GPU; one whole GPU
    the history does not yet allow to share; the guard's cool-off). The webhook applies it;
    the defrag planner plans with it."""
    if recommendation.held(now):
        return None
    if num_gpu == 1 and gpu_milli < MILLI_PER_GPU:
        return admitted_milli(recommendation, gpu_milli)
    if num_gpu == 1:
        return whole_gpu_share(recommendation)
    return None
