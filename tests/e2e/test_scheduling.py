"""gpufrag-scheduler end to end: the real kube-scheduler calls our extender over HTTP, and the
real API server stores the result.

- placement: every pod lands on the node the extender's filter decided on, GPU annotations are
  consistent, no GPU is over-committed, replicas of a model version co-locate up to the cap;
- fragmentation: the same workload through the default scheduler and through ours;
- failure: the extender stopped mid-run, with ``ignorable`` true and false.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from devkit.controlplane import ControlPlane
from devkit.extender import ExtenderProcess, gpufrag_scheduler_config
from devkit.procs import wait_until
from devkit.stack import (
    bound_node,
    cluster_state,
    delete_nodes,
    gpu_pod,
    make_nodes,
)
from gpufrag import conventions as cv
from scheduler.core import PodRequest, TargetWorkload, fragmentation_ratio

PRODUCTS = {"T4": 15_360, "V100M32": 32_768, "A10": 23_028, "G2": 16_384}
CAP = 3


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[ExtenderProcess]:
    log = tmp_path_factory.mktemp("extender") / "extender.log"
    # Affinity weighted above the policy so the co-location rule is what the test observes.
    ext = ExtenderProcess(control_plane, log, extra_args=(
        "--set", f"affinity.max_replicas_per_node={CAP}", "--set", "affinity.cap_is_hard=true",
        "--set", "weights.affinity=2.0"))
    ext.start()
    control_plane.start_scheduler("gpufrag-scheduler", gpufrag_scheduler_config(ext.url))
    yield ext
    control_plane.stop_scheduler("gpufrag-scheduler")
    ext.stop()


def _stream(rng: random.Random) -> list[dict[str, object]]:
    pods: list[dict[str, object]] = []
    for i in range(30):
        kind = rng.choice(["whole", "share", "share", "multi", "constrained"])
        if kind == "whole":
            pods.append(gpu_pod(f"whole-{i}", gpus=1, group="place"))
        elif kind == "multi":
            pods.append(gpu_pod(f"multi-{i}", gpus=rng.choice([2, 4]), group="place"))
        elif kind == "constrained":
            pods.append(gpu_pod(f"spec-{i}", milli=rng.choice([300, 500]),
                                products=("V100M32", "A10"), group="place"))
        else:
            pods.append(gpu_pod(f"share-{i}", milli=rng.choice([230, 470, 650, 810]),
                                group="place"))
    for i in range(7):
        pods.append(gpu_pod(f"llm-v1-{i}", milli=250, model="llm", version="v1", group="place"))
    for i in range(3):
        pods.append(gpu_pod(f"llm-v2-{i}", milli=250, model="llm", version="v2", group="place"))
    return pods


def test_every_pod_lands_where_the_extender_decided(
        control_plane: ControlPlane, extender: ExtenderProcess, namespace: str) -> None:
    nodes = make_nodes(control_plane, "place", PRODUCTS, per_product=4)
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    try:
        placed: dict[str, str] = {}
        for body in _stream(random.Random(7)):
            name = body["metadata"]["name"]  # type: ignore[index]
            core.create_namespaced_pod(namespace, body)
            placed[name] = bound_node(core, namespace, name)

        # The deciding filter names its choice (the last one, where a pod was filtered again).
        ranked = {r["pod"]: r["node"] for r in extender.log_events("filter")
                  if r["pod"].startswith(f"{namespace}/") and "node" in r}
        for name, node in placed.items():
            assert ranked[f"{namespace}/{name}"] == node, name

        # GPU annotations: present, the right count, never over-committed, products honoured.
        used: dict[tuple[str, int], int] = defaultdict(int)
        node_product = {n: n.split("-")[1] for n in nodes}
        for pod in core.list_namespaced_pod(namespace).items:
            annotations = pod.metadata.annotations or {}
            gpus = [int(g) for g in annotations[cv.ANNOTATION_GPU_INDICES].split(",")]
            requests = pod.spec.containers[0].resources.requests
            whole = int(requests.get(cv.RESOURCE_GPU, "0"))
            milli = int(requests.get(cv.RESOURCE_GPU_MILLI, "0"))
            assert len(gpus) == (whole or 1) and len(set(gpus)) == len(gpus)
            for g in gpus:
                assert 0 <= g < 8
                used[(pod.spec.node_name, g)] += 1000 if whole else milli
            spec = annotations.get(cv.ANNOTATION_GPU_SPEC)
            if spec:
                assert node_product[pod.spec.node_name] in {p.lower() for p in spec.split("|")}
        assert max(used.values()) <= 1000

        # Model-version replicas co-locate, at most CAP per node.
        v1 = Counter(node for name, node in placed.items() if name.startswith("llm-v1"))
        assert max(v1.values()) == CAP and len(v1) == 3  # 7 replicas: 3 + 3 + 1
        assert '_bucket{le="0.005",verb="filter"}' in extender.metrics()
        assert not list(extender.log_events("prioritize"))  # the decision needs no ranking
    finally:
        for name in [p.metadata.name for p in core.list_namespaced_pod(namespace).items]:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        delete_nodes(control_plane, nodes)


def test_ours_ends_less_fragmented_than_the_default_scheduler(
        control_plane: ControlPlane, extender: ExtenderProcess, namespace: str) -> None:
    """The same pods, in the same order, through the default scheduler and through ours, each
    on its own 6 four-GPU nodes: one 4-GPU pod, six 1-GPU pods, then two more 4-GPU pods.

    Each pod waits for both schedulers to bind it before the next one is created, so both see
    the same state at every step and the outcome does not depend on timing. The default
    scheduler scores CPU and memory only (LeastAllocated): it spreads the 1-GPU pods one per
    node, which leaves no node with 4 free GPUs, so the last two pods cannot be placed. FGD
    knows 4-GPU pods are part of the workload and packs the 1-GPU pods instead. Whole GPUs
    only: the default scheduler does not see per-GPU shares, so with shares it would "bind"
    pods no GPU can hold and the comparison would be meaningless.
    """
    groups = {"default-scheduler": "frag-default", cv.SCHEDULER_NAME: "frag-ours"}
    nodes = [n for g in groups.values() for n in make_nodes(control_plane, g, {"A10": 23_028},
                                                              per_product=6, gpus=4)]
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    placed_first, last = [4] + [1] * 6, [4, 4]
    try:
        for i, gpus in enumerate(placed_first):
            for scheduler, group in groups.items():
                core.create_namespaced_pod(namespace, gpu_pod(
                    f"{group}-{i}", gpus=gpus, cpu="8", scheduler=scheduler, group=group))
            for group in groups.values():
                bound_node(core, namespace, f"{group}-{i}")

        def used_nodes(group: str) -> int:
            return len({p.spec.node_name for p in core.list_namespaced_pod(namespace).items
                        if p.metadata.name.startswith(group + "-") and p.spec.node_name})

        # Spread versus packed, before the big pods arrive: the reason for what follows.
        assert used_nodes("frag-default") == 6
        assert used_nodes("frag-ours") == 3  # the 4-GPU node, four 1-GPU pods, two 1-GPU pods

        for j, gpus in enumerate(last, start=len(placed_first)):
            for scheduler, group in groups.items():
                core.create_namespaced_pod(namespace, gpu_pod(
                    f"{group}-{j}", gpus=gpus, cpu="8", scheduler=scheduler, group=group))
            bound_node(core, namespace, f"frag-ours-{j}")
            verdict = wait_until(lambda j=j: _scheduling_verdict(core, namespace,
                                                                  f"frag-default-{j}"),
                                 timeout_s=60, what=f"the default scheduler on frag-default-{j}")
            assert verdict == "unschedulable", verdict

        states = {s: cluster_state(control_plane, g) for s, g in groups.items()}
        workload = TargetWorkload.from_pods(_requests(placed_first + last))
        ratio = {s: fragmentation_ratio(st, workload) for s, st in states.items()}
        print(f"fragmentation ratio: {ratio}")
        assert ratio[cv.SCHEDULER_NAME] < ratio["default-scheduler"]
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        delete_nodes(control_plane, nodes)


def _requests(sizes: list[int]) -> list[PodRequest]:
    return [PodRequest(name=f"w{i}", cpu_milli=8000, memory_mib=1024, num_gpu=g, gpu_milli=1000)
            for i, g in enumerate(sizes)]


def _scheduling_verdict(core: kubernetes.client.CoreV1Api, namespace: str, name: str
                        ) -> str | None:
    """'unschedulable' once the scheduler marked the pod PodScheduled=False (Unschedulable),
    'bound to <node>' if it was bound after all, None while neither."""
    pod = core.read_namespaced_pod(name, namespace)
    if pod.spec.node_name:
        return f"bound to {pod.spec.node_name}"
    unschedulable = any(c.type == "PodScheduled" and c.status == "False"
                        and c.reason == "Unschedulable" for c in pod.status.conditions or ())
    return "unschedulable" if unschedulable else None


def _pending_for(core: kubernetes.client.CoreV1Api, namespace: str, name: str,
                 seconds: float) -> bool:
    try:
        wait_until(lambda: core.read_namespaced_pod(name, namespace).spec.node_name or None,
                   timeout_s=seconds, what="bind")
    except Exception:
        return True
    return False


def test_memory_share_pods_are_placed_by_the_extender_alone(
        control_plane: ControlPlane, extender: ExtenderProcess, namespace: str) -> None:
    """Pods asking GPU memory (``gpufrag.io/gpu-memory-mib``, carried by ``gpu-milli: 1``, the
    resource the device plugin hands their GPU for) on nodes that, like a real node, advertise
    no GPU memory: kube-scheduler ignores the resource (managedResources), so it is the
    extender that fits them, two 6,000 MiB shares per 15,360 MiB T4, and the fifth waits.
    Without ``ignoredByScheduler`` kube-scheduler fails each one as Insufficient first. A
    memory ask with no carrier would start without a GPU: it waits, and says why."""
    nodes = make_nodes(control_plane, "memshare", {"T4": 15_360}, per_product=2, gpus=1)
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    try:
        for i in range(4):
            core.create_namespaced_pod(namespace, gpu_pod(f"mem-{i}", milli=1,
                                                          gpu_memory_mib=6_000,
                                                          group="memshare"))
            bound_node(core, namespace, f"mem-{i}")
        per_node = Counter(p.spec.node_name for p in core.list_namespaced_pod(namespace).items)
        assert per_node == dict.fromkeys(nodes, 2)
        for pod in core.list_namespaced_pod(namespace).items:
            assert (pod.metadata.annotations or {})[cv.ANNOTATION_GPU_INDICES] == "0"
        core.create_namespaced_pod(namespace, gpu_pod("mem-over", milli=1, gpu_memory_mib=6_000,
                                                      group="memshare"))
        verdict = wait_until(lambda: _scheduling_verdict(core, namespace, "mem-over"),
                             timeout_s=30, what="a verdict on the fifth memory share")
        assert verdict == "unschedulable"
        core.create_namespaced_pod(namespace, gpu_pod("mem-alone", gpu_memory_mib=1_000,
                                                      group="memshare"))
        verdict = wait_until(lambda: _scheduling_verdict(core, namespace, "mem-alone"),
                             timeout_s=30, what="a verdict on a memory ask with no carrier")
        assert verdict == "unschedulable"
        (condition,) = [c for c in core.read_namespaced_pod("mem-alone", namespace).status
                        .conditions if c.type == "PodScheduled"]
        assert "no device plugin hands a GPU for memory alone" in condition.message, \
            condition.message
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        delete_nodes(control_plane, nodes)


def test_extender_outage_ignorable_and_not(control_plane: ControlPlane, extender: ExtenderProcess,
                                            namespace: str, tmp_path: Path) -> None:
    nodes = make_nodes(control_plane, "outage", {"T4": 15_360}, per_product=4, gpus=4)
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    # A second scheduler profile that may go on without the extender (prioritize only: the
    # default binder binds when the extender is away).
    control_plane.start_scheduler("gpufrag-ignorable", gpufrag_scheduler_config(
        extender.url, ignorable=True, bind=False, name="gpufrag-ignorable"))
    try:
        core.create_namespaced_pod(namespace, gpu_pod("before", milli=300, group="outage"))
        bound_node(core, namespace, "before")
        extender.stop()

        # ignorable: true -> scheduled by the default scoring while the extender is down.
        core.create_namespaced_pod(namespace, gpu_pod(
            "ign-down", milli=300, group="outage", scheduler="gpufrag-ignorable"))
        bound_node(core, namespace, "ign-down", timeout_s=60)
        # ignorable: false -> waits.
        core.create_namespaced_pod(namespace, gpu_pod("strict-down", milli=300, group="outage"))
        assert _pending_for(core, namespace, "strict-down", 8)

        extender.start()  # resyncs from the API server, then the waiting pod goes through
        bound_node(core, namespace, "strict-down", timeout_s=120)
        core.create_namespaced_pod(namespace, gpu_pod(
            "ign-up", milli=300, group="outage", scheduler="gpufrag-ignorable"))
        bound_node(core, namespace, "ign-up")
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
        assert all(p.spec.node_name for p in pods.values()) and len(pods) == 4
        seen = {r["pod"] for r in extender.log_events("filter")}
        assert f"{namespace}/ign-up" in seen and f"{namespace}/strict-down" in seen
        annotated = pods["strict-down"].metadata.annotations or {}
        assert cv.ANNOTATION_GPU_INDICES in annotated
    finally:
        control_plane.stop_scheduler("gpufrag-ignorable")
        if extender.process is None:
            extender.start()
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        delete_nodes(control_plane, nodes)
