"""MIG pods through gpufrag-scheduler end to end: kube-scheduler calls the extender over HTTP for
pods asking ``nvidia.com/mig-<profile>``, on fake MIG nodes published as NVIDIA's GPU operator
publishes them (``mixed`` strategy: allocatable per profile, GPU feature discovery's labels).

- FGD over MIG decides: with a 4g.40gb-heavy workload, a 2g.20gb goes to the node where it
  strands least (its 2g instance sits on slices no 4g can use), not to the node that sorts first
  (whose free 2g instances sit where the only 4g place left starts);
- nothing is bound where the profile has no free instance: not where kube-scheduler's own count
  says so, nor where the agent's reading says the one instance is taken by a process outside
  any pod (which only the extender knows), and the extender's reason reaches the pod.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from devkit.controlplane import ControlPlane
from devkit.extender import ExtenderProcess, gpufrag_scheduler_config
from devkit.procs import wait_until
from devkit.stack import GROUP_LABEL, bound_node, delete_nodes
from gpufrag import conventions as cv
from gpufrag.gpu_usage import GpuUsage, MigInstanceUsage, NodeGpuUsage
from scheduler.kube.mignodes import mig_node_to_k8s
from scheduler.kube.mignodes import mig_pod_to_k8s as mig_pod

SCHEDULER = "gpufrag-mig"
GROUP = "mig"
H100 = ("NVIDIA-H100-80GB-HBM3", 81_559)


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[ExtenderProcess]:
    log = tmp_path_factory.mktemp("mig-extender") / "extender.log"
    ext = ExtenderProcess(control_plane, log, extra_args=(
        "--set", f"names.scheduler_name={SCHEDULER}")).start()
    # MIG pods reach the extender because managedResources names their resources
    # (gpufrag.conventions.MANAGED_RESOURCES, as every shipped configuration does).
    control_plane.start_scheduler(SCHEDULER, gpufrag_scheduler_config(ext.url, name=SCHEDULER))
    yield ext
    control_plane.stop_scheduler(SCHEDULER)
    ext.stop()


def _create_mig_node(plane: ControlPlane, name: str, counts: dict[str, int],
                     annotations: dict[str, str] | None = None) -> str:
    """A CPU node made Ready by the harness, then given its MIG side: labels, annotations,
    and ``nvidia.com/mig-<profile>`` capacity and allocatable in its status."""
    want = mig_node_to_k8s(name, *H100, 1, counts)
    plane.create_gpu_node(name, 0, "", 0, labels={GROUP_LABEL: GROUP})
    core = kubernetes.client.CoreV1Api(plane.api_client())
    core.patch_node(name, {"metadata": {"labels": want["metadata"]["labels"],
                                        "annotations": annotations or {}}})
    mig = {k: v for k, v in want["status"]["allocatable"].items()
           if k.startswith("nvidia.com/mig-")}
    core.patch_node_status(name, {"status": {"capacity": mig, "allocatable": mig}})
    return name


def _pod(namespace: str, name: str, profiles: dict[str, int], *, group: str = "",
         node: str = "") -> dict[str, Any]:
    """A pod of the MIG scheduler asking ``profiles``, kept to ``group``'s nodes (or bound to
    ``node`` by its spec), as the API server takes it."""
    body = mig_pod(name, profiles, namespace=namespace, node=node,
                          scheduler_name=SCHEDULER)
    body["spec"]["terminationGracePeriodSeconds"] = 0
    if group:
        body["spec"]["nodeSelector"] = {GROUP_LABEL: group}
    body["metadata"].pop("uid", None)
    body.pop("status", None)
    return body


def _unschedulable(core: Any, namespace: str, name: str) -> str | None:
    """The scheduler's message once it marked the pod Unschedulable; None while it has not
    (a bound pod fails the test)."""
    pod = core.read_namespaced_pod(name, namespace)
    assert not pod.spec.node_name, f"{name} was bound to {pod.spec.node_name}"
    for c in pod.status.conditions or ():
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return str(c.message or "")
    return None


def _agent_says_taken(node: str) -> str:
    """The agent's reading of one H100 whose one 3g.40gb instance holds memory of a process
    outside any pod: in use, although no pod asks it."""
    instance = MigInstanceUsage("3g.40gb", 0, "MIG-e2e", 2048, 40_192)
    gpu = GpuUsage(0, "GPU-e2e", "NVIDIA H100 80GB HBM3", 2048, 81_559, 0, mig=(instance,))
    return NodeGpuUsage(node, time.time(), 15.0, (gpu,)).to_json()


def test_mig_pods_go_where_they_strand_least_and_never_without_a_free_instance(
        control_plane: ControlPlane, extender: ExtenderProcess, namespace: str) -> None:
    # Any: the client's hints take its model classes, its calls take the JSON shape too.
    core: Any = kubernetes.client.CoreV1Api(control_plane.api_client())
    # a-cut: 3g.40gb (held) + two 2g.20gb where a 4g.40gb would start. b-half: 4g.40gb +
    # 2g.20gb + 1g.20gb, its 2g on slices 4-5, which no 4g can use. c-agent: one 3g.40gb,
    # taken according to the agent.
    nodes = [_create_mig_node(control_plane, "mig-a-cut", {"3g.40gb": 1, "2g.20gb": 2}),
             _create_mig_node(control_plane, "mig-b-half",
                              {"4g.40gb": 1, "2g.20gb": 1, "1g.20gb": 1}),
             _create_mig_node(control_plane, "mig-c-agent", {"3g.40gb": 1}, {
                 cv.ANNOTATION_GPU_USAGE: _agent_says_taken("mig-c-agent")})]
    try:
        core.create_namespaced_pod(namespace, _pod(namespace, "held", {"3g.40gb": 1},
                                                   node="mig-a-cut"))
        # The workload: 4g.40gb pods waiting where no node is (seen by the extender's watch).
        for i in range(4):
            core.create_namespaced_pod(namespace, _pod(namespace, f"big-{i}", {"4g.40gb": 1},
                                                       group="mig-nowhere"))
        wait_until(lambda: any(r.get("mig_profiles", {}).get("4g.40gb", 0) > 0.5
                               for r in [*extender.log_events("target workload set"),
                                         *extender.log_events("MIG target workload set")]),
                   timeout_s=30, what="the extender's MIG workload with the 4g.40gb pods")

        core.create_namespaced_pod(namespace, _pod(namespace, "two-g", {"2g.20gb": 1},
                                                   group=GROUP))
        assert bound_node(core, namespace, "two-g") == "mig-b-half"
        decided = [r["node"] for r in extender.log_events("filter")
                   if r.get("pod") == f"{namespace}/two-g" and "node" in r]
        assert decided[-1:] == ["mig-b-half"]

        # No 3g.40gb is free: a-cut's is held by a pod, b-half has none, c-agent's is taken
        # by a process (kube-scheduler's count passes it; the extender's reading does not).
        core.create_namespaced_pod(namespace, _pod(namespace, "three-g", {"3g.40gb": 1},
                                                   group=GROUP))
        message = wait_until(lambda: _unschedulable(core, namespace, "three-g"),
                             timeout_s=60, what="three-g marked unschedulable")
        assert "no free nvidia.com/mig-3g.40gb instance (1 of 1 in use)" in message, message
        assert _unschedulable(core, namespace, "three-g") is not None  # still not bound
    finally:
        for pod in core.list_namespaced_pod(namespace).items:
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
        delete_nodes(control_plane, nodes)
