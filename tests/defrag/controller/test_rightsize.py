"""Right-sizing in the cycle: readings -> recommendations published per workload, modes, the
right-sized shares handed to the planner, dry run, failures reported (the real API: e2e)."""

from __future__ import annotations

import dataclasses
from typing import Any

from defrag.controller.model import Snapshot
from defrag.controller.rightsize import publish
from defrag.rightsizing.recommender import RightsizingConfig, parse
from defrag.rightsizing.workloads import Workload
from gpufrag import conventions as cv
from node.agent.usage import GpuUsage, NodeGpuUsage, PodGpuUsage
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
