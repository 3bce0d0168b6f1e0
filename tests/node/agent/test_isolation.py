"""The isolation check: a share pod whose measured GPU memory exceeds its share.

The readings are the recorded 2 x A100-80GB node of :mod:`tests.node.agent.fakes` (GPU 0:
POD_A 20,000 MiB and POD_B 10,000 MiB; GPU 1: POD_C 12,000 MiB and a host process); the
shares are read from pod objects the way the agent reads them from the API.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from gpufrag.conventions import (
    ANNOTATION_GPU_INDICES,
    RESOURCE_GPU,
    RESOURCE_GPU_MEMORY_MIB,
    RESOURCE_GPU_MILLI,
    KubeNames,
)
from gpufrag.gpu_usage import GpuUsage, NodeGpuUsage, PodGpuUsage
from gpufrag.nvml import MIB, NvmlReader
from node.agent.cgroup import PodDirectory, PodRecord, PodShare, share_from_pod
from node.agent.isolation import ShareWatch
from node.agent.loop import Agent, AgentConfig
from node.agent.metrics import AgentMetrics, Health
from node.agent.publish import EVENT_REASON_GPU_MEMORY_OVER_SHARE, Publisher, PublishPolicy
from scheduler.kube.claims import MigPartition
from tests.node.agent.fakes import (
    POD_A,
    POD_B,
    POD_C,
    FakeClock,
    FakeLister,
    FakePods,
    RecordingLog,
    RecordingWriter,
    fake_nvml,
    pod_events,
)

A100_MIB = 81_920


def pod_obj(uid: str, requests: Mapping[str, str], gpus: str | None = "0", *,
            containers: int = 1) -> dict[str, Any]:
    annotations = {} if gpus is None else {ANNOTATION_GPU_INDICES: gpus}
    return {"metadata": {"name": f"pod-{uid[-4:]}", "namespace": "serving", "uid": uid,
                         "annotations": annotations},
            "spec": {"containers": [{"name": f"c{i}", "resources": {"limits": dict(requests)}}
                                    for i in range(containers)]}}


def share(requests: Mapping[str, str], gpus: str | None = "0",
          names: KubeNames | None = None) -> PodShare:
    found = share_from_pod(pod_obj("uid-0000", requests, gpus), names or KubeNames())
    assert found is not None
    return found


# -- reading the share off the pod ---------------------------------------------------------------

def test_the_share_is_read_as_the_extender_reads_it() -> None:
    milli = share({RESOURCE_GPU_MILLI: "250"})
    assert (milli.request.gpu_milli, milli.request.gpu_memory_mib, milli.gpus) == (250, 0, (0,))
    memory = share({RESOURCE_GPU_MEMORY_MIB: "12000"}, "1")
    assert (memory.request.gpu_memory_mib, memory.gpus, memory.gpus_text) == (12_000, (1,), "1")
    hami = KubeNames(gpu_memory="nvidia.com/gpumem", gpu_cores="nvidia.com/gpucores")
    mapped = share({RESOURCE_GPU: "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"},
                   names=hami)
    assert (mapped.request.gpu_memory_mib, mapped.request.gpu_milli) == (3_000, 300)
    assert share({RESOURCE_GPU_MILLI: "100"}, gpus="zero").gpus is None  # malformed: unchecked


def dra_pod_obj(node: str = "gpu-node") -> dict[str, Any]:
    """A pod on ``node`` whose GPU comes through its claim ``c`` (no extended resource)."""
    obj = pod_obj("uid-0002", {"cpu": "1"}, None)
    obj["spec"].update(nodeName=node, resourceClaims=[{"name": "gpu",
                                                       "resourceClaimName": "c"}])
    return obj


def dra_claim(device: str = "", milli: str = "250") -> dict[str, Any]:
    claim: dict[str, Any] = {"metadata": {"name": "c", "namespace": "serving"}, "status": {}}
    if device:
        claim["status"]["allocation"] = {"devices": {"results": [{
            "request": "gpu", "driver": "gpu.gpufrag.io", "pool": "gpu-node",
            "device": device, "consumedCapacity": {"milli": milli}}]}}
    return claim


def test_a_dra_pods_share_and_gpus_are_its_claims_allocation() -> None:
    found = share_from_pod(dra_pod_obj(), KubeNames(), {"serving/c": dra_claim("gpu-1")})
    assert found is not None
    assert (found.request.gpu_milli, found.gpus, found.gpus_text) == (250, (1,), "1")
    # Not allocated (or allocated on another node): nothing to hold it to.
    assert share_from_pod(dra_pod_obj(), KubeNames(), {"serving/c": dra_claim()}) is None
    assert share_from_pod(dra_pod_obj("other"), KubeNames(),
                          {"serving/c": dra_claim("gpu-1")}) is None
    # Without its claims read, a DRA pod asks nothing of its containers: no share.
    assert share_from_pod(dra_pod_obj(), KubeNames()) is None


def test_a_dra_mig_pod_holds_its_partitions_gpu_profile_and_start() -> None:
    claim = dra_claim("gpu-1-mig-3g-40gb-4")
    del claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
    found = share_from_pod(dra_pod_obj(), KubeNames(), {"serving/c": claim})
    assert found is not None
    assert (found.gpus, found.gpus_text, found.partitions) == (
        (1,), "1", (MigPartition(1, "3g.40gb", 4),))
    assert found.request.num_gpu == 0  # no GPU of the placement state: the instance is its
    # Its memory is the instance's (MIG enforces it): not held to a share on its own GPU,
    # but its processes on another GPU are not its own.
    watch = ShareWatch(intervals=1)
    checked, _ = watch.observe(reading(30_000, gpu=1, uid=POD_A.uid), {POD_A.uid: found}.get,
                               0.0)
    assert checked == []
    checked, due = watch.observe(reading(30_000, gpu=0, uid=POD_A.uid), {POD_A.uid: found}.get,
                                 1.0)
    assert [(o.gpu_index, o.share_mib, o.chosen) for o in due] == [(0, 0, False)]
    # On another node's pool, or not allocated: nothing held here.
    assert share_from_pod(dra_pod_obj("other"), KubeNames(), {"serving/c": claim}) is None


@pytest.mark.parametrize("requests", [{}, {"cpu": "1"}, {RESOURCE_GPU_MILLI: "1500"},
                                      {"example.com/gpu": "1"}])
def test_no_share_for_cpu_pods_and_unplaceable_requests(requests: dict[str, str]) -> None:
    assert share_from_pod(pod_obj("uid-0001", requests), KubeNames()) is None


def test_the_directory_hands_out_the_share_of_the_listed_pod() -> None:
    a = share({RESOURCE_GPU_MILLI: "200"})
    directory = PodDirectory(FakeLister([PodRecord(POD_A, share=a), PodRecord(POD_B)]),
                             clock=FakeClock(0.0))
    assert directory.lookup(POD_A.uid) == POD_A
    assert directory.share_of(POD_A.uid) == a
    assert directory.share_of(POD_B.uid) is None


# -- the watch, pure -------------------------------------------------------------------------------

def reading(used_mib: int, *, gpu: int = 0, uid: str = POD_A.uid) -> NodeGpuUsage:
    pod = PodGpuUsage("serving", "llama-7b-0", uid, used_mib)
    return NodeGpuUsage("node1", 0.0, 15.0, (GpuUsage(gpu, f"GPU-{gpu}", "A100", used_mib,
                                                      A100_MIB, 50, (pod,)),))


def test_one_event_per_overrun_after_the_streak_then_quiet() -> None:
    watch = ShareWatch(intervals=2, cooldown_s=600)
    a = share({RESOURCE_GPU_MILLI: "200"})  # 16,384 MiB of an 80 GiB GPU
    shares = {POD_A.uid: a}.get
    checked, due = watch.observe(reading(16_384), shares, 0)
    assert [over for _, over in checked] == [False] and due == []  # at the share: fine
    assert watch.observe(reading(17_000), shares, 15)[1] == []  # one reading over: not yet
    checked, due = watch.observe(reading(17_000), shares, 30)
    (overrun,) = due
    assert (overrun.pod, overrun.gpu_index, overrun.used_mib, overrun.share_mib,
            overrun.intervals, overrun.chosen) == (POD_A, 0, 17_000, 16_384, 2, True)
    assert "more than its share of 16384 MiB (200 milli-GPU of 81920 MiB)" in overrun.message()
    assert "without MPS the share is not enforced" in overrun.message()
    for t in range(45, 600, 15):  # still over: reported once
        assert watch.observe(reading(17_000), shares, t)[1] == []


def test_a_pod_flapping_across_its_share_is_reported_at_most_once_per_cooldown() -> None:
    watch = ShareWatch(intervals=1, cooldown_s=300)
    shares = {POD_A.uid: share({RESOURCE_GPU_MEMORY_MIB: "8000"})}.get
    reported = []
    for i in range(60):  # 15 minutes, over every other reading
        now = i * 15.0
        _, due = watch.observe(reading(9_000 if i % 2 == 0 else 7_000), shares, now)
        reported += [now for _ in due]
    assert reported == [0.0, 300.0, 600.0]


def test_tolerance_and_whole_gpus() -> None:
    watch = ShareWatch(intervals=1, tolerance_mib=500)
    shares = {POD_A.uid: share({RESOURCE_GPU_MEMORY_MIB: "8000"})}.get
    assert watch.observe(reading(8_500), shares, 0)[1] == []
    assert len(watch.observe(reading(8_501), shares, 15)[1]) == 1
    whole = {POD_A.uid: share({RESOURCE_GPU: "1"})}.get  # a whole GPU: nothing to exceed
    assert watch.observe(reading(80_000), whole, 30) == ([], [])


def test_memory_on_a_gpu_not_chosen_for_the_pod_is_an_overrun_of_a_zero_share() -> None:
    watch = ShareWatch(intervals=1)
    shares = {POD_A.uid: share({RESOURCE_GPU: "1"}, gpus="1")}.get  # whole GPU 1, seen on 0
    (overrun,) = watch.observe(reading(500, gpu=0), shares, 0)[1]
    assert (overrun.share_mib, overrun.chosen) == (0, False)
    assert "GPU 0 (GPU-0) was not chosen for this pod (its recorded GPUs are 1)" in \
        overrun.message()


def test_events_per_reading_are_bounded_and_state_follows_the_pods() -> None:
    watch = ShareWatch(intervals=1, max_events=3)
    uids = [f"uid-{i:04d}" for i in range(8)]
    pods = tuple(PodGpuUsage("serving", f"p{i}", uid, 2_000) for i, uid in enumerate(uids))
    usage = NodeGpuUsage("node1", 0.0, 15.0,
                         (GpuUsage(0, "GPU-0", "A100", 16_000, A100_MIB, 50, pods),))
    shares = dict.fromkeys(uids, share({RESOURCE_GPU_MEMORY_MIB: "1000"})).get
    sizes = [len(watch.observe(usage, shares, t)[1]) for t in (0, 15, 30, 45)]
    assert sizes == [3, 3, 2, 0]  # every pod reported once, three at a time
    assert len(watch) == 8
    watch.observe(NodeGpuUsage("node1", 60.0, 15.0, ()), shares, 60)
    assert len(watch) == 0  # pods that left are forgotten


# -- through the agent, on recorded NVML readings --------------------------------------------------

def test_the_agent_reports_over_share_pods_by_metric_and_event() -> None:
    shares = {
        POD_A.uid: share({RESOURCE_GPU_MILLI: "200"}, "0"),  # 20,000 MiB used > 16,384
        POD_B.uid: share({RESOURCE_GPU_MEMORY_MIB: "12000"}, "0"),  # 10,000 MiB: within
        POD_C.uid: share({RESOURCE_GPU_MILLI: "500"}, "0"),  # runs on GPU 1, chosen GPU 0
    }
    config = AgentConfig(node_name="node1", interval_s=15.0, share_intervals=2)
    reader = NvmlReader(fake_nvml())
    reader.open()
    writer, clock, log = RecordingWriter(), FakeClock(), RecordingLog()
    metrics = AgentMetrics("node1")
    agent = Agent(config, reader=reader, pods=FakePods(),
                  publisher=Publisher(writer, PublishPolicy(64, 10, 60.0)), metrics=metrics,
                  health=Health(clock, stall_after_s=60), log=log.as_logger(), clock=clock,
                  shares=shares.get)

    def value(name: str, pod: str, gpu: int) -> float | None:
        got: float | None = metrics.registry.get_sample_value(
            name, {"namespace": "serving" if pod != POD_C.name else "batch", "pod": pod,
                   "node": "node1", "gpu": str(gpu)})
        return got

    for _ in range(4):
        assert agent.tick() is not None
        clock.advance(15)
        if _ == 0:  # one reading over: the metric waits for the streak, like the Event
            assert value("gpufrag_agent_gpu_memory_over_share", POD_A.name, 0) == 0
            assert pod_events(writer) == []
    events = [(e["pod"], e["reason"], e["type"]) for e in pod_events(writer)]
    assert events == [(POD_A, EVENT_REASON_GPU_MEMORY_OVER_SHARE, "Warning"),
                      (POD_C, EVENT_REASON_GPU_MEMORY_OVER_SHARE, "Warning")]
    assert "hold 20000 MiB, more than its share of 16384 MiB" in pod_events(writer)[0]["message"]
    assert value("gpufrag_agent_gpu_memory_over_share", POD_A.name, 0) == 1
    assert value("gpufrag_agent_gpu_memory_over_share", POD_B.name, 0) == 0
    assert value("gpufrag_agent_gpu_memory_over_share", POD_C.name, 1) == 1
    assert value("gpufrag_pod_gpu_memory_share_bytes", POD_A.name, 0) == 16_384 * MIB
    assert value("gpufrag_pod_gpu_memory_share_bytes", POD_B.name, 0) == 12_000 * MIB
    assert value("gpufrag_pod_gpu_memory_share_bytes", POD_C.name, 1) == 0
    assert metrics.registry.get_sample_value(
        "gpufrag_agent_events_total", {"reason": EVENT_REASON_GPU_MEMORY_OVER_SHARE}) == 2
    assert log.events("warning").count("gpu_memory_over_share") == 2
    reader.close()


def test_without_share_lookup_nothing_is_checked() -> None:
    reader = NvmlReader(fake_nvml())
    reader.open()
    writer, clock = RecordingWriter(), FakeClock()
    metrics = AgentMetrics("node1")
    agent = Agent(AgentConfig(node_name="node1", share_intervals=1), reader=reader,
                  pods=FakePods(), publisher=Publisher(writer, PublishPolicy(64, 10, 60.0)),
                  metrics=metrics, health=Health(clock, stall_after_s=60),
                  log=RecordingLog().as_logger(), clock=clock)
    agent.tick()
    assert pod_events(writer) == []
    assert b"gpufrag_agent_gpu_memory_over_share{" not in metrics.render()
    reader.close()
