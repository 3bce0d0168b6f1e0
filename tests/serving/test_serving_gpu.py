"""The NVML probe and the per-batch memory-growth warning, driven by recorded readings."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from gpufrag.nvml import MIB, NvmlReader
from gpufrag.nvml_recorded import RecordedNvml
from serving.gpu import MemoryGrowthWatch, NvmlProbe, detect_gpus
from serving.testing import FakeBackend, rows

RECORDING = RecordedNvml.load(Path(__file__).parent / "data" / "nvml_2x_h100.json")


def probe_on(nvml: RecordedNvml) -> NvmlProbe:
    """A probe over an opened reader of ``nvml``, without detect_gpus's log lines."""
    reader = NvmlReader(nvml)
    reader.open()
    return NvmlProbe(reader)


def recording() -> RecordedNvml:
    """A fresh replay of the recording (each fake consumes its own copy of the samples)."""
    return RecordedNvml(RECORDING.devices)


def test_probe_reads_utilisation_and_memory_per_gpu() -> None:
    probe = probe_on(recording())
    first = probe.read()
    assert [r.index for r in first] == [0, 1]
    assert first[0].product == "NVIDIA H100 80GB HBM3"
    assert first[0].uuid.startswith("GPU-")
    assert first[0].utilization_ratio == pytest.approx(0.87)
    assert first[0].memory_used_bytes == 20 * 1024 * MIB
    assert first[0].memory_total_bytes == 85520809984


def test_detect_gpus_returns_a_probe_when_nvml_works() -> None:
    probe = detect_gpus(recording())
    assert probe is not None and probe.count == 2


@pytest.mark.parametrize(("nvml", "reason"), [
    (RecordedNvml(init_error="NVMLError_LibraryNotFound"), "NVML unavailable"),
    (RecordedNvml([]), "found no GPU devices"),
], ids=["no-library", "zero-devices"])
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
    watch = MemoryGrowthWatch(FakeBackend(), probe_on(recording()), threshold_mib=100)
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
    watch = MemoryGrowthWatch(backend, probe_on(recording()))
    assert watch.static_batch_size == 8 and watch.inputs == backend.inputs
    assert watch.infer(rows(1))["y"].shape == (1, 4)
    watch.close()
    assert backend.closed


def test_a_lost_gpu_is_skipped_and_logged_once() -> None:
    nvml = recording()
    probe = probe_on(nvml)
    for device in nvml.devices:
        device.errors["nvmlDeviceGetMemoryInfo"] = ["NVMLError_GpuIsLost"]
    with structlog.testing.capture_logs() as logs:
        assert probe.read() == [] and probe.read() == []
        assert probe.memory_used_bytes() == {}
    assert [entry["event"] for entry in logs] == ["gpu_read_failed"]


def test_only_the_lost_gpu_is_skipped() -> None:
    nvml = recording()
    probe = probe_on(nvml)
    nvml.devices[0].errors["nvmlDeviceGetUtilizationRates"] = ["NVMLError_GpuIsLost"]
    with structlog.testing.capture_logs() as logs:
        assert [r.index for r in probe.read()] == [1]
    assert logs[0]["gpu"] == 0 and "GPU is lost" in logs[0]["error"]


def test_the_per_batch_read_is_memory_only() -> None:
    nvml = recording()
    probe = probe_on(nvml)
    del nvml.calls[:]
    assert probe.memory_used_bytes() == {0: 20 * 1024 * MIB, 1: 4 * 1024 * MIB}
    assert nvml.calls == ["nvmlDeviceGetMemoryInfo"] * 2  # no identity, no process listing


def test_the_probe_closes_nvml() -> None:
    nvml = recording()
    probe_on(nvml).close()
    assert nvml.calls[-1] == "nvmlShutdown"
