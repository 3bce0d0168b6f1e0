"""The GenAI serving trace (cluster-trace-v2026-GenAI) as the event-driven replay reads it.

Four series, each through the traces' one bounded CSV reader (:func:`simulations.openb.read_rows`)
so a bad row is one ``BadInput`` naming file, row and field; each has a seeded stand-in of the
same shape for runs without the trace (``genai/`` absent from the data root,
:mod:`gpufrag.dataroot`):

- ``qps.csv`` -> the **demand curve**: requests per second summed over the trace's pods at each
  timestamp (57 s apart; ~22 h, a diurnal shape from 0.1 to 9.6 rps). Timestamps must be
  present and in order. The replay scales it so its peak is ``serving_peak_rps``.
- ``basemodel_update_latency_anon.csv`` -> **replica start times** (ms). The samples are
  bimodal: 1.3-9 s (weights already on the node) and 10-79 s (pulled and loaded): a replica on a
  node where its model version is warm draws from the first group, any other from the second.
- ``pod_gpu_duty_cycle_anon.csv`` -> how busy a trace pod's GPUs are (%), for GPU-hours used.
- ``lora_request_trace.csv`` -> **model-version popularity** (``checkpoint_model_version_id``):
  the serving Deployments are the most requested versions, their load split by request counts.
  Requests with no version recorded (25 of 26,823) are counted, not errors.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gpufrag.dataroot import data_root
from gpufrag.errors import BadInput
from simulations.openb import MAX_AMOUNT, amount, read_rows

FloatArray = npt.NDArray[np.float64]

# The default trace folder: under the data root, settled when the command starts.
DEFAULT_DIR = data_root() / "genai"
QPS_FILE = "qps.csv"
LATENCY_FILE = "basemodel_update_latency_anon.csv"
DUTY_FILE = "pod_gpu_duty_cycle_anon.csv"
REQUESTS_FILE = "lora_request_trace.csv"
# A load faster than this (ms) found the model's weights on the node already.
WARM_SPLIT_MS = 10_000.0
MAX_TIMESTAMP = MAX_AMOUNT
MAX_QPS = 10**9
MAX_LATENCY_MS = 10**9


@dataclass(frozen=True)
class ServingTrace:
    """What the replay needs of the GenAI trace (or of its synthetic stand-in)."""

    curve_t_s: FloatArray  # seconds from the first sample, ascending
    curve_rps: FloatArray  # cluster-wide requests per second from that time on
    cold_start_s: FloatArray  # start times of replicas whose model was not on the node
    warm_start_s: FloatArray  # ... whose model was
    duty: FloatArray  # GPU busy fraction samples, 0..1
    versions: tuple[str, ...]  # model versions, most requested first
    version_share: FloatArray  # request share of each (sums to 1)
    unversioned_requests: int = 0
    source: str = "synthetic"

    @cached_property
    def period_s(self) -> float:
        """The curve repeats after its last sample (plus one sampling step)."""
        if self.curve_t_s.size < 2:
            return 86_400.0
        step = float(np.median(np.diff(self.curve_t_s)))
        return float(self.curve_t_s[-1]) + step

    @cached_property
    def peak_rps(self) -> float:
        return float(self.curve_rps.max()) if self.curve_rps.size else 0.0

    def rps_at(self, t_s: float) -> float:
        """The curve's value at ``t_s`` (it repeats; the sample at or before ``t_s``)."""
        t = t_s % self.period_s
        i = int(np.searchsorted(self.curve_t_s, t, side="right")) - 1
        return float(self.curve_rps[max(i, 0)])

    def top(self, count: int) -> tuple[tuple[str, ...], FloatArray]:
        """The ``count`` most requested versions and their shares among them."""
        names = self.versions[:count]
        share = self.version_share[: len(names)]
        return names, share / share.sum()


def _timestamp(row: dict[str, str], source: str, number: int, previous: float) -> float:
    t = float(amount(row, "timestamp_anon", source, number, MAX_TIMESTAMP))
    if t < previous:
        raise BadInput(f"timestamp {row['timestamp_anon'].strip()} is before the previous row's "
                       f"{previous:.0f}; the series must be in time order", source=source,
                       row=number, field="timestamp_anon")
    return t


def read_demand(path: Path) -> tuple[FloatArray, FloatArray]:
    """(seconds from the first sample, summed rps) per distinct timestamp of ``qps.csv``."""
    source = str(path)
    totals: dict[float, float] = {}
    previous = -1.0
    for number, row in read_rows(path, ("timestamp_anon", "value")):
        t = _timestamp(row, source, number, previous)
        previous = t
        totals[t] = totals.get(t, 0.0) + float(amount(row, "value", source, number, MAX_QPS))
    if not totals:
        raise BadInput("no samples", source=source, row=2)
    times = np.array(list(totals))
    return times - times[0], np.array(list(totals.values()))


def read_values(path: Path, high: int) -> FloatArray:
    """The ``value`` column of a GenAI series, each in ``0..high``, timestamps in order."""
    source = str(path)
    values: list[float] = []
    previous = -1.0
    for number, row in read_rows(path, ("timestamp_anon", "value")):
        previous = _timestamp(row, source, number, previous)
        values.append(float(amount(row, "value", source, number, high)))
    if not values:
        raise BadInput("no samples", source=source, row=2)
    return np.array(values)


def read_versions(path: Path) -> tuple[Counter[str], int]:
    """Requests per model version in ``lora_request_trace.csv``, and those with none."""
    counts: Counter[str] = Counter()
    missing = 0
    for _, row in read_rows(path, ("checkpoint_model_version_id",)):
        version = row["checkpoint_model_version_id"].strip()
        if version:
            counts[version] += 1
        else:
            missing += 1
    if not counts:
        raise BadInput("no request names a checkpoint_model_version_id", source=str(path))
    return counts, missing


def _split_starts(latency_ms: FloatArray, source: str) -> tuple[FloatArray, FloatArray]:
    cold = latency_ms[latency_ms >= WARM_SPLIT_MS] / 1000.0
    warm = latency_ms[latency_ms < WARM_SPLIT_MS] / 1000.0
    if cold.size == 0 or warm.size == 0:
        raise BadInput(f"needs loads both under and over {WARM_SPLIT_MS / 1000:g} s (warm and "
                       "cold starts)", source=source)
    return cold, warm


def _ranked(counts: Counter[str]) -> tuple[tuple[str, ...], FloatArray]:
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    total = sum(counts.values())
    return tuple(k for k, _ in ranked), np.array([n / total for _, n in ranked])


def load_serving_trace(directory: Path) -> ServingTrace:
    """Read the four series from ``directory`` (the GenAI trace's layout)."""
    t, rps = read_demand(directory / QPS_FILE)
    cold, warm = _split_starts(read_values(directory / LATENCY_FILE, MAX_LATENCY_MS),
                               str(directory / LATENCY_FILE))
    duty = np.clip(read_values(directory / DUTY_FILE, 100) / 100.0, 0.0, 1.0)
    counts, missing = read_versions(directory / REQUESTS_FILE)
    versions, share = _ranked(counts)
    return ServingTrace(curve_t_s=t, curve_rps=rps, cold_start_s=cold, warm_start_s=warm,
                        duty=duty, versions=versions, version_share=share,
                        unversioned_requests=missing, source=str(directory))


def synthetic_serving_trace(seed: int = 0) -> ServingTrace:
    """A seeded stand-in with the trace's shape: a diurnal curve sampled every 57 s (peak
    9.6 rps, trough 0.1), bimodal start times fitted to the trace's two groups (warm
    lognormal median 2.6 s; cold median 30 s), busy fractions mostly idle with a tail (as the
    trace: median 0, 90th percentile 25%), and 87 versions with Zipf-like popularity."""
    rng = np.random.default_rng(seed + 23)
    t = np.arange(0.0, 22.3 * 3600.0, 57.0)
    phase = 2 * np.pi * t / (24 * 3600.0)
    rps = np.maximum(0.09, 4.9 + 4.7 * np.sin(phase + 0.3) + rng.normal(0, 0.4, t.size))
    cold = rng.lognormal(np.log(30.0), 0.35, 4800).clip(10.0, 80.0)
    warm = rng.lognormal(np.log(2.6), 0.3, 2700).clip(1.3, 9.9)
    duty = np.where(rng.random(20_000) < 0.6, 0.0, rng.beta(1.2, 3.5, 20_000))
    ranks = np.arange(1, 88)
    share = (1.0 / ranks) / (1.0 / ranks).sum()
    versions = tuple(f"M{i:04d}" for i in range(87))
    return ServingTrace(curve_t_s=t, curve_rps=rps, cold_start_s=cold, warm_start_s=warm,
                        duty=duty, versions=versions, version_share=share)
