"""The deciding filter (``filter.answer: decide``, the default): the choice in ``NodeNames``,
its GPUs assumed at filter so the next pod's filter sees them, confirmed by the bind,
released by a bind elsewhere, a new filter of the same pod, or the TTL."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from flask.testing import FlaskClient

from scheduler.core import ClusterState, choose
from scheduler.core.types import NodeSpec
from scheduler.extender.app import create_app
from scheduler.extender.extender import Extender
from scheduler.kube.cache import ClusterCache
from scheduler.kube.convert import node_to_k8s
from tests.builders import node, pod
from tests.scheduler.extender.helpers import (
    FakeClock,
    RecordingBinder,
    filtered,
    k8s_pod,
    make_config,
    post,
    serve,
)
from tests.scheduler.extender.helpers import bound as bind

NAMES = ["n0", "n1", "n2"]


def pending(name: str, **overrides: Any) -> dict[str, Any]:
    return k8s_pod(pod(name, **overrides), uid=f"uid-{name}")


def test_the_answer_is_the_core_choice_alone_and_its_gpus_are_assumed() -> None:
    nodes = [node(n, gpu_count=2) for n in NAMES]
    bound = [k8s_pod(pod("half", gpu_milli=500), node="n1", gpus=(0,))]
    request = pod("p", gpu_milli=500)
    runtime = serve(nodes, [*bound, pending("p", gpu_milli=500)])
    reply = filtered(runtime, pending("p", gpu_milli=500), NAMES)

    expected_state = ClusterState(nodes)
    expected_state.place(pod("half", gpu_milli=500), "n1", (0,))
    expected = choose(expected_state, runtime.extender.placement.scorer.policy, request)
    assert expected is not None
    assert reply == {"Nodes": None, "NodeNames": [expected.node], "FailedNodes": {},
                     "FailedAndUnresolvableNodes": {}, "Error": ""}
    placed = runtime.cache.state.pods["default/p"]
    assert (placed.node, placed.gpus) == (expected.node, expected.gpus)
    assert runtime.cache.assumed_node("default/p") == expected.node


def test_the_next_pods_filter_sees_the_decision() -> None:
    # Two 1-GPU nodes, two 1-GPU pods, no bind in between: the second filter must not pick
    # the GPU the first one was given.
    runtime = serve([node("n0", gpu_count=1), node("n1", gpu_count=1)],
                    [pending("a"), pending("b")])
    first = filtered(runtime, pending("a"), ["n0", "n1"])["NodeNames"]
    second = filtered(runtime, pending("b"), ["n0", "n1"])["NodeNames"]
    assert sorted(first + second) == ["n0", "n1"]
    assert bind(runtime, "b", second[0]) == {"Error": ""}
    assert bind(runtime, "a", first[0]) == {"Error": ""}


def test_bind_confirms_the_decision_with_the_same_gpus(clock: FakeClock) -> None:
    binder = RecordingBinder()
    runtime = serve([node("n0", gpu_count=4)], [pending("p", gpu_milli=300)], clock=clock,
                    binder=binder, config=make_config(bind={"assume_ttl_s": 10}))
    filtered(runtime, pending("p", gpu_milli=300), ["n0"])
    decided = runtime.cache.state.pods["default/p"].gpus
    clock.advance(8)
    assert bind(runtime, "p", "n0") == {"Error": ""}
    assert binder.calls[0].gpus == decided
    assert "default/p" not in runtime.cache.decided
    clock.advance(8)  # past the filter's deadline, not the bind's: the TTL started again
    assert runtime.cache.expire() == []
    clock.advance(3)
    assert runtime.cache.expire() == ["default/p"]


def test_a_bind_elsewhere_releases_the_decision() -> None:
    binder = RecordingBinder()
    runtime = serve([node("n0", gpu_count=1), node("n1", gpu_count=1)], [pending("p")],
                    binder=binder)
    decided = filtered(runtime, pending("p"), ["n0", "n1"])["NodeNames"][0]
    other = "n1" if decided == "n0" else "n0"
    assert bind(runtime, "p", other) == {"Error": ""}
    assert [c.node for c in binder.calls] == [other]
    assert runtime.cache.state.pods["default/p"].node == other
    row = runtime.cache.state.index[decided]
    assert int(runtime.cache.state.gpu_free[row, 0]) == 1000  # nothing left behind


def test_the_decision_expires_after_the_ttl(clock: FakeClock) -> None:
    runtime = serve([node("n0", gpu_count=1)], [pending("p")], clock=clock,
                    config=make_config(bind={"assume_ttl_s": 5}))
    filtered(runtime, pending("p"), ["n0"])
    assert runtime.cache.counts()["pods_assumed"] == 1
    clock.advance(5)
    runtime.extender.maintain()
    assert runtime.cache.counts()["pods_assumed"] == 0
    assert "default/p" not in runtime.cache.state.pods and not runtime.cache.decided


def test_filtering_the_same_pod_again_decides_afresh_without_counting_it_twice() -> None:
    runtime = serve([node("n0", gpu_count=1)], [pending("p")])
    assert filtered(runtime, pending("p"), ["n0"])["NodeNames"] == ["n0"]
    assert filtered(runtime, pending("p"), ["n0"])["NodeNames"] == ["n0"]
    assert runtime.cache.counts()["pods_assumed"] == 1


def test_when_nothing_fits_every_node_keeps_its_reason() -> None:
    # What preemption reads: only nodes listed in FailedNodes are candidates for it.
    runtime = serve([node("n0", gpu_count=1), node("cpu", gpu_count=0, gpu_product="")],
                    [k8s_pod(pod("busy"), node="n0", gpus=(0,)), pending("p")])
    reply = filtered(runtime, pending("p"), ["n0", "cpu", "new"])
    assert reply["NodeNames"] == []
    assert reply["FailedNodes"] == {
        "n0": "needs 1 free GPUs, has 0",
        "new": "node not yet known to the gpufrag extender (its watch is behind); retry"}
    assert reply["FailedAndUnresolvableNodes"] == {"cpu": "needs 1 GPUs, node has 0"}
    assert runtime.cache.counts()["pods_assumed"] == 0


def test_filter_nodes_answers_the_best_few_best_first_and_assumes_the_best() -> None:
    nodes = [node(n, gpu_count=2) for n in NAMES]
    runtime = serve(nodes, [pending("p", gpu_milli=500)],
                    config=make_config(filter={"nodes": 2}))
    reply = filtered(runtime, pending("p", gpu_milli=500), NAMES)
    assert len(reply["NodeNames"]) == 2
    status, scores = post(runtime.app.test_client(), "/prioritize",
                          {"Pod": pending("p", gpu_milli=500), "NodeNames": NAMES})
    assert status == 200
    # The assumed node stays the top one in prioritize (the state holds the pod there now).
    best = runtime.cache.assumed_node("default/p")
    assert best in reply["NodeNames"]
    assert {h["Host"]: h["Score"] for h in scores}[best] == 10


def test_a_cpu_only_pod_passes_every_node_and_assumes_nothing() -> None:
    runtime = serve([node(n) for n in NAMES], [pending("web", num_gpu=0, gpu_milli=0)])
    reply = filtered(runtime, pending("web", num_gpu=0, gpu_milli=0), NAMES)
    assert reply["NodeNames"] == NAMES and runtime.cache.counts()["pods_assumed"] == 0



def test_filters_for_pods_the_cluster_does_not_have_hold_no_gpu() -> None:
    # One free GPU. Whoever reaches the verb port files 50 filters for made-up pods: each is
    # answered, none holds the GPU, and the real pod's filter then gets it (and holds it).
    runtime = serve([node("n0", gpu_count=1)], [pending("real")])
    for i in range(50):
        made_up = filtered(runtime, pending(f"ghost-{i}"), ["n0"])
        assert made_up["NodeNames"] == ["n0"]
    assert runtime.cache.assumed == {} and runtime.extender.filter.unassumed_decisions == 50
    assert filtered(runtime, pending("real"), ["n0"])["NodeNames"] == ["n0"]
    assert runtime.cache.assumed_node("default/real") == "n0"
    # A pod known by name but filed with another UID is not the cluster's pod either.
    impostor = k8s_pod(pod("real"), uid="uid-someone-else")
    runtime.cache.forget("default/real")
    filtered(runtime, impostor, ["n0"])
    assert runtime.cache.assumed == {}
    assert "gpufrag_extender_unassumed_decisions_total 51.0" in runtime.app.test_client().get(
        "/metrics").get_data(as_text=True)


def watched(nodes: list[NodeSpec], pods: list[dict[str, Any]], await_s: float
            ) -> tuple[ClusterCache, Extender, FlaskClient]:
    """An extender whose cache a watch feeds (the test applies the watch's events), waiting
    ``await_s`` for a pod it has not seen; a snapshot has no watch and never waits."""
    config = make_config(filter={"await_watch_s": await_s})
    cache = ClusterCache(config.names, clock=FakeClock())
    cache.load([node_to_k8s(n) for n in nodes], pods)
    extender = Extender(cache, config, clock=FakeClock())
    extender.maintain()
    return cache, extender, create_app(extender).test_client()


def test_a_filter_ahead_of_the_watch_waits_for_it_and_then_holds_the_gpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kube-scheduler's informer saw the pod first: the watch delivers it while the filter
    waits (here from another thread, once the filter has asked), and the decision holds."""
    cache, extender, client = watched([node("n0", gpu_count=1)], [], await_s=1.0)
    real = cache.await_pod

    def the_watch_catches_up(key: str, uid: str, timeout_s: float,
                             claims: tuple[str, ...] = ()) -> bool:
        threading.Thread(target=cache.apply_pod, args=(pending("late"),)).start()
        return real(key, uid, timeout_s, claims)

    monkeypatch.setattr(cache, "await_pod", the_watch_catches_up)
    status, reply = post(client, "/filter", {"Pod": pending("late"), "NodeNames": ["n0"]})
    assert status == 200 and reply["NodeNames"] == ["n0"]
    assert cache.assumed_node("default/late") == "n0"
    assert (extender.filter.unassumed_decisions, extender.filter.watch_waits_timed_out) == (0, 0)


def test_a_filter_whose_pod_never_shows_gives_up_and_holds_nothing() -> None:
    cache, extender, client = watched([node("n0", gpu_count=1)], [], await_s=0.001)
    status, reply = post(client, "/filter", {"Pod": pending("ghost"), "NodeNames": ["n0"]})
    assert status == 200 and reply["NodeNames"] == ["n0"]
    assert cache.assumed == {}
    assert (extender.filter.unassumed_decisions, extender.filter.watch_waits_timed_out) == (1, 1)
    assert "gpufrag_extender_watch_waits_timed_out_total 1.0" in client.get(
        "/metrics").get_data(as_text=True)


def test_a_pod_the_watch_has_shown_is_not_waited_for() -> None:
    """Known pods (pending or bound), and pods without a GPU, never wait: a pod known under
    another UID is waited for (it is not that pod) until the wait runs out."""
    cache, extender, client = watched([node("n0", gpu_count=2)],
                                      [pending("p"), pending("web", num_gpu=0, gpu_milli=0)],
                                      await_s=0.001)
    post(client, "/filter", {"Pod": pending("p"), "NodeNames": ["n0"]})
    post(client, "/filter", {"Pod": pending("web", num_gpu=0, gpu_milli=0),
                             "NodeNames": ["n0"]})
    assert extender.filter.watch_waits_timed_out == 0 and cache.assumed_node("default/p") == "n0"
    assert cache.await_pod("default/p", "uid-p", 0.0)
    assert not cache.await_pod("default/p", "uid-other", 0.0)


def test_a_snapshot_never_waits_whatever_the_setting() -> None:
    runtime = serve([node("n0")], [], config=make_config(filter={"await_watch_s": 1.0}))
    assert runtime.extender.placement.config.filter.await_watch_s == 0.0
