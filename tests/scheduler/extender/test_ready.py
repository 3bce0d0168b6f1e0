"""Turning ready: the kernel is compiled for the verbs' own calls and ``on_ready`` has run
before ``/readyz`` says 200, whether the state came from a snapshot or from a first sync."""

from __future__ import annotations

import gc

import pytest

from scheduler.core import fragkernel
from scheduler.extender.config import ExtenderConfig
from scheduler.extender.runtime import freeze_heap
from scheduler.extender.service import Extender
from scheduler.kube.cache import ClusterCache
from scheduler.kube.convert import node_to_k8s
from tests.builders import node, pod
from tests.scheduler.extender.helpers import FakeClock, k8s_pod, make_config, post, serve


def test_ready_only_after_the_first_sync_and_on_ready(clock: FakeClock) -> None:
    cache = ClusterCache(clock=clock)
    seen: list[bool] = []
    extender = Extender(cache, ExtenderConfig(), clock=clock,
                        on_ready=lambda: seen.append(extender.ready))
    extender.maintain()
    assert not extender.ready and seen == []  # nothing synced yet
    cache.replace_nodes([node_to_k8s(node("n1", gpu_count=2))])
    cache.replace_pods([])
    extender.maintain()
    assert extender.ready
    assert seen == [False]  # called once, before ready turned true
    extender.maintain()
    assert seen == [False]


def test_a_snapshot_is_ready_at_once_and_on_ready_ran(clock: FakeClock) -> None:
    cache = ClusterCache(clock=clock)
    cache.load([node_to_k8s(node("n1", gpu_count=2))], [])
    calls: list[int] = []
    extender = Extender(cache, ExtenderConfig(), clock=clock, on_ready=lambda: calls.append(1))
    assert extender.ready and calls == [1]


@pytest.mark.skipif(fragkernel.compiled() is None, reason="numba not installed, or "
                    "GPUFRAG_NO_JIT set: there is no kernel to compile")
def test_warming_up_compiles_what_the_verbs_call(clock: FakeClock) -> None:
    kernel = fragkernel.compiled()
    assert kernel is not None
    for answer in ("decide", "feasible"):
        runtime = serve([node("n1", gpu_count=4), node("n2", gpu_count=8)], clock=clock,
                        config=make_config(filter={"answer": answer}))
        warmed = set(kernel.signatures)  # type: ignore[attr-defined]  # a numba dispatcher
        assert warmed, "turning ready compiled nothing"
        client = runtime.app.test_client()
        status, body = post(client, "/filter", {
            "Pod": k8s_pod(pod("p", gpu_milli=500)), "NodeNames": ["n1", "n2"]})
        assert status == 200 and body["NodeNames"], body
        status, _ = post(client, "/prioritize", {
            "Pod": k8s_pod(pod("q")), "NodeNames": ["n1", "n2"]})
        assert status == 200
        # The verbs' calls were compiled already: nothing new on the request path.
        assert set(kernel.signatures) == warmed  # type: ignore[attr-defined]


def test_freeze_heap_moves_what_is_alive_out_of_the_collector() -> None:
    gc.unfreeze()
    try:
        alive = [[i] for i in range(1000)]  # containers the collector tracks
        freeze_heap()
        assert gc.get_freeze_count() >= len(alive)
        assert not any(o is alive for o in gc.get_objects())  # no longer walked
    finally:
        gc.unfreeze()
