"""The recorded NVML: the recording format, time moving with memory reads, scripted errors."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpufrag.errors import BadInput
from gpufrag.nvml import MIB, GpuReadError, NvmlApi, NvmlReader
from gpufrag.nvml_recorded import (
    CALL_HISTORY,
    DEVICE_CALLS,
    RecordedDevice,
    RecordedNvml,
    RecordedProcess,
    RecordedSample,
)

SERVING_RECORDING = Path(__file__).parents[1] / "serving" / "data" / "nvml_2x_h100.json"


def device(**overrides: Any) -> dict[str, Any]:
    """One device of a JSON recording, with keyword overrides."""
    raw: dict[str, Any] = {"name": "Tesla T4", "uuid": "GPU-t4", "memory_total": 16 * 1024 * MIB,
                           "samples": [{"gpu": 10, "memory_used": MIB}]}
    raw.update(overrides)
    return raw


def test_the_serving_recording_replays_through_the_reader() -> None:
    with NvmlReader(RecordedNvml.load(SERVING_RECORDING)) as reader:
        first = reader.read()
        assert [r.memory_used_bytes for r in first] == [21474836480, 4294967296]
        assert [r.utilization_pct for r in first] == [87, 12]
        for _ in range(5):
            last = reader.read()
    # Time moves one sample per memory read; the last sample repeats.
    assert [r.utilization_pct for r in last] == [91, 13]
    assert last[1].memory_used_bytes - first[1].memory_used_bytes == 300 * MIB


def test_processes_and_graphics_processes_come_from_the_recording() -> None:
    nvml = RecordedNvml.from_recording({"devices": [device(
        processes=[{"pid": 10, "used_bytes": 2 * MIB}],
        graphics_processes=[{"pid": 11, "used_bytes": None}])]})
    with NvmlReader(nvml) as reader:
        (gpu,) = reader.read()
    assert [(p.pid, p.memory_used_bytes) for p in gpu.processes] == [(10, 2 * MIB), (11, 0)]


def test_built_from_python_objects_and_copied() -> None:
    recorded = [RecordedDevice(name="A10", uuid="GPU-a", memory_total_bytes=24 * 1024 * MIB,
                               samples=[RecordedSample(5, MIB), RecordedSample(6, 2 * MIB)],
                               processes=[RecordedProcess(1, MIB)])]
    first, second = RecordedNvml(recorded), RecordedNvml(recorded)
    with NvmlReader(first) as reader:
        reader.read()
        assert reader.read()[0].memory_used_bytes == 2 * MIB
    with NvmlReader(second) as reader:  # the first replay did not consume the caller's samples
        assert reader.read()[0].memory_used_bytes == MIB
    assert len(recorded[0].samples) == 2


def test_an_error_script_takes_one_entry_per_call_and_repeats_the_last() -> None:
    nvml = RecordedNvml.from_recording({"devices": [device(errors={
        "nvmlDeviceGetMemoryInfo": [None, "NVMLError_GpuIsLost", None],
        "nvmlDeviceGetUtilizationRates": "NVMLError_NotSupported",
    })]})
    with NvmlReader(nvml) as reader:
        assert reader.read()[0].utilization_pct == 0  # NotSupported on every call
        with pytest.raises(GpuReadError, match="GPU 0: .* failed: GPU is lost"):
            reader.read()
        assert reader.read_memory(0).memory_used_bytes == MIB
        assert reader.read_memory(0).memory_used_bytes == MIB


def test_init_error_raises_the_real_pynvml_class() -> None:
    nvml = RecordedNvml.from_recording({"init_error": "NVMLError_DriverNotLoaded", "devices": []})
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        nvml.nvmlInit()


def test_calls_before_init_fail_like_nvml() -> None:
    nvml = RecordedNvml([RecordedDevice("T4", "GPU-t4", MIB, [RecordedSample(0, 0)])])
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(TypeError, match="not a handle"):
        nvml.nvmlDeviceGetName(0)


def test_the_call_history_stays_bounded() -> None:
    nvml = RecordedNvml([])
    nvml.nvmlInit()
    for _ in range(3 * CALL_HISTORY):
        nvml.nvmlDeviceGetCount()
    assert CALL_HISTORY <= len(nvml.calls) < 2 * CALL_HISTORY


@pytest.mark.parametrize(("recording", "field"), [
    ({"devices": {}}, "devices"),
    ({"devices": [device(samples=[])]}, "devices[0].samples"),
    ({"devices": [device(name="")]}, "devices[0].name"),
    ({"devices": [device(memory_total=True)]}, "devices[0].memory_total"),
    ({"devices": [device(samples=[{"gpu": 101, "memory_used": 0}])]}, "devices[0].samples[0].gpu"),
    ({"devices": [device(samples=[{"gpu": 1, "memory_used": 1 << 50}])]},
     "devices[0].samples[0].memory_used"),
    ({"devices": [device(processes=[{"pid": -1, "used_bytes": 0}])]},
     "devices[0].processes[0].pid"),
    ({"devices": [device(errors={"nvmlDeviceGetFanSpeed": "NVMLError_GpuIsLost"})]},
     "devices[0].errors"),
    ({"devices": [device(errors={"nvmlDeviceGetName": ["GpuIsLost"]})]},
     "devices[0].errors.nvmlDeviceGetName[0]"),
    ({"devices": [device(errors={"nvmlDeviceGetName": []})]},
     "devices[0].errors.nvmlDeviceGetName"),
    ({"init_error": "NVMLError_Nope", "devices": []}, "init_error"),
])
def test_a_bad_recording_names_the_field(recording: dict[str, Any], field: str) -> None:
    with pytest.raises(BadInput) as caught:
        RecordedNvml.from_recording(recording, source="rec.json")
    assert (caught.value.source, caught.value.field) == ("rec.json", field)


def test_a_bad_file_says_which(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    path.write_text("{")
    with pytest.raises(BadInput, match="rec.json: not JSON"):
        RecordedNvml.load(path)
    with pytest.raises(BadInput, match="cannot read"):
        RecordedNvml.load(tmp_path / "missing.json")
    path.write_text(json.dumps({"devices": [device()]}))
    assert RecordedNvml.load(path).devices[0].name == "Tesla T4"


def test_a_deeply_nested_file_is_bad_input_not_a_recursion_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"devices": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(BadInput, match="deep.json: not JSON: depth limit"):
        RecordedNvml.load(path)


def test_it_answers_every_call_the_protocol_names() -> None:
    names = {n for n, _ in inspect.getmembers(NvmlApi) if n.startswith("nvml")}
    assert names <= {n for n in dir(RecordedNvml) if n.startswith("nvml")}
    assert set(DEVICE_CALLS) == names - {"nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount"}
