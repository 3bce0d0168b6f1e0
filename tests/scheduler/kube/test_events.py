"""scheduler.kube.events: one Event body for every writer, named so that a second report of the
same object and reason within the window is a duplicate the API server refuses."""

from __future__ import annotations

import re

import pytest

from scheduler.kube.events import (
    CLUSTER_EVENT_NAMESPACE,
    EVENT_MESSAGE_CHARS,
    Involved,
    event_name,
    warning_event,
)

POD = Involved("Pod", "llama-7b-0", "serving", "uid-1")
NODE = Involved("Node", "gpu-7", uid="gpu-7")
HOUR_START = 1_732_899_600.0  # a multiple of 3600
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def test_the_body_names_the_object_reason_component_and_time() -> None:
    namespace, body = warning_event(POD, reason="GPUMemoryGrowth", message="grew",
                                    component="gpufrag-agent", instance="gpufrag-agent-gpu-7",
                                    host="gpu-7", now_s=0.0)
    assert namespace == body["metadata"]["namespace"] == "serving"
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "llama-7b-0",
                                      "namespace": "serving", "uid": "uid-1"}
    assert (body["type"], body["reason"], body["message"], body["count"]) == (
        "Warning", "GPUMemoryGrowth", "grew", 1)
    assert body["source"] == {"component": "gpufrag-agent", "host": "gpu-7"}
    assert body["reportingInstance"] == "gpufrag-agent-gpu-7"
    assert body["firstTimestamp"] == body["lastTimestamp"] == "1970-01-01T00:00:00Z"


def test_a_cluster_scoped_object_s_event_goes_to_default_and_long_text_is_cut() -> None:
    namespace, body = warning_event(NODE, reason="R", message="m" * 5000, component="c",
                                    instance="i" * 500, now_s=0.0)
    assert namespace == CLUSTER_EVENT_NAMESPACE and "namespace" not in body["involvedObject"]
    assert len(body["message"]) == EVENT_MESSAGE_CHARS and len(body["reportingInstance"]) == 128
    assert body["source"] == {"component": "c"}  # no host given: none written


@pytest.mark.parametrize(("other", "same"), [
    ({"now_s": HOUR_START + 3599}, True),  # later in the same window
    ({"now_s": HOUR_START + 3600}, False),  # the next window
    ({"reason": "GPUMemoryOverShare"}, False),
    ({"involved": Involved("Pod", "llama-7b-0", "serving", "uid-2")}, False),  # recreated pod
    ({"about": "4242/GPU-a"}, False),  # another thing of the object under the same reason
    ({"window_s": 60.0, "now_s": HOUR_START + 60}, False),
])
def test_one_name_per_object_reason_and_window(other: dict[str, object], same: bool) -> None:
    base: dict[str, object] = {"involved": POD, "reason": "GPUMemoryGrowth",
                               "now_s": HOUR_START}
    first = event_name(**base)  # type: ignore[arg-type]
    assert (event_name(**{**base, **other}) == first) is same  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["huge", "a" * 253, "x" * 199 + ".-y", "<unnamed>", "UPPER_x"])
def test_names_are_valid_whatever_the_object_is_called(name: str) -> None:
    found = event_name(Involved("Pod", name, "ns"), "R", now_s=0.0)
    assert len(found) <= 253 and _DNS_SUBDOMAIN.match(found), found
