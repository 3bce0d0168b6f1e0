"""A GPU pod that gpufrag-scheduler placed without the extender's say is counted and reported.

kube-scheduler skips an ``ignorable`` extender that fails or times out and places the pod by
its own plugins; the extender notices in its watch (here: the cache's ``apply_pod``, which the
watch calls) and says so in ``gpufrag_extender_bypassed_pods_total`` and a Warning Event.
"""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from scheduler.extender.runtime import Runtime
from scheduler.kube.bypass import ACTIVE_WINDOW_S, bypassed
from scheduler.kube.cache import SkippedObject
from scheduler.kube.podwarning import PodWarning
from scheduler.kube.skipreport import (
    EVENT_REASON_BYPASSED,
    EVENT_REASON_UNREADABLE,
    SkipReporter,
    skip_event,
)
from tests.builders import node, pod
from tests.scheduler.extender.helpers import FakeClock, k8s_pod, post, serve


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def runtime(clock: FakeClock) -> Runtime:
    return serve([node("n0", gpu_count=4), node("n1", gpu_count=4)], clock=clock)


@pytest.fixture
def heard(runtime: Runtime) -> list[PodWarning]:
    found: list[PodWarning] = []
    runtime.cache.bypass.on_bypass = found.append
    return found


def gpu_pod(name: str, *, at: str = "", scheduler_name: str | None = None,
            **overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"uid": f"uid-{name}", "node": at}
    if scheduler_name is not None:
        kwargs["scheduler_name"] = scheduler_name
    return k8s_pod(pod(name, **overrides), **kwargs)


def bypassed_total(client: FlaskClient) -> float:
    text = client.get("/metrics").get_data(as_text=True)
    (family,) = [f for f in text_string_to_metric_families(text)
                 if f.name == "gpufrag_extender_bypassed_pods"]
    (sample,) = [s for s in family.samples if s.name.endswith("_total")]
    return sample.value


def filter_on(client: FlaskClient, obj: dict[str, Any], names: list[str]) -> list[str]:
    status, reply = post(client, "/filter", {"Pod": obj, "NodeNames": names})
    assert status == 200, reply
    passed: list[str] = reply["NodeNames"]
    return passed


def test_a_pod_bound_where_the_filter_decided_is_not_bypassed(
        runtime: Runtime, heard: list[PodWarning]) -> None:
    client = runtime.app.test_client()
    (chosen,) = filter_on(client, gpu_pod("a"), ["n0", "n1"])
    runtime.cache.apply_pod(gpu_pod("a", at=chosen))
    assert heard == [] and bypassed_total(client) == 0


def test_a_pod_bound_elsewhere_than_the_filter_passed_is_bypassed(
        runtime: Runtime, heard: list[PodWarning]) -> None:
    client = runtime.app.test_client()
    (chosen,) = filter_on(client, gpu_pod("a"), ["n0", "n1"])
    other = "n1" if chosen == "n0" else "n0"
    runtime.cache.apply_pod(gpu_pod("a", at=other))
    (report,) = heard
    assert (report.key, report.namespace, report.name, report.uid) == (
        "default/a", "default", "a", "uid-a")
    assert f"bound to {other}, a node the gpufrag extender did not pass for it" in report.message
    assert bypassed_total(client) == 1


def test_a_pod_bound_while_its_filter_is_being_answered_is_bypassed(
        runtime: Runtime, heard: list[PodWarning]) -> None:
    # What an ignorable extender looks like to kube-scheduler past httpTimeout: the request
    # arrived, its answer is not made yet, and the pod is bound by kube-scheduler's plugins.
    runtime.cache.bypass.asked("default/a")
    runtime.cache.apply_pod(gpu_pod("a", at="n0"))
    (report,) = heard
    assert "still answering its filter" in report.message and "httpTimeout" in report.message
    assert "no fragmentation scoring and no GPU record" in report.message


def test_a_pod_never_filtered_by_an_extender_in_use_is_bypassed(
        runtime: Runtime, clock: FakeClock, heard: list[PodWarning]) -> None:
    client = runtime.app.test_client()
    filter_on(client, gpu_pod("other"), ["n0", "n1"])
    clock.advance(ACTIVE_WINDOW_S - 1)
    runtime.cache.apply_pod(gpu_pod("a", at="n1"))  # e.g. created with spec.nodeName
    (report,) = heard
    assert "no filter answer" in report.message and "spec.nodeName" in report.message


def test_an_extender_nobody_asks_judges_nothing(
        runtime: Runtime, clock: FakeClock, heard: list[PodWarning]) -> None:
    # The standby replica of a leader-elected pair: its kube-scheduler places nothing.
    runtime.cache.apply_pod(gpu_pod("a", at="n1"))
    client = runtime.app.test_client()
    filter_on(client, gpu_pod("other"), ["n0", "n1"])
    clock.advance(ACTIVE_WINDOW_S + 1)  # ... or the active one until it stopped being asked
    runtime.cache.apply_pod(gpu_pod("b", at="n1"))
    assert heard == []


@pytest.mark.parametrize("obj", [
    gpu_pod("cpu", at="n0", num_gpu=0, gpu_milli=0),
    gpu_pod("theirs", at="n0", scheduler_name="default-scheduler"),
], ids=["no GPU", "another scheduler"])
def test_only_gpu_pods_of_this_scheduler_are_judged(
        runtime: Runtime, heard: list[PodWarning], obj: dict[str, Any]) -> None:
    filter_on(runtime.app.test_client(), gpu_pod("other"), ["n0", "n1"])
    runtime.cache.apply_pod(obj)
    assert heard == []


def test_pods_bound_before_the_first_list_are_not_judged(clock: FakeClock) -> None:
    found: list[PodWarning] = []
    runtime = serve([node("n0", gpu_count=4)], [gpu_pod("old", at="n0")], clock=clock)
    runtime.cache.bypass.on_bypass = found.append
    runtime.cache.replace_pods([gpu_pod("old", at="n0")])  # a relist: nothing newly bound
    assert found == [] and runtime.cache.bypass.total == 0


def test_the_warning_event_says_what_happened() -> None:
    report = bypassed("team/a", "uid-a", "bound to n0, a node ...")
    namespace, body = skip_event(report, instance="extender-0", now_s=0)
    assert namespace == "team"
    assert (body["type"], body["reason"]) == ("Warning", EVENT_REASON_BYPASSED)
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "a",
                                      "namespace": "team", "uid": "uid-a"}
    assert body["message"] == ("placed by its scheduler without the gpufrag extender: "
                               "bound to n0, a node ...")


def test_one_event_per_pod_and_cause() -> None:
    written: list[dict[str, Any]] = []
    reporter = SkipReporter(lambda _ns, body: written.append(body), instance="x")
    warning = bypassed("team/a", "uid-a", "why")
    reporter.report(warning)
    reporter.report(warning)  # seen again (a status update): no second Event
    reporter.report(SkippedObject("Pod", "team/a", "team", "a", "uid-a", "bad quantity"))
    assert reporter.write_queued() == 2
    assert [b["reason"] for b in written] == [EVENT_REASON_BYPASSED, EVENT_REASON_UNREADABLE]
    assert len({b["metadata"]["name"] for b in written}) == 2
