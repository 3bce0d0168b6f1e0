"""``gpufrag inspect --summary``: the fleet in a few lines, and what the waste loop did to it.

Pure: inspect's document (:func:`defrag.controller.inspect.view`), the pods as the defrag cycle
reads them, the pod objects and the defrag state -> :class:`FleetSummary`.

Where each figure comes from, and what the cluster does not record:

- GPUs used / reserved but idle / reserved with no reading / free, and free whole GPUs: the
  document's per-GPU figures (:mod:`defrag.fleet.split`) and its cluster summary.
- The idle ratio and the nodes over the trigger: the document's, i.e. the defrag cycle's own
  measure (``defrag.controller.measure``), never computed again here.
- GPU-hours given back: each running pod the right-sizing webhook admitted smaller carries
  what it asked and what it got (``names.annotation_rightsizing_change``); the share given
  back times the time since the pod started, summed. Pods that ended took their record with
  them, so this is a lower bound ("at least").
- Evictions: the defrag state on the hints ConfigMap keeps, per workload, the time of its last
  move for the cooldown; the count of those is a lower bound on the evictions since the oldest.
  The total is not kept in the cluster (it is the ``gpufrag_defrag_evictions_total`` metric
  each cycle pushes).
- Free whole GPUs gained: the cluster keeps no earlier figure to compare with, so it is said
  to be not recorded (each cycle's before and after is its ``free_whole_gpus{phase}`` metric;
  ``gpufrag whatif --defrag`` measures it against a baseline).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import numpy as np
import orjson

from defrag.controller.convergence import DefragState
from defrag.controller.model import PodInfo
from defrag.fleet.split import FREE, IDLE, PARTS, UNREAD, USED, fleet_split
from gpufrag.conventions import KubeNames
from gpufrag.waste_report import Figure, WasteOutcome
from scheduler.core.types import MILLI_PER_GPU
from scheduler.kube.convert import annotations_of

NOT_KEPT: Final = ("the cluster keeps no earlier figure to compare with; each defrag cycle's "
                   "before and after is its gpufrag_defrag_free_whole_gpus{phase} metric")
SHOWN_NODES: Final = 10  # nodes over the trigger named on the line; the rest counted


@dataclass(frozen=True, slots=True)
class Rightsized:
    """What the running right-sized pods give back now, and since they started."""

    pods: int
    gpus_given_back: float
    gpu_hours_given_back: float
    without_start: int  # right-sized pods with no start time: left out of the GPU-hours


@dataclass(frozen=True, slots=True)
class FleetSummary:
    cluster: str
    at: str  # ISO time the figures are judged at
    nodes: int
    gpus: int
    parts_gpus: tuple[float, float, float, float]  # used, idle, unread, free (PARTS order)
    free_whole_gpus: int
    idle_ratio: float
    threshold: float
    over: tuple[str, ...]  # nodes over the trigger
    no_reading: int  # nodes with no fresh agent reading
    pending_gpu_pods: int
    rightsized: Rightsized
    outcome: WasteOutcome

    def lines(self) -> list[str]:
        used, idle, unread, free = self.parts_gpus
        named = ", ".join(self.over[:SHOWN_NODES]) + (
            f" and {len(self.over) - SHOWN_NODES} more" if len(self.over) > SHOWN_NODES else "")
        lines = [
            f"cluster {self.cluster} at {self.at}: {self.nodes:,} node(s), {self.gpus:,} GPU(s)",
            f"GPUs:                   {used:,.1f} used, {idle:,.1f} reserved but idle, "
            + (f"{unread:,.1f} reserved with no reading, " if unread else "")
            + f"{free:,.1f} free ({self.free_whole_gpus:,} whole GPU(s) free)",
            f"idle ratio:             {self.idle_ratio:.1%} (reserved minus peak use over the "
            f"window, over reserved: the defrag trigger's; a node over {self.threshold:.0%} "
            "triggers)",
            f"nodes over the trigger: {len(self.over):,} of {self.nodes:,}"
            + (f" ({named})" if self.over else "")
            + (f"; {self.no_reading:,} with no reading" if self.no_reading else ""),
            f"pending GPU pods:       {self.pending_gpu_pods:,}",
            f"right-sized pods:       {self.rightsized.pods:,} running, "
            f"{self.rightsized.gpus_given_back:,.2f} GPU(s) given back now",
        ]
        return lines + self.outcome.lines()

    def as_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "at": self.at, "nodes": self.nodes, "gpus": self.gpus,
                "gpus_by_part": {p: round(v, 3) for p, v in zip(PARTS, self.parts_gpus,
                                                                 strict=True)},
                "free_whole_gpus": self.free_whole_gpus, "idle_ratio": self.idle_ratio,
                "threshold": self.threshold, "nodes_over_trigger": list(self.over),
                "nodes_without_reading": self.no_reading,
                "pending_gpu_pods": self.pending_gpu_pods,
                "rightsized": {"pods": self.rightsized.pods,
                               "gpus_given_back": round(self.rightsized.gpus_given_back, 3),
                               "gpu_hours_given_back":
                                   round(self.rightsized.gpu_hours_given_back, 3),
                               "pods_without_start_time": self.rightsized.without_start},
                **self.outcome.as_dict()}


def iso(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _given_back_milli(text: str | None) -> int:
    """The share (milli per GPU) a right-sizing change annotation says was given back; 0 for
    none or one that cannot be read (it is the webhook's record, not ours to repair)."""
    if not text:
        return 0
    try:
        change = orjson.loads(text)
    except orjson.JSONDecodeError:
        return 0
    if not isinstance(change, dict):
        return 0
    asked, got = change.get("from"), change.get("to")
    if (not isinstance(asked, int) or not isinstance(got, int) or isinstance(asked, bool)
            or isinstance(got, bool)):
        return 0
    return max(asked - got, 0)


def rightsized(pod_objects: Sequence[Mapping[str, Any]], pods: Mapping[str, PodInfo],
               now: float, names: KubeNames, *, nodes: Collection[str],
               namespace: str | None = None) -> Rightsized:
    """The running pods on ``nodes`` (of ``namespace``, when given) admitted smaller by the
    webhook: GPUs given back now and GPU-hours given back since each started."""
    count, gpus, hours, without = 0, 0.0, 0.0, 0
    for obj in pod_objects:
        milli = _given_back_milli(annotations_of(obj).get(names.annotation_rightsizing_change))
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
        info = pods.get(key)
        if (not milli or info is None or info.node not in nodes or not info.running
                or (namespace is not None and info.namespace != namespace)):
            continue
        given = milli * max(info.request.num_gpu, 1) / MILLI_PER_GPU
        count += 1
        gpus += given
        if info.started_s is None or not math.isfinite(info.started_s):
            without += 1
            continue
        hours += given * max(now - info.started_s, 0.0) / 3600.0
    return Rightsized(count, gpus, hours, without)


def evictions(state: DefragState | None, why_not: str, now: float) -> Figure:
    """A lower bound on the defrag controller's evictions, from its state's cooldown record."""
    if state is None:
        return Figure.unknown(why_not)
    if not state.moved:
        return Figure(0, "no workload moved within the cooldown the defrag state keeps; the "
                         "total is the gpufrag_defrag_evictions_total metric", at_least=True)
    oldest = min(state.moved.values())
    return Figure(len(state.moved),
                  f"workloads moved since {iso(oldest)}, "
                  f"{max(now - oldest, 0.0) / 3600:.1f} h ago, as the defrag state keeps them "
                  "for the cooldown; the total is the gpufrag_defrag_evictions_total metric",
                  at_least=True)


def summarize(doc: Mapping[str, Any], *, cluster: str, now: float,
              pod_objects: Sequence[Mapping[str, Any]], pods: Mapping[str, PodInfo],
              state: DefragState | None, state_note: str, names: KubeNames,
              namespace: str | None = None) -> FleetSummary:
    """The summary of inspect's document ``doc`` judged at ``now`` (unix seconds): of the
    nodes it shows, and of ``namespace``'s pods when it was filtered so."""
    nodes: Sequence[Mapping[str, Any]] = doc["nodes"]
    splits = fleet_split(nodes)
    parts = (np.sum([s.sum(axis=0) for s in splits], axis=0) if splits
             else np.zeros(len(PARTS)))
    sized = rightsized(pod_objects, pods, now, names, nodes={n["node"] for n in nodes},
                       namespace=namespace)
    hours = Figure(sized.gpu_hours_given_back,
                   f"by the {sized.pods:,} right-sized pod(s) running now, since each started; "
                   "pods that ended are not recorded"
                   + (f"; {sized.without_start} with no start time left out"
                      if sized.without_start else ""),
                   at_least=True)
    return FleetSummary(
        cluster=cluster, at=iso(now), nodes=len(nodes), gpus=sum(len(s) for s in splits),
        parts_gpus=(float(parts[USED]), float(parts[IDLE]), float(parts[UNREAD]),
                    float(parts[FREE])),
        free_whole_gpus=int(doc["cluster"]["free_whole_gpus"]),
        idle_ratio=float(doc["cluster"]["idle_ratio"]), threshold=float(doc["threshold"]),
        over=tuple(n["node"] for n in nodes if n["trigger"] == "over"),
        no_reading=sum(1 for n in nodes if n["trigger"] == "no reading"),
        pending_gpu_pods=len(doc["pending_gpu_pods"]), rightsized=sized,
        outcome=WasteOutcome(gpu_hours_given_back=hours,
                             free_whole_gpus_gained=Figure.unknown(NOT_KEPT),
                             evictions=evictions(state, state_note, now)))
