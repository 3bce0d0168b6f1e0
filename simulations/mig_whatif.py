"""``gpufrag whatif --mig``: the same demand on a MIG fleet, under whole GPUs, fixed MIG layouts
and the layout advisor's (:mod:`scheduler.core.mig_layout`).

The cluster: the trace's MIG-capable nodes. openb names no A100; its two undisclosed 8-GPU
products are taken as the A100 class (``OPENB_MIG_FAMILIES``: G2 as A100 80GB, G3 as H100
80GB; both have the same profile names and sizes); a node whose product the MIG table knows
(``NVIDIA-A100-SXM4-80GB``, ...) is taken as it is. Other nodes are left out.

The pods: every GPU pod of the trace, whatever its ``gpu_spec`` (the question is the same
demand on a MIG fleet), tuned to ``--tune`` x the MIG GPUs' capacity and shuffled as the static
replay does (:func:`~simulations.workload.tune_workload`). A share pod needs its share of the
GPU's memory (``gpu_milli`` x GPU memory, or its GPU memory ask if larger) and gets the
smallest profile with that much; a whole-GPU pod gets one 7g instance per GPU, on one node.

The replay is static, as the FGD paper's: pods arrive in the seeded order and never leave; each
goes to the first node, in a seeded node order, with the instances it needs free and the CPU
it asks for (static MIG: a pod fits only an instance of exactly its profile, so which node
matters only through CPU). Modes:

- ``whole-gpu``: MIG off; every pod takes whole GPUs (a share pod one GPU).
- ``all-1g.10gb``, ``all-balanced``, ``all-3g.40gb``: every GPU cut the same way, three of the
  layouts in NVIDIA's MIG manager's default config (7 x 1g; 2 x 1g + 2g + 3g; 2 x 3g).
- ``advisor``: :func:`~scheduler.core.mig_layout.advise_layouts` per family, given the whole
  arrival list's instances (each family its share of them, by slices of capacity).

Figures: allocation (the trace's GPU share of placed pods over capacity, the FGD paper's
measure) when arrivals reach 100% of capacity and at the end (``--tune``, 130% by default);
slices held by placed pods at the end; stranded slices (free at the end while pods failed:
capacity the demand could not use); failed pods.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gpufrag.errors import EXIT_BAD_INPUT, EXIT_OK, BadInput, BadInputArgumentParser
from scheduler.core.mig import MIG_MODELS, SLICES, MigGpuModel, mig_model
from scheduler.core.mig_layout import MigLayout, advise_layouts, full_layouts, mig_parted_config
from scheduler.core.types import MILLI_PER_GPU, NodeSpec, PodRequest
from simulations.openb import load_nodes, load_pods
from simulations.replay import tie_order
from simulations.synthetic import synthetic_nodes, synthetic_pods
from simulations.workload import MAX_ARRIVALS, expected_arrivals, tune_workload

OPENB_MIG_FAMILIES: Mapping[str, str] = {"G2": "A100-80GB", "G3": "H100-80GB"}
# Fixed layouts by profile position in the family's table (smallest first): 7 x 1g (one slice),
# 2 x 1g + 2g + 3g, 2 x 3g: NVIDIA's all-1g.*, all-balanced and all-3g.* configs. (3g + 4g
# would read as 2 x 3g here: a 4g.40gb has a 3g.40gb's memory, so no pod maps to it.)
FIXED_LAYOUTS: Mapping[str, Mapping[int, int]] = {
    "all-1g.10gb": {0: 7}, "all-balanced": {0: 2, 2: 1, 3: 1}, "all-3g.40gb": {3: 2}}
WHOLE = "whole-gpu"
ADVISOR = "advisor"
MODES = (WHOLE, *FIXED_LAYOUTS, ADVISOR)
MAX_SYNTHETIC_NODES = 100_000


@dataclass(frozen=True, slots=True)
class MigNode:
    name: str
    model: MigGpuModel
    gpus: int
    cpu_milli: int


@dataclass(frozen=True, slots=True)
class MigPod:
    """A GPU pod as static MIG sees it: per family, the profile it needs and how many."""

    name: str
    cpu_milli: int
    gpus: int  # whole GPUs it would take with MIG off
    share_milli: int  # the trace's GPU demand: what allocation counts
    needs: Mapping[str, tuple[str, int]]  # family -> (profile, instances)


@dataclass(frozen=True, slots=True)
class MigRun:
    mode: str
    placed: int
    failed: int
    alloc_pct_at_100: float
    alloc_pct_at_end: float
    held_pct_at_end: float
    stranded_slices: int
    slices: int


def mig_cluster(nodes: Sequence[NodeSpec],
                families: Mapping[str, str] = OPENB_MIG_FAMILIES) -> list[MigNode]:
    """The MIG-capable GPU nodes of ``nodes``: products the MIG table knows, or mapped by
    ``families`` (product -> family)."""
    cluster = []
    for node in nodes:
        if node.gpu_count < 1:
            continue
        model = mig_model(node.gpu_product, node.gpu_memory_mib)
        if model is None and node.gpu_product in families:
            model = MIG_MODELS[families[node.gpu_product]]
        if model is not None:
            cluster.append(MigNode(node.name, model, node.gpu_count, node.cpu_milli))
    return cluster


def mig_pod(pod: PodRequest, models: Sequence[MigGpuModel]) -> MigPod:
    """``pod`` (a GPU pod) in MIG terms on each of ``models``: the smallest profile holding its
    share of the GPU's memory, or one whole-GPU (7g) instance per GPU it asks."""
    needs = {}
    for model in models:
        whole = model.profiles[-1]
        if pod.num_gpu > 1 or pod.gpu_milli >= MILLI_PER_GPU:
            needs[model.family] = (whole.name, max(1, pod.num_gpu))
            continue
        memory = max(pod.gpu_milli * model.memory_mib // MILLI_PER_GPU, pod.gpu_memory_mib)
        needs[model.family] = ((model.smallest_fitting(memory) or whole).name, 1)
    return MigPod(pod.name, pod.cpu_milli, max(1, pod.num_gpu), pod.gpu_demand_milli, needs)


def fixed_layout(model: MigGpuModel, mode: str) -> MigLayout:
    """The full layout of ``model`` a fixed mode names."""
    want = {model.profiles[i].name: n for i, n in FIXED_LAYOUTS[mode].items()}
    return next(layout for layout in full_layouts(model) if dict(layout.counts) == want)


def advised_layouts(cluster: Sequence[MigNode], pods: Sequence[MigPod]) -> dict[str, MigLayout]:
    """The advisor's layout per node, each family given its share (by GPUs) of the pods'
    instances as the window's demand."""
    by_family: dict[str, list[MigNode]] = {}
    for node in cluster:
        by_family.setdefault(node.model.family, []).append(node)
    total = sum(n.gpus for n in cluster)
    layouts: dict[str, MigLayout] = {}
    for family, nodes in by_family.items():
        share = sum(n.gpus for n in nodes) / total
        demand: dict[str, float] = {}
        for pod in pods:
            profile, count = pod.needs[family]
            demand[profile] = demand.get(profile, 0.0) + count * share
        advice = advise_layouts(nodes[0].model, [(n.name, n.gpus) for n in nodes], demand)
        layouts.update(advice.by_node)
    return layouts


def replay_mig(cluster: Sequence[MigNode], pods: Sequence[MigPod], mode: str,
               layouts: Mapping[str, MigLayout] | None, seed: int) -> MigRun:
    """One static replay of ``pods`` (in order) on ``cluster`` cut as ``layouts`` (None: MIG
    off, whole GPUs)."""
    order = [cluster[i] for i in tie_order(len(cluster), seed)]
    # One row of free instances per (family, profile): the same name may differ in size
    # between families (an A100 40GB's 1g.10gb has two slices, an 80GB's one).
    models = {n.model.family: n.model for n in order}
    keys = [(f, p.name) for f, m in models.items() for p in m.profiles] + [(WHOLE, WHOLE)]
    row = {key: i for i, key in enumerate(keys)}
    size = [SLICES if f == WHOLE else (models[f].profile(p) or models[f].profiles[-1]).slices
            for f, p in keys]
    free = np.zeros((len(keys), len(order)), np.int64)
    for j, node in enumerate(order):
        if layouts is None:
            free[row[WHOLE, WHOLE], j] = node.gpus
        else:
            for profile, n in layouts[node.name].counts:
                free[row[node.model.family, profile], j] += node.gpus * n
    cpu = np.array([n.cpu_milli for n in order], np.int64)
    slices = SLICES * sum(n.gpus for n in order)
    capacity = slices * MILLI_PER_GPU // SLICES
    placed = held = alloc = arrived = 0
    alloc_at_100: float | None = None
    for pod in pods:
        arrived += pod.share_milli
        wants = ([row[WHOLE, WHOLE]] if layouts is None else
                 [row[f, p] for f, (p, _) in pod.needs.items()])
        counts = [pod.gpus] if layouts is None else [k for _, k in pod.needs.values()]
        best: tuple[int, int, int] | None = None  # (node, row, count): the first node that fits
        for r, count in zip(wants, counts, strict=True):
            fits = (free[r] >= count) & (cpu >= pod.cpu_milli)
            if fits.any() and (best is None or int(np.argmax(fits)) < best[0]):
                best = (int(np.argmax(fits)), r, count)
        if best is not None:
            j, r, count = best
            free[r, j] -= count
            cpu[j] -= pod.cpu_milli
            held += count * size[r]
            alloc += pod.share_milli
            placed += 1
        if alloc_at_100 is None and arrived >= capacity:
            alloc_at_100 = 100 * alloc / capacity
    failed = len(pods) - placed
    at_end = 100 * alloc / capacity
    return MigRun(mode, placed, failed, round(at_end if alloc_at_100 is None else alloc_at_100, 2),
                  round(at_end, 2), round(100 * held / slices, 2), slices - held if failed else 0,
                  slices)


@dataclass(frozen=True, slots=True)
class MigWhatif:
    workload: str
    nodes: int
    gpus: int
    families: Mapping[str, int]  # family -> GPUs
    arrivals: int
    tune: float
    seed: int
    runs: tuple[MigRun, ...]
    advised: Mapping[str, MigLayout]


def run_mig_whatif(nodes: Sequence[NodeSpec], pods: Sequence[PodRequest], *, workload: str,
                   tune: float, seed: int, modes: Sequence[str] = MODES) -> MigWhatif:
    """Every mode on the same tuned, shuffled arrivals. BadInput when the cluster has no
    MIG-capable GPU or no pod asks for a GPU."""
    cluster = mig_cluster(nodes)
    if not cluster:
        raise BadInput("no MIG-capable GPU node (A100/H100/H200, or openb's "
                       f"{'/'.join(OPENB_MIG_FAMILIES)}) in the cluster")
    gpu_pods = [p for p in pods if p.num_gpu > 0 and p.gpu_demand_milli > 0]
    if not gpu_pods:
        raise BadInput("no pod asks for a GPU")
    gpus = sum(n.gpus for n in cluster)
    capacity = gpus * MILLI_PER_GPU
    if expected_arrivals(gpu_pods, capacity, tune) > MAX_ARRIVALS:
        raise BadInput(f"reaching --tune {tune} x capacity needs more than {MAX_ARRIVALS} pods; "
                       "lower --tune")
    models = list({n.model.family: n.model for n in cluster}.values())
    arrivals = [mig_pod(p, models) for p in tune_workload(gpu_pods, capacity, tune, seed)]
    advised = advised_layouts(cluster, arrivals) if ADVISOR in modes else {}
    runs = []
    for mode in modes:
        layouts: Mapping[str, MigLayout] | None
        if mode == WHOLE:
            layouts = None
        elif mode == ADVISOR:
            layouts = advised
        else:
            layouts = {n.name: fixed_layout(n.model, mode) for n in cluster}
        runs.append(replay_mig(cluster, arrivals, mode, layouts, seed))
    families: dict[str, int] = {}
    for node in cluster:
        families[node.model.family] = families.get(node.model.family, 0) + node.gpus
    return MigWhatif(workload, len(cluster), gpus, families, len(arrivals), tune, seed,
                     tuple(runs), advised)


def table(result: MigWhatif) -> str:
    """The comparison as a Markdown table."""
    end = f"{round(result.tune * 100)}%"
    lines = [f"| mode | alloc@100% | alloc@{end} | slices held@{end} | stranded slices@{end} "
             "| failed pods |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in result.runs:
        lines.append(f"| {r.mode} | {r.alloc_pct_at_100:.1f}% | {r.alloc_pct_at_end:.1f}% "
                     f"| {r.held_pct_at_end:.1f}% | {r.stranded_slices:,} "
                     f"({100 * r.stranded_slices / r.slices:.1f}%) | {r.failed:,} |")
    return "\n".join(lines)


def _mix(advised: Mapping[str, MigLayout]) -> str:
    tally: dict[str, int] = {}
    for layout in advised.values():
        tally[layout.name] = tally.get(layout.name, 0) + 1
    return ", ".join(f"{n} x {name}" for name, n in sorted(tally.items(), key=lambda kv: -kv[1]))


def build_parser() -> BadInputArgumentParser:
    p = BadInputArgumentParser(
        prog="gpufrag whatif --mig",
        description="The same demand on a MIG fleet: whole GPUs vs fixed MIG layouts vs the "
        "layout advisor's, by allocation at 100%% and --tune x capacity and stranded slices "
        "(docs/mig.md). With no --nodes/--pods, a seeded synthetic cluster is used.")
    p.add_argument("--nodes", type=Path, help="openb node CSV")
    p.add_argument("--pods", type=Path, help="openb pod CSV")
    p.add_argument("--seed", type=int, default=42, help="arrival and node order (default: 42)")
    p.add_argument("--tune", type=float, default=1.3,
                   help="total GPU demand as a multiple of capacity (default: 1.3)")
    p.add_argument("--synthetic-nodes", type=int, default=300,
                   help="node count of the synthetic cluster (default: 300)")
    p.add_argument("--out", type=Path, help="write summary.json and the advisor's "
                   "mig-parted config and node labels here")
    return p


def _load(args: argparse.Namespace) -> tuple[str, list[NodeSpec], list[PodRequest]]:
    if (args.nodes is None) != (args.pods is None):
        raise BadInput("--nodes and --pods go together (or give neither for the synthetic run)")
    if not 1 <= args.tune <= 10:
        raise BadInput(f"--tune {args.tune} outside [1, 10] (allocation is read at 100%)")
    if not 0 <= args.seed < 2**63:
        raise BadInput(f"--seed {args.seed} outside 0..2^63-1")
    if not 1 <= args.synthetic_nodes <= MAX_SYNTHETIC_NODES:
        raise BadInput(f"--synthetic-nodes {args.synthetic_nodes} outside "
                       f"1..{MAX_SYNTHETIC_NODES}")
    if args.nodes is None:
        return ("synthetic", synthetic_nodes(args.synthetic_nodes, seed=0),
                synthetic_pods(2000, seed=0))
    nodes = load_nodes(args.nodes)
    return args.pods.stem, nodes, load_pods(args.pods)


def _write(result: MigWhatif, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    summary = {k: v for k, v in asdict(result).items() if k not in ("runs", "advised")}
    summary["runs"] = [asdict(r) for r in result.runs]
    (out / "mig-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "mig-parted-config.yaml").write_text(mig_parted_config(result.advised.values()))
    labels = {node: layout.config_name for node, layout in result.advised.items()}
    (out / "mig-config-labels.json").write_text(json.dumps(labels, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    try:
        workload, nodes, pods = _load(args)
        result = run_mig_whatif(nodes, pods, workload=workload, tune=args.tune, seed=args.seed)
        if args.out is not None:
            _write(result, args.out)
    except BadInput as exc:
        print(f"gpufrag whatif --mig: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        print(f"gpufrag whatif --mig: cannot write to {args.out}: {exc.strerror or exc}",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    kind = ("a synthetic cluster (no trace given)" if workload == "synthetic"
            else f"trace {workload}")
    fams = ", ".join(f"{g:,} {f}" for f, g in result.families.items())
    print(f"MIG what-if on {kind}: {result.nodes:,} MIG nodes ({fams} GPUs), "
          f"{result.arrivals:,} GPU pods at {result.tune}x capacity, seed {result.seed}")
    print(table(result))
    print(f"\nadvisor's layouts: {_mix(result.advised)}")
    if args.out is not None:
        print(f"wrote {args.out}/mig-summary.json, mig-parted-config.yaml, "
              "mig-config-labels.json")
    return EXIT_OK
