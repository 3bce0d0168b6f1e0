"""What the webhook does to one pod: pure (the pod, its workload's annotations -> a decision).

For a pod of a workload in ``auto`` mode with a recommendation, the container that asks for a
GPU share (``names.gpu_milli``, below one whole GPU) gets the share

    new = min(asked, max(recommendation.milli, milli(peak)))

— never above what the user asked, never below the largest use observed in the window. Its
requests and limits (where present) are rewritten, and the pod is annotated
(``names.annotation_rightsizing_change``) with what changed and why. Everything else is a
*skip*: the pod is admitted unchanged, the reason is counted (a metric label) and, for bad
input, returned as an admission warning so ``kubectl`` shows it.
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
    admitted_milli,
    lookup,
    milli_for,
    parse,
    parse_mode,
)
from defrag.rightsizing.workloads import Workload
from gpufrag.conventions import KubeNames
from gpufrag.errors import BadInput
from scheduler.kube.quantity import QuantityError, parse_quantity

# Skip reasons (the ``reason`` label of gpufrag_admission_skips_total).
SKIP_REASONS = (
    "not_a_pod_create", "bare_pod", "no_gpu_share", "several_gpu_containers", "owner_unknown",
    "lookup_failed", "mode_off", "mode_recommend", "bad_mode", "no_recommendation",
    "bad_recommendation", "bad_request", "at_or_below_recommendation", "internal_error",
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


def gpu_share_container(pod: Mapping[str, Any], names: KubeNames
                        ) -> tuple[int, int] | Decision:
    """(container index, milli asked) of the one container asking for a share, or a skip."""
    found: list[tuple[int, int]] = []
    for i, container in enumerate((pod.get("spec") or {}).get("containers") or []):
        resources = container.get("resources") or {}
        value = ((resources.get("limits") or {}).get(names.gpu_milli)
                 or (resources.get("requests") or {}).get(names.gpu_milli))
        if value is None:
            continue
        try:
            milli = math.ceil(parse_quantity(value))
        except QuantityError as e:
            return skip("bad_request", f"container {container.get('name')!r}: "
                                       f"{names.gpu_milli}: {e}")
        if 0 < milli < MILLI_PER_GPU:
            found.append((i, milli))
    if not found:
        return skip("no_gpu_share", f"no container asks for a {names.gpu_milli} share below "
                                    f"{MILLI_PER_GPU}")
    if len(found) > 1:
        return skip("several_gpu_containers", "more than one container asks for a GPU share; "
                                              "right-sizing sets one container's share")
    return found[0]


def decide(pod: Mapping[str, Any], workload: Workload, names: KubeNames) -> Decision:
    """The decision for a pod of ``workload`` (whose annotations carry mode and recommendation)."""
    target = gpu_share_container(pod, names)
    if isinstance(target, Decision):
        return target
    index, asked = target
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
    floor_milli = milli_for(rec.peak_mib, rec.gpu_memory_mib)
    new = admitted_milli(rec, asked)
    if new >= asked:
        return skip("at_or_below_recommendation",
                    f"asks {asked} milli, recommendation {rec.milli} (peak {floor_milli})")
    container = pod["spec"]["containers"][index]
    resources = container.get("resources") or {}
    patch: list[dict[str, Any]] = []
    for part in ("requests", "limits"):
        if names.gpu_milli in (resources.get(part) or {}):
            patch.append({"op": "replace", "path": f"/spec/containers/{index}/resources/{part}/"
                          f"{_escape(names.gpu_milli)}", "value": str(new)})
    change = {"container": container.get("name"), "resource": names.gpu_milli,
              "from": asked, "to": new, "workload": workload.text,
              "model_version": version or None, "recommendation_milli": rec.milli,
              "peak_milli": floor_milli, "computed_at": rec.computed_at, "why": rec.why()}
    annotations = (pod.get("metadata") or {}).get("annotations")
    value = orjson.dumps(change).decode()
    if annotations is None:
        patch.append({"op": "add", "path": "/metadata/annotations",
                      "value": {names.annotation_rightsizing_change: value}})
    else:
        patch.append({"op": "add", "path": "/metadata/annotations/"
                      f"{_escape(names.annotation_rightsizing_change)}", "value": value})
    return Decision(patch=patch, change=change,
                    message=f"{names.gpu_milli} {asked} -> {new}")
