"""``gpufrag inspect``: who holds each GPU, what it uses and what sits idle, node by node.

One read of the cluster (Nodes, Pods, ResourceClaims and ResourceSlices, GPUReservations; a
list each, paged) or
of a file that ``gpufrag export-snapshot`` wrote (it holds no ResourceClaims: a pod that gets
its GPUs through DRA claims holds none there), then the defrag cycle's own reading of it: the
placement state the extender would build (:func:`defrag.controller.snapshot.build_snapshot`,
with the reservations held as the extender holds them) and the cycle's measure (idle memory
as DESIGN.md defines it: reserved minus peak use over the window; FGD fragmentation against
the cluster's own workload). A pod that gets its GPUs through DRA claims is shown on the GPUs their
allocations name, read as the extender reads them (:mod:`scheduler.kube.claims`). Nothing is
written: it needs only ``get``/``list`` on nodes, pods and gpureservations, and ``list`` on
resourceclaims to show DRA pods' GPUs (docs/operations.md, "Inspect").

Per node: product, GPU memory, GPUs, the idle ratio and whether it is over the defrag trigger,
the node's FGD fragmentation (milli-GPU), cordoned. Per GPU: free milli, memory in use now and
at its peak (with a fresh agent reading), and each holder: a pod with its share and what it
asked (``whole``, ``milli``, ``memory``), or a reservation with its expiry. Per GPU in MIG mode
(``mig_gpus``): its instances and the pods holding each, from DRA claims' partitions and the
agent's fresh reading (:mod:`defrag.controller.miginuse`). Reservations that
hold capacity for nothing (expired, owner or node gone: :mod:`defrag.controller.ledger`) are
marked where they sit and listed at the end with why; the next ``gpufrag defrag`` cycle
releases the ones it made. GPU processes that belong to no live pod (the node agent's
``strays``: a pod deleted and its process left behind, or a process in no pod at all) are shown
under their GPU from a fresh agent reading and listed at the end the same way: their memory
counts as used and nothing gives it back until they exit. A pod the device plugin gave GPUs
its ``gpu-indices`` record does not name (:func:`defrag.controller.ledger.misallocated_pods`)
is marked ``MISALLOCATED (reason)`` under the GPUs the extender counts it on and listed at the
end. ``-o json|yaml`` print the same as data; ``-o wide`` adds each pod's own use and peak.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
import yaml

from defrag.controller.cluster import read_dra, read_nodes_and_pods, read_reservations
from defrag.controller.config import DefragConfig
from defrag.controller.ledger import (
    MisallocatedPod,
    StaleReservation,
    misallocated_pods,
    stale_reservations,
)
from defrag.controller.measure import measure
from defrag.controller.model import NodeMig, Snapshot
from defrag.controller.snapshot import UsageSource, build_snapshot, hold_reservations
from gpufrag.conventions import KubeNames, names_from_environ
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, BadInput, BadInputArgumentParser
from gpufrag.logs import configure
from scheduler.core.types import MILLI_PER_GPU, PodRequest
from scheduler.kube.client import api_client
from scheduler.kube.reservations import PLACEMENT_NAMESPACE, reservation_from_k8s
from scheduler.kube.snapshot import read_snapshot

PROG = "gpufrag inspect"
OUTPUTS = ("table", "wide", "json", "yaml")
DEFAULTS = DefragConfig()  # the cycle's own trigger and staleness defaults


@dataclass(frozen=True, slots=True)
class Source:
    """What was read: the objects, and the time the figures are judged at."""

    nodes: list[Mapping[str, Any]]
    pods: list[Mapping[str, Any]]
    reservations: list[Mapping[str, Any]]
    now: float
    note: str = ""
    claims: list[Mapping[str, Any]] = field(default_factory=list)  # ResourceClaims (DRA)
    slices: list[Mapping[str, Any]] = field(default_factory=list)  # the driver's slices (DRA)


def asked(pod: PodRequest) -> str:
    """What a pod asked for, in the words of its request."""
    if pod.gpu_memory_mib:
        return "memory"
    if pod.num_gpu and pod.gpu_milli >= MILLI_PER_GPU:
        return "whole"
    return "milli"


def _iso(unix_s: float) -> str | None:
    if not math.isfinite(unix_s):
        return None
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _mib(value: float) -> int:
    return round(value)


def view(snapshot: Snapshot, reservations: Iterable[Mapping[str, Any]], *, node: str | None,
         namespace: str | None, threshold: float,
         stale: Sequence[StaleReservation] = (),
         misallocated: Sequence[MisallocatedPod] = ()) -> dict[str, Any]:
    """The inspection as data (what ``-o json`` prints). ``node``/``namespace`` filter; a node
    is listed under a namespace filter when it holds a pod of that namespace."""
    state, usage = snapshot.state, snapshot.usage
    measured = measure(state, usage, snapshot.target_workload(DEFAULTS.coverage))
    expiry: dict[str, float] = {}
    for obj in reservations:
        try:
            r = reservation_from_k8s(obj)
        except BadInput:
            continue  # build_snapshot's caller reports it
        expiry[r.key] = r.expires
    why_stale = {f"{PLACEMENT_NAMESPACE}/{s.name}": s.reason for s in stale}
    why_misallocated = {m.key: m.mismatch.reason for m in misallocated}
    nodes: list[dict[str, Any]] = []
    strays: list[dict[str, Any]] = []  # of the nodes shown, in node and GPU order
    for row, name in enumerate(state.names):
        if not state.active[row] or (node is not None and name != node):
            continue
        holders: dict[int, list[dict[str, Any]]] = {}
        seen_namespace = namespace is None
        for key in sorted(state.pods_on_node[row]):
            placed = state.pods[key]
            ns = placed.pod.namespace
            if namespace is not None and ns not in (namespace, PLACEMENT_NAMESPACE):
                continue
            seen_namespace = seen_namespace or ns == namespace
            memory = int(state.gpu_memory_mib[row])
            milli = placed.pod.milli_on(memory) or placed.pod.gpu_milli
            entry: dict[str, Any]
            if ns == PLACEMENT_NAMESPACE:
                entry = {"reservation": placed.pod.name, "milli": milli,
                         "expires": _iso(expiry.get(key, math.inf))}
                if key in why_stale:
                    entry["stale"] = why_stale[key]
            else:
                entry = {"pod": key, "milli": milli, "asked": asked(placed.pod),
                         "used_mib": _round_or_none(usage.pod_used_mib.get(key)),
                         "peak_mib": _round_or_none(usage.pod_peak_mib.get(key))}
                if placed.pod.gpu_memory_mib:
                    entry["memory_mib"] = placed.pod.gpu_memory_mib
                if key in why_misallocated:
                    entry["misallocated"] = why_misallocated[key]
            for gpu in placed.gpus:
                holders.setdefault(gpu, []).append(entry)
        if not seen_namespace:
            continue
        ratio = float(measured.idle_ratio[row])
        known = not np.isnan(ratio)
        reading = snapshot.readings.get(name)
        read_gpus = {g.index: g for g in reading.gpus} if reading is not None else {}
        gpus = []
        for gpu in range(int(state.gpu_count[row])):
            fresh = bool(usage.known[row, gpu])
            read = read_gpus.get(gpu)
            found = read.strays if read is not None else ()
            gpus.append({"index": gpu, "free_milli": int(state.gpu_free[row, gpu]),
                         "used_mib": _mib(usage.used_mib[row, gpu]) if fresh else None,
                         "peak_mib": _mib(usage.peak_mib[row, gpu]) if fresh else None,
                         "holders": holders.get(gpu, []),
                         "strays": [{"pid": s.pid, "used_mib": s.memory_used_mib,
                                     "reason": s.reason} for s in found]})
            strays.extend(
                {"node": name, "gpu": gpu, "pid": s.pid, "used_mib": s.memory_used_mib,
                 "reason": s.reason,
                 "detail": s.message(gpu, read.uuid)}
                for s in found if read is not None)
        nodes.append({
            "node": name, "product": (state.products[int(state.product[row])]
                                          if state.product[row] >= 0 else ""),
            "gpu_memory_mib": int(state.gpu_memory_mib[row]), "gpus": gpus,
            "idle_ratio": round(ratio, 4) if known else None,
            "idle_mib": _mib(measured.idle_mib[row]),
            "trigger": ("no reading" if not known else "over" if ratio > threshold else "under"),
            "frag_milli": _mib(measured.frag_milli[row]),
            "cordoned": name in snapshot.cordoned,
            "mig_gpus": mig_gpus(snapshot.mig.get(name), namespace)})
    summary = measured.summary
    return {"nodes": nodes, "threshold": threshold,
            "pending_gpu_pods": sorted(p.key for p in snapshot.pending
                                       if namespace is None or p.request.namespace == namespace),
            "cluster": {"idle_ratio": round(summary.idle_ratio, 4),
                        "frag_ratio": round(summary.frag_ratio, 4),
                        "free_whole_gpus": summary.free_whole_gpus,
                        "nodes_with_usage": summary.nodes_with_usage},
            "stale_reservations": [
                {"reservation": s.name, "reason": s.reason, "detail": s.detail,
                 "node": s.node, "released_by_defrag": s.managed}
                for s in stale if (node is None or s.node == node)
                and (namespace is None or s.namespace == namespace)],
            "strays": strays,
            "misallocated_pods": [
                {"pod": m.key, "node": m.node, "reason": m.mismatch.reason,
                 "recorded": list(m.mismatch.recorded), "given": list(m.mismatch.given),
                 "detail": m.mismatch.message()}
                for m in misallocated if (node is None or m.node == node)
                and (namespace is None or m.namespace == namespace)]}


def mig_gpus(mig: NodeMig | None, namespace: str | None) -> list[dict[str, Any]]:
    """A node's GPUs in MIG mode, each with its instances and who holds them
    (:mod:`defrag.controller.miginuse`); under a namespace filter, only the instances a pod
    of that namespace holds. ``dynamic``: the DRA driver's partitions (instances made per
    claim, every other placement free)."""
    if mig is None:
        return []
    found = []
    for index, product in mig.gpus.items():
        instances = [
            {"profile": held.instance.profile, "start": held.instance.start,
             "pods": list(held.pods), "from": list(held.sources)}
            for held in mig.instances if held.instance.gpu == index
            and (namespace is None or any(p.startswith(f"{namespace}/") for p in held.pods))]
        found.append({"index": index, "product": product, "dynamic": mig.dynamic,
                      "instances": instances})
    return found


def _round_or_none(value: float | None) -> int | None:
    return None if value is None else _mib(value)


def _percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.1%}"


def _figure(mib: int | None) -> str:
    return "-" if mib is None else f"{mib:,} MiB"


def table(data: Mapping[str, Any], *, wide: bool) -> str:
    """The human form: a line per node, a line per GPU under it, a line per holder."""
    lines = [f"{'NODE':<24} {'PRODUCT':<22} {'GPUS':>4} {'IDLE':>7} {'TRIGGER':<10} "
             f"{'FRAG':>6}  NOTE"]
    for n in data["nodes"]:
        note = "cordoned" if n["cordoned"] else ""
        lines.append(f"{n['node']:<24} {n['product'] or '-':<22} {len(n['gpus']):>4} "
                     f"{_percent(n['idle_ratio']):>7} {n['trigger']:<10} "
                     f"{n['frag_milli'] / MILLI_PER_GPU:>6.2f}  {note}".rstrip())
        for g in n["gpus"]:
            lines.append(f"  gpu {g['index']}: free {g['free_milli']} milli, used "
                         f"{_figure(g['used_mib'])}, peak {_figure(g['peak_mib'])}")
            for h in g["holders"]:
                if "reservation" in h:
                    stale_mark = f", STALE ({h['stale']})" if "stale" in h else ""
                    lines.append(f"    reservation {h['reservation']}: {h['milli']} milli, "
                                 f"expires {h['expires'] or 'never'}{stale_mark}")
                    continue
                share = (f"{h['memory_mib']:,} MiB ({h['milli']} milli)" if "memory_mib" in h
                         else f"{h['milli']} milli")
                extra = (f", used {_figure(h['used_mib'])}, peak {_figure(h['peak_mib'])}"
                         if wide else "")
                wrong = (f", MISALLOCATED ({h['misallocated']})" if "misallocated" in h
                         else "")
                lines.append(f"    {h['pod']}: {share}, asked {h['asked']}{extra}{wrong}")
            for s in g["strays"]:
                lines.append(f"    process {s['pid']} (no live pod): {_figure(s['used_mib'])}, "
                             f"STRAY ({s['reason']})")
        for m in n["mig_gpus"]:
            kind = "DRA partitions, made per claim" if m["dynamic"] else "MIG"
            lines.append(f"  mig gpu {m['index']} ({kind}): {len(m['instances'])} instance(s)")
            for i in m["instances"]:
                lines.append(f"    {i['profile']} at slice {i['start']}: "
                             f"{', '.join(i['pods']) or 'free'}")
    for r in data["stale_reservations"]:
        lines.append(f"stale reservation {r['reservation']} ({r['reason']}): {r['detail']}")
    for s in data["strays"]:
        lines.append(f"stray process {s['pid']} on {s['node']} ({s['reason']}): {s['detail']}")
    for m in data["misallocated_pods"]:
        lines.append(f"misallocated pod {m['pod']} on {m['node']} ({m['reason']}): "
                     f"{m['detail']}")
    c = data["cluster"]
    lines.append(f"{len(data['nodes'])} node(s); cluster idle {c['idle_ratio']:.1%} "
                 f"(trigger over {data['threshold']:.0%}), fragmentation {c['frag_ratio']:.1%}, "
                 f"{c['free_whole_gpus']} whole GPU(s) free, "
                 f"{len(data['pending_gpu_pods'])} GPU pod(s) pending")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """inspect's flags (their one home; ``--summary`` and ``--plot`` add theirs to it)."""
    p = BadInputArgumentParser(prog=PROG, description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else "
                                            "$KUBECONFIG or ~/.kube/config)")
    where.add_argument("--snapshot", help="a file gpufrag export-snapshot wrote, instead of a "
                                          "live cluster (its agent readings are judged at the "
                                          "newest reading's time)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    p.add_argument("--node", help="only this node")
    p.add_argument("--namespace", help="only pods of this namespace, and the nodes holding them")
    p.add_argument("-o", "--output", choices=OUTPUTS, default="table")
    p.add_argument("--threshold", type=float, default=DEFAULTS.threshold,
                   help=f"the idle ratio the defrag trigger reads as over (default: "
                        f"{DEFAULTS.threshold:g})")
    p.add_argument("--orphan-grace-s", type=float, default=DEFAULTS.orphan_grace_s,
                   help="a reservation whose owner has no pod this long after it was made is "
                        f"stale (default: {DEFAULTS.orphan_grace_s:g}, as gpufrag defrag)")
    return p


def _newest_reading(nodes: Sequence[Mapping[str, Any]], names: KubeNames) -> float:
    newest = 0.0
    for obj in nodes:
        text = ((obj.get("metadata") or {}).get("annotations") or {}).get(
            names.annotation_gpu_usage)
        if not text:
            continue
        try:
            stamp = orjson.loads(text).get("timestamp")
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if isinstance(stamp, int | float):
            newest = max(newest, float(stamp))
    return newest


def read_source(args: argparse.Namespace, names: KubeNames) -> Source:
    """The objects to inspect, from the snapshot file or the live cluster."""
    if args.snapshot:
        snap = read_snapshot(args.snapshot)
        newest = _newest_reading(snap.nodes, names)
        note = ("" if newest else
                "the snapshot holds no agent reading: memory use is unknown")
        return Source(snap.nodes, snap.pods, [], newest or time.time(), note)
    client = api_client(args.kubeconfig, args.context)
    nodes, pods = read_nodes_and_pods(client)
    dra = read_dra(client)
    held = read_reservations(client, names.hints_namespace)
    notes = [dra.note] if dra.note else []
    if held is None:
        notes.append("no GPUReservation CRD: no reservation shown")
    return Source(nodes, pods, list(held or ()), time.time(), "; ".join(notes), dra.claims,
                  dra.slices)


@dataclass(frozen=True, slots=True)
class Inspected:
    """What one read of the cluster gives every view of it: the objects read, the defrag
    cycle's own snapshot of them, what could not be read, and inspect's document."""

    source: Source
    snapshot: Snapshot
    problems: list[str]
    doc: dict[str, Any]


def inspect_cluster(args: argparse.Namespace, names: KubeNames) -> Inspected:
    """Check the flags, read the cluster (or the snapshot) and build the document; the one
    path of ``gpufrag inspect`` and of its ``--summary`` and ``--plot`` (defrag/fleet).
    Raises ``BadInput`` for a bad flag, API and connection errors as they come."""
    if not 0.0 <= args.threshold < 1.0:
        raise BadInput(f"{args.threshold!r} must be in [0, 1)", field="--threshold")
    if not 0.0 <= args.orphan_grace_s <= 86400.0:
        raise BadInput(f"{args.orphan_grace_s!r} is outside 0..86400 seconds",
                       field="--orphan-grace-s")
    source = read_source(args, names)
    usage = UsageSource(DEFAULTS.stale_intervals, source.now)
    snapshot, problems = build_snapshot(source.nodes, source.pods, [], usage, names,
                                        source.claims, source.slices)
    stale = stale_reservations(source.reservations, snapshot.pods,
                               snapshot.state.index, source.now,
                               grace_s=args.orphan_grace_s)
    problems += hold_reservations(snapshot, source.reservations, source.now)
    if args.node is not None and args.node not in snapshot.state.index:
        raise BadInput(f"no node {args.node!r} in the cluster "
                       f"({len(snapshot.state.index)} nodes read)", field="--node")
    doc = view(snapshot, source.reservations, node=args.node, namespace=args.namespace,
               threshold=args.threshold, stale=stale,
               misallocated=misallocated_pods(source.pods, snapshot.readings, names))
    return Inspected(source, snapshot, problems, doc)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure()
    names = names_from_environ()
    try:
        seen = inspect_cluster(args, names)
    except BadInput as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:  # API refusals, connection errors
        print(f"{PROG}: failed: {e}", file=sys.stderr)
        return EXIT_FAILURE
    source, snapshot, problems, data = seen.source, seen.snapshot, seen.problems, seen.doc
    data["skipped"] = problems
    data["notes"] = [n for n in (source.note,) if n] + [
        f"{n.node}: {n.reason}" for n in snapshot.notes]
    if args.output == "json":
        print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
    elif args.output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False), end="")
    else:
        print(table(data, wide=args.output == "wide"))
        for line in data["notes"] + [f"skipped: {p}" for p in problems]:
            print(f"note: {line}", file=sys.stderr)
    return EXIT_OK
