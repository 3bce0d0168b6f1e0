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
:func:`~defrag.rightsizing.recommender.replacement_milli` (a pod asking one whole GPU too,
once the history allows it), so the
planner is told that share (``Snapshot.rightsized``) and can plan the move that gives the
difference back. A workload whose
lookup or patch fails is reported and left alone: publishing is advice and never stops a cycle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from defrag.controller.config import DefragConfig
from defrag.controller.model import PodInfo, Snapshot
from defrag.rightsizing.recommender import (
    Mode,
    PodSample,
    Recommendation,
    RightsizingConfig,
    lookup,
    parse_mode,
    pod_samples,
    replacement_milli,
    update,
    version_key,
)
from defrag.rightsizing.workloads import Workload
from gpufrag.conventions import KubeNames
from gpufrag.errors import BadInput
from scheduler.kube.convert import share_memory_mib


class Workloads(Protocol):
    """Pods' controllers through the API (``defrag.rightsizing.workloads.WorkloadClient``)."""

    def resolve(self, namespace: str, owner_references: Any) -> Workload | None: ...

    def patch_annotation(self, workload: Workload, key: str, value: str) -> None: ...

    def event(self, workload: Workload, reason: str, message: str) -> None: ...


# The Warning Event on a workload whose share the guard raised.
EVENT_REASON_RAISED = "GPUShareRaised"


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
    # Pod key -> (workload, may right-sizing change it): every sampled pod (Snapshot.sizable).
    sizable: dict[str, tuple[str, bool]] = field(default_factory=dict)
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> pods
    problems: list[str] = field(default_factory=list)
    # The guard's raises: (workload, model version, MiB used past the share, new floor MiB).
    raised: list[tuple[str, str, int, int]] = field(default_factory=list)


def _owner_refs(info: PodInfo) -> list[dict[str, Any]]:
    return [{"kind": info.owner_kind, "name": info.owner_name, "uid": info.owner_uid,
             "controller": True}]


def publish(snapshot: Snapshot, workloads: Workloads, config: RightsizingConfig,
            names: KubeNames, now: float, *, dry_run: bool) -> RightsizingReport:
    """Update every sampled workload's recommendation; say which replicas shrink if moved."""
    report = RightsizingReport()
    by_uid = {info.uid: info for info in snapshot.pods.values() if info.uid}
    resolved: dict[tuple[str, str], Workload | None] = {}
    groups: dict[str, _Group] = {}
    for reading in snapshot.readings.values():
        for sample in pod_samples(reading):
            info = by_uid.get(sample.uid)
            if info is None:
                report.skipped["not a running pod the cycle read"] += 1
                continue
            report.sizable[info.key] = (f"{info.owner_kind or 'bare pod'}/{info.namespace}/"
                                        f"{info.owner_name or info.name}", False)
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
            group = groups.setdefault(workload.uid, _Group(workload))
            group.samples.setdefault(version, []).append(sample)
            group.infos.append(info)
            over = overrun_mib(info, sample)
            if over:
                group.overruns[version] = max(group.overruns.get(version, 0), over)
    for group in sorted(groups.values(), key=lambda g: g.workload.text):
        workload, samples, infos = group.workload, group.samples, group.infos
        try:
            mode = parse_mode(workload.annotations.get(names.annotation_rightsizing_mode))
        except BadInput as e:
            report.problems.append(f"{workload.text}: {e}")
            report.skipped["bad mode annotation"] += len(infos)
            for info in infos:
                report.sizable[info.key] = (f"{workload.text} (bad mode)", False)
            continue
        for info in infos:
            multi = ", multi-GPU" if info.request.num_gpu > 1 else ""
            report.sizable[info.key] = (f"{workload.text} (mode {mode.value}{multi})",
                                        mode is Mode.AUTO and info.request.num_gpu == 1)
        if mode is Mode.OFF:
            report.skipped["mode off"] += len(infos)
            continue
        old = workload.annotations.get(names.annotation_gpu_recommendation)
        overruns = group.overruns if mode is Mode.AUTO else {}
        text, recs = update(old, samples, now, config, overruns)
        written = text != old
        if written and not dry_run:
            try:
                workloads.patch_annotation(workload, names.annotation_gpu_recommendation, text)
            except Exception as e:  # advice: a failed write skips this workload only
                report.problems.append(f"{workload.text}: writing "
                                       f"{names.annotation_gpu_recommendation} failed: {e}")
                continue
        report.published.append(Published(workload, mode, recs, written))
        for version, used in sorted(overruns.items()):
            _raise(report, workloads, workload, version, used, recs.get(version),
                   dry_run=dry_run)
        if mode is not Mode.AUTO:
            continue
        for info in infos:
            rec = lookup(recs, info.labels.get(names.label_model_version))
            milli = None if rec is None else replacement_milli(rec, info.request.num_gpu,
                                                               info.request.gpu_milli, now)
            if milli is not None and milli < info.request.gpu_milli:
                report.rightsized[info.key] = milli
    return report


@dataclass
class _Group:
    """One workload's pods this cycle: samples and overruns per model version."""

    workload: Workload
    samples: dict[str, list[PodSample]] = field(default_factory=dict)
    infos: list[PodInfo] = field(default_factory=list)
    overruns: dict[str, int] = field(default_factory=dict)


def overrun_mib(info: PodInfo, sample: PodSample) -> int:
    """What a share pod used past its share in this reading (its use; its share itself when a
    container of the right-sized pod ran out of memory), or 0 when within it. The share is
    the one the agent's isolation check holds the pod to (memory asked, or milli of the GPU);
    whole and multi-GPU pods have nothing to overrun."""
    share = share_memory_mib(info.request, sample.gpu_memory_mib)
    if share is None:
        return 0
    if sample.memory_used_mib > share:
        return sample.memory_used_mib
    return share if info.out_of_memory else 0


def _raise(report: RightsizingReport, workloads: Workloads, workload: Workload, version: str,
           used_mib: int, rec: Recommendation | None, *, dry_run: bool) -> None:
    """Report one raise, and (not in a dry run) tell the workload's owners with an Event."""
    floor = rec.raised_mib if rec is not None else 0
    message = (f"a replica (model version {version}) used {used_mib} MiB of GPU memory past "
               f"its share; recommendation raised to at least {floor} MiB, new pods admitted "
               "as their template asks until the cool-off ends")
    report.raised.append((workload.text, version, used_mib, floor))
    if dry_run:
        return
    try:
        workloads.event(workload, EVENT_REASON_RAISED, message)
    except Exception as e:  # advice, like the annotation: never stops the cycle
        report.problems.append(f"{workload.text}: recording the {EVENT_REASON_RAISED} Event "
                               f"failed: {e}")


def out_of_bounds(snapshot: Snapshot, now: float, config: DefragConfig) -> frozenset[str]:
    """The right-sized pods whose right-sizing alone pays an eviction: VPA's updater evicts only
    pods far outside their recommendation, and leaves the rest to be right-sized when they
    restart. Here: the share held is at least ``config.rightsize_evict_ratio`` times the share
    its replacement would be admitted with (``Snapshot.rightsized``), and the pod has run for
    ``config.rightsize_min_age_s`` or more (a pod whose start is not known is not evicted for
    its size: it may be about to roll out)."""
    out = set()
    for key, milli in snapshot.rightsized.items():
        info = snapshot.pods.get(key)
        placement = snapshot.state.pods.get(key)
        if info is None or placement is None or milli <= 0 or info.started_s is None:
            continue
        if (placement.pod.gpu_milli >= config.rightsize_evict_ratio * milli
                and now - info.started_s >= config.rightsize_min_age_s):
            out.add(key)
    return frozenset(out)


__all__ = ["Published", "RightsizingReport", "Workloads", "out_of_bounds", "overrun_mib",
           "publish"]
