"""Right-sizing in the defrag what-if: per-pod GPU memory over time -> recommendations -> shares.

The cluster's loop, replayed with its own code:

1. **Readings.** Every GPU pod of the what-if is given one container of the GenAI trace's
   ``pod_gpu_memory_used_bytes`` (seeded), aligned so the container's first sample is the
   what-if's time 0. A sample is read as a fraction of a ``gpu_gib`` GPU (the trace's pods each
   hold one whole GPU; see :mod:`simulations.defrag_whatif`) and the pod uses that fraction of
   what it reserved when the cluster was filled, in MiB per GPU. After a container's last sample
   its last value holds. Without the trace, :func:`synthetic_memory_trace` stands in.
2. **Recommendations.** The controller folds each workload's readings into the recommender's
   history (:class:`defrag.rightsizing.recommender.WorkloadHistory`: one peak per interval) and
   recommends with :func:`~defrag.rightsizing.recommender.recommend` — the same functions
   ``gpufrag defrag`` runs. In the openb trace every pod is its own workload.
3. **Admission.** A replacement is the workload's template, so it asks what the pod first
   asked; the webhook's rule (:func:`defrag.admission.mutate.decide`, given the workload's mode
   and recommendation annotations exactly as the controller publishes them) says what share it
   is admitted with: a share below one GPU is right-sized, and a pod asking one whole GPU
   becomes a share once its history allows it (``whole_gpu_min_intervals`` hourly peaks, the
   recommender's default of a day unless the config says otherwise); multi-GPU pods keep what
   they ask.

Histories are kept only for single-GPU pods: for a multi-GPU pod the webhook's answer is
"multi-GPU pods stay whole" whatever the recommendation, so its history would change nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from defrag.admission.mutate import decide
from defrag.rightsizing.recommender import (
    ANY_VERSION,
    Mode,
    PodSample,
    Raise,
    Recommendation,
    RightsizingConfig,
    WorkloadHistory,
    encode,
    recommend,
    replacement_milli,
)
from defrag.rightsizing.workloads import Workload
from gpufrag.conventions import DEFAULT_NAMES, KubeNames
from gpufrag.errors import BadInput
from scheduler.core.types import MILLI_PER_GPU, PodRequest
from simulations.openb import MAX_AMOUNT, amount, read_rows

FloatArray = npt.NDArray[np.float64]
BYTES_PER_GIB = 1024**3
MAX_SAMPLE_BYTES = 2**63
# The synthetic stand-in: a per-container level drawn from a Beta fitted to the GenAI trace's
# fractions (mean 0.48, sd 0.10) and a daily swing that puts the mean at about 0.65 x the peak,
# as the trace's containers have it (median mean/peak 0.63).
SYNTHETIC_BETA = (10.8, 11.7)
SYNTHETIC_SWING = 0.35


@dataclass(frozen=True)
class MemoryTrace:
    """Per container: sample times (seconds since its first sample, ascending) and the used
    fraction of the trace's GPU at each (0..1)."""

    t_s: tuple[FloatArray, ...]
    fraction: tuple[FloatArray, ...]
    source: str = "synthetic"

    @property
    def containers(self) -> int:
        return len(self.t_s)

    def at(self, container: int, t_s: float) -> float:
        """The container's fraction at ``t_s`` (its last sample at or before; the first before
        it started)."""
        times = self.t_s[container]
        i = int(np.searchsorted(times, t_s, side="right")) - 1
        return float(self.fraction[container][max(i, 0)])

    def between(self, container: int, start_s: float, end_s: float
                ) -> tuple[FloatArray, FloatArray]:
        """The samples with ``start_s < t <= end_s`` (times, fractions)."""
        times = self.t_s[container]
        lo = int(np.searchsorted(times, start_s, side="right"))
        hi = int(np.searchsorted(times, end_s, side="right"))
        return times[lo:hi], self.fraction[container][lo:hi]


def read_memory_trace(path: Path, gpu_gib: float) -> MemoryTrace:
    """The GenAI trace's per-container series, each sample as a fraction of a ``gpu_gib`` GPU
    (capped at 1). Read with the traces' one bounded CSV reader; a sample must be a finite
    number of bytes in 0..2^63, a timestamp a finite number of seconds. Rows without a
    ``container_ip`` form one series."""
    source = str(path)
    by_container: dict[str, list[tuple[float, float]]] = {}
    for number, row in read_rows(path, ("timestamp_anon", "value")):
        t = float(amount(row, "timestamp_anon", source, number, MAX_AMOUNT))
        value = float(amount(row, "value", source, number, MAX_SAMPLE_BYTES))
        by_container.setdefault(row.get("container_ip") or "", []).append((t, value))
    if not by_container:
        raise BadInput("no samples", source=source)
    times: list[FloatArray] = []
    fractions: list[FloatArray] = []
    for name in sorted(by_container):
        samples = np.array(sorted(by_container[name]))
        times.append(samples[:, 0] - samples[0, 0])
        fractions.append(np.clip(samples[:, 1] / (gpu_gib * BYTES_PER_GIB), 0.0, 1.0))
    return MemoryTrace(tuple(times), tuple(fractions), source="genai trace")


def synthetic_memory_trace(seed: int = 0, *, containers: int = 64, hours: float = 24.0,
                           step_s: float = 60.0) -> MemoryTrace:
    """A seeded stand-in of the trace's shape: per container a level (the Beta fitted to the
    trace) swinging over a day with a random phase, plus a little noise."""
    rng = np.random.default_rng(seed + 11)
    t = np.arange(0.0, hours * 3600.0, step_s)
    times: list[FloatArray] = []
    fractions: list[FloatArray] = []
    for _ in range(containers):
        level = rng.beta(*SYNTHETIC_BETA)
        phase = rng.uniform(0.0, 2 * math.pi)
        swing = 1.0 + SYNTHETIC_SWING * np.sin(2 * math.pi * t / 86400.0 + phase)
        noise = rng.normal(0.0, 0.02, size=t.size)
        times.append(t.copy())
        fractions.append(np.clip(level * swing + noise, 0.0, 1.0))
    a, b = SYNTHETIC_BETA
    return MemoryTrace(tuple(times), tuple(fractions), source=f"synthetic Beta({a}, {b}) "
                       f"with a daily swing of {SYNTHETIC_SWING:.0%}")


def tiled(trace: MemoryTrace, until_s: float) -> MemoryTrace:
    """``trace`` with each container's series repeated back to back until ``until_s``: the
    GenAI containers cover about a day, a what-if over days reads each as a workload whose day
    repeats (a lap is the container's span plus one median sample step)."""
    times: list[FloatArray] = []
    fractions: list[FloatArray] = []
    for t, f in zip(trace.t_s, trace.fraction, strict=True):
        step = float(np.median(np.diff(t))) if t.size > 1 else 60.0
        lap = float(t[-1] - t[0]) + step
        laps = max(1, math.ceil(until_s / lap))
        times.append(np.concatenate([t + k * lap for k in range(laps)]))
        fractions.append(np.tile(f, laps))
    return MemoryTrace(tuple(times), tuple(fractions), source=f"{trace.source}, repeated")


@dataclass
class _Tracked:
    container: int
    scale_mib: float  # what the pod reserved per GPU when it was first placed
    asked_milli: int  # its template's ask per GPU if single-GPU (1000: one whole GPU); else 0
    since_s: float = -math.inf  # when it started (the fill's pods: before the trace)
    history: WorkloadHistory = field(default_factory=WorkloadHistory)
    recommendation: Recommendation | None = None
    guard: Raise = field(default_factory=Raise)
    raises: int = 0  # times the guard raised it (a sample over the share it held)
    raised_share_mib: float | None = None  # the share it held when first raised


@dataclass
class OverShare:
    """Out of sample: each reading judged against the share the pod held when it was taken
    (a share set from earlier readings). ``samples`` counts the readings of pods holding less
    than they first asked (right-sized); ``over`` those above the share held."""

    samples: int = 0
    over: int = 0
    raised: int = 0  # workloads the guard raised
    # Workloads over their share again after a raise, in a replica admitted since (the one
    # that overran keeps its share until it is replaced: that is not a second overrun).
    over_again: int = 0

    @property
    def ratio(self) -> float:
        return self.over / self.samples if self.samples else 0.0


class Rightsizing:
    """Readings, recommendations and admitted shares for the what-if's pods (see the module
    docstring). ``mode`` is every workload's ``gpufrag.io/rightsizing-mode``."""

    def __init__(self, trace: MemoryTrace, *, mode: Mode = Mode.AUTO,
                 config: RightsizingConfig | None = None, names: KubeNames = DEFAULT_NAMES,
                 seed: int = 0, count_skips: bool = True) -> None:
        self.trace = trace
        self.mode = mode
        # False: admitted shares straight from the webhook's share rule, without the annotation
        # round trip that names each skip reason (a what-if over days asks thousands a cycle).
        self.count_skips = count_skips
        self.config = (config or RightsizingConfig()).validated()
        self.names = names
        self.rng = np.random.default_rng(seed + 7)
        self.pods: dict[str, _Tracked] = {}
        self.observed_until_s = -math.inf
        self.skips: dict[str, int] = {}
        self.over_share = OverShare()
        self.overran: set[str] = set()  # pods with a reading above their share at the last observe

    def track(self, key: str, request: PodRequest, gpu_memory_mib: float, *,
              since_s: float = -math.inf) -> None:
        """Give a newly placed GPU pod its container and the reservation its use scales with;
        ``since_s``: when it started (its peaks count from then)."""
        if key in self.pods or not request.wants_gpu:
            return
        container = int(self.rng.integers(0, self.trace.containers))
        scale = request.gpu_milli / MILLI_PER_GPU * gpu_memory_mib
        self.pods[key] = _Tracked(container, scale,
                                  request.gpu_milli if request.num_gpu == 1 else 0,
                                  since_s=since_s)

    def restarted(self, key: str, now_s: float) -> None:
        """A new replica of ``key``'s workload started at ``now_s``: its peaks count from then
        (its history, recommendation and guard are the workload's and stay)."""
        pod = self.pods.get(key)
        if pod is not None:
            pod.since_s = now_s

    def forget(self, key: str) -> None:
        """``key``'s workload ended: nothing more to read or recommend."""
        self.pods.pop(key, None)

    def asked_milli(self, key: str) -> int:
        """What ``key``'s template asks per GPU if it is a tracked single-GPU pod, else 0."""
        pod = self.pods.get(key)
        return pod.asked_milli if pod is not None else 0

    def has_recommendation(self, key: str) -> bool:
        """Whether ``key``'s workload has a recommendation yet (without one, its replacements
        are admitted at the template's ask)."""
        pod = self.pods.get(key)
        return pod is not None and pod.recommendation is not None

    def used_mib(self, key: str, t_s: float) -> float:
        pod = self.pods[key]
        return self.trace.at(pod.container, t_s) * pod.scale_mib

    def peak_mib(self, key: str, t_s: float) -> float:
        """The most the pod used at any sample over the recommender's window up to ``t_s``
        (since it started): what the node agent publishes as its ``peak_mib``."""
        pod = self.pods[key]
        start = max(pod.since_s, t_s - self.config.window_s)
        _, fractions = self.trace.between(pod.container, start, t_s)
        now = self.trace.at(pod.container, t_s)
        return max(float(fractions.max()) if fractions.size else now, now) * pod.scale_mib

    def observe(self, until_s: float, gpu_memory_mib: Mapping[str, float],
                share_mib: Mapping[str, float] | None = None) -> None:
        """Fold every single-GPU pod's readings since the last call (up to ``until_s``) into its
        workload's history and recommend; ``gpu_memory_mib`` is the GPU each pod is on and
        ``share_mib`` what it reserves there now. A reading above that share is an overrun:
        counted (:attr:`over_share`) and, as the controller does, the guard raises the
        workload (:meth:`defrag.rightsizing.recommender.Raise.after_overrun`)."""
        start = self.observed_until_s
        shares = share_mib or {}
        self.overran = set()
        for key, pod in self.pods.items():
            if not pod.asked_milli or key not in gpu_memory_mib:
                continue
            times, fractions = self.trace.between(pod.container, start, until_s)
            gpu_mib = int(gpu_memory_mib[key])
            used = (fractions * pod.scale_mib).astype(np.int64)
            share = shares.get(key)
            # Right-sized: holding less than its template asks on this GPU (a pod on a smaller
            # GPU than it first had holds less memory, but it is not right-sized).
            asked_mib = pod.asked_milli / MILLI_PER_GPU * gpu_mib
            if share is not None and share < min(pod.scale_mib, asked_mib) and used.size:
                over = used[used > share]
                self.over_share.samples += int(used.size)
                self.over_share.over += int(over.size)
                if over.size:
                    self.overran.add(key)
                    if pod.raised_share_mib is None:
                        self.over_share.raised += 1
                        pod.raised_share_mib = share
                    elif share != pod.raised_share_mib:
                        self.over_share.over_again += 1
                        pod.raised_share_mib = share
                    pod.raises += 1
                    pod.guard = pod.guard.after_overrun(int(over.max()), until_s, self.config)
            pod.history = pod.history.add(self._interval_peaks(key, times, used, gpu_mib),
                                          until_s, self.config)
            pod.recommendation = recommend(pod.history, self.config, until_s, pod.guard)
        self.observed_until_s = until_s

    def _interval_peaks(self, key: str, times: FloatArray, used: npt.NDArray[np.int64],
                        gpu_mib: int) -> list[PodSample]:
        """One reading per history interval, its largest (what the history keeps of them: the
        node agent's peak), so a day of minute samples folds as 24 readings, not 1,440."""
        if not used.size:
            return []
        interval = self.config.interval_s
        buckets = np.floor(times / interval)
        ns, _, name = key.rpartition("/")
        out = []
        for bucket in np.unique(buckets):
            in_bucket = buckets == bucket
            i = int(np.argmax(np.where(in_bucket, used, -1)))
            out.append(PodSample(ns, name, key, int(used[i]), gpu_mib, float(times[i])))
        return out

    def workload(self, key: str) -> Workload:
        """The workload's controller as the webhook reads it: mode and recommendation
        annotations, as the controller publishes them."""
        pod = self.pods.get(key)
        annotations = {self.names.annotation_rightsizing_mode: self.mode.value}
        if pod is not None and pod.recommendation is not None:
            annotations[self.names.annotation_gpu_recommendation] = encode(
                {ANY_VERSION: pod.recommendation})
        ns, _, name = key.rpartition("/")
        return Workload("ReplicaSet", ns, f"owner-{name}", f"owner-{key}", annotations)

    def template(self, key: str, request: PodRequest) -> dict[str, Any]:
        """The pod its owner's template creates: what the pod first asked for."""
        pod = self.pods.get(key)
        asked = pod.asked_milli if pod is not None else 0
        limits = ({self.names.gpu_milli: str(asked)} if 0 < asked < MILLI_PER_GPU
                  else {self.names.gpu: str(request.num_gpu if not asked else 1)})
        ns, _, name = key.rpartition("/")
        return {"metadata": {"name": name, "namespace": ns, "labels": {}},
                "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}}

    def admitted_milli(self, key: str, request: PodRequest) -> int:
        """The share the webhook admits ``key``'s replacement with (0: as the template asks,
        or not a share); each skip reason is counted in :attr:`skips`, unless ``count_skips``
        is off: then the share is the one the webhook's rule gives (``decide`` applies
        :func:`~defrag.rightsizing.recommender.replacement_milli` to one GPU's ask, and keeps
        the ask when that is not smaller), read off the recommendation without encoding it."""
        pod = self.pods.get(key)
        if not self.count_skips:
            asked = pod.asked_milli if pod is not None else 0
            rec = pod.recommendation if pod is not None else None
            if self.mode is not Mode.AUTO or rec is None or not asked:
                return asked
            new = replacement_milli(rec, 1, asked, self.observed_until_s)
            return new if new is not None and new < asked else asked
        decision = decide(self.template(key, request), self.workload(key), self.names,
                          self.observed_until_s)
        if decision.change is None:
            reason = decision.skip or "unchanged"
            self.skips[reason] = self.skips.get(reason, 0) + 1
            return pod.asked_milli if pod is not None else 0
        return int(decision.change["to"])

    def rightsized(self, requests: Mapping[str, PodRequest]) -> dict[str, int]:
        """Pod key -> the share its replacement would get, for every single-GPU pod whose
        replacement would differ from what it holds now (``Snapshot.rightsized``)."""
        self.skips = {}
        out: dict[str, int] = {}
        for key, request in requests.items():
            pod = self.pods.get(key)
            if pod is None or not pod.asked_milli:
                continue
            milli = self.admitted_milli(key, request)
            if milli and milli != request.gpu_milli:
                out[key] = milli
        return out

    def sizable(self, requests: Mapping[str, PodRequest]) -> dict[str, tuple[str, bool]]:
        """Pod key -> (its workload, whether right-sizing may change its replacements: mode
        auto and one GPU), as the controller reports it (``Snapshot.sizable``)."""
        out: dict[str, tuple[str, bool]] = {}
        for key, request in requests.items():
            if not request.wants_gpu:
                continue
            multi = ", multi-GPU" if request.num_gpu > 1 else ""
            out[key] = (f"{self.workload(key).text} (mode {self.mode.value}{multi})",
                        self.mode is Mode.AUTO and request.num_gpu == 1)
        return out
