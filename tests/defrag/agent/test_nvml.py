from __future__ import annotations

import inspect
import re

import pytest

from defrag.agent.nvml import (
    GpuReadError,
    GpuReading,
    NoGpuError,
    NvmlApi,
    NvmlReader,
    ProcessReading,
    load_pynvml,
)
from tests.defrag.agent.fakes import MIB, FakeDevice, FakeNvml, nvml_error, recorded_devices


def test_reads_every_gpu_and_its_processes_in_mib() -> None:
    with NvmlReader(FakeNvml()) as reader:
        assert reader.device_count == 2
        gpu0, gpu1 = reader.read()
    assert gpu0 == GpuReading(
        index=0,
        uuid="GPU-5a3c9f1e-7b2d-4c8e-9f01-23456789abcd",
        product="NVIDIA A100-SXM4-80GB",
        memory_used_mib=30_512,  # 30512 MiB + 123456 bytes, floored
        memory_total_mib=81_920,
        utilization_pct=63,
        processes=(ProcessReading(4242, 20_000), ProcessReading(5151, 10_000)),
    )
    # Compute and graphics processes together, sorted by pid.
    assert gpu1.processes == (ProcessReading(6060, 12_000), ProcessReading(7070, 256))
    assert gpu1.utilization_pct == 17


def test_a_process_in_both_lists_is_counted_once() -> None:
    device = FakeDevice(uuid="GPU-x", used_bytes=2048 * MIB, compute=[(10, 1024 * MIB)],
                        graphics=[(10, 1024 * MIB), (11, None)])
    with NvmlReader(FakeNvml([device])) as reader:
        (gpu,) = reader.read()
    # pid 11: the driver could not say (usedGpuMemory None) -> listed with 0.
    assert gpu.processes == (ProcessReading(10, 1024), ProcessReading(11, 0))


def test_bytes_from_older_pynvml_are_decoded() -> None:
    device = FakeDevice(uuid=b"GPU-bytes", name=b"Tesla T4")
    with NvmlReader(FakeNvml([device])) as reader:
        (gpu,) = reader.read()
    assert (gpu.uuid, gpu.product) == ("GPU-bytes", "Tesla T4")


def test_unsupported_utilisation_and_process_lists_degrade_to_zero_and_empty() -> None:
    device = FakeDevice(uuid="GPU-mig", utilization_pct=50, compute=[(1, MIB)], errors={
        "nvmlDeviceGetUtilizationRates": nvml_error("NVMLError_NotSupported"),
        "nvmlDeviceGetComputeRunningProcesses": nvml_error("NVMLError_NotSupported"),
    })
    with NvmlReader(FakeNvml([device])) as reader:
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
    devices[1].errors[call] = nvml_error("NVMLError_GpuIsLost")
    with (NvmlReader(FakeNvml(devices)) as reader,
          pytest.raises(GpuReadError, match=re.escape(says))):
        reader.read()


@pytest.mark.parametrize(("error", "says"), [
    ("NVMLError_LibraryNotFound", "libnvidia-ml.so.1"),
    ("NVMLError_DriverNotLoaded", "driver not loaded"),
])
def test_no_library_or_driver_is_no_gpu(error: str, says: str) -> None:
    fake = FakeNvml(init_error=nvml_error(error))
    with pytest.raises(NoGpuError, match=re.escape(says)):
        NvmlReader(fake).open()
    assert fake.calls == ["nvmlInit"]  # nothing to shut down


def test_zero_devices_is_no_gpu_and_shuts_nvml_down() -> None:
    fake = FakeNvml([])
    with pytest.raises(NoGpuError, match="zero GPUs"):
        NvmlReader(fake).open()
    assert fake.calls[-1] == "nvmlShutdown"


def test_other_init_failures_are_faults_not_no_gpu() -> None:
    with pytest.raises(GpuReadError, match="initialisation failed: Insufficient Permissions"):
        NvmlReader(FakeNvml(init_error=nvml_error("NVMLError_NoPermission"))).open()


def test_read_before_open_says_so() -> None:
    with pytest.raises(GpuReadError, match="not open"):
        NvmlReader(FakeNvml()).read()


def test_close_is_idempotent() -> None:
    fake = FakeNvml()
    reader = NvmlReader(fake)
    reader.open()
    reader.close()
    reader.close()
    assert fake.calls.count("nvmlShutdown") == 1


def test_real_pynvml_has_every_call_the_protocol_names() -> None:
    api = load_pynvml()
    names = [n for n, _ in inspect.getmembers(NvmlApi) if n.startswith("nvml")]
    assert len(names) == 10
    for name in names:
        assert callable(getattr(api, name)), name
