"""The NVML probe and the per-batch memory-growth warning, driven by recorded readings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import structlog

from serving.gpu import MIB, MemoryGrowthWatch, NvmlProbe, detect_gpus
from serving.testing import FakeBackend, RecordedNvml, rows

RECORDING = json.loads((Path(__file__).parent / "data" / "nvml_2x_h100.json").read_text())


def test_probe_reads_utilisation_and_memory_per_gpu() -> None:
    probe = NvmlProbe(RecordedNvml(RECORDING))
    first = probe.read()
    assert [r.index for r in first] == [0, 1]
    assert first[0].name == "NVIDIA H100 80GB HBM3"
    assert first[0].uuid.startswith("GPU-")  # decoded from the bytes old pynvml returns
    assert first[0].utilization_ratio == pytest.approx(0.87)
    assert first[0].memory_used_bytes == 20 * 1024 * MIB
    assert first[0].memory_total_bytes == 85520809984


def test_detect_gpus_returns_a_probe_when_nvml_works() -> None:
    probe = detect_gpus(RecordedNvml(RECORDING))
    assert probe is not None and probe.count == 2


@pytest.mark.parametrize(("nvml", "reason"), [
    (RecordedNvml(fail_init="NVML Shared Library Not Found"), "NVML unavailable"),
    (RecordedNvml({"devices": []}), "found no GPU devices"),
])
def test_no_gpu_is_one_clear_log_line_and_no_probe(nvml: RecordedNvml, reason: str) -> None:
    with structlog.testing.capture_logs() as logs:
        assert detect_gpus(nvml) is None
    assert len(logs) == 1 and logs[0]["event"] == "no_gpu" and reason in logs[0]["reason"]


def test_detect_gpus_on_this_machine_does_not_raise() -> None:
    """Here (CI, no GPU) this says so and returns None; on a GPU node it returns a probe."""
    probe = detect_gpus()
    if probe is not None:
        assert probe.count >= 1 and probe.read()
        probe.close()


def test_memory_growth_over_threshold_across_a_batch_is_a_warning() -> None:
    # Memory reads: GPU0 20 GiB -> 20 GiB (+0) on batch one, then +20 MiB; GPU1 +0 then +300 MiB.
    watch = MemoryGrowthWatch(FakeBackend(), NvmlProbe(RecordedNvml(RECORDING)),
                              threshold_mib=100)
    with structlog.testing.capture_logs() as logs:
        watch.infer(rows(2))
        assert logs == []
        watch.infer(rows(2))
    warnings = [entry for entry in logs if entry["event"] == "gpu_memory_growth"]
    assert len(warnings) == 1 and watch.warnings == 1
    assert warnings[0]["gpu"] == 1 and warnings[0]["grew_mib"] == 300.0
    assert warnings[0]["log_level"] == "warning" and warnings[0]["batch_rows"] == 2


def test_memory_watch_passes_the_backend_through() -> None:
    backend = FakeBackend(static_batch_size=8)
    watch = MemoryGrowthWatch(backend, NvmlProbe(RecordedNvml(RECORDING)))
    assert watch.static_batch_size == 8 and watch.inputs == backend.inputs
    assert watch.infer(rows(1))["y"].shape == (1, 4)
    watch.close()
    assert backend.closed


class _FlakyNvml(RecordedNvml):
    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        raise RecordedNvml.NVMLError("GPU is lost")


def test_a_lost_gpu_is_skipped_and_logged_once() -> None:
    probe = NvmlProbe(_FlakyNvml(RECORDING))
    with structlog.testing.capture_logs() as logs:
        assert probe.read() == [] and probe.read() == []
    assert [entry["event"] for entry in logs] == ["gpu_read_failed"]
