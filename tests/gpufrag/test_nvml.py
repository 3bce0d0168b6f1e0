from __future__ import annotations

import inspect
import re
from typing import Any

import pytest

from gpufrag.nvml import (
    MIB,
    GpuReadError,
    GpuReading,
    NoGpuError,
    NvmlApi,
    NvmlReader,
    ProcessReading,
    detect,
    load_pynvml,
)
from gpufrag.nvml_recorded import RecordedNvml
from tests.node.agent.fakes import build_gpu, fake_nvml, recorded_devices


def test_reads_every_gpu_and_its_processes_in_mib() -> None:
    with NvmlReader(fake_nvml()) as reader:
        assert reader.device_count == 2
        gpu0, gpu1 = reader.read()
    assert gpu0 == GpuReading(
        index=0,
        uuid="GPU-5a3c9f1e-7b2d-4c8e-9f01-23456789abcd",
        product="NVIDIA A100-SXM4-80GB",
        memory_used_bytes=30_512 * MIB + 123_456,
        memory_total_bytes=81_920 * MIB,
        utilization_pct=63,
        processes=(ProcessReading(4242, 20_000 * MIB), ProcessReading(5151, 10_000 * MIB)),
    )
    assert gpu0.memory_used_mib == 30_512  # 30512 MiB + 123456 bytes, floored
    assert gpu0.memory_total_mib == 81_920
    assert [p.memory_used_mib for p in gpu0.processes] == [20_000, 10_000]
    # Compute and graphics processes together, sorted by pid.
    assert gpu1.processes == (ProcessReading(6060, 12_000 * MIB), ProcessReading(7070, 256 * MIB))
    assert gpu1.utilization_pct == 17


def test_a_process_in_both_lists_is_counted_once() -> None:
    device = build_gpu("GPU-x", used_bytes=2048 * MIB, compute=[(10, 1024 * MIB)],
                       graphics=[(10, 1024 * MIB), (11, None)])
    with NvmlReader(fake_nvml([device])) as reader:
        (gpu,) = reader.read()
    # pid 11: the driver could not say (usedGpuMemory None) -> listed with 0.
    assert gpu.processes == (ProcessReading(10, 1024 * MIB), ProcessReading(11, 0))


def test_bytes_from_older_pynvml_are_decoded() -> None:
    device = build_gpu(b"GPU-bytes", name=b"Tesla T4")
    with NvmlReader(fake_nvml([device])) as reader:
        (gpu,) = reader.read()
    assert (gpu.uuid, gpu.product) == ("GPU-bytes", "Tesla T4")


def test_unsupported_utilisation_and_process_lists_degrade_to_zero_and_empty() -> None:
    device = build_gpu("GPU-mig", utilization_pct=50, compute=[(1, MIB)], errors={
        "nvmlDeviceGetUtilizationRates": ["NVMLError_NotSupported"],
        "nvmlDeviceGetComputeRunningProcesses": ["NVMLError_NotSupported"],
    })
    with NvmlReader(fake_nvml([device])) as reader:
        (gpu,) = reader.read()
    assert gpu.utilization_pct == 0
    assert gpu.processes == ()


@pytest.mark.parametrize(("call", "says"), [
    ("nvmlDeviceGetMemoryInfo", "GPU 1: reading identity/memory failed: GPU is lost"),
    ("nvmlDeviceGetUtilizationRates", "GPU 1: reading utilisation failed"),
    ("nvmlDeviceGetGraphicsRunningProcesses", "GPU 1: listing processes failed"),
])
def test_a_failing_call_names_the_gpu(call: str, says: str) -> None:
    devices = recorded_devices()
    devices[1].errors[call] = ["NVMLError_GpuIsLost"]
    with (NvmlReader(fake_nvml(devices)) as reader,
          pytest.raises(GpuReadError, match=re.escape(says))):
        reader.read()


@pytest.mark.parametrize(("error", "says"), [
    ("NVMLError_LibraryNotFound", "libnvidia-ml.so.1"),
    ("NVMLError_DriverNotLoaded", "driver not loaded"),
])
def test_no_library_or_driver_is_no_gpu(error: str, says: str) -> None:
    fake = fake_nvml(init_error=error)
    with pytest.raises(NoGpuError, match=re.escape(says)):
        NvmlReader(fake).open()
    assert fake.calls == ["nvmlInit"]  # nothing to shut down


def test_zero_devices_is_no_gpu_and_shuts_nvml_down() -> None:
    fake = fake_nvml([])
    with pytest.raises(NoGpuError, match="zero GPUs"):
        NvmlReader(fake).open()
    assert fake.calls[-1] == "nvmlShutdown"


def test_other_init_failures_are_faults_not_no_gpu() -> None:
    with pytest.raises(GpuReadError, match="initialisation failed: Insufficient Permissions"):
        NvmlReader(fake_nvml(init_error="NVMLError_NoPermission")).open()


def test_read_before_open_says_so() -> None:
    with pytest.raises(GpuReadError, match="not open"):
        NvmlReader(fake_nvml()).read()


def test_close_is_idempotent() -> None:
    fake = fake_nvml()
    reader = NvmlReader(fake)
    reader.open()
    reader.close()
    reader.close()
    assert fake.calls.count("nvmlShutdown") == 1


def test_real_pynvml_has_every_call_the_protocol_names() -> None:
    api = load_pynvml()
    names = [n for n, _ in inspect.getmembers(NvmlApi) if n.startswith("nvml")]
    assert len(names) == 26  # 10 whole-GPU calls + 8 MIG reads + 8 MIG writes
    for name in names:
        assert callable(getattr(api, name)), name


def test_units_are_bytes_with_mib_and_ratio_derived() -> None:
    reading = GpuReading(index=0, uuid="GPU-a", product="p", memory_used_bytes=3 * MIB - 1,
                         memory_total_bytes=16 * MIB, utilization_pct=45)
    assert (reading.memory_used_mib, reading.memory_total_mib) == (2, 16)  # floored
    assert reading.utilization_ratio == 0.45
    assert ProcessReading(1, MIB + 1).memory_used_mib == 1


def test_one_gpu_and_memory_alone_can_be_read() -> None:
    fake = fake_nvml()
    with NvmlReader(fake) as reader:
        assert reader.read_gpu(1, processes=False).processes == ()
        assert reader.read_gpu(1).processes != ()
        del fake.calls[:]
        memory = reader.read_memory(0)
        assert fake.calls == ["nvmlDeviceGetMemoryInfo"]  # one call: no identity, no processes
        with pytest.raises(IndexError, match="GPU 2 does not exist"):
            reader.read_memory(2)
    assert (memory.index, memory.memory_used_mib, memory.memory_total_mib) == (0, 30_512, 81_920)


def test_inventory_names_every_gpu_without_reading_memory() -> None:
    fake = fake_nvml()
    with NvmlReader(fake) as reader:
        gpus = reader.inventory()
    assert [(g.index, g.product) for g in gpus] == [(0, "NVIDIA A100-SXM4-80GB"),
                                                    (1, "NVIDIA A100-SXM4-80GB")]
    assert gpus[0].uuid == "GPU-5a3c9f1e-7b2d-4c8e-9f01-23456789abcd"
    assert "nvmlDeviceGetMemoryInfo" not in fake.calls


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append(("info", event, fields))

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append(("warning", event, fields))


def test_detect_returns_an_open_reader_and_says_what_it_found() -> None:
    log = _Log()
    reader = detect(fake_nvml(), log=log)
    assert reader is not None and len(reader.read()) == 2
    reader.close()
    ((level, event, fields),) = log.lines
    assert (level, event, fields["count"]) == ("info", "gpus_found", 2)


@pytest.mark.parametrize(("nvml", "level", "event", "says"), [
    (fake_nvml(init_error="NVMLError_LibraryNotFound"), "info", "no_gpu", "libnvidia-ml.so.1"),
    (fake_nvml([]), "info", "no_gpu", "zero GPUs"),
    (fake_nvml(init_error="NVMLError_NoPermission"), "warning", "nvml_failed",
     "Insufficient Permissions"),
], ids=["no-library", "zero-devices", "no-permission"])
def test_detect_without_a_usable_gpu_is_one_line_and_none(
        nvml: RecordedNvml, level: str, event: str, says: str) -> None:
    log = _Log()
    assert detect(nvml, log=log, effect="CPU only") is None
    ((got_level, got_event, fields),) = log.lines
    assert (got_level, got_event, fields["effect"]) == (level, event, "CPU only")
    assert says in fields.get("reason", fields.get("error", ""))


def test_detect_closes_nvml_when_the_inventory_fails() -> None:
    devices = recorded_devices()
    devices[0].errors["nvmlDeviceGetName"] = ["NVMLError_GpuIsLost"]
    fake = fake_nvml(devices)
    assert detect(fake, log=_Log()) is None
    assert fake.calls[-1] == "nvmlShutdown"
