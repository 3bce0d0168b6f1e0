"""The deciding filter on the real kube-scheduler: what changes when the filter answers with
the one node the extender chose (``filter.answer: decide``, the default).

- kube-scheduler skips scoring when one node is feasible: neither its score plugins nor the
  extender's prioritize verb run, even in a profile that configures prioritizeVerb;
- a burst of pods, filtered back to back before any of them is bound, lands without a refused
  bind or an over-committed GPU: each filter assumes its decision, so the next one sees it.

The other two changes are pinned where the behaviour already had its test, now run with the
deciding filter (the default configuration of ``gpufrag_scheduler_config``):
preemption (the filter lists every node with its reason when the pod fits none, so
DefaultPreemption finds its candidates and the preempt verb trims them) in
tests/e2e/test_preemption.py, and the ``ignorable`` fallback (kube-scheduler places the pod on
its own while the extender is down) in tests/e2e/test_scheduling.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from devkit.controlplane import ControlPlane
from devkit.extender import ExtenderProcess, gpufrag_scheduler_config
from devkit.procs import wait_until
from devkit.stack import delete_nodes, gpu_pod, make_nodes
from gpufrag import conventions as cv

GROUP = "decides"


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[ExtenderProcess]:
    log = tmp_path_factory.mktemp("extender-decides") / "extender.log"
    ext = ExtenderProcess(control_plane, log).start()
    # prioritizeVerb configured on purpose: kube-scheduler must not call it (one feasible node).
    control_plane.start_scheduler("gpufrag-scheduler", gpufrag_scheduler_config(
        ext.url, prioritize=True))
    yield ext
    control_plane.stop_scheduler("gpufrag-scheduler")
    ext.stop()


def test_a_burst_lands_on_the_decisions_without_scoring_or_refused_binds(
        control_plane: ControlPlane, extender: ExtenderProcess, namespace: str) -> None:
    # 3 nodes x 4 GPUs, 12 one-GPU pods created at once: every GPU is needed, so a filter
    # that did not see the previous decision would pick a GPU taken and its bind be refused.
    nodes = make_nodes(control_plane, GROUP, {"A10": 23_028}, per_product=3, gpus=4)
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    names = [f"burst-{i}" for i in range(12)]
    try:
        for name in names:
            core.create_namespaced_pod(namespace, gpu_pod(name, gpus=1, group=GROUP))

        def all_bound() -> list[Any] | None:
            pods: list[Any] = core.list_namespaced_pod(namespace).items
            return pods if len(pods) == len(names) and all(
                p.spec.node_name for p in pods) else None

        pods = wait_until(all_bound, timeout_s=60, what="12 pods bound")
        taken = Counter((p.spec.node_name, p.metadata.annotations[cv.ANNOTATION_GPU_INDICES])
                        for p in pods)
        assert len(taken) == 12 and set(taken.values()) == {1}, taken

        pod_ids = {f"{namespace}/{n}" for n in names}
        decided = {r["pod"]: r["node"] for r in extender.log_events("filter")
                   if r["pod"] in pod_ids and "node" in r}
        assert decided == {f"{namespace}/{p.metadata.name}": p.spec.node_name for p in pods}
        refused = [r for r in extender.log_events("bind")
                   if r.get("pod") in pod_ids and r.get("refused")]
        assert refused == []
        # One feasible node: kube-scheduler skipped scoring, so prioritize was never called.
        assert [r for r in extender.log_events("prioritize") if r["pod"] in pod_ids] == []
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        delete_nodes(control_plane, nodes)
