"""Prioritize: the single best node gets 10 (the core's choice for pods without affinity),
affinity and placement hints move the ranking, unknown and unfit nodes get 0."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from scheduler.core import ClusterState, choose
from scheduler.extender.scoring import scale_priorities
from scheduler.policies import make_policy
from tests.builders import node, pod
from tests.scheduler.extender.helpers import (
    FakeClock,
    filtered,
    k8s_pod,
    make_config,
    scores,
    serve,
)


@pytest.mark.parametrize(("key", "best", "top", "expected"), [
    ([5.0, 5.0, 5.0], 1, [], [9, 10, 9]),
    ([0.0, 50.0, 100.0], 2, [], [0, 4, 10]),
    ([100.0, 99.0, 0.0], 0, [], [10, 8, 0]),
    ([100.0, 10.0, 0.0], 0, [2], [9, 0, 10]),
])
def test_scale_priorities(key: list[float], best: int, top: list[int],
                          expected: list[int]) -> None:
    mask = np.zeros(len(key), np.bool_)
    mask[top] = True
    assert scale_priorities(np.array(key), best, mask).tolist() == expected


def test_a_tie_goes_to_the_first_node_by_name_and_only_it_gets_10() -> None:
    runtime = serve([node("gpu-c"), node("gpu-a"), node("gpu-b")])
    assert scores(runtime, k8s_pod(pod("p")), ["gpu-c", "gpu-a", "gpu-b"]) == {
        "gpu-c": 9, "gpu-a": 10, "gpu-b": 9}


@pytest.mark.parametrize("policy", ["fgd", "bestfit", "dotprod", "gpu-packing",
                                    "gpu-clustering"])
def test_best_node_is_the_core_choice(policy: str) -> None:
    nodes = [node(f"n{i}", gpu_count=4 if i % 2 else 2) for i in range(6)]
    bound = [k8s_pod(pod(f"b{i}", gpu_milli=250 * (1 + i % 3)), node=f"n{i}", gpus=(0,))
             for i in range(5)]
    runtime = serve(nodes, bound, config=make_config(policy=policy))
    state = ClusterState(nodes)
    for i in range(5):
        state.place(pod(f"b{i}", namespace="default", gpu_milli=250 * (1 + i % 3)), f"n{i}",
                    (0,))
    core_policy = make_policy(policy, workload=runtime.extender.placement.workload)
    for request in (pod("share", gpu_milli=300), pod("whole"), pod("two", num_gpu=2)):
        decision = choose(state, core_policy, request)
        assert decision is not None
        got = scores(runtime, k8s_pod(request), [n.name for n in nodes])
        assert [name for name, s in got.items() if s == 10] == [decision.node]


def test_unknown_and_unfit_nodes_score_0() -> None:
    runtime = serve([node("gpu-a"), node("cpu-a", gpu_count=0, gpu_product="")])
    assert scores(runtime, k8s_pod(pod("p")), ["ghost", "cpu-a", "gpu-a"]) == {
        "ghost": 0, "cpu-a": 0, "gpu-a": 10}


def model_pod(name: str, version: str = "v1", **overrides: Any) -> Any:
    return pod(name, model="llama", model_version=version, **overrides)


NAMES = ["n0", "n1", "n2"]


def affinity_runtime(bound: list[dict[str, Any]], clock: FakeClock | None = None,
                     **affinity: Any) -> Any:
    return serve([node(n, gpu_count=4) for n in NAMES], bound, clock=clock,
                 config=make_config(affinity=affinity, weights={"policy": 1.0,
                                                                "affinity": 2.0},
                                    filter={"answer": "feasible"}))


def test_same_version_beats_other_version_beats_nothing() -> None:
    # n0 and n2 hold one 1-GPU pod each, so the policy alone cannot tell them apart; n1 is idle.
    bound = [k8s_pod(model_pod("old", "v0"), node="n0", gpus=(0,)),
             k8s_pod(model_pod("same", "v1"), node="n2", gpus=(0,))]
    runtime = affinity_runtime(bound)
    # FGD alone ties all three (the first by name wins) ...
    assert scores(runtime, k8s_pod(pod("plain")), NAMES) == {"n0": 10, "n1": 9, "n2": 9}
    # ... so the blend is 1 + 2 · bonus: same version 3, other version 2, nothing 1.
    assert scores(runtime, k8s_pod(model_pod("new")), NAMES) == {"n0": 4, "n1": 0, "n2": 10}


def test_warm_window_keeps_part_of_the_bonus(clock: FakeClock) -> None:
    bound = [k8s_pod(model_pod("gone"), node="n1", gpus=(0,)),
             k8s_pod(pod("filler"), node="n2", gpus=(0,))]
    runtime = affinity_runtime(bound, clock, warm_window_s=600)
    runtime.cache.delete_pod("default/gone")  # the replica left n1 at clock.now
    clock.advance(300)
    got = scores(runtime, k8s_pod(model_pod("new")), NAMES)
    assert max(got, key=lambda n: got[n]) == "n1" and got["n1"] == 10
    clock.advance(301)  # outside the window: the policy decides alone again
    plain = scores(runtime, k8s_pod(pod("plain")), NAMES)
    assert scores(runtime, k8s_pod(model_pod("later")), NAMES) == plain


def test_at_the_cap_the_bonus_becomes_a_penalty_and_a_hard_cap_filters() -> None:
    # n2 runs 2 replicas of 250 milli on GPU 0; with whole-GPU pods in the workload (one on n1)
    # FGD alone would fill that GPU's other half rather than break a whole GPU elsewhere.
    bound = [k8s_pod(model_pod(f"r{i}", gpu_milli=250), node="n2", gpus=(0,)) for i in range(2)]
    bound.append(k8s_pod(pod("whole"), node="n1", gpus=(0,)))
    request = k8s_pod(model_pod("new", gpu_milli=500))
    uncapped = affinity_runtime(bound)
    assert scores(uncapped, k8s_pod(pod("plain", gpu_milli=500)), NAMES)["n2"] == 10
    assert scores(uncapped, request, NAMES)["n2"] == 10

    # Soft cap: the penalty outweighs the policy's preference, so the third replica goes
    # elsewhere (only withholding the bonus would have left n2 first); still feasible there,
    # and chosen when nothing else is offered.
    soft = affinity_runtime(bound, max_replicas_per_node=2)
    got = scores(soft, request, NAMES)
    assert got["n2"] < 10 and max(got.values()) == 10
    assert filtered(soft, request, NAMES)["NodeNames"] == NAMES
    assert scores(soft, request, ["n2"]) == {"n2": 10}

    hard = affinity_runtime(bound, max_replicas_per_node=2, cap_is_hard=True)
    reply = filtered(hard, request, NAMES)
    assert reply["NodeNames"] == ["n0", "n1"]
    assert reply["FailedNodes"] == {
        "n2": "runs 2 replicas of model llama:v1; the per-node cap is 2"}
    assert scores(hard, request, NAMES)["n2"] == 0


def hints_configmap(data: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "gpufrag-placement-hints", "namespace": "gpufrag-system"},
            "data": {owner: orjson.dumps(h).decode() for owner, h in data.items()}}


def test_placement_hint_puts_the_hinted_node_on_top(clock: FakeClock) -> None:
    hints = hints_configmap({"rs-1": [{"node": "n2", "expires": clock.now + 60}],
                             "rs-old": [{"node": "n2", "expires": clock.now - 1}]})
    runtime = serve([node(n) for n in NAMES], configmaps=[hints], clock=clock)
    unhinted = scores(runtime, k8s_pod(pod("p")), NAMES)
    assert unhinted["n0"] == 10
    hinted = scores(runtime, k8s_pod(pod("p"), owner="rs-1"), NAMES)
    assert hinted["n2"] == 10 and max(hinted["n0"], hinted["n1"]) <= 9
    assert scores(runtime, k8s_pod(pod("p"), owner="rs-old"), NAMES) == unhinted
    clock.advance(61)
    assert scores(runtime, k8s_pod(pod("p"), owner="rs-1"), NAMES) == unhinted


def test_hint_for_a_node_the_pod_does_not_fit_is_ignored(clock: FakeClock) -> None:
    hints = hints_configmap({"rs-1": [{"node": "n2", "expires": clock.now + 60}]})
    full = [k8s_pod(pod(f"f{g}"), node="n2", gpus=(g,)) for g in range(2)]
    runtime = serve([node(n) for n in NAMES], full, configmaps=[hints], clock=clock)
    got = scores(runtime, k8s_pod(pod("p"), owner="rs-1"), NAMES)
    assert got["n2"] == 0 and sorted(got.values()) == [0, 9, 10]
