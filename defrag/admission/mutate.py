"""What the webhook does to one pod: pure (the pod, its workload's annotations -> a decision).

For a pod of a workload in ``auto`` mode with a recommendation, the container that asks for a
GPU share (``names.gpu_milli``, below one whole GPU) gets the share

    new = min(asked, max(recommendation.milli, milli(peak)))

— never above what the user asked, never below the largest use observed in the window. A
container that asks exactly one whole GPU (``names.gpu: 1``) becomes that share of one GPU only
when the recommendation allows it (``whole_gpu``: enough history; see
:func:`defrag.rightsizing.recommender.replacement_milli`): its ``names.gpu`` is replaced by
``names.gpu_milli`` in its requests and limits. Multi-GPU pods stay whole. Either way the pod
is annotated (``names.annotation_rightsizing_change``) with what changed, what it replaced and
why; the workload's template is never touched, so switching the mode off admits the next pods
exactly as the template asks. Everything else is a *skip*: the pod is admitted unchanged, the
reason is counted (a metric label) and, for bad input, returned as an admission warning so
``kubectl`` shows it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from defrag.rightsizing.recommender import (
    MILLI_PER_GPU,
    Mode,
    Recommendation,
    lookup,
    milli_for,
    parse,
    parse_mode,
    replacement_milli,
)
from defrag.rightsizing.workloads import Workload
from gpufrag.conventions import KubeNames
from gpufrag.errors import BadInput
from scheduler.kube.convert import uncarried
from scheduler.kube.quantity import QuantityError, parse_quantity

# Skip reasons (the ``reason`` label of gpufrag_admission_skips_total).
SKIP_REASONS = (
    "not_a_pod_create", "bare_pod", "no_gpu_share", "several_gpu_containers", "owner_unknown",
    "lookup_failed", "mode_off", "mode_recommend", "bad_mode", "no_recommendation",
    "bad_recommendation", "bad_request", "at_or_below_recommendation", "internal_error",
    "multi_gpu", "whole_gpu_kept", "oom_cooloff",
)
# Skips that mean the input is wrong: the reason goes back as an admission warning.
WARN_REASONS = frozenset({"bad_mode", "bad_recommendation", "bad_request", "lookup_failed",
                          "internal_error"})


@dataclass(frozen=True, slots=True)
class Decision:
    """A JSON patch (empty = unchanged) or the reason the pod was left alone."""

    patch: list[dict[str, Any]] = field(default_factory=list)
    skip: str | None = None
    message: str = ""
    change: Mapping[str, Any] | None = None
    carriers: int = 0  # GPU-memory asks given their carrier (carrier_patch), whatever the rest

    @property
    def warnings(self) -> list[str]:
        if self.skip in WARN_REASONS:
            return [f"gpufrag right-sizing left this pod unchanged: {self.message}"]
        return []


def skip(reason: str, message: str) -> Decision:
    assert reason in SKIP_REASONS, reason
    return Decision(skip=reason, message=message)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True, slots=True)
class Target:
    """The one container right-sizing may change: its index, the milli it asks (per GPU), and
    whether that is one whole GPU (``names.gpu: 1``) rather than a share."""

    index: int
    asked_milli: int
    whole: bool = False


def _asked(resources: Mapping[str, Any], resource: str) -> Any:
    return ((resources.get("limits") or {}).get(resource)
            or (resources.get("requests") or {}).get(resource))


def gpu_target(pod: Mapping[str, Any], names: KubeNames) -> Target | Decision:
    """The one container asking for a share, or for exactly one whole GPU; else a skip."""
    found: list[Target] = []
    for i, container in enumerate((pod.get("spec") or {}).get("containers") or []):
        resources = container.get("resources") or {}
        share, whole = _asked(resources, names.gpu_milli), _asked(resources, names.gpu)
        if share is None and whole is None:
            continue
        resource, value = (names.gpu_milli, share) if share is not None else (names.gpu, whole)
        try:
            amount = math.ceil(parse_quantity(value))
        except QuantityError as e:
            return skip("bad_request", f"container {container.get('name')!r}: {resource}: {e}")
        if share is not None and 0 < amount < MILLI_PER_GPU:
            found.append(Target(i, amount))
        elif share is None and amount == 1:
            found.append(Target(i, MILLI_PER_GPU, whole=True))
        elif share is None and amount > 1:
            return skip("multi_gpu", f"container {container.get('name')!r} asks {amount} "
                                     f"{names.gpu}: multi-GPU pods stay whole")
    if not found:
        return skip("no_gpu_share", f"no container asks for a {names.gpu_milli} share below "
                                    f"{MILLI_PER_GPU} or for one {names.gpu}")
    if len(found) > 1:
        return skip("several_gpu_containers", "more than one container asks for a GPU; "
                                              "right-sizing sets one container's share")
    return found[0]


def _new_share(target: Target, rec: Recommendation, workload: Workload,
               now: float) -> int | Decision:
    new = replacement_milli(rec, 1, target.asked_milli, now)
    if new is None:
        why = ("the recommendation or the peak fills the GPU" if rec.whole_gpu else
               f"{rec.intervals} hourly peak(s) of history, too few to share a whole GPU")
        return skip("whole_gpu_kept", f"{workload.text} keeps whole GPUs: {why}")
    if new >= target.asked_milli:
        return skip("at_or_below_recommendation",
                    f"asks {target.asked_milli} milli, recommendation {rec.milli} "
                    f"(peak {milli_for(rec.peak_mib, rec.gpu_memory_mib)})")
    return new


def _patch(container: Mapping[str, Any], target: Target, new: int,
           names: KubeNames) -> list[dict[str, Any]]:
    resources = container.get("resources") or {}
    patch: list[dict[str, Any]] = []
    base = f"/spec/containers/{target.index}/resources"
    for part in ("requests", "limits"):
        if target.whole and names.gpu in (resources.get(part) or {}):
            patch.append({"op": "remove", "path": f"{base}/{part}/{_escape(names.gpu)}"})
            patch.append({"op": "add", "path": f"{base}/{part}/{_escape(names.gpu_milli)}",
                          "value": str(new)})
        elif not target.whole and names.gpu_milli in (resources.get(part) or {}):
            patch.append({"op": "replace", "path": f"{base}/{part}/{_escape(names.gpu_milli)}",
                          "value": str(new)})
    return patch


def carrier_patch(pod: Mapping[str, Any], names: KubeNames
                  ) -> tuple[list[dict[str, Any]], int]:
    """``names.gpu_milli: 1`` beside every GPU-memory ask that comes alone, for any pod: the
    patch, and how many containers it carries.

    The kubelet hands a container a GPU only through a resource a device plugin advertises,
    and none advertises GPU memory (:func:`scheduler.kube.convert.uncarried`; the extender
    refuses such a pod, naming this fix). One milli is the carrier: placement counts the share
    at its memory's part of the GPU whatever the milli, and the device plugin hands the
    container the memory it asked as its limit."""
    patch: list[dict[str, Any]] = []
    try:
        found = uncarried(pod, names)
    except BadInput:  # the extender names what is wrong with the pod; nothing to add here
        return [], 0
    for key, i, _ in found:
        resources = pod["spec"][key][i].get("resources") or {}
        for part in ("requests", "limits"):
            if names.gpu_memory in (resources.get(part) or {}):
                patch.append({"op": "add", "path": f"/spec/{key}/{i}/resources/{part}/"
                              f"{_escape(names.gpu_milli)}", "value": "1"})
    return patch, len(found)


def decide(pod: Mapping[str, Any], workload: Workload, names: KubeNames,
           now: float) -> Decision:
    """The decision for a pod of ``workload`` (whose annotations carry mode and recommendation)
    at ``now`` (unix seconds: the guard's cool-off is judged against it)."""
    target = gpu_target(pod, names)
    if isinstance(target, Decision):
        return target
    try:
        mode = parse_mode(workload.annotations.get(names.annotation_rightsizing_mode))
    except BadInput as e:
        return skip("bad_mode", f"{workload.text}: annotation "
                                f"{names.annotation_rightsizing_mode}: {str(e).split(': ', 1)[-1]}")
    if mode is Mode.OFF:
        return skip("mode_off", f"{workload.text} is in mode off")
    if mode is Mode.RECOMMEND:
        return skip("mode_recommend", f"{workload.text} is in mode recommend")
    text = workload.annotations.get(names.annotation_gpu_recommendation)
    if not text:
        return skip("no_recommendation", f"{workload.text} has no recommendation yet")
    try:
        recs = parse(text, source=f"{workload.text} annotation "
                                  f"{names.annotation_gpu_recommendation}")
    except BadInput as e:
        return skip("bad_recommendation", str(e))
    labels = (pod.get("metadata") or {}).get("labels") or {}
    version = labels.get(names.label_model_version)
    rec = lookup(recs, version)
    if rec is None:
        return skip("no_recommendation", f"{workload.text} has no recommendation for model "
                                         f"version {version or '(none)'}")
    if rec.held(now):
        return skip("oom_cooloff", f"{workload.text} ran past its share; admitted as asked "
                                   f"until {rec.hold_until:.0f} (the guard's cool-off)")
    new = _new_share(target, rec, workload, now)
    if isinstance(new, Decision):
        return new
    container = pod["spec"]["containers"][target.index]
    patch = _patch(container, target, new, names)
    change = {"container": container.get("name"), "resource": names.gpu_milli,
              "from": target.asked_milli, "to": new,
              "replaced": {names.gpu: "1"} if target.whole else None,
              "memory_mib": rec.memory_mib, "workload": workload.text,
              "model_version": version or None, "recommendation_milli": rec.milli,
              "peak_milli": milli_for(rec.peak_mib, rec.gpu_memory_mib),
              "computed_at": rec.computed_at, "why": rec.why()}
    annotations = (pod.get("metadata") or {}).get("annotations")
    value = orjson.dumps(change).decode()
    if annotations is None:
        patch.append({"op": "add", "path": "/metadata/annotations",
                      "value": {names.annotation_rightsizing_change: value}})
    else:
        patch.append({"op": "add", "path": "/metadata/annotations/"
                      f"{_escape(names.annotation_rightsizing_change)}", "value": value})
    message = (f"{names.gpu} 1 -> {names.gpu_milli} {new}" if target.whole
               else f"{names.gpu_milli} {target.asked_milli} -> {new}")
    return Decision(patch=patch, change=change, message=message)
