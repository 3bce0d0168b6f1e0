"""The extender with ``dra.enabled``: a pod asking GPUs through ResourceClaims is judged for
what its claims ask, each node scored for the GPU DRA's first fit gives there
(``first-fit-scored``), and that GPU assumed at filter and bind (docs/dra.md, "What reads
claims"); its bind writes no GPU record, since no device plugin serves it."""

from __future__ import annotations

from typing import Any

from scheduler.core import choose
from scheduler.core.gpus import FIRST_FIT
from scheduler.extender.runtime import Runtime
from scheduler.kube.reservations import Reservation
from scheduler.policies import make_policy
from tests.builders import node, pod
from tests.scheduler.extender.helpers import (
    RecordingBinder,
    filtered,
    k8s_pod,
    make_config,
    serve,
)
from tests.scheduler.extender.helpers import bound as bind

DRIVER = "gpu.gpufrag.io"
DRA = make_config(dra={"enabled": True})


def dra_pod(name: str, owner: str = "") -> dict[str, Any]:
    """A pending pod of gpufrag's scheduler whose GPU comes through claim ``c-<name>``."""
    obj = k8s_pod(pod(name, num_gpu=0, gpu_milli=0), uid=f"uid-{name}", owner=owner)
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    obj["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"c-{name}"}]}
    return obj


def claim(name: str, milli: int) -> dict[str, Any]:
    return {"metadata": {"name": f"c-{name}", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER, "capacity": {"requests": {"milli": str(milli)}}}}]}},
            "status": {}}


def runtime_with(pods: list[dict[str, Any]], names: list[str], *, binder: RecordingBinder
                 | None = None, milli: int = 250) -> Runtime:
    # n0's GPU 1 has 300 free: the tightest fit for a 250 share, not the first.
    busy = k8s_pod(pod("busy", gpu_milli=700), node="n0", gpus=(1,))
    runtime = serve([node(n, gpu_count=2) for n in ("n0", "n1")], [busy, *pods],
                    config=DRA, binder=binder)
    for name in names:
        runtime.cache.apply_claim(claim(name, milli))
    return runtime


def test_a_dra_pod_is_judged_for_its_claim_and_assumed_on_the_first_fitting_gpu() -> None:
    runtime = runtime_with([dra_pod("a"), k8s_pod(pod("dp", gpu_milli=250), uid="uid-dp")],
                           ["a"])
    assert filtered(runtime, dra_pod("a"), ["n0"])["NodeNames"] == ["n0"]
    assert runtime.cache.state.pods["default/a"].gpus == (0,)  # first fit, not the tightest
    # The same share through the device plugin: the policy's GPU, the tightest.
    filtered(runtime, k8s_pod(pod("dp", gpu_milli=250), uid="uid-dp"), ["n0"])
    assert runtime.cache.state.pods["default/dp"].gpus == (1,)


def test_the_node_and_gpu_are_fgd_scored_for_first_fit() -> None:
    runtime = runtime_with([dra_pod("a")], ["a"])
    cache, placement = runtime.cache, runtime.extender.placement
    request = cache.pods["default/a"].request
    policy = make_policy("fgd", workload=placement.workload, device_choice=FIRST_FIT)
    expected = choose(cache.state, policy, request, device_choice=FIRST_FIT)
    assert expected is not None
    assert filtered(runtime, dra_pod("a"), ["n0", "n1"])["NodeNames"] == [expected.node]
    assert cache.state.pods["default/a"].gpus == expected.gpus


def test_a_dra_pod_is_bound_without_a_gpu_record_on_the_assumed_gpu() -> None:
    binder = RecordingBinder()
    runtime = runtime_with([dra_pod("a")], ["a"], binder=binder)
    filtered(runtime, dra_pod("a"), ["n0"])
    assert bind(runtime, "a", "n0") == {"Error": ""}
    (call,) = binder.calls
    assert (call.node, call.gpus, call.extra) == ("n0", None, {})
    assert runtime.cache.assumed_node("default/a") == "n0"
    assert runtime.cache.state.pods["default/a"].gpus == (0,)


def test_a_bind_without_a_decision_assumes_first_fit_too() -> None:
    binder = RecordingBinder()
    runtime = runtime_with([dra_pod("a")], ["a"], binder=binder)
    assert bind(runtime, "a", "n0") == {"Error": ""}
    assert runtime.cache.state.pods["default/a"].gpus == (0,)
    assert binder.calls[0].gpus is None


def test_with_dra_off_a_claim_pod_is_not_the_extenders_to_judge() -> None:
    runtime = serve([node("n0", gpu_count=2)], [dra_pod("a")])
    runtime.cache.apply_claim(claim("a", 250))
    reply = filtered(runtime, dra_pod("a"), ["n0"])
    assert reply["NodeNames"] == ["n0"] and "default/a" not in runtime.cache.state.pods


def test_a_reservation_keeps_its_gpu_from_other_dra_pods_and_gives_it_to_its_owners() -> None:
    runtime = serve([node("n0", gpu_count=1)], [dra_pod("x"), dra_pod("mine", owner="rs-1")],
                    config=DRA)
    for name in ("x", "mine"):
        runtime.cache.apply_claim(claim(name, 1000))
    runtime.cache.reservations.replace([Reservation(
        name="r", node="n0", gpus=(0,), gpu_milli=1000, owner_uid="rs-1", namespace="default")])
    assert filtered(runtime, dra_pod("x"), ["n0"])["NodeNames"] == []
    assert filtered(runtime, dra_pod("mine", owner="rs-1"), ["n0"])["NodeNames"] == ["n0"]
    assert runtime.cache.state.pods["default/mine"].gpus == (0,)
