"""The extender's Prometheus metrics for objects it cannot read: how many are left out of the
state now (a gauge), how many were ever left out (a counter), and, against a live cluster only,
what became of the Warning Events about them. The rest of /metrics is covered with the
verbs in test_contract.py."""

from __future__ import annotations

from typing import Any

import kubernetes
from prometheus_client.parser import text_string_to_metric_families

from scheduler.extender.config import ExtenderConfig
from scheduler.extender.runtime import Runtime, cluster_runtime
from scheduler.kube.convert import pod_to_k8s
from tests.builders import node, pod
from tests.scheduler.extender.helpers import serve

NODES = [node("gpu-a", gpu_count=4)]


def unreadable(name: str, quantity: str = "9" * 5000) -> dict[str, Any]:
    """A pod whose GPU request the API server stores but no quantity parser should read."""
    body = pod_to_k8s(pod(name), node="gpu-a")
    body["metadata"]["uid"] = f"uid-{name}"
    body["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = quantity
    return body


def samples(runtime: Runtime) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, by name and labels (parsed, so the text is valid too)."""
    text = runtime.app.test_client().get("/metrics").data.decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_skipped_objects_are_a_gauge_and_a_counter_by_kind() -> None:
    runtime = serve(NODES, [unreadable("huge", "10e99999"), unreadable("long"),
                            pod_to_k8s(pod("fine"), node="gpu-a")])
    found = samples(runtime)
    assert found[("gpufrag_extender_skipped_objects", (("kind", "pod"),))] == 2
    assert found[("gpufrag_extender_skipped_objects", (("kind", "node"),))] == 0
    assert found[("gpufrag_extender_object_skips_total", (("kind", "pod"),))] == 2
    assert found[("gpufrag_extender_pods", (("state", "placed"),))] == 1

    runtime.cache.delete_pod("default/huge")
    found = samples(runtime)
    assert found[("gpufrag_extender_skipped_objects", (("kind", "pod"),))] == 1
    assert found[("gpufrag_extender_object_skips_total", (("kind", "pod"),))] == 2


def test_objects_a_relist_dropped_are_counted_by_kind() -> None:
    runtime = serve(NODES, [pod_to_k8s(pod("kept"), node="gpu-a"),
                            pod_to_k8s(pod("missed"), node="gpu-a")])
    assert samples(runtime)[("gpufrag_extender_relist_dropped_objects_total",
                             (("kind", "pod"),))] == 0
    runtime.cache.replace_pods([pod_to_k8s(pod("kept"), node="gpu-a")])  # "missed" is gone
    found = samples(runtime)
    assert found[("gpufrag_extender_relist_dropped_objects_total", (("kind", "pod"),))] == 1
    assert found[("gpufrag_extender_relist_dropped_objects_total", (("kind", "node"),))] == 0
    assert found[("gpufrag_extender_pods", (("state", "placed"),))] == 1


def test_snapshot_mode_writes_no_events() -> None:
    runtime = serve(NODES, [unreadable("huge")])
    assert runtime.reporter is None and runtime.cache.on_skip is None
    names = {name for name, _ in samples(runtime)}
    assert "gpufrag_extender_skipped_objects" in names
    assert not any(n.startswith("gpufrag_extender_skip_events") for n in names)


class RecordingWriter:
    def __init__(self) -> None:
        self.written: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, namespace: str, body: dict[str, Any]) -> None:
        self.written.append((namespace, body))


def test_a_live_cluster_reports_events_by_outcome() -> None:
    # Nothing is started: no thread, no connection. The cache is fed as the watch would.
    runtime = cluster_runtime(kubernetes.client.ApiClient, ExtenderConfig())
    try:
        assert runtime.reporter is not None
        writer = RecordingWriter()
        runtime.reporter.write = writer
        runtime.cache.replace_nodes([])
        runtime.cache.apply_pod(unreadable("huge"))
        runtime.cache.apply_pod(unreadable("huge"))  # a status update: no second Event
        assert runtime.reporter.write_queued() == 1
        assert writer.written[0][1]["involvedObject"]["name"] == "huge"
        found = samples(runtime)
        assert found[("gpufrag_extender_skip_events_total", (("outcome", "written"),))] == 1
        assert found[("gpufrag_extender_skip_events_total", (("outcome", "failed"),))] == 0
        assert found[("gpufrag_extender_skip_events_total", (("outcome", "dropped"),))] == 0
        assert found[("gpufrag_extender_skipped_objects", (("kind", "pod"),))] == 1
    finally:
        runtime.stop()
