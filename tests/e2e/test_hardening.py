"""Pods whose quantities no parser should read, stored through the real API server, cannot stall
gpufrag-scheduler: GPU pods go on being bound within seconds, and each such pod is reported
(the extender's log, its ``gpufrag_extender_skipped_objects`` gauge, a Warning Event on the
pod) and left out of the extender's state.

What the API server stores (checked against this control plane): ``nvidia.com/gpu`` and
``gpufrag.io/gpu-milli`` requests of ``"1e100000"`` (kept as ``"10e99999"``) and of five
thousand 9s (kept as given; twenty 9s are refused as "must be an integer", five thousand are
not). ``"1e999999999"`` is not among them: the API server's own parser spends its whole
request timeout on it and answers 504 without storing the pod, so it is not tried here.

gpufrag-scheduler never binds these pods (the extender's filter answers 400). The upstream
default scheduler does, once a node exists, onto a 4-GPU node (its int64 arithmetic wraps; 2^64
GPUs "fits" too), so whether the default-scheduler pod is bound depends on timing and is not
checked: it is left out of the extender's state either way.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devkit.controlplane import ControlPlane
from devkit.extender import ExtenderProcess, gpufrag_scheduler_config
from devkit.procs import tail, wait_until
from devkit.stack import bound_node, delete_nodes, gpu_pod, make_nodes
from gpufrag import conventions as cv
from scheduler.extender.config import config_from_mapping
from scheduler.extender.runtime import cluster_runtime
from scheduler.kube.skipreport import EVENT_REASON_UNREADABLE, REPORTING_COMPONENT
from tests.e2e.test_rbac import Clients, as_service_account  # noqa: F401  (a fixture: RBAC)

GROUP = "harden"
BOUND_WITHIN_S = 15.0
REPORTED_WITHIN_S = 30.0
HUGE_EXPONENT = "1e100000"
MANY_DIGITS = "9" * 5000
# name -> (resource, quantity, scheduler): every pathological shape, for ours and the default.
PATHOLOGICAL: dict[str, tuple[str, str, str]] = {
    "exp-gpu": (cv.RESOURCE_GPU, HUGE_EXPONENT, cv.SCHEDULER_NAME),
    "digits-gpu": (cv.RESOURCE_GPU, MANY_DIGITS, cv.SCHEDULER_NAME),
    "exp-milli": (cv.RESOURCE_GPU_MILLI, HUGE_EXPONENT, cv.SCHEDULER_NAME),
    "digits-milli": (cv.RESOURCE_GPU_MILLI, MANY_DIGITS, cv.SCHEDULER_NAME),
    "digits-default": (cv.RESOURCE_GPU, MANY_DIGITS, "default-scheduler"),
}


def pathological_pod(name: str, resource: str, quantity: str, scheduler: str) -> dict[str, Any]:
    body = gpu_pod(name, scheduler=scheduler, group=GROUP)
    resources = body["spec"]["containers"][0]["resources"]
    resources["requests"][resource] = resources["limits"][resource] = quantity
    return body


def core_api(plane: ControlPlane) -> Any:
    """A ``CoreV1Api``, typed as Any: the tests read model fields the stubs call optional."""
    return kubernetes.client.CoreV1Api(plane.api_client())


def unreadable_events(core: Any, namespace: str, name: str) -> list[Any] | None:
    """The pod's GpufragUnreadable Events; None while there are none (for ``wait_until``)."""
    events = list(core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},reason={EVENT_REASON_UNREADABLE}"
    ).items)
    return events or None


def scrape(ext: ExtenderProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(ext.metrics())
            for s in family.samples}


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[ExtenderProcess]:
    log = tmp_path_factory.mktemp("hardening") / "extender.log"
    ext = ExtenderProcess(control_plane, log).start()
    control_plane.start_scheduler("gpufrag-scheduler", gpufrag_scheduler_config(ext.url))
    yield ext
    control_plane.stop_scheduler("gpufrag-scheduler")
    ext.stop()


def test_pathological_pods_are_reported_and_gpu_pods_still_bind_within_seconds(
        control_plane: ControlPlane, extender: ExtenderProcess, namespace: str) -> None:
    core = core_api(control_plane)
    assert extender.process is not None
    # The extender serves in its own process (no worker to restart): "no restart" is the
    # same process answering throughout.
    pid = extender.process.pid
    nodes: list[str] = []
    try:
        for name, (resource, quantity, scheduler) in PATHOLOGICAL.items():
            core.create_namespaced_pod(namespace, pathological_pod(
                name, resource, quantity, scheduler))
            stored = core.read_namespaced_pod(name, namespace).spec.containers[0]
            assert len(stored.resources.requests[resource]) >= len("10e99999"), name

        # Nodes created after the pathological pods reach the extender through the same watch
        # stream: a pod that can only go there shows the watch went on past them.
        nodes = make_nodes(control_plane, GROUP, {"A10": 23_028}, per_product=2, gpus=4)
        started = time.monotonic()
        core.create_namespaced_pod(namespace, gpu_pod("whole", gpus=1, group=GROUP))
        core.create_namespaced_pod(namespace, gpu_pod("share", milli=500, group=GROUP))
        for name in ("whole", "share"):
            assert bound_node(core, namespace, name, timeout_s=BOUND_WITHIN_S) in nodes
        assert time.monotonic() - started < BOUND_WITHIN_S
        annotations = core.read_namespaced_pod("share", namespace).metadata.annotations
        assert annotations[cv.ANNOTATION_GPU_INDICES] in {"0", "1", "2", "3"}

        for name, (resource, _, _) in PATHOLOGICAL.items():
            events = wait_until(functools.partial(unreadable_events, core, namespace, name),
                                timeout_s=REPORTED_WITHIN_S, what=f"the Event on pod {name}")
            assert len(events) == 1, name  # once per pod, however often it is re-read
            event = events[0]
            assert event.type == "Warning" and event.reporting_component == REPORTING_COMPONENT
            assert f"requests.{resource}" in event.message, event.message
            assert "larger in magnitude" in event.message or "5000 characters" in event.message
            if PATHOLOGICAL[name][2] == cv.SCHEDULER_NAME:
                assert not core.read_namespaced_pod(name, namespace).spec.node_name, name

        def all_skipped() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            found = scrape(extender)
            skipped = found[("gpufrag_extender_skipped_objects", (("kind", "pod"),))]
            return found if skipped == len(PATHOLOGICAL) else None

        found = wait_until(all_skipped, timeout_s=REPORTED_WITHIN_S,
                           what="the skipped-objects gauge to count every pathological pod")
        assert found[("gpufrag_extender_skip_events_total", (("outcome", "written"),))] \
            == len(PATHOLOGICAL)
        assert found[("gpufrag_extender_skip_events_total", (("outcome", "dropped"),))] == 0
        assert found[("gpufrag_extender_pods", (("state", "placed"),))] >= 2

        assert extender.running() and extender.process.pid == pid  # no restart either
        log = extender.log_path.read_text()
        assert "WORKER TIMEOUT" not in log and "event not applied" not in log
        skipped_lines = [r for r in extender.log_events("object skipped")
                         if r["object"].startswith(f"pod {namespace}/")]
        assert {r["object"] for r in skipped_lines} == {
            f"pod {namespace}/{name}" for name in PATHOLOGICAL}
    finally:
        print(tail(extender.log_path))  # shown only when the test fails
        for pod in core.list_namespaced_pod(namespace).items:
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
        delete_nodes(control_plane, nodes)

    wait_until(lambda: scrape(extender)[("gpufrag_extender_skipped_objects", (
        ("kind", "pod"),))] == 0 or None, timeout_s=REPORTED_WITHIN_S,
        what="deleted pods to leave the skipped-objects gauge")


def test_the_extender_service_account_may_write_the_event(
        control_plane: ControlPlane, as_service_account: Clients,  # noqa: F811
        namespace: str) -> None:
    """The extender writes Events with the manifests' ServiceAccount: ``create events`` comes
    with kube-scheduler's own role, bound to the same account (they share the pod)."""
    config = config_from_mapping({"maintenance_interval_s": 0.2, "watch": {"timeout_s": 5}})

    def as_extender() -> kubernetes.client.ApiClient:
        return as_service_account("gpufrag-scheduler")

    rt = cluster_runtime(as_extender, config)
    rt.start()
    admin = core_api(control_plane)
    try:
        wait_until(lambda: rt.extender.ready or None, timeout_s=60,
                   what="the extender to list and watch as gpufrag-scheduler")
        admin.create_namespaced_pod(namespace, pathological_pod(
            "unreadable", cv.RESOURCE_GPU, MANY_DIGITS, "nobody"))
        events = wait_until(lambda: unreadable_events(admin, namespace, "unreadable"),
                            timeout_s=REPORTED_WITHIN_S, what="the Event, written as the SA")
        assert events[0].involved_object.uid == admin.read_namespaced_pod(
            "unreadable", namespace).metadata.uid
        assert rt.reporter is not None
        assert rt.reporter.outcomes["failed"] == 0, rt.reporter.outcomes
    finally:
        rt.stop()
