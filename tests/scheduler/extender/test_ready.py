"""Turning ready: the kernel is compiled for the verbs' own calls and ``on_ready`` has run
before ``/readyz`` says 200, whether the state came from a snapshot or from a first sync."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.core import fragkernel
from scheduler.extender.config import ExtenderConfig
from scheduler.extender.extender import Extender
from scheduler.extender.runtime import freeze_heap
from scheduler.kube.cache import ClusterCache
from scheduler.kube.convert import node_to_k8s
from tests import skips
from tests.builders import node, pod
from tests.scheduler.extender.helpers import FakeClock, k8s_pod, make_config, post, serve

REPO = Path(__file__).resolve().parents[3]


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


@pytest.fixture
def numba_engine() -> Iterator[None]:
    """The numba engine in use for the test (the one that compiles on first use), whichever
    engine this machine prefers; the previous one put back after it."""
    if fragkernel.kernel("numba") is None:
        skips.skip(skips.NOT_INSTALLED, "numba: there is no kernel to compile")
    previous = fragkernel.engine()
    fragkernel.use("numba")
    yield
    fragkernel.use(previous)


@pytest.mark.usefixtures("numba_engine")
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


# Run in a fresh interpreter: in this one the kernel has been compiled by earlier tests.
_GPUS_AFTER_READY = """
from scheduler.core import fragkernel
from scheduler.kube.convert import node_to_k8s
from tests.builders import node, pod
from tests.scheduler.extender.helpers import k8s_pod, post, serve

# Ready before the node's GPUs are registered: the state has no free GPU share to score.
runtime = serve([node("n1", gpu_count=0, gpu_product="")])
assert runtime.extender.ready
kernel = fragkernel.compiled()
warmed = set(kernel.signatures)
assert warmed, "turning ready compiled nothing"
runtime.cache.apply_node(node_to_k8s(node("n1", gpu_count=2)))  # the device plugin registers
status, body = post(runtime.app.test_client(), "/filter",
                    {"Pod": k8s_pod(pod("p")), "NodeNames": ["n1"]})
assert status == 200 and body["NodeNames"] == ["n1"], body
assert set(kernel.signatures) == warmed, "the first filter compiled the kernel"
"""


@skips.skip_if(fragkernel.kernel("numba") is None, skips.NOT_INSTALLED,
               "numba: there is no kernel to compile")
def test_the_kernel_is_compiled_at_ready_even_when_no_gpu_is_registered_yet() -> None:
    """What the base layout's first filter once paid (1-2.5 s, past the 2 s httpTimeout): a
    state with no free GPU share is scored without the kernel, so warming up on the state
    compiled nothing."""
    env = {**os.environ, "NUMBA_CACHE_DIR": "/nonexistent/numba",  # compile, do not load
           "GPUFRAG_KERNEL": "numba"}
    result = subprocess.run([sys.executable, "-c", _GPUS_AFTER_READY], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]


def test_freeze_heap_moves_what_is_alive_out_of_the_collector() -> None:
    gc.unfreeze()
    try:
        alive = [[i] for i in range(1000)]  # containers the collector tracks
        freeze_heap()
        assert gc.get_freeze_count() >= len(alive)
        assert not any(o is alive for o in gc.get_objects())  # no longer walked
    finally:
        gc.unfreeze()
