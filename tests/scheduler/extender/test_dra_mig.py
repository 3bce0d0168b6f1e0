"""The extender with ``dra.enabled`` on nodes whose GPUs are the DRA driver's MIG partitions
(dynamic MIG): a pod whose claim asks a MIG profile's class is judged on the node's
partitions, those its pods' claims were allocated in use and every other free legal placement
free, FGD over MIG choosing the node; its bind writes no record (docs/dra.md)."""

from __future__ import annotations

from typing import Any

from node.dra.slices import build_slices
from node.gpus import Gpu
from scheduler.core.mig import MigInstance
from scheduler.extender.runtime import Runtime
from scheduler.kube.claims import DRIVER_NAME as DRIVER
from scheduler.kube.claims import mig_class_name, mig_device_name
from tests.builders import node, pod
from tests.scheduler.extender.helpers import (
    RecordingBinder,
    filtered,
    k8s_pod,
    make_config,
    serve,
)
from tests.scheduler.extender.helpers import bound as bind

A100 = "NVIDIA A100-SXM4-80GB"
DRA = make_config(dra={"enabled": True})  # MIG pods reach it as any DRA pod (docs/dra.md)


def mig_pod(name: str, node_name: str = "") -> dict[str, Any]:
    """A pod of gpufrag's scheduler whose MIG instance comes through claim ``c-<name>``."""
    obj = k8s_pod(pod(name, num_gpu=0, gpu_milli=0), uid=f"uid-{name}", node=node_name)
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    obj["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": f"c-{name}"}]
    return obj


def mig_claim(name: str, profile: str, allocated: tuple[str, int, int] | None = None
              ) -> dict[str, Any]:
    """Claim ``c-<name>`` asking one ``profile`` partition; ``allocated``: (node, GPU,
    start) kube-scheduler gave it."""
    claim: dict[str, Any] = {
        "metadata": {"name": f"c-{name}", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": mig_class_name(profile)}}]}},
        "status": {}}
    if allocated is not None:
        pool, gpu, start = allocated
        claim["status"]["allocation"] = {"devices": {"results": [{
            "request": "gpu", "driver": DRIVER, "pool": pool,
            "device": mig_device_name(gpu, profile, start)}]}}
    return claim


def mig_cluster(pods: list[dict[str, Any]], claims: list[dict[str, Any]], *,
                binder: RecordingBinder | None = None) -> Runtime:
    """m0 and m1, two A100 80GB each, every GPU in MIG mode and published as partitions by
    the driver (the Nodes advertise no GPU); and ``pods`` with their ``claims``."""
    runtime = serve([node(n, gpu_count=0) for n in ("m0", "m1")], pods, config=DRA,
                    binder=binder)
    for name in ("m0", "m1"):
        gpus = [Gpu(i, f"GPU-{name}-{i}", A100, 81_920) for i in range(2)]
        for obj in build_slices(name, DRIVER, gpus, {0: True, 1: True}):
            runtime.cache.apply_slice(obj)
    for obj in claims:
        runtime.cache.apply_claim(obj)
    return runtime


def in_use(runtime: Runtime, name: str) -> list[MigInstance]:
    cache = runtime.cache
    layout = cache.mig.layout(cache.state, name, 0.0)
    assert layout is not None and layout.source == "claims"
    return [i for i in layout.instances if i.in_use]


def test_a_dra_mig_node_lays_out_its_allocated_partitions_and_every_free_placement() -> None:
    # The 3g was allocated on GPU 1 (first fit would have put it beside the 4g on GPU 0):
    # the allocation, not a guess, says where it is.
    runtime = mig_cluster([mig_pod("four", "m0"), mig_pod("three", "m0")],
                          [mig_claim("four", "4g.40gb", ("m0", 0, 0)),
                           mig_claim("three", "3g.40gb", ("m0", 1, 0))])
    assert in_use(runtime, "m0") == [MigInstance(0, "4g.40gb", 0, True),
                                     MigInstance(1, "3g.40gb", 0, True)]
    layout = runtime.cache.mig.layout(runtime.cache.state, "m0", 0.0)
    assert layout is not None
    # Slices 4-7 of each GPU are free: 1g.10gb at 4, 5, 6, 1g.20gb at 4, 6, 2g and 3g at 4.
    assert layout.free == {"1g.10gb": 6, "1g.20gb": 4, "2g.20gb": 2, "3g.40gb": 2}
    assert {i.start for i in layout.instances if not i.in_use} == {4, 5, 6}
    assert in_use(runtime, "m1") == []
    # Its claim deleted, a partition is free again.
    runtime.cache.delete_claim_object(mig_claim("three", "3g.40gb"))
    assert in_use(runtime, "m0") == [MigInstance(0, "4g.40gb", 0, True)]


def test_a_dra_mig_pod_is_judged_against_what_is_really_taken() -> None:
    # m0: a 3g at slice 0 of each GPU, so no 4g placement is left (first fit would have put
    # both on GPU 0, leaving GPU 1 whole); m1 is empty.
    runtime = mig_cluster(
        [mig_pod("b", "m0"), mig_pod("c", "m0"), mig_pod("new")],
        [mig_claim("b", "3g.40gb", ("m0", 0, 0)), mig_claim("c", "3g.40gb", ("m0", 1, 0)),
         mig_claim("new", "4g.40gb")])
    assert filtered(runtime, mig_pod("new"), ["m0", "m1"])["NodeNames"] == ["m1"]
    runtime.cache.forget("default/new")
    reply = filtered(runtime, mig_pod("new"), ["m0"])
    assert reply["NodeNames"] == []
    assert "no free placement for 1 4g.40gb partition(s)" in reply["FailedNodes"]["m0"]


def test_fgd_over_mig_prefers_the_node_whose_partitions_it_completes() -> None:
    """A 3g beside the 3g at slice 0 fills GPU 0 of m0 (F falls); on m1's empty GPUs it
    would strand the 7g's room (F grows)."""
    runtime = mig_cluster([mig_pod("b", "m0"), mig_pod("new")],
                          [mig_claim("b", "3g.40gb", ("m0", 0, 0)),
                           mig_claim("new", "3g.40gb")])
    assert filtered(runtime, mig_pod("new"), ["m1", "m0"])["NodeNames"] == ["m0"]
    # Assumed there before its allocation shows: first fit's placement, the free 3g at 4.
    assert in_use(runtime, "m0") == [MigInstance(0, "3g.40gb", 0, True),
                                     MigInstance(0, "3g.40gb", 4, True)]
    # The allocation shows (bound, allocated where first fit put it): the same layout.
    runtime.cache.apply_claim(mig_claim("new", "3g.40gb", ("m0", 0, 4)))
    runtime.cache.apply_pod(mig_pod("new", "m0"))
    assert in_use(runtime, "m0") == [MigInstance(0, "3g.40gb", 0, True),
                                     MigInstance(0, "3g.40gb", 4, True)]
    assert "default/new" not in runtime.cache.assumed


def test_a_dra_mig_pod_is_bound_without_a_record_and_its_profile_counts_in_the_workload(
        ) -> None:
    binder = RecordingBinder()
    runtime = mig_cluster([mig_pod("new")], [mig_claim("new", "1g.10gb")], binder=binder)
    assert bind(runtime, "new", "m1") == {"Error": ""}
    (call,) = binder.calls
    assert (call.node, call.gpus, call.extra) == ("m1", None, {})
    assert in_use(runtime, "m1") == [MigInstance(0, "1g.10gb", 6, True)]  # first fit: the top
    assert runtime.cache.mig.profile_counts() == {"1g.10gb": 1}
