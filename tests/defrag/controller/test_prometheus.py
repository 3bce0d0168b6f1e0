"""DCGM samples from Prometheus answers (recorded shapes, parsed without a server)."""

from __future__ import annotations

from typing import Any

import pytest

from defrag.controller.errors import CycleStopped
from defrag.controller.prometheus import peak_query, samples_from
from defrag.controller.snapshot import GpuSample


def vector(*series: tuple[dict[str, str], float]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_FB_USED", **m}, "value": [1700000000.0, str(v)]}
        for m, v in series]}}


def stamps(*series: tuple[dict[str, str], float]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [1700000000.0, str(ts)]} for m, ts in series]}}


GPU0 = {"gpu": "0", "UUID": "GPU-a", "Hostname": "node-1", "exported_pod": "web-0",
        "exported_namespace": "serving", "pod": "dcgm-exporter-x", "namespace": "gpu"}
GPU1 = {"gpu": "1", "UUID": "GPU-b", "node": "node-1"}
NO_NODE = {"gpu": "2", "UUID": "GPU-c"}


def test_values_join_their_timestamps() -> None:
    samples = samples_from(vector((GPU0, 4096), (GPU1, 10), (NO_NODE, 1)),
                           stamps((GPU0, 1699999990.5), (GPU1, 1699999000.0)))
    assert samples == [
        GpuSample("node-1", 0, 4096.0, 1699999990.5, "serving", "web-0"),
        GpuSample("node-1", 1, 10.0, 1699999000.0, "", ""),
    ]


def test_the_peak_over_the_window_joins_its_series() -> None:
    samples = samples_from(vector((GPU0, 4096), (GPU1, 10)),
                           stamps((GPU0, 1699999990.5), (GPU1, 1699999000.0)),
                           vector((GPU0, 9000)))  # GPU1's series is newer than the window
    assert [(s.gpu, s.peak_mib) for s in samples] == [(0, 9000.0), (1, None)]
    assert peak_query(86400) == "max_over_time(DCGM_FI_DEV_FB_USED[86400s])"


def test_an_error_answer_stops_the_cycle() -> None:
    with pytest.raises(CycleStopped, match="bad_data: parse error"):
        samples_from({"status": "error", "errorType": "bad_data", "error": "parse error"},
                     stamps())
