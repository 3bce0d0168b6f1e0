"""NVML's MIG calls through the adapter and the recorded fake: instances with their placement,
processes read once on their instance, no GPU-level utilisation passed off as idle."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpufrag.errors import BadInput
from gpufrag.nvml import MIB, GpuReadError, MigReading, NvmlReader, ProcessReading
from gpufrag.nvml_recorded import RecordedNvml
from tests.node.agent.fakes import fake_nvml

DATA = Path(__file__).parents[1] / "node" / "agent" / "data"
A100_MIG = DATA / "nvml_a100_80gb_mig.json"
H100_MIG = DATA / "nvml_h100_80gb_mig.json"


def recording(path: Path = A100_MIG) -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads(path.read_bytes())
    return copy.deepcopy(loaded)


def read(raw: dict[str, Any]) -> Any:
    with NvmlReader(RecordedNvml.from_recording(raw)) as reader:
        return reader.read()


def test_a_gpu_in_mig_mode_lists_its_instances_by_start_with_their_processes() -> None:
    gpu0, gpu1 = read(recording())
    assert gpu0.mig_mode and not gpu1.mig_mode and gpu1.mig == ()
    assert [(i.start, i.slices, i.compute_slices, i.profile_id) for i in gpu0.mig] == [
        (0, 4, 3, 9), (4, 2, 2, 14), (6, 1, 1, 19)]
    first = gpu0.mig[0]
    assert first == MigReading(
        gpu_instance_id=1, profile_id=9, uuid="MIG-4f3a1c2e-8d6b-5e7f-9a0b-1c2d3e4f5a01",
        start=0, slices=4, compute_slices=3, profile_memory_mib=40192,
        memory_used_bytes=20480 * MIB, memory_total_bytes=40192 * MIB,
        processes=(ProcessReading(4242, 20000 * MIB),))
    assert (first.memory_used_mib, first.memory_total_mib) == (20480, 40192)
    # The GPU's processes are its instances', each once.
    assert [p.pid for p in gpu0.processes] == [4242, 5151]


def test_no_gpu_level_utilisation_in_mig_mode_is_said_not_read_as_idle() -> None:
    gpu0, gpu1 = read(recording())
    assert (gpu0.utilization_pct, gpu0.utilization_supported) == (0, False)
    assert (gpu1.utilization_pct, gpu1.utilization_supported) == (41, True)


def test_the_h100_recording_reads_both_gpus_in_mig_mode() -> None:
    gpus = read(recording(H100_MIG))
    assert [[(i.start, i.slices) for i in g.mig] for g in gpus] == [
        [(0, 4), (4, 4)], [(0, 2), (2, 2), (4, 2), (6, 1)]]
    assert [p.pid for p in gpus[1].processes] == [5151, 5252, 6060, 6161]


def test_a_gpu_without_mig_at_all_reads_as_before() -> None:
    raw = recording()
    raw["devices"][1]["errors"] = {"nvmlDeviceGetMigMode": "NVMLError_NotSupported"}
    plain = read(raw)[1]
    assert (plain.mig_mode, plain.mig, [p.pid for p in plain.processes]) == (False, (), [6060])
    with NvmlReader(fake_nvml()) as reader:  # recordings without "mig": MIG off
        assert not any(g.mig_mode for g in reader.read())


def test_mig_mode_on_with_no_instance_yet_is_mig_mode_with_none() -> None:
    raw = recording()
    raw["devices"][0]["mig"] = []
    gpu0 = read(raw)[0]
    assert gpu0.mig_mode and gpu0.mig == () and gpu0.processes == ()


def test_two_compute_instances_of_one_gpu_instance_are_one_instance() -> None:
    raw = recording()
    migs = raw["devices"][0]["mig"]
    migs.append(dict(migs[0], uuid="MIG-second-ci",
                     processes=[{"pid": 9999, "used_bytes": 1024 * MIB}]))
    gpu0 = read(raw)[0]
    assert [i.start for i in gpu0.mig] == [0, 4, 6]
    assert gpu0.mig[0].uuid == migs[0]["uuid"]
    assert [p.pid for p in gpu0.mig[0].processes] == [4242, 9999]
    assert [p.pid for p in gpu0.processes] == [4242, 5151, 9999]


def test_a_failing_mig_call_names_the_gpu_and_what_failed() -> None:
    raw = recording()
    raw["devices"][0]["errors"]["nvmlGpuInstanceGetInfo"] = "NVMLError_GpuIsLost"
    with pytest.raises(GpuReadError, match="GPU 0: reading its MIG instances failed"):
        read(raw)
    raw = recording()
    raw["devices"][0]["errors"]["nvmlDeviceGetMigMode"] = "NVMLError_GpuIsLost"
    with pytest.raises(GpuReadError, match="GPU 0: reading the MIG mode failed"):
        read(raw)


def test_a_placement_refused_to_an_unprivileged_reader_is_unknown_not_a_failure() -> None:
    raw = recording()
    raw["devices"][0]["errors"]["nvmlDeviceGetGpuInstanceById"] = "NVMLError_NoPermission"
    gpu0 = read(raw)[0]
    assert [(i.start, i.slices, i.compute_slices) for i in gpu0.mig] == [
        (None, None, 3), (None, None, 2), (None, None, 1)]
    assert [p.pid for p in gpu0.processes] == [4242, 5151]  # still read, per instance


def test_read_without_processes_reads_no_instances() -> None:
    with NvmlReader(RecordedNvml.from_recording(recording())) as reader:
        gpu0 = reader.read(processes=False)[0]
    assert gpu0.mig_mode and gpu0.mig == () and gpu0.processes == ()


def mig_entry(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = recording()["devices"][0]["mig"][2]
    return {**raw, **overrides}


@pytest.mark.parametrize(("migs", "field"), [
    ({}, "devices[0].mig"),
    ([mig_entry(start=7, size=2)], "devices[0].mig[0].start"),
    ([mig_entry(), mig_entry(gpu_instance_id=99, uuid="MIG-x")], "devices[0].mig[1].start"),
    ([mig_entry(), mig_entry(start=5, uuid="MIG-x")], "devices[0].mig[1].gpu_instance_id"),
    ([mig_entry(), mig_entry(start=5, gpu_instance_id=99)], "devices[0].mig[1].uuid"),
    ([mig_entry()] * 8, "devices[0].mig"),
    ([mig_entry(gpu_instance_slice_count=8)], "devices[0].mig[0].gpu_instance_slice_count"),
    ([mig_entry(memory_used=1 << 50)], "devices[0].mig[0].memory_used"),
    ([mig_entry(memory_size_mb=0)], "devices[0].mig[0].memory_size_mb"),
    ([mig_entry(processes=[{"pid": -3, "used_bytes": 0}])], "devices[0].mig[0].processes[0].pid"),
    (["x"], "devices[0].mig[0]"),
    ([mig_entry(profile_id="9")], "devices[0].mig[0].profile_id"),
])
def test_a_bad_mig_recording_names_the_field(migs: Any, field: str) -> None:
    raw = recording()
    raw["devices"][0]["mig"] = migs
    with pytest.raises(BadInput) as caught:
        RecordedNvml.from_recording(raw, source="rec.json")
    assert (caught.value.source, caught.value.field) == ("rec.json", field)
