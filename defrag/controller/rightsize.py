"""Right-sizing, once per cycle: the agent's per-pod readings -> recommendations published on the
workloads' controllers, and the right-sized share of each replica the planner may move.

Each cycle (a CronJob run) folds the pods' samples in this cycle's fresh agent readings
(``Snapshot.readings``) into the history kept in the workload's own annotation
(``names.annotation_gpu_recommendation``, format in :mod:`defrag.rightsizing.recommender`), so
the history survives between runs with no store of its own, and writes the annotation back when
it changed (a merge patch of that one key; never in a dry run). The webhook
(:mod:`defrag.admission`) reads the same annotation.

A workload whose mode (``names.annotation_rightsizing_mode``) is ``off`` keeps no recommendation;
one in ``auto`` has its pods' replacements admitted at
:func:`~defrag.rightsizing.recommender.admitted_milli`, so the planner is told that share
(``Snapshot.rightsized``) and can plan the move that gives the difference back. A workload whose
lookup or patch fails is reported and left alone: publishing is advice and never stops a cycle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from defrag.controller.model import PodInfo, Snapshot
from defrag.rightsizing.recommender import (
    Mode,
    PodSample,
    Recommendation,
    RightsizingConfig,
    admitted_milli,
    lookup,
    parse_mode,
    pod_samples,
    update,
    version_key,
)
from defrag.rightsizing.workloads import Workload
from gpufrag.conventions import KubeNames
from gpufrag.errors import BadInput


class Workloads(Protocol):
    """Pods' controllers through the API (``defrag.rightsizing.workloads.WorkloadClient``)."""

    def resolve(self, namespace: str, owner_references: Any) -> Workload | None: ...

    def patch_annotation(self, workload: Workload, key: str, value: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Published:
    workload: Workload
    mode: Mode
    recommendations: Mapping[str, Recommendation]  # model version ("*": none) -> it
    written: bool  # the annotation changed (and was written, unless a dry run)

    def as_dict(self) -> dict[str, Any]:
        return {"workload": self.workload.text, "mode": self.mode.value, "written": self.written,
                "recommendations": {
                    v: {"memory_mib": r.memory_mib, "milli": r.milli, "peak_mib": r.peak_mib,
                        "samples": r.samples, "intervals": r.intervals}
                    for v, r in sorted(self.recommendations.items())}}


@dataclass
class RightsizingReport:
    published: list[Published] = field(default_factory=list)
    rightsized: dict[str, int] = field(default_factory=dict)  # pod key -> admitted milli
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> pods
    problems: list[str] = field(default_factory=list)


def _owner_refs(info: PodInfo) -> list[dict[str, Any]]:
    return [{"kind": info.owner_kind, "name": info.owner_name, "uid": info.owner_uid,
             "controller": True}]


def publish(snapshot: Snapshot, workloads: Workloads, config: RightsizingConfig,
            names: KubeNames, now: float, *, dry_run: bool) -> RightsizingReport:
    """Update every sampled workload's recommendation; say which replicas shrink if moved."""
    report = RightsizingReport()
    by_uid = {info.uid: info for info in snapshot.pods.values() if info.uid}
    resolved: dict[tuple[str, str], Workload | None] = {}
    groups: dict[str, tuple[Workload, dict[str, list[PodSample]], list[PodInfo]]] = {}
    for reading in snapshot.readings.values():
        for sample in pod_samples(reading):
            info = by_uid.get(sample.uid)
            if info is None:
                report.skipped["not a running pod the cycle read"] += 1
                continue
            if not info.owner_uid:
                report.skipped["bare pod"] += 1
                continue
            where = (info.namespace, info.owner_uid)
            if where not in resolved:
                try:
                    resolved[where] = workloads.resolve(info.namespace, _owner_refs(info))
                except Exception as e:  # the API's fault, not the cycle's: report, go on
                    report.problems.append(f"{info.key}: reading its controller "
                                           f"{info.owner_kind}/{info.owner_name} failed: {e}")
                    resolved[where] = None
            workload = resolved[where]
            if workload is None:
                report.skipped["no supported controller"] += 1
                continue
            version = version_key(info.labels.get(names.label_model_version))
            _, samples, infos = groups.setdefault(workload.uid, (workload, {}, []))
            samples.setdefault(version, []).append(sample)
            infos.append(info)
    for workload, samples, infos in sorted(groups.values(), key=lambda g: g[0].text):
        try:
            mode = parse_mode(workload.annotations.get(names.annotation_rightsizing_mode))
        except BadInput as e:
            report.problems.append(f"{workload.text}: {e}")
            report.skipped["bad mode annotation"] += len(infos)
            continue
        if mode is Mode.OFF:
            report.skipped["mode off"] += len(infos)
            continue
        old = workload.annotations.get(names.annotation_gpu_recommendation)
        text, recs = update(old, samples, now, config)
        written = text != old
        if written and not dry_run:
            try:
                workloads.patch_annotation(workload, names.annotation_gpu_recommendation, text)
            except Exception as e:  # advice: a failed write skips this workload only
                report.problems.append(f"{workload.text}: writing "
                                       f"{names.annotation_gpu_recommendation} failed: {e}")
                continue
        report.published.append(Published(workload, mode, recs, written))
        if mode is not Mode.AUTO:
            continue
        for info in infos:
            rec = lookup(recs, info.labels.get(names.label_model_version))
            asked = info.request.gpu_milli
            if rec is None or not info.request.is_share:
                continue
            milli = admitted_milli(rec, asked)
            if milli < asked:
                report.rightsized[info.key] = milli
    return report


__all__ = ["Published", "RightsizingReport", "Workloads", "publish"]
