"""Pods asking MIG instances through the extender's verbs: filter reasons, FGD over MIG in
prioritize and in the deciding filter, the bind's re-check, the agent's reading as the source
of positions, and the MIG target workload."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrag.gpu_usage import GpuUsage, MigInstanceUsage, NodeGpuUsage, PodGpuUsage
from scheduler.core.mig import MigWorkload
from scheduler.extender.migscoring import agent_mig, mig_workload
from scheduler.extender.runtime import Runtime
from scheduler.kube.mignodes import mig_node_to_k8s
from scheduler.kube.mignodes import mig_pod_to_k8s as mig_pod
from tests.builders import node
from tests.scheduler.extender.helpers import FakeClock, bound, filtered, make_config, scores, serve

H100 = ("NVIDIA-H100-80GB-HBM3", 81_559)
FEASIBLE = make_config(filter={"answer": "feasible"})


def mig_node(name: str, counts: dict[str, int], gpus: int = 1, **kwargs: Any) -> dict[str, Any]:
    return mig_node_to_k8s(name, *H100, gpus, counts, **kwargs)


def test_filter_reasons_are_data_naming_the_profile_and_its_use() -> None:
    nodes: list[Any] = [mig_node("full", {"3g.40gb": 2}),
                        mig_node("other", {"1g.10gb": 7}, config="all-1g.10gb"),
                        mig_node("free", {"3g.40gb": 2}), node("plain", gpu_count=2)]
    bound = [mig_pod("a", {"3g.40gb": 1}, node="full"), mig_pod("b", {"3g.40gb": 1},
                                                                node="full"),
             mig_pod("c", {"3g.40gb": 1}, node="free")]
    runtime = serve(nodes, bound, config=FEASIBLE)
    reply = filtered(runtime, mig_pod("p", {"3g.40gb": 1}), ["full", "other", "free", "plain"])
    assert reply["NodeNames"] == ["free"]
    assert reply["FailedNodes"] == {
        "full": "no free nvidia.com/mig-3g.40gb instance (2 of 2 in use)"}
    assert reply["FailedAndUnresolvableNodes"]["other"] == (
        "no nvidia.com/mig-3g.40gb instance on this node (it offers 1g.10gb, "
        "mig.config all-1g.10gb)")
    assert reply["FailedAndUnresolvableNodes"]["plain"].startswith("not a MIG node")
    # two instances asked, one free
    two = filtered(runtime, mig_pod("q", {"3g.40gb": 2}), ["free"])
    assert two["FailedNodes"] == {
        "free": "no free nvidia.com/mig-3g.40gb instance (1 of 2 in use, 2 asked)"}


def test_a_whole_gpu_pod_never_lands_on_mig_capacity() -> None:
    runtime = serve([mig_node("mig", {"7g.80gb": 2}, gpus=2), node("plain", gpu_count=1)],
                    config=FEASIBLE)
    whole = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "w", "namespace": "default", "uid": "uid-w"},
             "spec": {"schedulerName": "gpufrag-scheduler", "containers": [
                 {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    assert filtered(runtime, whole, ["mig", "plain"])["NodeNames"] == ["plain"]


# A 4g.40gb-heavy workload: four pods waiting for one, one 3g.40gb bound, and the 2g.20gb.
WORKLOAD_PODS = [mig_pod(f"big-{i}", {"4g.40gb": 1}) for i in range(4)]


def _stranding_cluster(config: Any = FEASIBLE) -> Runtime:
    """``a-cut``: 3g.40gb (in use) + two 2g.20gb, which the packing puts at 0 and 2, where a
    4g.40gb would start: a 2g there breaks the only 4g place left. ``b-half``: 4g.40gb +
    2g.20gb + 1g.20gb, nothing in use: its 2g sits at 4, on slices no 4g can use."""
    nodes = [mig_node("a-cut", {"3g.40gb": 1, "2g.20gb": 2}),
             mig_node("b-half", {"4g.40gb": 1, "2g.20gb": 1, "1g.20gb": 1})]
    pods = [*WORKLOAD_PODS, mig_pod("held", {"3g.40gb": 1}, node="a-cut"),
            mig_pod("p", {"2g.20gb": 1})]
    return serve(nodes, pods, config=config)


def test_the_mig_workload_is_the_profiles_the_pods_ask() -> None:
    runtime = _stranding_cluster()
    assert runtime.extender.placement.mig_workload == MigWorkload(
        {"4g.40gb": 4 / 6, "3g.40gb": 1 / 6, "2g.20gb": 1 / 6})
    assert mig_workload({}) is None


def test_a_2g_goes_where_it_strands_least() -> None:
    runtime = _stranding_cluster()
    names = ["a-cut", "b-half"]
    assert filtered(runtime, mig_pod("p", {"2g.20gb": 1}), names)["NodeNames"] == names
    given = scores(runtime, mig_pod("p", {"2g.20gb": 1}), names)
    assert given["b-half"] == 10 and given["a-cut"] < given["b-half"]


def test_the_deciding_filter_picks_and_holds_the_instance_that_strands_least() -> None:
    runtime = _stranding_cluster(make_config())
    assert filtered(runtime, mig_pod("p", {"2g.20gb": 1}), ["a-cut", "b-half"])[
        "NodeNames"] == ["b-half"]
    assert runtime.cache.assumed_node("default/p") == "b-half"
    # held there: a second 2g.20gb finds b-half's one 2g taken
    second = filtered(runtime, mig_pod("q", {"2g.20gb": 1}), ["b-half"])
    assert second["NodeNames"] == []
    # a new filter of the same pod does not count its own assumption against it
    assert filtered(runtime, mig_pod("p", {"2g.20gb": 1}), ["b-half"])["NodeNames"] == [
        "b-half"]
    assert scores(runtime, mig_pod("p", {"2g.20gb": 1}), ["a-cut", "b-half"])[
        "b-half"] == 10
    assert bound(runtime, "p", "b-half")["Error"] == ""


def test_bind_rechecks_the_instances_and_holds_one() -> None:
    runtime = serve([mig_node("m", {"3g.40gb": 1}), node("plain", gpu_count=1)],
                    [mig_pod("p", {"3g.40gb": 1}), mig_pod("q", {"3g.40gb": 1})],
                    config=FEASIBLE)
    assert "not a MIG node" in bound(runtime, "p", "plain")["Error"]
    assert bound(runtime, "p", "m")["Error"] == ""
    call = runtime.extender.bind.binder.calls[-1]  # type: ignore[union-attr]
    assert (call.node, call.gpus) == ("m", None)  # the device plugin picks the instance
    assert "(1 of 1 in use)" in bound(runtime, "q", "m")["Error"]


def _usage(now: float, *instances: MigInstanceUsage) -> str:
    pods = tuple(PodGpuUsage("default", f"pod-{uid}", uid, 1024)
                 for i in instances for uid in i.pods)
    gpu = GpuUsage(0, "GPU-0", "NVIDIA H100 80GB HBM3", 2048, 81_559, 0, pods=pods,
                   mig=instances)
    return NodeGpuUsage("m", now, 15.0, (gpu,)).to_json()


def test_the_agent_s_reading_says_which_instances_are_in_use_while_fresh() -> None:
    clock = FakeClock()
    # Both 3g.40gb instances in use, one by a pod the extender does not know of.
    text = _usage(clock.now - 1, MigInstanceUsage("3g.40gb", 0, "MIG-a", 1024, 40_000,
                                                  pods=("x",)),
                  MigInstanceUsage("3g.40gb", 4, "MIG-b", 1024, 40_000, pods=("y",)))
    obj = mig_node("m", {"3g.40gb": 2})
    obj["metadata"]["annotations"] = {"gpufrag.io/gpu-usage": text}
    runtime = serve([obj], config=FEASIBLE, clock=clock)
    reply = filtered(runtime, mig_pod("p", {"3g.40gb": 1}), ["m"])
    assert reply["FailedNodes"] == {"m": "no free nvidia.com/mig-3g.40gb instance (2 of 2 in use)"}
    clock.advance(15 * 8 + 2)  # the agent stopped publishing: the counts decide again
    assert filtered(runtime, mig_pod("p", {"3g.40gb": 1}), ["m"])["NodeNames"] == ["m"]


@pytest.mark.parametrize("text", ["not json", '{"version": 1}', _usage(0.0)])
def test_an_unreadable_or_mig_less_reading_leaves_the_labels_to_decide(text: str) -> None:
    assert agent_mig(text) is None


def test_the_agent_s_instances_keep_nvml_s_gpu_index() -> None:
    text = _usage(5.0, MigInstanceUsage("7g.80gb", 0, "MIG-a", 0, 80_000))
    reading = agent_mig(text)
    assert reading is not None and reading.fresh_until == 5.0 + 15.0 * 8
    assert [(i.gpu, i.profile, i.start, i.in_use) for i in reading.instances] == [
        (0, "7g.80gb", 0, False)]


def test_the_mig_workload_follows_the_pods_even_beside_a_configured_one() -> None:
    clock = FakeClock()
    config = make_config(workload={"specs": [{"num_gpu": 2}], "refresh_s": 60})
    runtime = serve([mig_node("m", {"1g.10gb": 7})], [mig_pod("a", {"1g.10gb": 1})],
                    config=config, clock=clock)
    assert runtime.extender.placement.mig_workload == MigWorkload({"1g.10gb": 1.0})
    configured = runtime.extender.placement.workload
    runtime.cache.apply_pod(mig_pod("b", {"3g.40gb": 1}))
    clock.advance(61)
    runtime.extender.maintain()
    assert runtime.extender.placement.workload is configured
    assert runtime.extender.placement.mig_workload == MigWorkload({"1g.10gb": 0.5, "3g.40gb": 0.5})


def test_a_new_agent_reading_is_read_at_once_not_from_the_kept_verdicts() -> None:
    clock = FakeClock()
    obj = mig_node("m", {"3g.40gb": 1})
    runtime = serve([obj], config=FEASIBLE, clock=clock)
    assert filtered(runtime, mig_pod("p", {"3g.40gb": 1}), ["m"])["NodeNames"] == ["m"]
    obj["metadata"]["annotations"] = {"gpufrag.io/gpu-usage": _usage(
        clock.now, MigInstanceUsage("3g.40gb", 0, "MIG-a", 1024, 40_000))}
    runtime.cache.apply_node(obj)  # a process outside any pod now holds the one instance
    assert filtered(runtime, mig_pod("p", {"3g.40gb": 1}), ["m"])["FailedNodes"] == {
        "m": "no free nvidia.com/mig-3g.40gb instance (1 of 1 in use)"}


def test_an_unchanged_mig_workload_keeps_the_kept_verdicts() -> None:
    clock = FakeClock()
    runtime = serve([mig_node("m", {"1g.10gb": 7})], [mig_pod("a", {"1g.10gb": 1})],
                    config=make_config(workload={"refresh_s": 60}), clock=clock)
    kept = runtime.extender.placement.mig_scorer
    runtime.cache.apply_pod(mig_pod("b", {"1g.10gb": 1}))  # same mix: 1g.10gb alone
    clock.advance(61)
    assert runtime.extender.upkeep.refresh_workload()
    placement = runtime.extender.placement
    assert placement.mig_scorer is kept and kept.scorer is placement.scorer
    runtime.cache.apply_pod(mig_pod("c", {"7g.80gb": 1}))
    clock.advance(61)
    assert runtime.extender.upkeep.refresh_workload()
    assert runtime.extender.placement.mig_scorer is not kept
