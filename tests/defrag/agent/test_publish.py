from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from defrag.agent.publish import (
    EVENT_REASON_GPU_MEMORY_GROWTH,
    KubeClusterWriter,
    LogOnlyWriter,
    Publisher,
    PublishError,
    PublishPolicy,
)
from defrag.agent.usage import GpuUsage, NodeGpuUsage, parse
from gpufrag.conventions import ANNOTATION_GPU_USAGE
from tests.defrag.agent.fakes import (
    POD_A,
    RecordingLog,
    RecordingWriter,
    api_client_for,
    fake_api_server,
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


def test_report_leak_creates_a_warning_event() -> None:
    writer = RecordingWriter()
    Publisher(writer, POLICY).report_leak(POD_A, "grew", T0)
    assert writer.events == [{"pod": POD_A, "reason": "GPUMemoryGrowth", "message": "grew",
                              "type": "Warning", "now": T0}]


def test_log_only_writer_writes_nothing_and_says_what_it_would() -> None:
    log = RecordingLog()
    writer = LogOnlyWriter(log.as_logger())
    writer.patch_node_annotation("node1", ANNOTATION_GPU_USAGE, "{}")
    writer.create_pod_event(POD_A, reason="GPUMemoryGrowth", message="m", event_type="Warning",
                            now=T0)
    assert log.events() == ["dry_run_patch_node", "dry_run_create_event"]


# --- the real client, against a fake API server -------------------------------------------------


def test_patch_is_a_merge_patch_of_one_annotation_on_the_named_node() -> None:
    value = reading(T0).to_json()
    with fake_api_server() as server:
        server.reply = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node1"}}
        KubeClusterWriter(api_client_for(server.url), node_name="node1").patch_node_annotation(
            "node1", ANNOTATION_GPU_USAGE, value)
    (request,) = server.requests
    assert (request.method, request.path) == ("PATCH", "/api/v1/nodes/node1")
    assert request.content_type == "application/merge-patch+json"
    assert request.body == {"metadata": {"annotations": {ANNOTATION_GPU_USAGE: value}}}


def test_event_is_a_core_v1_warning_on_the_pod() -> None:
    with fake_api_server() as server:
        writer = KubeClusterWriter(api_client_for(server.url), node_name="node1")
        writer.create_pod_event(POD_A, reason=EVENT_REASON_GPU_MEMORY_GROWTH,
                                message="GPU memory grew by 600 MiB", event_type="Warning",
                                now=T0 + 0.5)
    (request,) = server.requests
    assert (request.method, request.path) == ("POST", "/api/v1/namespaces/serving/events")
    event = request.body
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "serving",
                                       "name": POD_A.name, "uid": POD_A.uid}
    assert (event["reason"], event["type"], event["count"]) == ("GPUMemoryGrowth", "Warning", 1)
    assert event["message"] == "GPU memory grew by 600 MiB"
    assert event["metadata"]["name"] == f"{POD_A.name}.{int((T0 + 0.5) * 1e9):x}"
    assert event["metadata"]["namespace"] == "serving"
    assert event["firstTimestamp"].startswith("2024-11-29T17:06:40.5")
    assert event["source"] == {"component": "gpufrag-agent", "host": "node1"}
    assert event["reportingComponent"] == "gpufrag-agent"
    json.dumps(event)  # plain JSON all the way down


@pytest.mark.parametrize(("status", "retryable", "says"), [
    (404, False, "node 'node1' does not exist; check --node-name / NODE_NAME"),
    (403, False, "needs RBAC 'patch nodes'"),
    (401, False, "needs RBAC"),
    (409, True, "HTTP 409"),
    (429, True, "HTTP 429"),
    (503, True, "HTTP 503"),
    (422, False, "HTTP 422"),
])
def test_api_errors_say_whether_to_retry_and_what_to_fix(status: int, retryable: bool,
                                                         says: str) -> None:
    with fake_api_server() as server:
        server.status = status
        writer = KubeClusterWriter(api_client_for(server.url), node_name="node1")
        with pytest.raises(PublishError, match=re.escape(says)) as caught:
            writer.patch_node_annotation("node1", ANNOTATION_GPU_USAGE, "{}")
    assert caught.value.retryable is retryable


def test_event_rbac_error_names_the_verb() -> None:
    with fake_api_server() as server:
        server.status = 403
        writer = KubeClusterWriter(api_client_for(server.url), node_name="node1")
        with pytest.raises(PublishError, match="'create events'"):
            writer.create_pod_event(POD_A, reason="GPUMemoryGrowth", message="m",
                                    event_type="Warning", now=T0)


def test_unreachable_api_server_is_retryable() -> None:
    with fake_api_server() as server:
        url = server.url
    # The server is shut down: nothing listens on the port any more.
    writer = KubeClusterWriter(api_client_for(url), node_name="node1", request_timeout_s=2.0)
    with pytest.raises(PublishError) as caught:
        writer.patch_node_annotation("node1", ANNOTATION_GPU_USAGE, "{}")
    assert caught.value.retryable
