"""Bind: GPUs chosen by the core on the requested node, recorded with the Binding, counted at
once ("assumed") so the next pod sees them, confirmed by the watch or expired after the TTL."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpufrag.conventions import ANNOTATION_GPU_RECORD
from scheduler.core import ClusterState, choose
from scheduler.kube.binder import BindError
from tests.builders import node, pod
from tests.records import SIGNER
from tests.scheduler.extender.helpers import (
    FakeClock,
    RecordingBinder,
    k8s_pod,
    make_config,
    post,
    serve,
)


def bind(runtime: Any, name: str, node_name: str, uid: str = "") -> dict[str, Any]:
    status, reply = post(runtime.app.test_client(), "/bind", {
        "PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": node_name})
    assert status == 200
    result: dict[str, Any] = reply
    return result


def pending(*names: str, **overrides: Any) -> list[dict[str, Any]]:
    return [k8s_pod(pod(n, **overrides), uid=f"uid-{n}") for n in names]


def test_bind_counts_the_placement_at_once(clock: FakeClock) -> None:
    binder = RecordingBinder()
    runtime = serve([node("n0", gpu_count=2)], pending("p1", "p2", "p3"), binder=binder,
                    clock=clock)
    assert bind(runtime, "p1", "n0", "uid-p1") == {"Error": ""}
    assert bind(runtime, "p2", "n0", "uid-p2") == {"Error": ""}
    assert [(c.name, c.uid, c.node, c.gpus) for c in binder.calls] == [
        ("p1", "uid-p1", "n0", (0,)), ("p2", "uid-p2", "n0", (1,))]
    _, reply = post(runtime.app.test_client(), "/filter",
                    {"Pod": pending("p3")[0], "NodeNames": ["n0"]})
    assert reply["FailedNodes"] == {"n0": "needs 1 free GPUs, has 0"}
    assert bind(runtime, "p3", "n0")["Error"] == (
        "pod default/p3 does not fit node n0 now: needs 1 free GPUs, has 0")
    assert runtime.cache.counts()["pods_assumed"] == 2


def test_share_goes_on_the_gpu_the_core_chooses() -> None:
    nodes = [node("n0", gpu_count=4)]
    bound = [k8s_pod(pod(f"b{g}", gpu_milli=m), node="n0", gpus=(g,))
             for g, m in enumerate((300, 600, 900))]
    binder = RecordingBinder()
    runtime = serve(nodes, [*bound, *pending("s", gpu_milli=400)], binder=binder)
    state = ClusterState(nodes)
    for g, m in enumerate((300, 600, 900)):
        state.place(pod(f"b{g}", gpu_milli=m), 0, (g,))
    decision = choose(state, runtime.extender.placement.scorer.policy, pod("s", gpu_milli=400),
                      np.array([0]))
    assert decision is not None
    assert bind(runtime, "s", "n0") == {"Error": ""}
    assert binder.calls[0].gpus == decision.gpus


def test_assumed_placement_expires_after_the_ttl(clock: FakeClock) -> None:
    runtime = serve([node("n0", gpu_count=1)], pending("p1", "p2"), clock=clock,
                    config=make_config(bind={"assume_ttl_s": 30}))
    bind(runtime, "p1", "n0")
    clock.advance(29)
    runtime.extender.maintain()
    assert runtime.cache.counts()["pods_assumed"] == 1
    assert "does not fit" in bind(runtime, "p2", "n0")["Error"]
    clock.advance(2)
    runtime.extender.maintain()
    assert runtime.cache.counts()["pods_assumed"] == 0
    assert "default/p1" not in runtime.cache.state.pods
    assert bind(runtime, "p2", "n0") == {"Error": ""}


def test_the_watch_confirms_an_assumption(clock: FakeClock) -> None:
    runtime = serve([node("n0", gpu_count=2)], pending("p1"), clock=clock)
    bind(runtime, "p1", "n0")
    # An update of the still-pending pod arrives first: the assumption stands.
    runtime.cache.apply_pod(k8s_pod(pod("p1"), uid="uid-p1", gpus=(0,)))
    assert runtime.cache.counts()["pods_assumed"] == 1
    # Then the binding.
    runtime.cache.apply_pod(k8s_pod(pod("p1"), uid="uid-p1", node="n0", gpus=(0,)))
    assert runtime.cache.counts() == {"nodes": 1, "pods_placed": 1, "pods_pending": 0,
                                          "pods_assumed": 0, "pods_unaccounted": 0}
    clock.advance(3600)
    runtime.extender.maintain()
    assert runtime.cache.state.pods["default/p1"].gpus == (0,)


def test_a_failed_bind_is_forgotten() -> None:
    binder = RecordingBinder(fail_with=BindError("binding pod default/p1 to n0: HTTP 409 "
                                                 "Conflict", retryable=False))
    runtime = serve([node("n0", gpu_count=1)], pending("p1"), binder=binder)
    assert bind(runtime, "p1", "n0")["Error"] == "binding pod default/p1 to n0: HTTP 409 Conflict"
    assert runtime.cache.counts()["pods_assumed"] == 0
    assert not runtime.cache.state.pods
    assert bind(runtime, "p1", "n0") == {"Error": ""}  # kube-scheduler's retry succeeds


def test_an_unexpected_binder_failure_is_a_500_and_forgotten() -> None:
    binder = RecordingBinder(fail_with=RuntimeError("connection pool broke"))
    runtime = serve([node("n0", gpu_count=1)], pending("p1"), binder=binder)
    status, reply = post(runtime.app.test_client(), "/bind", {
        "PodName": "p1", "PodNamespace": "default", "Node": "n0"})
    assert status == 500
    assert reply == {"Error": "internal error in the gpufrag extender; see its log"}
    assert runtime.cache.counts()["pods_assumed"] == 0 and not runtime.cache.state.pods
    assert bind(runtime, "p1", "n0") == {"Error": ""}


def test_a_repeated_bind_to_the_same_node_gives_the_same_gpus() -> None:
    binder = RecordingBinder()
    runtime = serve([node("n0", gpu_count=2), node("n1")], pending("p1"), binder=binder)
    bind(runtime, "p1", "n0")
    bind(runtime, "p1", "n0")
    assert [c.gpus for c in binder.calls] == [(0,), (0,)]
    assert "already placed on n0" in bind(runtime, "p1", "n1")["Error"]


def test_a_pod_the_watch_has_not_shown_yet_is_read_from_the_api() -> None:
    late = k8s_pod(pod("late", num_gpu=2), uid="uid-late")
    binder = RecordingBinder(pods={"default/late": late})
    runtime = serve([node("n0", gpu_count=2)], binder=binder)
    assert bind(runtime, "late", "n0", "uid-late") == {"Error": ""}
    assert binder.reads == ["default/late"]
    assert binder.calls[0].gpus == (0, 1)


def test_a_recreated_pod_is_read_again() -> None:
    binder = RecordingBinder(pods={"default/p1": k8s_pod(pod("p1", num_gpu=2), uid="uid-new")})
    runtime = serve([node("n0", gpu_count=2)], pending("p1"), binder=binder)
    bind(runtime, "p1", "n0", "uid-new")
    assert binder.reads == ["default/p1"]
    assert binder.calls[0].gpus == (0, 1)


def test_a_cpu_only_pod_is_bound_without_gpu_indices() -> None:
    binder = RecordingBinder()
    runtime = serve([node("n0")], pending("web", num_gpu=0, gpu_milli=0), binder=binder)
    assert bind(runtime, "web", "n0") == {"Error": ""}
    assert binder.calls[0].gpus is None


def test_a_bound_pod_is_not_bound_again() -> None:
    runtime = serve([node("n0")], [k8s_pod(pod("p1"), node="n0", gpus=(1,))])
    assert bind(runtime, "p1", "n0")["Error"] == "pod default/p1 is already bound to n0"


def test_a_pod_of_another_scheduler_is_not_bound() -> None:
    binder = RecordingBinder()
    others = [k8s_pod(pod("theirs"), scheduler_name="default-scheduler"),
              {**k8s_pod(pod("unnamed")), "spec": {"containers": []}}]  # the API's default
    runtime = serve([node("n0", gpu_count=2)], others, binder=binder)
    assert bind(runtime, "theirs", "n0")["Error"] == (
        "pod default/theirs has spec.schedulerName 'default-scheduler', not "
        "'gpufrag-scheduler' (names.scheduler_name): the gpufrag extender binds only the pods "
        "of its own scheduler")
    assert "spec.schedulerName 'default-scheduler'" in bind(runtime, "unnamed", "n0")["Error"]
    assert binder.calls == [] and runtime.cache.counts()["pods_assumed"] == 0
    assert binder.reads == ["default/theirs", "default/unnamed"]


def test_the_scheduler_name_is_the_configured_one() -> None:
    binder = RecordingBinder()
    runtime = serve([node("n0")], [k8s_pod(pod("p1"), scheduler_name="gpu-b")], binder=binder,
                    config=make_config(names={"scheduler_name": "gpu-b"}))
    assert bind(runtime, "p1", "n0") == {"Error": ""}
    runtime = serve([node("n0")], [k8s_pod(pod("p1"))], binder=RecordingBinder(),
                    config=make_config(names={"scheduler_name": "gpu-b"}))
    assert "not 'gpu-b'" in bind(runtime, "p1", "n0")["Error"]


def test_a_pod_the_cache_knows_by_its_uid_is_bound_without_a_read() -> None:
    # The watch keeps the request and spec.schedulerName; kube-scheduler sends the UID, and a
    # pod with that UID cannot have changed either: no GET before the bind.
    binder = RecordingBinder()
    runtime = serve([node("n0")], pending("p1"), binder=binder)
    assert bind(runtime, "p1", "n0", "uid-p1") == {"Error": ""}
    assert binder.reads == [] and [c.node for c in binder.calls] == ["n0"]


def test_the_cached_scheduler_name_is_checked_too() -> None:
    binder = RecordingBinder()
    theirs = k8s_pod(pod("theirs"), scheduler_name="default-scheduler", uid="uid-theirs")
    runtime = serve([node("n0")], [theirs], binder=binder)
    assert "spec.schedulerName 'default-scheduler'" in bind(runtime, "theirs", "n0",
                                                            "uid-theirs")["Error"]
    assert binder.reads == [] and binder.calls == []


def test_the_pod_is_read_from_the_api_when_the_bind_names_no_uid() -> None:
    # Without a UID the cache's copy may be another pod of the same name: the API decides
    # (here: it is gone).
    binder = RecordingBinder()
    runtime = serve([node("n0")], pending("p1"), binder=binder)
    del binder.pods["default/p1"]
    assert bind(runtime, "p1", "n0")["Error"] == "pod default/p1 not found"
    assert binder.reads == ["default/p1"] and binder.calls == []


def test_the_bind_signs_the_gpu_record_for_the_pod_and_node() -> None:
    binder = RecordingBinder()
    runtime = serve([node("n0", gpu_count=2)],
                    pending("p1") + pending("cpu", num_gpu=0, gpu_milli=0), binder=binder)
    runtime.extender.bind.signer = SIGNER
    assert bind(runtime, "p1", "n0", "uid-p1") == {"Error": ""}
    assert bind(runtime, "cpu", "n0", "uid-cpu") == {"Error": ""}
    gpu_call, cpu_call = binder.calls
    record = gpu_call.extra[ANNOTATION_GPU_RECORD]
    verifier = SIGNER.verifier()
    assert verifier.problem(record, uid="uid-p1", node="n0", gpus_text="0") == ""
    assert verifier.problem(record, uid="uid-p1", node="n0", gpus_text="1") != ""
    assert cpu_call.extra == {}  # no GPU, no record


def test_without_a_signer_no_record_is_written() -> None:
    binder = RecordingBinder()
    runtime = serve([node("n0", gpu_count=2)], pending("p1"), binder=binder)
    assert bind(runtime, "p1", "n0", "uid-p1") == {"Error": ""}
    assert binder.calls[0].extra == {}


def test_a_gpu_pod_is_not_bound_unsigned_while_a_signature_is_required() -> None:
    """Fail safe: before the signing key is had, a GPU pod's bind is refused with the reason
    (it stays pending, kube-scheduler retries) rather than bound with a record the device plugin
    refuses; a pod without GPUs needs no record and is bound."""
    binder = RecordingBinder()
    runtime = serve([node("n0", gpu_count=2)],
                    pending("p1") + pending("cpu", num_gpu=0, gpu_milli=0), binder=binder)
    runtime.extender.bind.signing_required = True
    error = bind(runtime, "p1", "n0", "uid-p1")["Error"]
    assert "no GPU-record signing key yet" in error and "stays pending" in error
    assert bind(runtime, "cpu", "n0", "uid-cpu") == {"Error": ""}
    assert [c.extra for c in binder.calls] == [{}]
    runtime.extender.bind.signer = SIGNER  # the key arrives: the retry binds, signed
    assert bind(runtime, "p1", "n0", "uid-p1") == {"Error": ""}
    assert ANNOTATION_GPU_RECORD in binder.calls[-1].extra
