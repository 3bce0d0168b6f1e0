"""The KSS-compatible workload: the FGD authors' simulator's exact arrivals and tie order.

The authors' simulator (KSS) seeds Go's global ``math/rand`` once with the tuning seed and then
draws, in this order (ported in :mod:`simulations.gorand`):

1. one ``Int()`` (a debug log line evaluates its arguments even when debug logging is off);
2. ``Shuffle`` of the trace's pods, sorted by name first (the arrival order);
3. workload tuning. Up: ``Intn(n)`` picks a pod of the trace (sorted by name) to clone as
   ``<name>-tuned-<k>``, appended after the shuffled trace, until the next pick's *per-GPU*
   share would push demand over ``tune`` x capacity (that pick is drawn, then dropped: demand
   stops just under the target). Down: ``Intn(len)`` removes pods of the shuffled list until
   demand is no longer over the target;
4. ``REFLECTOR_DRAWS`` draws it does not make itself: starting the scheduler, each of its
   informers' reflectors draws one ``Float64`` for its watch timeout (client-go jitters it).
   Measured on the reference run: exactly 10 ``Int63`` draws sit between the tuning and the
   node permutation, and with them every one of its 1,213 node prefixes is reproduced;
5. ``Perm(len(nodes))`` over the nodes sorted by name: node ``i`` is renamed
   ``<perm[i]:04d>-<name>``; KSS breaks equal scores by node name, so these prefixes are its
   tie order.

Its FGD target workload (``typicalPodsConfig``): pod specs (CPU, per-GPU share, GPU count, GPU
type) of the trace, CPU-only pods included, counted, ordered by count and then by the spec
itself (both descending), kept until they cover 95% of pods (one spec at a time), each
popularity ``(count / total) / (covered / total)`` in float64 exactly as KSS computes it.
KSS keys a spec's GPU models by the trace's text (``V100M16|V100M32`` and
``V100M16|V100M32|V100M32`` are two specs in openb's gpuspec33), so :func:`kss_target` takes
those texts (:func:`simulations.openb.gpu_spec_texts`) where gpufrag's own pods hold sets.
"""

from __future__ import annotations

import csv
import dataclasses
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpufrag.errors import BadInput
from scheduler.core.fragmentation import TargetWorkload
from scheduler.core.state import IntArray
from scheduler.core.types import MILLI_PER_GPU, NodeSpec, PodRequest
from simulations.gorand import GoRand
from simulations.workload import MAX_ARRIVALS

POPULARITY_THRESHOLD_PCT = 95
INCREASE_STEP = 1
REFLECTOR_DRAWS = 10
# Kube-scheduler's non-zero request: a pod asking no CPU counts 100 milli in KSS's specs.
DEFAULT_MILLI_CPU = 100


@dataclass(frozen=True)
class KssWorkload:
    """Arrivals in KSS's order, each node's tie rank (by ``nodes`` index) and KSS's names."""

    arrivals: list[PodRequest]
    tie_rank: IntArray
    node_names: list[str]


def _spec_type(pod: PodRequest) -> str:
    return "|".join(sorted(pod.gpu_spec))


def kss_workload(nodes: list[NodeSpec], pods: list[PodRequest], tune: float,
                 seed: int) -> KssWorkload:
    """What KSS replays for ``seed``: see the module docstring for the draws, in order.

    Like KSS (which panics), a trace without GPU demand cannot be tuned: ``ValueError``; so is
    one that would need more than ``MAX_ARRIVALS`` pods (callers check
    :func:`simulations.workload.expected_arrivals` first)."""
    if tune > 0 and not any(p.gpu_demand_milli for p in pods):
        raise ValueError("KSS-compatible tuning needs pods that ask for GPUs")
    rng = GoRand(seed)
    rng.go_int()
    by_name = sorted(pods, key=lambda p: p.name)
    arrivals = list(by_name)

    def swap(i: int, j: int) -> None:
        arrivals[i], arrivals[j] = arrivals[j], arrivals[i]

    rng.shuffle(len(arrivals), swap)
    demand = sum(p.gpu_demand_milli for p in arrivals)
    target = tune * float(sum(n.gpu_count for n in nodes) * MILLI_PER_GPU)
    if tune > 0 and float(demand) > target:
        while float(demand) > target and arrivals:
            gone = arrivals.pop(rng.intn(len(arrivals)))
            demand -= gone.gpu_demand_milli
    elif tune > 0 and float(demand) < target and by_name:
        k = 0
        while True:
            src = by_name[rng.intn(len(by_name))]
            if float(demand + src.gpu_milli) > target:
                break
            if len(arrivals) >= MAX_ARRIVALS:
                raise ValueError(f"more than {MAX_ARRIVALS} arrivals needed to reach tune {tune}")
            demand += src.gpu_demand_milli
            arrivals.append(dataclasses.replace(src, name=f"{src.name}-tuned-{k}"))
            k += 1
    for _ in range(REFLECTOR_DRAWS):
        rng.float64()
    order = sorted(range(len(nodes)), key=lambda i: nodes[i].name)
    perm = rng.perm(len(nodes))
    names = [""] * len(nodes)
    for i, row in enumerate(order):
        names[row] = f"{perm[i]:04d}-{nodes[row].name}"
    rank = np.empty(len(nodes), np.int64)
    rank[sorted(range(len(nodes)), key=names.__getitem__)] = np.arange(len(nodes))
    return KssWorkload(arrivals=arrivals, tie_rank=rank, node_names=names)


def kss_target(pods: list[PodRequest], threshold_pct: int = POPULARITY_THRESHOLD_PCT,
               step: int = INCREASE_STEP,
               spec_texts: Mapping[str, str] | None = None) -> TargetWorkload:
    """KSS's typical pods of ``pods`` (the trace before tuning), in KSS's order and floats;
    ``spec_texts`` (pod name -> the trace's ``gpu_spec`` text) keys GPU models as KSS does."""
    texts = spec_texts or {}
    counts = Counter((p.cpu_milli or DEFAULT_MILLI_CPU, p.gpu_milli, p.num_gpu,
                      texts.get(p.name, _spec_type(p)) if p.gpu_spec else "") for p in pods)
    if not counts:
        raise ValueError("kss_target needs at least one pod")
    # Descending by count, then by (cpu, milli, GPU count, GPU type) descending: KSS sorts
    # sort.Reverse of "count, then spec" ascending.
    specs = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    total = float(sum(counts.values()))
    expected = float(threshold_pct) * total / 100.0
    covered = 0.0
    kept = 0
    limit = 0
    while covered < expected:
        limit += step
        while kept < limit and kept < len(specs):
            covered += float(specs[kept][1])
            kept += 1
        if kept >= len(specs):
            break
    share = [float(n) / total for _, n in specs[:kept]]
    if kept < len(specs):
        share = [s / (covered / total) for s in share]
    chosen = [key for key, _ in specs[:kept]]
    return TargetWorkload(
        cpu_milli=np.array([c for c, _, _, _ in chosen], np.int64),
        num_gpu=np.array([n for _, _, n, _ in chosen], np.int64),
        gpu_milli=np.array([m for _, m, _, _ in chosen], np.int64),
        gpu_spec=tuple(frozenset(s for s in t.split("|") if s) for _, _, _, t in chosen),
        popularity=np.array(share, np.float64),
    )


@dataclass(frozen=True)
class ReferenceDecision:
    order: int
    pod: str
    node: str  # the trace node name (KSS's prefix removed); "" when the pod failed


def read_decisions(path: Path) -> list[ReferenceDecision]:
    """A KSS decisions file (``order,pod,node``; node names carry KSS's 4-digit prefix)."""
    out: list[ReferenceDecision] = []
    try:
        with path.open(newline="") as handle:
            for number, row in enumerate(csv.DictReader(handle), start=2):
                try:
                    node = row["node"].strip()
                    out.append(ReferenceDecision(int(row["order"]), row["pod"].strip(),
                                                 node.split("-", 1)[1] if node else ""))
                except (KeyError, ValueError, IndexError, AttributeError):
                    raise BadInput("expected order,pod,node with a prefixed node name",
                                   source=str(path), row=number) from None
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror or exc}", source=str(path)) from None
    return out
