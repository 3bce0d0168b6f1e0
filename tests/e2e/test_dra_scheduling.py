"""The extender with ``dra.enabled`` on the real kube-scheduler, API server and resourceclaim
controller (1.36): a burst of pods asking GPU shares and whole GPUs through
ResourceClaimTemplates, on fake GPU nodes that advertise no GPU themselves (as once the device
plugin has left them) and whose ResourceSlices are published the way the DRA driver builds
them (``node.dra.slices``): the extender reads their GPUs from the slices. kube-scheduler's
own allocator writes every allocation; the extender chooses each node (its deciding filter)
and assumes the GPU first fit will take there, so the next pod of the burst is judged
against it.

What is checked: every pod lands on the node and the GPU that FGD's node choice with DRA's
first fit inside the node predicts, replayed here through the same core in the order the
extender decided (``first-fit-scored``, docs/dra.md); no bind is refused; and once the burst
is allocated the extender holds no assumption, and one more pod goes where the state the
claims describe predicts; ``gpufrag inspect`` (the defrag cycle's snapshot) shows every pod on
the GPU its claim's allocation names, and so does the node agent's ledger of pods.

The nodes have no kubelet, so the pods are bound and allocated but never run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
import structlog

from defrag.controller.inspect import main as inspect_main
from devkit.controlplane import ControlPlane
from devkit.extender import ExtenderProcess, dra_scheduling, metric_value
from devkit.procs import wait_until
from devkit.stack import GROUP_LABEL, delete_nodes
from gpufrag.conventions import LABEL_GPU_MEMORY_MIB, LABEL_GPU_PRODUCT, SCHEDULER_NAME
from node.agent.cgroup import KubePodLister
from node.dra.slices import build_slice
from node.gpus import Gpu
from scheduler.core import ClusterState, choose
from scheduler.core.fragmentation import TargetWorkload
from scheduler.core.gpus import FIRST_FIT
from scheduler.core.types import NodeSpec, PodRequest
from scheduler.kube.claims import DRIVER_NAME, claimed_gpus
from scheduler.policies import make_policy
from tests.deviceclasses import create_device_class

GROUP = "dra-burst"
DEVICE_CLASS = "e2e-burst.gpu.gpufrag.io"
PRODUCT, GPU_MEMORY_MIB, GPUS = "A100", 81_920, 2
# A fixed target workload, so the replay here scores as the extender does.
SPECS = [{"cpu_milli": 1000, "num_gpu": 1, "gpu_milli": 500, "popularity": 0.5},
         {"cpu_milli": 1000, "num_gpu": 1, "gpu_milli": 1000, "popularity": 0.5}]
# First a half GPU pinned to the last node, then the burst: halves first. The first half fills
# the seed's GPU exactly; for the second, that GPU is full, so FGD ties every node and takes
# the first by name, where a picture without the first half's GPU would put it beside the
# seed again (the exact fill): a stale picture lands it elsewhere than FGD predicts.
SEED = "seed"
BURST = [("p0", "half"), ("p1", "half"), ("p2", "half"), ("p3", "half"),
         ("p4", "quarter"), ("p5", "whole"), ("p6", "quarter")]
TEMPLATES = {"quarter": 250, "half": 500, "whole": None}
LAST = "last"  # sent once the burst is allocated
# KEP-5004: a class mapping an extended resource to whole GPUs of the driver.
MAPPED_CLASS = "e2e-mapped.gpu.gpufrag.io"
MAPPED_RESOURCE = "e2e.gpufrag.io/dra-gpu"
MAPPED_GROUP = "dra-mapped"


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[ExtenderProcess]:
    folder = tmp_path_factory.mktemp("extender-dra")
    with dra_scheduling(control_plane, folder, {
        "dra": {"enabled": True, "device_classes": [DEVICE_CLASS, MAPPED_CLASS]},
        "workload": {"specs": SPECS},
        # Long enough that no assumption expires within the test: a 0 assumed at the end
        # means every one was replaced by its claim's allocation.
        "bind": {"assume_ttl_s": 600}}) as ext:
        yield ext


def _publish_slices(resource: Any, core: Any, nodes: list[str]) -> None:
    for name in nodes:
        uid = core.read_node(name).metadata.uid
        gpus = [Gpu(i, f"GPU-{name}-{i}", PRODUCT, GPU_MEMORY_MIB) for i in range(GPUS)]
        resource.create_resource_slice(build_slice(name, DRIVER_NAME, gpus, {}, node_uid=uid))


def _template(name: str, milli: int | None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS}
    if milli is not None:
        exactly["capacity"] = {"requests": {"milli": str(milli)}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}}


def _pod(name: str, template: str, node: str = "", *, group: str = GROUP,
         cpu: str = "1") -> dict[str, Any]:
    pinned = {"kubernetes.io/hostname": node} if node else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": SCHEDULER_NAME, "terminationGracePeriodSeconds": 0,
                     "nodeSelector": {GROUP_LABEL: group, **pinned},
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "main", "image": "gpufrag-e2e:none",
                                     "resources": {"requests": {"cpu": cpu, "memory": "1Gi"},
                                                   "claims": [{"name": "gpu"}]}}]}}


def _mapped_pod(name: str) -> dict[str, Any]:
    """A pod asking one GPU as an extended resource, with no claim in its spec (KEP-5004)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": SCHEDULER_NAME, "terminationGracePeriodSeconds": 0,
                     "nodeSelector": {GROUP_LABEL: MAPPED_GROUP},
                     "containers": [{"name": "main", "image": "gpufrag-e2e:none",
                                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                   "limits": {MAPPED_RESOURCE: "1"}}}]}}


def _gpu_nodes(control_plane: ControlPlane, group: str, count: int) -> list[str]:
    """Nodes as the device plugin leaves them when DRA takes over (docs/dra.md, "Install"):
    no GPU in their allocatable, GPU feature discovery's product and memory labels kept. The
    extender reads their GPUs from their ResourceSlices."""
    nodes = [f"{group}-{i}" for i in range(count)]
    for name in nodes:
        control_plane.create_gpu_node(name, 0, PRODUCT, GPU_MEMORY_MIB, cpu_milli=128_000,
                                      memory_mib=1024 * 1024, labels={
                                          GROUP_LABEL: group, LABEL_GPU_PRODUCT: PRODUCT,
                                          LABEL_GPU_MEMORY_MIB: str(GPU_MEMORY_MIB)})
    return nodes


def _replay_policy() -> Any:
    """FGD with DRA's first fit inside the node, on the extender's fixed target workload."""
    workload = TargetWorkload.from_specs(
        ((int(s["cpu_milli"]), int(s["num_gpu"]), int(s["gpu_milli"]), frozenset()),
         float(s["popularity"])) for s in SPECS)
    return make_policy("fgd", workload=workload, device_choice=FIRST_FIT)


def _empty_state(nodes: list[str]) -> ClusterState:
    return ClusterState([NodeSpec(n, cpu_milli=128_000, memory_mib=1024 * 1024,
                                  gpu_count=GPUS, gpu_product=PRODUCT,
                                  gpu_memory_mib=GPU_MEMORY_MIB) for n in nodes])


def test_a_dra_burst_lands_where_fgd_and_first_fit_predict(
        control_plane: ControlPlane, extender: ExtenderProcess, namespace: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    client = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    nodes = _gpu_nodes(control_plane, GROUP, 3)
    create_device_class(resource, DEVICE_CLASS)
    try:
        _publish_slices(resource, core, nodes)
        for name, milli in TEMPLATES.items():
            resource.create_namespaced_resource_claim_template(namespace, _template(name, milli))
        core.create_namespaced_pod(namespace, _pod(SEED, "half", nodes[-1]))
        expected = 1

        def allocated() -> dict[str, dict[str, Any]] | None:
            claims = {}
            for pod in core.list_namespaced_pod(namespace).items:
                statuses = pod.status.resource_claim_statuses or []
                if not pod.spec.node_name or len(statuses) != 1:
                    return None
                claim = client.sanitize_for_serialization(resource.read_namespaced_resource_claim(
                    statuses[0].resource_claim_name, namespace))
                if not (claim.get("status") or {}).get("allocation"):
                    return None
                claims[pod.metadata.name] = {"node": pod.spec.node_name, "claim": claim}
            return claims if len(claims) == expected else None

        seed = wait_until(allocated, timeout_s=60, what="the seed bound and allocated")[SEED]
        wait_until(lambda: metric_value(extender.metrics(), "gpufrag_extender_pods",
                                   state="assumed") == 0 or None,
                   timeout_s=30, what="the extender to count the seed's claim")
        for name, template in BURST:
            core.create_namespaced_pod(namespace, _pod(name, template))
        expected += len(BURST)
        found = wait_until(allocated, timeout_s=90, what="the burst bound and allocated")
        got = {}
        for name, entry in found.items():
            (gpu,) = claimed_gpus(entry["claim"], driver=DRIVER_NAME) or ()
            assert gpu.pool == entry["node"], name  # the allocation is on the pod's node
            got[name] = (entry["node"], (gpu.index,), gpu.milli)

        pod_ids = {f"{namespace}/{name}": name for name, _ in BURST}
        decisions = [(pod_ids[r["pod"]], r["node"]) for r in extender.log_events("filter")
                     if r.get("pod") in pod_ids and "node" in r]
        assert sorted(name for name, _ in decisions) == sorted(pod_ids.values())  # once each
        assert [r for r in extender.log_events("bind")
                if r.get("pod") in pod_ids and r.get("refused")] == []

        # FGD chooses the node, each node scored for the GPU first fit gives there, and
        # first fit takes that GPU: replayed through the core in the extender's order.
        policy = _replay_policy()
        state = _empty_state(nodes)
        (seed_gpu,) = claimed_gpus(seed["claim"], driver=DRIVER_NAME) or ()
        assert (seed["node"], seed_gpu.index) == (nodes[-1], 0)
        state.place(PodRequest(SEED, cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=500,
                               namespace=namespace), nodes[-1], (0,))
        templates = dict(BURST)
        predicted = {}
        for name, node in decisions:
            milli = TEMPLATES[templates[name]] or 1000
            request = PodRequest(name, cpu_milli=1000, memory_mib=1024, num_gpu=1,
                                 gpu_milli=milli, namespace=namespace)
            decision = choose(state, policy, request, device_choice=FIRST_FIT)
            assert decision is not None and decision.node == node, (name, decision, node)
            state.place(request, decision.row, decision.gpus)
            predicted[name] = (decision.node, decision.gpus, milli)
        del got[SEED]
        assert got == predicted

        # The extender's picture equals the claims': no assumption left, every pod counted,
        # and a pod sent after the burst goes where the claims' state predicts.
        def settled() -> str | None:
            text = extender.metrics()
            assumed = metric_value(text, "gpufrag_extender_pods", state="assumed")
            return text if assumed == 0 else None

        text = wait_until(settled, timeout_s=30, what="every assumption replaced by its claim")
        assert metric_value(text, "gpufrag_extender_pods", state="placed") >= len(BURST)
        core.create_namespaced_pod(namespace, _pod(LAST, "quarter"))
        expected += 1
        last = wait_until(allocated, timeout_s=60, what="the last pod allocated")[LAST]
        (gpu,) = claimed_gpus(last["claim"], driver=DRIVER_NAME) or ()
        request = PodRequest(LAST, cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=250,
                             namespace=namespace)
        decision = choose(state, policy, request, device_choice=FIRST_FIT)
        assert decision is not None
        assert (last["node"], (gpu.index,)) == (decision.node, decision.gpus)

        # gpufrag inspect (the defrag cycle's own snapshot) lists the claims and shows each
        # pod on the GPU its allocation names.
        try:
            assert inspect_main(["--kubeconfig", str(control_plane.kubeconfig_path),
                                 "--namespace", namespace, "-o", "json"]) == 0
        finally:
            structlog.reset_defaults()  # inspect configures logging for its process
        shown = json.loads(capsys.readouterr().out)
        holders = {h["pod"].partition("/")[2]: (n["node"], g["index"], h["milli"])
                   for n in shown["nodes"] for g in n["gpus"] for h in g["holders"]
                   if "pod" in h}
        want = {name: (node, gpus[0], milli) for name, (node, gpus, milli) in got.items()}
        want[SEED] = (nodes[-1], 0, 500)
        want[LAST] = (last["node"], gpu.index, 250)
        assert holders == want

        # The node agent's ledger (its pod list) reads each DRA pod's share and GPU from its
        # claim, on every node.
        ledger = {}
        for node in nodes:
            for record in KubePodLister(control_plane.new_api_client(), node).list_pods():
                if record.share is not None and record.ref.namespace == namespace:
                    ledger[record.ref.name] = (node, *(record.share.gpus or ()),
                                               record.share.request.gpu_milli)
        assert ledger == want
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        delete_nodes(control_plane, nodes)  # their slices go with them (owned by the Node)
        resource.delete_device_class(DEVICE_CLASS)


def test_pods_asking_a_mapped_extended_resource_go_where_fgd_predicts(
        control_plane: ControlPlane, extender: ExtenderProcess, namespace: str) -> None:
    """KEP-5004: a pod asking an extended resource that a DeviceClass of the driver maps has
    no claim until kube-scheduler makes one in its binding cycle. The extender reads the
    class's mapping (its DeviceClass watch) and judges such a pod for the whole GPUs it asks,
    first fit inside the node, as a pod with a claim: each pod lands on the node and GPU FGD
    predicts. The first node holds a pod with most of its CPU, so kube-scheduler's own
    scoring (least allocated) would send the pods elsewhere: without the extender's say they
    would not land where FGD does. Once each pod's claim exists, the extender counts it from
    the claim (no assumption left)."""
    client = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    resource = kubernetes.client.ResourceV1Api(client)
    nodes = _gpu_nodes(control_plane, MAPPED_GROUP, 2)
    create_device_class(resource, DEVICE_CLASS)  # the seed's template's
    create_device_class(resource, MAPPED_CLASS, extendedResourceName=MAPPED_RESOURCE)
    try:
        _publish_slices(resource, core, nodes)
        resource.create_namespaced_resource_claim_template(namespace, _template("half", 500))
        # The seed: half of the first node's GPU 0 and most of its CPU.
        core.create_namespaced_pod(namespace, _pod(SEED, "half", nodes[0], group=MAPPED_GROUP,
                                                   cpu="100"))
        names = [SEED]

        def allocated() -> dict[str, tuple[str, int, int]] | None:
            """Each pod's node, and its claim's GPU and milli, once all are allocated."""
            found = {}
            for name in names:
                raw: Any = core.read_namespaced_pod(name, namespace, _preload_content=False)
                pod = json.loads(raw.data)
                node = pod["spec"].get("nodeName")
                claim_names = [s.get("resourceClaimName") for s in
                               pod.get("status", {}).get("resourceClaimStatuses") or []]
                extended = pod.get("status", {}).get("extendedResourceClaimStatus") or {}
                claim_names.append(extended.get("resourceClaimName"))
                claim_names = [c for c in claim_names if c]
                if not node or len(claim_names) != 1:
                    return None
                claim = client.sanitize_for_serialization(
                    resource.read_namespaced_resource_claim(claim_names[0], namespace))
                gpus = claimed_gpus(claim, driver=DRIVER_NAME)
                if not gpus:
                    return None
                (gpu,) = gpus
                assert gpu.pool == node, name
                found[name] = (node, gpu.index, gpu.milli)
            return found

        wait_until(allocated, timeout_s=60, what="the seed bound and allocated")
        wait_until(lambda: metric_value(extender.metrics(), "gpufrag_extender_pods",
                                   state="assumed") == 0 or None,
                   timeout_s=30, what="the extender to count the seed's claim")
        policy = _replay_policy()
        state = _empty_state(nodes)
        state.place(PodRequest(SEED, cpu_milli=100_000, memory_mib=1024, num_gpu=1,
                               gpu_milli=500, namespace=namespace), nodes[0], (0,))
        # One at a time: each decided on the state its predecessor's claim leaves.
        for i in range(3):
            name = f"m{i}"
            core.create_namespaced_pod(namespace, _mapped_pod(name))
            names.append(name)
            got = wait_until(allocated, timeout_s=60, what=f"{name} bound and allocated")
            request = PodRequest(name, cpu_milli=1000, memory_mib=1024, num_gpu=1,
                                 gpu_milli=1000, namespace=namespace)
            decision = choose(state, policy, request, device_choice=FIRST_FIT)
            assert decision is not None
            assert got[name] == (decision.node, decision.gpus[0], 1000), (name, decision)
            state.place(request, decision.row, decision.gpus)
        assert [r for r in extender.log_events("bind")
                if r.get("pod") == f"{namespace}/m0" and r.get("refused")] == []
        # The first pod had to pass the busy first node over on kube-scheduler's own score.
        assert got["m0"][0] == nodes[0]
        wait_until(lambda: metric_value(extender.metrics(), "gpufrag_extender_pods",
                                   state="assumed") == 0 or None,
                   timeout_s=30, what="every assumption replaced by its claim")
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        delete_nodes(control_plane, nodes)
        resource.delete_device_class(MAPPED_CLASS)
        resource.delete_device_class(DEVICE_CLASS)
