"""Used GPU memory from DCGM through Prometheus (``--prometheus URL``).

dcgm-exporter publishes ``DCGM_FI_DEV_FB_USED`` (MiB) per GPU with labels ``gpu`` (index),
``UUID``, ``Hostname`` (the node) and, with its Kubernetes mapping on, ``pod``/``namespace`` —
renamed ``exported_pod``/``exported_namespace`` when Prometheus scrapes the exporter's own pod.
An instant query returns the query time, not the time of the sample, so staleness is read from a
second query, ``timestamp(DCGM_FI_DEV_FB_USED)``, joined on the labels. The peak over the
window, which the idle ratio reads (memory reserved and not touched), is a third,
``max_over_time(DCGM_FI_DEV_FB_USED[<window>s])``, joined the same way; a series without one
(newer than the window's first scrape) peaks at what it uses now.

The figures are per GPU (dcgm-exporter has no per-process memory): where several pods share a
GPU, its peak is shared out in proportion to their shares, which is never more than the sum
of their own peaks (they need not peak together), so a pod's idle memory can read higher
than the agent's per-pod figures would say. Prefer the agent where both run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests

from defrag.controller.errors import CycleStopped
from defrag.controller.snapshot import GpuSample

METRIC = "DCGM_FI_DEV_FB_USED"
NODE_LABELS = ("Hostname", "node", "kubernetes_node", "nodename")


def _series(payload: Mapping[str, Any], what: str) -> list[tuple[dict[str, str], float]]:
    if payload.get("status") != "success":
        raise CycleStopped(f"querying Prometheus for {what}",
                           f"{payload.get('errorType', 'error')}: {payload.get('error', payload)}")
    data = payload.get("data") or {}
    if data.get("resultType") != "vector":
        raise CycleStopped(f"querying Prometheus for {what}",
                           f"expected a vector, got {data.get('resultType')!r}")
    out = []
    for item in data.get("result") or []:
        metric = {str(k): str(v) for k, v in (item.get("metric") or {}).items()
                  if k != "__name__"}
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        out.append((metric, value))
    return out


def peak_query(window_s: float) -> str:
    return f"max_over_time({METRIC}[{int(window_s)}s])"


def samples_from(values: Mapping[str, Any], timestamps: Mapping[str, Any],
                 peaks: Mapping[str, Any] | None = None) -> list[GpuSample]:
    """Join the query answers into one sample per series (series without a node or GPU label,
    or without a timestamp, are dropped: they cannot be attributed)."""
    stamp_of = {frozenset(m.items()): ts for m, ts in _series(timestamps, f"timestamp({METRIC})")}
    peak_of = ({frozenset(m.items()): v for m, v in _series(peaks, f"the peak of {METRIC}")}
               if peaks is not None else {})
    out = []
    for metric, value in _series(values, METRIC):
        node = next((metric[k] for k in NODE_LABELS if metric.get(k)), "")
        stamp = stamp_of.get(frozenset(metric.items()))
        if not node or stamp is None or not metric.get("gpu", "").isdigit():
            continue
        out.append(GpuSample(
            node=node, gpu=int(metric["gpu"]), used_mib=value, timestamp=stamp,
            namespace=metric.get("exported_namespace") or metric.get("namespace", ""),
            pod=metric.get("exported_pod") or metric.get("pod", ""),
            peak_mib=peak_of.get(frozenset(metric.items()))))
    return out


def fetch_samples(base_url: str, *, peak_window_s: float, timeout_s: float = 10.0,
                  session: requests.Session | None = None) -> list[GpuSample]:
    """Query Prometheus at ``base_url`` (e.g. http://prometheus.monitoring:9090): used memory,
    its timestamps, and its peak over ``peak_window_s``."""
    http = session or requests.Session()
    answers = []
    for query in (METRIC, f"timestamp({METRIC})", peak_query(peak_window_s)):
        try:
            response = http.get(f"{base_url.rstrip('/')}/api/v1/query", params={"query": query},
                                timeout=timeout_s)
            answers.append(response.json())
        except (requests.RequestException, ValueError) as e:
            raise CycleStopped(f"querying Prometheus at {base_url} for {query}", str(e)) from None
    return samples_from(answers[0], answers[1], answers[2])
