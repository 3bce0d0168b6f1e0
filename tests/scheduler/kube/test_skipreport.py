"""Warning Events on objects the extender cannot read: bodies, one per UID, never blocking."""

from __future__ import annotations

import re
from typing import Any

import kubernetes
import pytest

from scheduler.kube.cache import SkippedObject
from scheduler.kube.skipreport import (
    EVENT_REASON_UNREADABLE,
    REPORTING_COMPONENT,
    SkipReporter,
    skip_event,
)


# ------------------------------------------------------------------ Events on skipped objects
def skipped_pod(name: str = "huge", uid: str = "uid-1", namespace: str = "team") -> SkippedObject:
    return SkippedObject(kind="Pod", key=f"{namespace}/{name}", namespace=namespace, name=name,
                         uid=uid, reason="field 'requests.nvidia.com/gpu': '10e99999' is too "
                         "large")


class RecordingWriter:
    """Records Event writes; ``fail_with`` is raised (once per entry) before recording."""

    def __init__(self, *fail_with: BaseException) -> None:
        self.written: list[tuple[str, dict[str, Any]]] = []
        self.fail_with = list(fail_with)

    def __call__(self, namespace: str, body: dict[str, Any]) -> None:
        if self.fail_with:
            raise self.fail_with.pop(0)
        self.written.append((namespace, body))


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def test_the_event_names_the_object_the_reason_and_the_extender() -> None:
    namespace, body = skip_event(skipped_pod(), instance="gpufrag-scheduler-0", now_s=0)
    assert namespace == "team"
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team",
                                      "name": "huge", "uid": "uid-1"}
    assert (body["type"], body["reason"]) == ("Warning", EVENT_REASON_UNREADABLE)
    assert body["message"].endswith(skipped_pod().reason)
    assert body["reportingComponent"] == body["source"]["component"] == REPORTING_COMPONENT
    assert body["reportingInstance"] == "gpufrag-scheduler-0"
    assert body["firstTimestamp"] == body["lastTimestamp"] == "1970-01-01T00:00:00Z"
    assert body["metadata"]["namespace"] == "team"
    # One name per object: a restarted extender gets 409 instead of writing a second Event.
    again = skip_event(skipped_pod(), instance="other", now_s=99)[1]
    assert again["metadata"]["name"] == body["metadata"]["name"]
    assert skip_event(skipped_pod(uid="uid-2"), instance="", now_s=0)[1][
        "metadata"]["name"] != body["metadata"]["name"]


@pytest.mark.parametrize("name", ["huge", "a" * 253, "x" * 199 + ".-y", "<unnamed>"])
def test_event_names_are_valid_whatever_the_object_is_called(name: str) -> None:
    event_name = skip_event(skipped_pod(name=name), instance="", now_s=0)[1]["metadata"]["name"]
    assert len(event_name) <= 253 and _DNS_SUBDOMAIN.match(event_name), event_name


def test_a_node_event_goes_to_the_default_namespace() -> None:
    node = SkippedObject(kind="Node", key="n0", namespace="", name="n0", uid="u", reason="bad")
    namespace, body = skip_event(node, instance="i", now_s=0)
    assert namespace == "default" and "namespace" not in body["involvedObject"]
    assert body["message"].startswith("gpufrag extender cannot read this node")


def test_one_event_per_uid() -> None:
    writer = RecordingWriter()
    reporter = SkipReporter(writer, instance="i", clock=lambda: 0.0)
    for _ in range(3):
        reporter.report(skipped_pod())
    reporter.report(skipped_pod(uid="uid-2"))  # re-created under the same name: a new pod
    assert reporter.write_queued() == 2
    reporter.report(skipped_pod())
    assert reporter.write_queued() == 0
    assert [b["involvedObject"]["uid"] for _, b in writer.written] == ["uid-1", "uid-2"]
    assert reporter.outcomes == {"written": 2, "failed": 0, "dropped": 0}


def test_a_full_queue_drops_and_the_next_read_reports_again() -> None:
    writer = RecordingWriter()
    reporter = SkipReporter(writer, instance="i", capacity=2)
    for i in range(3):
        reporter.report(skipped_pod(name=f"p{i}", uid=f"u{i}"))
    assert reporter.outcomes["dropped"] == 1
    assert reporter.write_queued() == 2
    reporter.report(skipped_pod(name="p2", uid="u2"))  # its next status update or relist
    assert reporter.write_queued() == 1
    assert reporter.outcomes == {"written": 3, "failed": 0, "dropped": 1}


def test_failed_writes_retry_only_when_a_retry_may_pass() -> None:
    writer = RecordingWriter(kubernetes.client.ApiException(status=503, reason="Unavailable"),
                             kubernetes.client.ApiException(status=403, reason="Forbidden"),
                             kubernetes.client.ApiException(status=409, reason="Conflict"))
    reporter = SkipReporter(writer, instance="i")
    reporter.report(skipped_pod(uid="retryable"))
    reporter.report(skipped_pod(uid="refused"))
    reporter.report(skipped_pod(uid="exists"))
    assert reporter.write_queued() == 3
    assert reporter.outcomes == {"written": 1, "failed": 2, "dropped": 0}  # 409: it is there
    for uid in ("retryable", "refused", "exists"):
        reporter.report(skipped_pod(uid=uid))
    assert reporter.write_queued() == 1  # only the 503 is tried again
    assert [b["involvedObject"]["uid"] for _, b in writer.written] == ["retryable"]


def test_remembered_uids_are_bounded() -> None:
    reporter = SkipReporter(RecordingWriter(), instance="i", remember=2)
    for uid in ("a", "b", "c"):
        reporter.report(skipped_pod(uid=uid))
    reporter.report(skipped_pod(uid="a"))  # forgotten (the oldest): reported again
    assert reporter.write_queued() == 4


