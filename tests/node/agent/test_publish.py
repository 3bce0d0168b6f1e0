from __future__ import annotations

from dataclasses import replace

import pytest

from gpufrag.conventions import ANNOTATION_GPU_USAGE
from gpufrag.gpu_usage import GpuUsage, NodeGpuUsage, parse
from node.agent.publish import (
    LogOnlyWriter,
    Publisher,
    PublishError,
    PublishPolicy,
)
from tests.node.agent.fakes import (
    POD_A,
    RecordingLog,
    RecordingWriter,
)

T0 = 1_732_900_000.0
POLICY = PublishPolicy(tolerance_mib=64, tolerance_pct=10, refresh_s=60.0)


def reading(at: float, used_mib: int = 30_000, util: int = 50) -> NodeGpuUsage:
    gpu = GpuUsage(index=0, uuid="GPU-aaaa", product="NVIDIA A100-SXM4-80GB",
                   memory_used_mib=used_mib, memory_total_mib=81_920, utilization_pct=util)
    return NodeGpuUsage(node="node1", timestamp=at, interval_s=15.0, gpus=(gpu,))


@pytest.mark.parametrize(("current", "reason"), [
    (reading(T0 + 15), None),  # unchanged, refresh not due
    (reading(T0 + 15, used_mib=30_064), None),  # within tolerance
    (reading(T0 + 15, used_mib=30_065), "changed"),
    (reading(T0 + 15, util=61), "changed"),
    (reading(T0 + 59.9), None),
    (reading(T0 + 60), "refresh"),  # unchanged but old enough that readers need a fresh stamp
])
def test_policy_reason(current: NodeGpuUsage, reason: str | None) -> None:
    assert POLICY.reason(current, reading(T0), T0) == reason


def test_policy_first_write() -> None:
    assert POLICY.reason(reading(T0), None, None) == "first"


def test_publisher_writes_only_when_due() -> None:
    writer = RecordingWriter()
    publisher = Publisher(writer, POLICY)
    reasons = [publisher.publish(reading(T0 + 15 * i, used_mib=30_000 + 10 * i))
               for i in range(6)]
    # Drift of 10 MiB per interval: 40 MiB after 4 intervals is within tolerance; the refresh
    # (60 s) fires at the 4th interval; then tolerance is measured from the new baseline.
    assert reasons == ["first", None, None, None, "refresh", None]
    assert [parse(value).timestamp for _, _, value in writer.patches] == [T0, T0 + 60]
    assert {(node, key) for node, key, _ in writer.patches} == {("node1", ANNOTATION_GPU_USAGE)}
    assert publisher.last_published_at == T0 + 60


def test_tolerance_is_measured_from_the_last_write_not_the_last_reading() -> None:
    writer = RecordingWriter()
    publisher = Publisher(writer, replace(POLICY, refresh_s=1e9))
    reasons = [publisher.publish(reading(T0 + i, used_mib=30_000 + 40 * i)) for i in range(3)]
    assert reasons == ["first", None, "changed"]  # 80 MiB since the write, 40 per step


def test_a_failed_write_is_retried_at_the_next_interval() -> None:
    writer = RecordingWriter(fail_with=PublishError("HTTP 503", retryable=True))
    publisher = Publisher(writer, POLICY)
    with pytest.raises(PublishError):
        publisher.publish(reading(T0))
    assert publisher.last_published_at is None
    writer.fail_with = None
    assert publisher.publish(reading(T0 + 15)) == "first"


def test_report_pod_creates_a_warning_event() -> None:
    writer = RecordingWriter()
    Publisher(writer, POLICY).report_pod(POD_A, "GPUMemoryGrowth", "grew", T0)
    assert writer.events == [{"pod": POD_A, "reason": "GPUMemoryGrowth", "message": "grew",
                              "type": "Warning", "now": T0}]


def test_log_only_writer_writes_nothing_and_says_what_it_would() -> None:
    log = RecordingLog()
    writer = LogOnlyWriter(log.as_logger())
    writer.patch_node_annotation("node1", ANNOTATION_GPU_USAGE, "{}")
    writer.create_pod_event(POD_A, reason="GPUMemoryGrowth", message="m", event_type="Warning",
                            now=T0)
    assert log.events() == ["dry_run_patch_node", "dry_run_create_event"]

# The real client against the real API server: tests/e2e/test_agent.py.
