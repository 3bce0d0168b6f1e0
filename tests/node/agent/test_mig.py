"""The agent on GPUs in MIG mode: each instance named, placed and attributed to its pods in the
usage annotation's ``mig`` list, from the A100 and H100 recordings (written from NVML's
documentation, not recorded on hardware: tests/node/agent/data)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from gpufrag.gpu_usage import MigInstanceUsage, parse
from gpufrag.nvml import MIB, GpuReading, MigReading, NvmlReader
from gpufrag.nvml_recorded import RecordedNvml
from node.agent.cgroup import PodRef
from node.agent.loop import Agent, AgentConfig, build_usage
from node.agent.metrics import AgentMetrics, Health
from node.agent.mig import profile_name
from node.agent.publish import Publisher, PublishPolicy
from tests.node.agent.fakes import (
    POD_A,
    POD_B,
    POD_C,
    FakeClock,
    FakePods,
    RecordingLog,
    RecordingWriter,
)

DATA = Path(__file__).parent / "data"
POD_D = PodRef("serving", "phi-3-0", "0b8f0c8e-4444-4a4a-9b9b-000000000004")


def readings(name: str) -> tuple[GpuReading, ...]:
    with NvmlReader(RecordedNvml.load(DATA / name)) as reader:
        return reader.read()


def test_the_a100_node_lists_its_mig_instances_and_leaves_the_plain_gpu_as_it_was() -> None:
    pods = FakePods({4242: POD_A, 5151: POD_B, 6060: POD_C})
    usage = build_usage("node1", 1.0, 15.0, readings("nvml_a100_80gb_mig.json"),
                        pods.pod_for_pid, pods.stray_reason)
    gpu0, gpu1 = usage.gpus
    assert gpu0.mig == (
        MigInstanceUsage("3g.40gb", 0, "MIG-4f3a1c2e-8d6b-5e7f-9a0b-1c2d3e4f5a01", 20480, 40192,
                         None, (POD_A.uid,)),
        MigInstanceUsage("2g.20gb", 4, "MIG-4f3a1c2e-8d6b-5e7f-9a0b-1c2d3e4f5a02", 0, 19968,
                         None, ()),
        MigInstanceUsage("1g.10gb", 6, "MIG-4f3a1c2e-8d6b-5e7f-9a0b-1c2d3e4f5a03", 4608, 9728,
                         None, (POD_B.uid,)),
    )
    # The pods on instances are the GPU's pods, with their memory, as for a whole GPU.
    assert [(p.uid, p.memory_used_mib) for p in gpu0.pods] == [(POD_A.uid, 20000),
                                                               (POD_B.uid, 4500)]
    assert gpu0.utilization_pct == 0 and gpu0.mig_mode  # the mig key marks it: no reading
    # GPU 1 has MIG off: no mig key, its utilisation read as ever.
    assert (gpu1.mig, gpu1.utilization_pct, [p.uid for p in gpu1.pods]) == ((), 41, [POD_C.uid])
    doc = orjson.loads(usage.to_json())
    assert "mig" not in doc["gpus"][1]
    assert doc["gpus"][0]["mig"][0]["utilization_pct"] is None
    assert parse(usage.to_json()) == usage  # the annotation's own reader takes it


def test_the_h100_node_names_its_profiles_and_keeps_strays_on_the_gpu() -> None:
    pods = FakePods({4242: POD_A, 5151: POD_D, 5252: POD_D, 6060: POD_C})
    usage = build_usage("node1", 1.0, 15.0, readings("nvml_h100_80gb_mig.json"),
                        pods.pod_for_pid, pods.stray_reason)
    gpu0, gpu1 = usage.gpus
    assert [(i.profile, i.start, i.memory_total_mib, i.pods) for i in gpu0.mig] == [
        ("4g.40gb", 0, 40448, (POD_A.uid,)), ("3g.40gb", 4, 40448, ())]
    assert [(i.profile, i.start, i.pods) for i in gpu1.mig] == [
        ("2g.20gb", 0, (POD_D.uid,)), ("2g.20gb", 2, (POD_D.uid,)), ("2g.20gb", 4, ()),
        ("1g.10gb", 6, (POD_C.uid,))]
    # One pod on two instances: one entry on the GPU, its containers' memory summed.
    assert [(p.uid, p.memory_used_mib) for p in gpu1.pods] == [(POD_C.uid, 2000),
                                                               (POD_D.uid, 16000)]
    assert [s.pid for s in gpu1.strays] == [6161]  # in no pod: a stray, on no instance's pods
    assert parse(usage.to_json()) == usage


def test_metrics_give_a_gpu_in_mig_mode_no_utilisation_series() -> None:
    pods = FakePods({4242: POD_A, 5151: POD_B, 6060: POD_C})
    usage = build_usage("node1", 1.0, 15.0, readings("nvml_a100_80gb_mig.json"),
                        pods.pod_for_pid)
    metrics = AgentMetrics("node1")
    plain = replace(usage, gpus=tuple(replace(g, mig=()) for g in usage.gpus))
    metrics.observe_usage(plain)  # as if MIG were off: a series for GPU 0 ...
    metrics.observe_usage(usage)  # ... removed once it is in MIG mode

    def util(gpu: int) -> float | None:
        labels = {"gpu": str(gpu), "UUID": usage.gpus[gpu].uuid,
                  "modelName": "NVIDIA A100-SXM4-80GB", "Hostname": "node1"}
        value: float | None = metrics.registry.get_sample_value("DCGM_FI_DEV_GPU_UTIL", labels)
        return value

    assert (util(0), util(1)) == (None, 41)
    assert metrics.registry.get_sample_value("DCGM_FI_DEV_FB_USED", {
        "gpu": "0", "UUID": usage.gpus[0].uuid, "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": "node1"}) == 20480 + 4608


def instance(compute: int, slices: int, memory_mib: int) -> MigReading:
    return MigReading(1, 0, "MIG-x", 0, slices, compute, memory_mib, 0, memory_mib * MIB)


def gpu(product: str, total_mib: int) -> GpuReading:
    return GpuReading(0, "GPU-x", product, 0, total_mib * MIB, 0)


@pytest.mark.parametrize(("product", "total_mib", "shape", "name"), [
    # From the MIG table (scheduler.core.mig) ...
    ("NVIDIA A100-SXM4-80GB", 81920, (1, 2, 19968), "1g.20gb"),
    ("NVIDIA A100-SXM4-80GB", 81920, (7, 8, 80640), "7g.80gb"),
    ("NVIDIA A100-SXM4-40GB", 40960, (2, 2, 9856), "2g.10gb"),
    ("NVIDIA H100 80GB HBM3", 81559, (3, 4, 40448), "3g.40gb"),
    ("NVIDIA H200", 143771, (1, 1, 17920), "1g.18gb"),
    # ... and, for a product it lacks, the device plugin's rule (eighths of the GPU, up).
    ("NVIDIA A30", 24576, (1, 1, 5952), "1g.6gb"),
    ("NVIDIA A30", 24576, (2, 2, 11968), "2g.12gb"),
    ("NVIDIA H100 NVL", 95830, (1, 1, 11008), "1g.12gb"),
])
def test_profile_names_are_the_device_plugins(product: str, total_mib: int,
                                              shape: tuple[int, int, int], name: str) -> None:
    assert profile_name(gpu(product, total_mib), instance(*shape)) == name


def refused_placements() -> RecordedNvml:
    """The A100 recording as an unprivileged agent reads it: NVML refuses the GPU instance."""
    nvml = RecordedNvml.load(DATA / "nvml_a100_80gb_mig.json")
    nvml.devices[0].errors["nvmlDeviceGetGpuInstanceById"] = ["NVMLError_NoPermission"]
    return nvml


def test_refused_placements_publish_the_gpu_without_mig_and_say_so_once() -> None:
    config = AgentConfig(node_name="node1")
    metrics, log, clock = AgentMetrics("node1"), RecordingLog(), FakeClock()
    with NvmlReader(refused_placements()) as reader:
        agent = Agent(config, reader=reader, pods=FakePods({4242: POD_A, 5151: POD_B,
                                                             6060: POD_C}),
                      publisher=Publisher(RecordingWriter(), PublishPolicy(64, 10, 60.0)),
                      metrics=metrics, health=Health(clock, stall_after_s=60.0),
                      log=log.as_logger(), clock=clock)
        first = agent.tick()
        clock.advance(15.0)
        agent.tick()
    assert first is not None
    gpu0 = first.gpus[0]
    # No placement, no mig list (its schema needs each start); the pods are still there.
    assert gpu0.mig == () and [p.uid for p in gpu0.pods] == [POD_A.uid, POD_B.uid]
    assert log.events("warning") == ["mig_placements_unreadable"]
    # NVML has no utilisation for it: no series, not a 0 (GPU 1, MIG off, keeps its own).
    labels = {"gpu": "0", "UUID": gpu0.uuid, "modelName": gpu0.product, "Hostname": "node1"}
    util = metrics.registry.get_sample_value
    assert util("DCGM_FI_DEV_GPU_UTIL", labels) is None
    assert util("DCGM_FI_DEV_GPU_UTIL", {**labels, "gpu": "1", "UUID": first.gpus[1].uuid}) == 41


def test_an_unplaced_instance_is_still_named_from_its_memory() -> None:
    with NvmlReader(refused_placements()) as reader:
        gpu0 = reader.read()[0]
    assert [(i.start, i.slices, i.profile_id) for i in gpu0.mig] == [(None, None, None)] * 3
    assert [profile_name(gpu0, i) for i in gpu0.mig] == ["3g.40gb", "2g.20gb", "1g.10gb"]
