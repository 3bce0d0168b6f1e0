"""The preempt verb: of kube-scheduler's candidate victims per node, only the fewest that free
a GPU the preemptor fits on (ties: least fragmentation); nodes where none helps are dropped."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from scheduler.extender.verbs import preempt as preempt_verb
from tests.builders import node, pod
from tests.scheduler.extender.helpers import k8s_pod, post, serve


def placed(name: str, gpu: int, milli: int) -> dict[str, Any]:
    return k8s_pod(pod(name, gpu_milli=milli), node="n0", gpus=(gpu,), uid=f"uid-{name}")


def preempt(runtime: Any, body: dict[str, Any]) -> dict[str, Any]:
    status, reply = post(runtime.app.test_client(), "/preempt", body)
    assert status == 200, reply
    result: dict[str, Any] = reply
    return result


def test_only_the_victims_on_the_gpu_the_pod_needs_are_kept() -> None:
    # GPU 0 holds a (400) + b (400); GPU 1 holds c (500). A 700 share needs both a and b
    # gone, or c alone: c is the fewest victims.
    pods = [placed("a", 0, 400), placed("b", 0, 400), placed("c", 1, 500)]
    runtime = serve([node("n0", gpu_count=2)], pods)
    preemptor = k8s_pod(pod("hi", gpu_milli=700), uid="uid-hi")
    reply = preempt(runtime, {"Pod": preemptor, "NodeNameToMetaVictims": {
        "n0": {"Pods": [{"UID": "uid-a"}, {"UID": "uid-b"}, {"UID": "uid-c"}],
               "NumPDBViolations": 2}}})
    assert reply == {"NodeNameToMetaVictims": {
        "n0": {"Pods": [{"UID": "uid-c"}], "NumPDBViolations": 1}}}


def test_victims_mode_with_pod_objects_and_a_node_where_nothing_helps() -> None:
    pods = [placed("a", 0, 300), placed("b", 1, 300)]
    runtime = serve([node("n0", gpu_count=2), node("n1", gpu_count=1)], pods)
    preemptor = k8s_pod(pod("hi", num_gpu=2), uid="uid-hi")
    reply = preempt(runtime, {"Pod": preemptor, "NodeNameToVictims": {
        "n0": {"Pods": [pods[0], pods[1]], "NumPDBViolations": 0},
        "n1": {"Pods": [], "NumPDBViolations": 0}}})
    assert reply == {"NodeNameToMetaVictims": {
        "n0": {"Pods": [{"UID": "uid-a"}, {"UID": "uid-b"}], "NumPDBViolations": 0}}}


def test_a_node_where_the_pod_fits_the_gpus_keeps_kube_schedulers_victims() -> None:
    pods = [placed("a", 0, 900)]
    runtime = serve([node("n0", gpu_count=2)], pods)
    preemptor = k8s_pod(pod("hi", gpu_milli=500), uid="uid-hi")
    reply = preempt(runtime, {"Pod": preemptor, "NodeNameToMetaVictims": {
        "n0": {"Pods": [{"UID": "uid-a"}], "NumPDBViolations": 0}}})
    # GPU 1 is free: the GPUs do not need the victim, so what blocks the pod is a limit the
    # extender does not count (pod count, ports); kube-scheduler refuses an empty victim list
    # from a non-ignorable extender, so its own candidates come back unchanged.
    assert reply == {"NodeNameToMetaVictims": {"n0": {"Pods": [{"UID": "uid-a"}],
                                                      "NumPDBViolations": 0}}}


def test_bad_preemption_args_are_400() -> None:
    runtime = serve([node("n0")])
    status, reply = post(runtime.app.test_client(), "/preempt", {
        "Pod": k8s_pod(pod("hi")), "NodeNameToMetaVictims": {"n0": {"Pods": [{}]}}})
    assert status == 400 and "UID" in reply["Error"]


def _three_victims() -> tuple[Any, dict[str, Any]]:
    pods = [placed("a", 0, 400), placed("b", 0, 400), placed("c", 1, 500)]
    runtime = serve([node("n0", gpu_count=2)], pods)
    body = {"Pod": k8s_pod(pod("hi", gpu_milli=700), uid="uid-hi"), "NodeNameToMetaVictims": {
        "n0": {"Pods": [{"UID": "uid-a"}, {"UID": "uid-b"}, {"UID": "uid-c"}],
               "NumPDBViolations": 2}}}
    return runtime, body


def test_the_search_runs_without_the_cache_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A filter is never queued behind a preempt: while the victim search runs, the cache's
    lock (which every filter takes) is free."""
    runtime, body = _three_victims()
    searching, lock_was_free = threading.Event(), []
    real = preempt_verb.choose_victims

    def filter_thread() -> None:  # the lock is reentrant: ask from another thread, as a filter
        acquired = runtime.cache.lock.acquire(timeout=2)
        lock_was_free.append(acquired)
        if acquired:
            runtime.cache.lock.release()

    def search(inputs: Any) -> Any:
        searching.set()
        other = threading.Thread(target=filter_thread)
        other.start()
        other.join(10)
        return real(inputs)

    monkeypatch.setattr(preempt_verb, "choose_victims", search)
    worker = threading.Thread(target=lambda: preempt(runtime, body))
    worker.start()
    assert searching.wait(5)
    worker.join(10)
    assert lock_was_free == [True]


def test_a_preempt_out_of_time_gives_kube_scheduler_its_own_victims(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runtime, body = _three_victims()
    monkeypatch.setattr(preempt_verb, "PREEMPT_BUDGET_S", 0.0)  # no time for any node
    reply = preempt(runtime, body)
    assert reply == {"NodeNameToMetaVictims": {"n0": {
        "Pods": [{"UID": "uid-a"}, {"UID": "uid-b"}, {"UID": "uid-c"}], "NumPDBViolations": 2}}}
