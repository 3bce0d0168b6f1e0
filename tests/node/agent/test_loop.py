from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from gpufrag.conventions import (
    ANNOTATION_GPU_ALLOCATED,
    ANNOTATION_GPU_INDICES,
    ANNOTATION_GPU_USAGE,
    RESOURCE_GPU,
)
from gpufrag.errors import BadInput
from gpufrag.gpu_usage import PodGpuUsage, StrayProcess, parse
from gpufrag.nvml import NvmlReader, ProcessReading
from gpufrag.nvml_recorded import RecordedNvml
from node.agent.cgroup import PodRef, PodShare, share_from_pod
from node.agent.loop import Agent, AgentConfig, build_usage, memory_by_pod
from node.agent.metrics import AgentMetrics, Health
from node.agent.publish import Publisher, PublishError, PublishPolicy
from tests.node.agent.fakes import (
    MIB,
    POD_A,
    POD_B,
    POD_C,
    FakeClock,
    FakePods,
    RecordingLog,
    RecordingWriter,
    fake_nvml,
    pod_events,
    processes,
)

CONFIG = AgentConfig(node_name="node1", interval_s=15.0, tolerance_mib=64, tolerance_pct=10,
                     refresh_intervals=4, leak_threshold_mib=100, leak_intervals=3)


@dataclass
class Rig:
    """An Agent on the recorded 2-GPU node with every collaborator in reach."""

    config: AgentConfig = CONFIG
    nvml: RecordedNvml = field(default_factory=fake_nvml)
    pods: FakePods = field(default_factory=FakePods)
    writer: RecordingWriter = field(default_factory=RecordingWriter)
    clock: FakeClock = field(default_factory=FakeClock)
    log: RecordingLog = field(default_factory=RecordingLog)
    # the node's GPU pods as the pod list reads them (the allocation check)
    placed: dict[PodRef, PodShare] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.reader = NvmlReader(self.nvml)
        self.reader.open()
        self.metrics = AgentMetrics(self.config.node_name)
        self.health = Health(self.clock, stall_after_s=60.0)
        self.agent = Agent(
            self.config, reader=self.reader, pods=self.pods,
            publisher=Publisher(self.writer, PublishPolicy(self.config.tolerance_mib,
                                                           self.config.tolerance_pct,
                                                           self.config.refresh_s)),
            metrics=self.metrics, health=self.health, log=self.log.as_logger(), clock=self.clock,
            pod_shares=lambda: self.placed.items(),
        )

    def tick(self) -> Any:
        result = self.agent.tick()
        self.clock.advance(self.config.interval_s)
        return result

    def sample(self, name: str, **labels: str) -> float | None:
        value: float | None = self.metrics.registry.get_sample_value(name, labels)
        return value


def test_first_tick_reads_attributes_publishes_and_becomes_ready() -> None:
    rig = Rig()
    assert not rig.health.ready
    usage = rig.tick()
    assert usage is not None and rig.health.ready
    ((node, key, value),) = rig.writer.patches
    assert (node, key) == ("node1", ANNOTATION_GPU_USAGE)
    published = parse(value)
    assert published == usage
    gpu0, gpu1 = published.gpus
    # The first reading is each pod's peak so far, over the window since now.
    at = usage.timestamp
    assert gpu0.pods == (PodGpuUsage("serving", "llama-7b-0", POD_A.uid, 20_000, 20_000, at),
                         PodGpuUsage("serving", "mistral-7b-0", POD_B.uid, 10_000, 10_000, at))
    # pid 7070 (a host process) is in no pod: its 256 MiB stay unattributed, listed as a stray.
    assert gpu1.pods == (PodGpuUsage("batch", "embed-0", POD_C.uid, 12_000, 12_000, at),)
    assert gpu1.memory_unattributed_mib == 800
    assert (gpu0.strays, gpu1.strays) == ((), (StrayProcess(7070, 256, "no_pod"),))
    assert rig.log.events("info") == ["ready"]
    assert rig.sample("gpufrag_agent_annotation_publishes_total", reason="first") == 1
    assert rig.sample("gpufrag_pod_gpu_memory_used_bytes", namespace="batch", pod="embed-0",
                      node="node1", gpu="1") == 12_000 * MIB


def test_unchanged_readings_wait_for_the_refresh() -> None:
    rig = Rig()
    for _ in range(6):
        rig.tick()
    # first at t0, then refresh after 4 intervals (60 s): t0 + 60.
    stamps = [parse(v).timestamp for _, _, v in rig.writer.patches]
    assert [s - stamps[0] for s in stamps] == [0.0, 60.0]


def test_a_change_beyond_tolerance_is_published_at_once() -> None:
    rig = Rig()
    rig.tick()
    rig.nvml.devices[0].samples[0].memory_used_bytes += 65 * MIB
    rig.tick()
    assert len(rig.writer.patches) == 2
    rig.nvml.devices[0].samples[0].memory_used_bytes += 10 * MIB
    rig.tick()
    assert len(rig.writer.patches) == 2


def test_a_read_error_is_logged_counted_and_not_fatal() -> None:
    rig = Rig()
    rig.nvml.devices[1].errors["nvmlDeviceGetMemoryInfo"] = ["NVMLError_GpuIsLost"]
    assert rig.tick() is None
    assert not rig.health.ready and rig.writer.patches == []
    assert rig.log.events("error") == ["gpu_read_failed"]
    assert rig.sample("gpufrag_agent_nvml_reads_total", result="error") == 1
    del rig.nvml.devices[1].errors["nvmlDeviceGetMemoryInfo"]
    assert rig.tick() is not None and rig.health.ready


def test_a_publish_error_keeps_readiness_false_and_retries() -> None:
    rig = Rig()
    rig.writer.fail_with = PublishError("HTTP 503", retryable=True)
    assert rig.tick() is None
    assert not rig.health.ready
    (error,) = [r for r in rig.log.records if r[0] == "error"]
    assert error[1:] == ("publish_failed", {"error": "HTTP 503", "retryable": True})
    assert rig.sample("gpufrag_agent_annotation_publishes_total", reason="error") == 1
    rig.writer.fail_with = None
    assert rig.tick() is not None
    assert len(rig.writer.patches) == 1 and rig.health.ready


def test_a_growing_pod_gets_one_event_and_the_metric() -> None:
    rig = Rig()
    leak = "gpufrag_agent_gpu_memory_leak_suspected"
    for step in range(6):
        rig.nvml.devices[0].processes = processes((4242, (20_000 + 500 * step) * MIB),
                                                  (5151, 10_000 * MIB))
        rig.tick()
        if step < 3:
            assert rig.sample(leak, namespace="serving", pod=POD_A.name) == 0
    (event,) = pod_events(rig.writer)
    assert (event["pod"], event["reason"], event["type"]) == (POD_A, "GPUMemoryGrowth", "Warning")
    assert "20000 -> 21500 MiB" in event["message"]
    assert rig.sample(leak, namespace="serving", pod=POD_A.name) == 1
    assert rig.sample(leak, namespace="serving", pod=POD_B.name) == 0
    assert rig.sample("gpufrag_agent_events_total", reason="GPUMemoryGrowth") == 1
    assert [e for e in rig.log.events("warning") if e != "gpu_process_without_pod"] == [
        "gpu_memory_growth"]


def test_a_failed_event_is_logged_and_the_interval_still_publishes() -> None:
    rig = Rig(config=AgentConfig(node_name="node1", leak_intervals=1, refresh_intervals=1))
    rig.tick()

    class EventsFail(RecordingWriter):
        def create_pod_event(self, *args: Any, **kwargs: Any) -> None:
            raise PublishError("HTTP 403; needs RBAC 'create events'", retryable=False)

    failing = EventsFail()
    rig.agent._publisher._writer = failing  # swap the writer, keep the publisher's state
    rig.nvml.devices[0].processes = processes((4242, 21_000 * MIB), (5151, 10_000 * MIB))
    assert rig.tick() is not None
    assert "event_failed" in rig.log.events("warning")
    assert len(failing.patches) == 1


def test_run_paces_ticks_and_stops_when_asked() -> None:
    rig = Rig()
    delays: list[float] = []

    def wait(delay: float) -> bool:
        delays.append(delay)
        rig.clock.advance(delay)
        return len(delays) == 3

    rig.agent.run(wait)
    assert delays == [15.0, 15.0, 15.0]
    assert rig.sample("gpufrag_agent_nvml_reads_total", result="ok") == 3


def test_run_does_not_queue_up_after_a_slow_tick() -> None:
    rig = Rig()
    reads = rig.nvml.nvmlDeviceGetUUID

    def slow_uuid(handle: object) -> str | bytes:
        rig.clock.advance(20.0)  # NVML took longer than the interval
        return reads(handle)

    rig.nvml.nvmlDeviceGetUUID = slow_uuid  # type: ignore[method-assign]
    delays: list[float] = []

    def wait(delay: float) -> bool:
        delays.append(delay)
        return True

    rig.agent.run(wait)
    assert delays == [0.0]


def test_build_usage_resolves_each_pid_once_and_sums_per_pod() -> None:
    pods = FakePods({1: POD_A, 2: POD_A})
    reader = NvmlReader(fake_nvml())
    reader.open()
    readings = reader.read()
    shared = replace(readings[0], processes=(
        ProcessReading(1, 100 * MIB), ProcessReading(2, 50 * MIB), ProcessReading(3, 7 * MIB)))
    usage = build_usage("node1", 1.23456, 15.0, [readings[1], shared], pods.pod_for_pid)
    assert [g.index for g in usage.gpus] == [0, 1]  # sorted by index
    assert usage.gpus[0].pods == (PodGpuUsage(POD_A.namespace, POD_A.name, POD_A.uid, 150),)
    assert sorted(pods.lookups) == [1, 2, 3, 6060, 7070]
    assert usage.timestamp == 1.235
    assert memory_by_pod(usage) == {POD_A: 150}
    assert usage.gpus[0].strays == ()  # strays only when asked why
    pods.gone.add(3)
    with_strays = build_usage("node1", 1.0, 15.0, [readings[1], shared], pods.pod_for_pid,
                              pods.stray_reason)
    assert with_strays.gpus[0].strays == (StrayProcess(3, 7, "pod_gone"),)
    assert with_strays.gpus[1].strays == (StrayProcess(6060, 12_000, "no_pod"),
                                          StrayProcess(7070, 256, "no_pod"))
    # A process in no pod by design (the MPS server: reason '') is no stray.
    by_design = build_usage("node1", 1.0, 15.0, [readings[1], shared], pods.pod_for_pid,
                            lambda pid: "" if pid == 6060 else pods.stray_reason(pid))
    assert by_design.gpus[1].strays == (StrayProcess(7070, 256, "no_pod"),)


@pytest.mark.parametrize(("overrides", "field_name"), [
    ({"node_name": ""}, "node_name"),
    ({"interval_s": 0}, "interval_s"),
    ({"tolerance_mib": -1}, "tolerance_mib"),
    ({"tolerance_pct": 101}, "tolerance_pct"),
    ({"refresh_intervals": 0}, "refresh_intervals"),
    ({"leak_threshold_mib": -1}, "leak_threshold_mib"),
    ({"leak_intervals": 0}, "leak_intervals"),
    ({"peak_window_s": 60.0}, "peak_window_s"),  # under one hour bucket
    ({"peak_window_s": float("nan")}, "peak_window_s"),
])
def test_config_validation_names_the_field(overrides: dict[str, Any], field_name: str) -> None:
    config = AgentConfig(**{"node_name": "node1", **overrides})
    with pytest.raises(BadInput) as caught:
        config.validate()
    assert caught.value.field == field_name


def test_default_config_is_valid_and_refresh_is_in_seconds() -> None:
    config = AgentConfig(node_name="node1").validate()
    assert (config.interval_s, config.leak_threshold_mib, config.leak_intervals) == (15.0, 100, 3)
    assert config.refresh_s == 60.0


def test_a_gpu_process_of_no_live_pod_gets_one_node_event_while_it_stays() -> None:
    """7070 is a host process; 6060's pod is deleted (its cgroup still names it)."""
    rig = Rig(pods=FakePods({4242: POD_A, 5151: POD_B}))
    rig.pods.gone.add(6060)
    rig.tick()
    assert sorted(rig.pods.lookups) == [4242, 5151, 6060, 7070]  # once each per reading
    rig.tick()
    strays = [e for e in rig.writer.events if e["reason"] == "GPUProcessWithoutPod"]
    assert [e["pod"] for e in strays] == [None, None]  # on the Node, once each over two ticks
    assert "process 6060 holds 12000 MiB on GPU 1" in strays[0]["message"]
    assert "its pod is gone from this node" in strays[0]["message"]
    assert "process 7070 holds 256 MiB on GPU 1" in strays[1]["message"]
    assert "it runs in no pod" in strays[1]["message"]
    assert rig.sample("gpufrag_agent_stray_gpu_processes", reason="pod_gone") == 1
    assert rig.sample("gpufrag_agent_stray_gpu_processes", reason="no_pod") == 1
    assert rig.sample("gpufrag_agent_stray_gpu_memory_bytes", reason="pod_gone") == 12_000 * MIB
    assert rig.sample("gpufrag_agent_events_total", reason="GPUProcessWithoutPod") == 2
    # the pod is listed again (the directory caught up): no stray left, the gauge says so
    # ... and the usage annotation carries both under their GPU, with why
    assert parse(rig.writer.patches[-1][2]).gpus[1].strays == (
        StrayProcess(6060, 12_000, "pod_gone"), StrayProcess(7070, 256, "no_pod"))
    rig.pods.by_pid[6060] = POD_C
    rig.pods.gone.clear()
    rig.tick()
    assert rig.sample("gpufrag_agent_stray_gpu_processes", reason="pod_gone") == 0
    # a stray that left is a change: published at once, not at the next refresh
    assert parse(rig.writer.patches[-1][2]).gpus[1].strays == (
        StrayProcess(7070, 256, "no_pod"),)
    # a stray that comes back after it left is reported again
    del rig.pods.by_pid[6060]
    rig.tick()
    assert len([e for e in rig.writer.events if e["reason"] == "GPUProcessWithoutPod"]) == 3


# The recorded node's GPUs (tests.node.agent.fakes.recorded_devices), by NVML index.
GPU_0 = "GPU-5a3c9f1e-7b2d-4c8e-9f01-23456789abcd"
GPU_1 = "GPU-0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6"


def placed(pod: PodRef, recorded: str | None, given: dict[str, list[str]] | str | None
           ) -> PodShare:
    """A whole-GPU pod's share as the agent's pod list reads it: its gpu-indices record and the
    device plugin's gpu-allocated mark (a dict, or raw text), each where given."""
    annotations = {}
    if recorded is not None:
        annotations[ANNOTATION_GPU_INDICES] = recorded
    if given is not None:
        annotations[ANNOTATION_GPU_ALLOCATED] = given if isinstance(given, str) else \
            json.dumps(given)
    share = share_from_pod({
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                     "annotations": annotations},
        "spec": {"containers": [{"name": "main",
                                 "resources": {"limits": {RESOURCE_GPU: "1"}}}]}})
    assert share is not None
    return share


def test_a_pod_the_device_plugin_gave_other_gpus_than_recorded_gets_one_event_while_it_stays(
        ) -> None:
    pod_d = PodRef("batch", "no-record-0", "uid-d")
    rig = Rig(placed={
        POD_A: placed(POD_A, "0", {"main": [GPU_0]}),  # as recorded
        POD_B: placed(POD_B, "0", {"main": [GPU_1]}),  # swapped with a twin: got GPU 1
        POD_C: placed(POD_C, "1", {"main": ["GPU-not-on-this-node"]}),
        pod_d: placed(pod_d, None, {"main": [GPU_1]}),  # no record: the kubelet chose
    })
    rig.tick()
    rig.tick()
    events = [e for e in pod_events(rig.writer) if e["reason"] == "GPUAllocationMismatch"]
    assert [(e["pod"], e["type"]) for e in events] == [(POD_C, "Warning"), (POD_B, "Warning")]
    assert events[1]["message"] == (
        "its containers got GPU(s) 1 but gpu-indices records 0: the device plugin gave GPUs "
        "the extender's record does not name, so the extender counts its share on GPUs it does "
        "not use (recreate the pod to realign them)")
    assert "GPU(s) GPU-not-on-this-node but gpu-indices records 1" in events[0]["message"]
    assert rig.sample("gpufrag_agent_gpu_allocation_mismatches", reason="other_gpus") == 1
    assert rig.sample("gpufrag_agent_gpu_allocation_mismatches", reason="unknown_gpu") == 1
    assert rig.sample("gpufrag_agent_events_total", reason="GPUAllocationMismatch") == 2
    # B is recreated and lands as recorded: no mismatch left of that kind, the gauge says so
    rig.placed[POD_B] = placed(POD_B, "1", {"main": [GPU_1]})
    rig.tick()
    assert rig.sample("gpufrag_agent_gpu_allocation_mismatches", reason="other_gpus") == 0
    # ... and one that comes back after it cleared is reported again
    rig.placed[POD_B] = placed(POD_B, "0", {"main": [GPU_1]})
    rig.tick()
    assert len([e for e in pod_events(rig.writer)
                if e["reason"] == "GPUAllocationMismatch"]) == 3


def test_a_failed_mismatch_event_is_asked_again_at_the_next_interval() -> None:
    rig = Rig(placed={POD_B: placed(POD_B, "0", {"main": [GPU_1]})})
    rig.writer.fail_with = PublishError("API server unreachable", retryable=True)
    rig.tick()
    rig.writer.fail_with = None
    rig.tick()
    rig.tick()
    assert [e["pod"] for e in pod_events(rig.writer)
            if e["reason"] == "GPUAllocationMismatch"] == [POD_B]


@pytest.mark.parametrize(("recorded", "given"), [
    ("0", None),  # not marked yet (or another device plugin serves the pod)
    ("0", "{not json"),  # a mark the plugin cannot read either: it reports that itself
    ("0", {"main": []}),
])
def test_pods_without_a_readable_mark_are_not_compared(
        recorded: str, given: dict[str, list[str]] | str | None) -> None:
    rig = Rig(placed={POD_B: placed(POD_B, recorded, given)})
    rig.tick()
    assert [e for e in pod_events(rig.writer) if e["reason"] == "GPUAllocationMismatch"] == []
    assert rig.sample("gpufrag_agent_gpu_allocation_mismatches", reason="other_gpus") == 0
