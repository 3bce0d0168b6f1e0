"""Right-sizing in the cycle: readings -> recommendations published per workload, modes, the
right-sized shares handed to the planner, dry run, failures reported (the real API: e2e)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from defrag.controller.config import DefragConfig
from defrag.controller.model import PodInfo, Snapshot
from defrag.controller.rightsize import out_of_bounds, overrun_mib, publish
from defrag.rightsizing.recommender import PodSample, RightsizingConfig, parse, update
from defrag.rightsizing.workloads import Workload
from gpufrag import conventions as cv
from gpufrag.gpu_usage import GpuUsage, NodeGpuUsage, PodGpuUsage
from scheduler.core import PodRequest
from tests.defrag.controller.builders import T4_MIB, gpu_node, share, snapshot

NOW = 1_767_225_600.0
CONFIG = RightsizingConfig()


class Workloads:
    """Controllers in memory: owner UID -> workload; records patches (and can fail them)."""

    def __init__(self, workloads: dict[str, Workload], *, fail_patch: bool = False) -> None:
        self.workloads = workloads
        self.fail_patch = fail_patch
        self.resolved: list[str] = []
        self.patches: list[tuple[str, str, str]] = []
        self.events: list[tuple[str, str, str]] = []

    def resolve(self, namespace: str, owner_references: Any) -> Workload | None:
        uid = owner_references[0]["uid"]
        self.resolved.append(uid)
        if uid == "broken":
            raise RuntimeError("HTTP 500")
        return self.workloads.get(uid)

    def patch_annotation(self, workload: Workload, key: str, value: str) -> None:
        if self.fail_patch:
            raise RuntimeError("HTTP 403: forbidden")
        self.patches.append((workload.text, key, value))

    def event(self, workload: Workload, reason: str, message: str) -> None:
        self.events.append((workload.text, reason, message))


def cluster(owners: dict[str, str], used_mib: int = 2048) -> Snapshot:
    """One T4 node; pod ``pX`` (700 milli = 11,468 MiB reserved) of owner ``owners[pX]``."""
    placed = [(share(name, 700), "n0", (i,)) for i, name in enumerate(sorted(owners))]
    snap = snapshot([gpu_node("n0", gpus=len(owners))], placed)
    for i, name in enumerate(sorted(owners)):
        key = f"ns/{name}"
        snap.pods[key] = dataclasses.replace(
            snap.pods[key], uid=f"uid-{name}", owner_uid=owners[name], owner_kind="ReplicaSet",
            owner_name=owners[name], labels={cv.LABEL_MODEL_VERSION: "v1"} if i == 0 else {})
    gpus = tuple(GpuUsage(index=i, uuid=f"GPU-{i}", product="T4", memory_used_mib=used_mib,
                          memory_total_mib=T4_MIB, utilization_pct=30,
                          pods=(PodGpuUsage("ns", name, f"uid-{name}", used_mib),))
                 for i, name in enumerate(sorted(owners)))
    snap.readings = {"n0": NodeGpuUsage("n0", NOW - 5, 15.0, gpus)}
    return snap


def workload(uid: str, mode: str | None = None, **annotations: str) -> Workload:
    if mode is not None:
        annotations[cv.ANNOTATION_RIGHTSIZING_MODE] = mode
    return Workload("Deployment", "ns", f"dep-{uid}", f"dep-uid-{uid}", annotations)


def run(snap: Snapshot, workloads: Workloads, *, dry_run: bool = False) -> Any:
    return publish(snap, workloads, CONFIG, cv.DEFAULT_NAMES, NOW, dry_run=dry_run)


def test_each_sampled_workload_gets_its_recommendation_written_on_its_controller() -> None:
    snap = cluster({"a": "rs-a", "b": "rs-b"})
    api = Workloads({"rs-a": workload("a"), "rs-b": workload("b")})
    report = run(snap, api)
    assert [p.workload.name for p in report.published] == ["dep-a", "dep-b"]
    assert [(w, k) for w, k, _ in api.patches] == [
        ("Deployment/ns/dep-a", cv.ANNOTATION_GPU_RECOMMENDATION),
        ("Deployment/ns/dep-b", cv.ANNOTATION_GPU_RECOMMENDATION)]
    recs = parse(api.patches[0][2])
    assert set(recs) == {"v1"}  # pod a carries model version v1; b has none ("*")
    assert set(parse(api.patches[1][2])) == {"*"}
    rec = recs["v1"]
    # p95 of one hourly peak (2048) + 15 % + 256 MiB, as thousandths of a 16 GiB GPU.
    assert (rec.peak_mib, rec.memory_mib, rec.milli) == (2048, 2612, 160)
    assert report.rightsized == {}  # recommend mode (the default): nothing shrinks


def test_auto_mode_tells_the_planner_the_share_the_webhook_will_admit() -> None:
    snap = cluster({"a": "rs-a", "b": "rs-b"})
    api = Workloads({"rs-a": workload("a", "auto"), "rs-b": workload("b", "off")})
    report = run(snap, api)
    assert report.rightsized == {"ns/a": 160}
    assert [p.workload.name for p in report.published] == ["dep-a"]
    assert report.skipped["mode off"] == 1 and len(api.patches) == 1
    # What the planner needs to tell actionable nodes from the rest: every sampled pod.
    assert report.sizable == {"ns/a": ("Deployment/ns/dep-a (mode auto)", True),
                              "ns/b": ("Deployment/ns/dep-b (mode off)", False)}


def test_history_continues_from_the_annotation_and_unchanged_is_not_rewritten() -> None:
    snap = cluster({"a": "rs-a"})
    first = Workloads({"rs-a": workload("a")})
    run(snap, first)
    text = first.patches[0][2]
    again = Workloads({"rs-a": workload("a", **{cv.ANNOTATION_GPU_RECOMMENDATION: text})})
    run(snap, again)
    # The same reading again: the interval's sample count grows, so it is written once more.
    assert parse(again.patches[0][2])["v1"].samples == 2
    settled = Workloads({"rs-a": workload(
        "a", **{cv.ANNOTATION_GPU_RECOMMENDATION: again.patches[0][2]})})
    empty = cluster({"a": "rs-a"})
    empty.readings = {}
    report = run(empty, settled)
    assert report.published == [] and settled.patches == []


def test_a_dry_run_computes_everything_and_writes_nothing() -> None:
    snap = cluster({"a": "rs-a"})
    api = Workloads({"rs-a": workload("a", "auto")})
    report = run(snap, api, dry_run=True)
    assert api.patches == [] and report.published[0].written
    assert report.rightsized == {"ns/a": 160}


def test_bare_pods_unknown_owners_and_api_failures_are_left_alone_and_reported() -> None:
    snap = cluster({"a": "rs-a", "b": "broken", "c": "gone"})
    snap.pods["ns/a"] = dataclasses.replace(snap.pods["ns/a"], owner_uid="", owner_kind="")
    api = Workloads({"rs-a": workload("a")})
    report = run(snap, api)
    assert report.published == []
    assert report.skipped == {"bare pod": 1, "no supported controller": 2}
    assert any("HTTP 500" in p for p in report.problems)


def test_a_failed_patch_or_a_bad_mode_skips_only_that_workload() -> None:
    snap = cluster({"a": "rs-a", "b": "rs-b"})
    api = Workloads({"rs-a": workload("a", "sometimes"), "rs-b": workload("b", "auto")},
                    fail_patch=True)
    report = run(snap, api)
    assert report.published == [] and report.rightsized == {}
    assert report.skipped["bad mode annotation"] == 1
    assert any("sometimes" in p for p in report.problems)
    assert any("HTTP 403" in p for p in report.problems)


def test_replicas_of_one_owner_are_looked_up_once() -> None:
    snap = cluster({"a": "rs-a", "b": "rs-a"})
    api = Workloads({"rs-a": workload("a")})
    report = run(snap, api)
    assert api.resolved == ["rs-a"]
    assert len(report.published) == 1


def a_day_of(peak_mib: int) -> str:
    """The recommendation annotation after 24 hourly peaks of ``peak_mib`` on a T4."""
    samples = [PodSample("ns", "w", "uid-w", peak_mib, T4_MIB, NOW - 3600.0 * (h + 1))
               for h in range(24)]
    text, _ = update(None, {"*": samples}, NOW - 1.0, CONFIG)
    return text


def whole_cluster(history: str | None) -> tuple[Snapshot, Workloads]:
    """One T4 node holding pod w, one whole GPU of owner rs-w, using 2,048 MiB."""
    snap = snapshot([gpu_node("n0", gpus=1)], [(share("w", 1000), "n0", (0,))])
    snap.pods["ns/w"] = dataclasses.replace(
        snap.pods["ns/w"], uid="uid-w", owner_uid="rs-w", owner_kind="ReplicaSet",
        owner_name="rs-w")
    gpu = GpuUsage(index=0, uuid="GPU-0", product="T4", memory_used_mib=2048,
                   memory_total_mib=T4_MIB, utilization_pct=30,
                   pods=(PodGpuUsage("ns", "w", "uid-w", 2048),))
    snap.readings = {"n0": NodeGpuUsage("n0", NOW - 5, 15.0, (gpu,))}
    annotations = {cv.ANNOTATION_GPU_RECOMMENDATION: history} if history else {}
    return snap, Workloads({"rs-w": workload("w", "auto", **annotations)})


def test_a_whole_gpu_pod_is_planned_as_a_share_once_its_workload_has_a_days_history() -> None:
    snap, api = whole_cluster(a_day_of(2048))
    report = run(snap, api)
    rec = parse(api.patches[0][2])["*"]
    assert rec.whole_gpu and rec.intervals == 24
    assert report.rightsized == {"ns/w": rec.milli}  # 2,048 MiB + 15 % + 256 MiB of 16 GiB
    assert rec.milli == 160
    # Its first reading only: it stays whole.
    fresh, api = whole_cluster(None)
    assert run(fresh, api).rightsized == {}


def test_a_share_pod_over_its_share_raises_its_workload_and_says_so() -> None:
    # pod a holds 700 milli of a T4 (11,468 MiB) and uses 12,000: over its share.
    snap = cluster({"a": "rs-a"}, used_mib=12_000)
    api = Workloads({"rs-a": workload("a", "auto")})
    report = run(snap, api)
    rec = parse(api.patches[0][2])["v1"]
    assert rec.raised_mib == 14_400 and rec.held(NOW)  # 12,000 x 1.2
    assert report.raised == [("Deployment/ns/dep-a", "v1", 12_000, 14_400)]
    assert report.rightsized == {}  # held: its replacement is admitted as asked
    ((text, reason, message),) = api.events
    assert (text, reason) == ("Deployment/ns/dep-a", "GPUShareRaised")
    assert "12000 MiB" in message and "14400 MiB" in message
    # A dry run computes the same and tells no one.
    dry = Workloads({"rs-a": workload("a", "auto")})
    assert run(snap, dry, dry_run=True).raised == report.raised and dry.events == []


def test_a_right_sized_pod_that_ran_out_of_memory_raises_by_its_share() -> None:
    snap = cluster({"a": "rs-a"}, used_mib=2048)
    snap.pods["ns/a"] = dataclasses.replace(snap.pods["ns/a"], out_of_memory=True)
    api = Workloads({"rs-a": workload("a", "auto")})
    report = run(snap, api)
    share = T4_MIB * 700 // 1000
    assert report.raised == [("Deployment/ns/dep-a", "v1", share, math.ceil(share * 1.2))]


def test_overruns_outside_auto_mode_raise_nothing() -> None:
    snap = cluster({"a": "rs-a"}, used_mib=12_000)
    api = Workloads({"rs-a": workload("a", "recommend")})
    assert run(snap, api).raised == [] and api.events == []


def test_an_overrun_is_judged_against_the_share_the_agent_holds_the_pod_to() -> None:
    # A memory share (8,000 MiB asked, no milli) within what it asked: no overrun; past it, an
    # overrun of what it used. A whole GPU has nothing to overrun.
    def info(request: PodRequest) -> PodInfo:
        return PodInfo(key="ns/p", request=request, uid="u")

    def used(mib: int) -> PodSample:
        return PodSample("ns", "p", "u", mib, T4_MIB, NOW)

    memory = PodRequest("p", namespace="ns", num_gpu=1, gpu_memory_mib=8000)
    assert overrun_mib(info(memory), used(6000)) == 0
    assert overrun_mib(info(memory), used(9000)) == 9000
    assert overrun_mib(info(share("p", 1000)), used(T4_MIB)) == 0


def test_out_of_bounds_lists_only_old_pods_far_above_their_admitted_share() -> None:
    snap = snapshot([gpu_node("n0", gpus=4)],
                    [(share(name, 600), "n0", (g,)) for g, name in enumerate("abcd")])
    day = 86400.0
    started = {"ns/a": NOW - 3 * day, "ns/b": NOW - 3 * day, "ns/c": NOW - 3600.0,
               "ns/d": None}
    snap.pods = {k: dataclasses.replace(p, started_s=started[k]) for k, p in snap.pods.items()}
    # a holds 2x its admitted share, b only 1.2x; c is as far out but restarted an hour ago;
    # d's start is not known (it may be about to roll out).
    snap.rightsized = {"ns/a": 300, "ns/b": 500, "ns/c": 300, "ns/d": 300}
    config = DefragConfig(rightsize_evict_ratio=1.5, rightsize_min_age_s=2 * day)
    assert out_of_bounds(snap, NOW, config) == {"ns/a"}
    assert out_of_bounds(snap, NOW, dataclasses.replace(config, rightsize_min_age_s=0.0)) == {
        "ns/a", "ns/c"}
