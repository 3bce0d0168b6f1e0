"""FGD's target workload: fixed from the configuration, or derived from the pods seen and
recomputed in the background (every ``refresh_s``, or sooner after a burst of changes)."""

from __future__ import annotations

from scheduler.core import TargetWorkload
from scheduler.extender.upkeep import FALLBACK_SPECS
from tests.builders import node, pod
from tests.scheduler.extender.helpers import FakeClock, k8s_pod, make_config, serve


def specs(workload: TargetWorkload) -> set[tuple[int, int]]:
    return set(zip(workload.num_gpu.tolist(), workload.gpu_milli.tolist(), strict=True))


def test_fallback_then_derived_from_the_pods_seen(clock: FakeClock) -> None:
    runtime = serve([node("n0", gpu_count=8)], clock=clock)
    fallback = TargetWorkload.from_specs(FALLBACK_SPECS)
    assert specs(runtime.extender.placement.workload) == specs(fallback)
    runtime.cache.apply_pod(k8s_pod(pod("a", num_gpu=2)))
    runtime.extender.maintain()  # one change among one pod: a burst, refreshed at once
    assert specs(runtime.extender.placement.workload) == {(2, 1000)}


def test_periodic_refresh_only_when_pods_changed(clock: FakeClock) -> None:
    config = make_config(workload={"refresh_s": 60, "change_fraction": 0})
    pods = [k8s_pod(pod(f"p{i}", gpu_milli=500)) for i in range(10)]
    runtime = serve([node("n0", gpu_count=8)], pods, config=config, clock=clock)
    scorer = runtime.extender.placement.scorer
    runtime.cache.apply_pod(k8s_pod(pod("w", num_gpu=4)))
    clock.advance(59)
    runtime.extender.maintain()
    assert runtime.extender.placement.scorer is scorer  # not yet due
    clock.advance(1)
    runtime.extender.maintain()
    assert specs(runtime.extender.placement.workload) == {(1, 500), (4, 1000)}
    refreshed = runtime.extender.placement.scorer
    clock.advance(600)
    runtime.extender.maintain()
    assert runtime.extender.placement.scorer is refreshed  # due, but nothing changed: caches kept


def test_a_burst_of_changes_refreshes_before_the_period(clock: FakeClock) -> None:
    config = make_config(workload={"refresh_s": 3600, "change_fraction": 0.25})
    pods = [k8s_pod(pod(f"p{i}", gpu_milli=500)) for i in range(8)]
    runtime = serve([node("n0", gpu_count=8)], pods, config=config, clock=clock)
    scorer = runtime.extender.placement.scorer
    runtime.cache.apply_pod(k8s_pod(pod("w0", num_gpu=2)))  # 1 change of 9 pods: < 25%
    runtime.extender.maintain()
    assert runtime.extender.placement.scorer is scorer
    for i in range(1, 3):
        runtime.cache.apply_pod(k8s_pod(pod(f"w{i}", num_gpu=2)))  # 3 of 11: >= 25%
    runtime.extender.maintain()
    assert runtime.extender.placement.scorer is not scorer
    assert specs(runtime.extender.placement.workload) == {(1, 500), (2, 1000)}


def test_configured_specs_are_never_replaced(clock: FakeClock) -> None:
    config = make_config(workload={"specs": [{"num_gpu": 8}, {"num_gpu": 1, "gpu_milli": 250,
                                                              "popularity": 3}]})
    runtime = serve([node("n0", gpu_count=8)], [k8s_pod(pod("p", num_gpu=2))], config=config,
                    clock=clock)
    assert specs(runtime.extender.placement.workload) == {(8, 1000), (1, 250)}
    assert runtime.extender.placement.workload.popularity.tolist() == [0.25, 0.75]
    clock.advance(10_000)
    runtime.cache.apply_pod(k8s_pod(pod("q", num_gpu=4)))
    runtime.extender.maintain()
    assert specs(runtime.extender.placement.workload) == {(8, 1000), (1, 250)}
