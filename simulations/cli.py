"""``gpufrag whatif``: compare placement policies on a trace (or a synthetic cluster).

Runs every (policy, seed) pair as one replay, in parallel processes, and writes the FGD authors'
CSV layout, a summary JSON and plots to ``--out``. ``gpufrag whatif sweep`` runs the
event-driven replay over a grid of policies x knobs x seeds (:mod:`simulations.sweep`) and
``gpufrag whatif merge`` joins sweep results (the shards of an Indexed Job). Bad input exits 2
with one line naming the file, row and field; a bad flag or flag value exits 2 with one line too
(not argparse's usage block), because both mean "fix what you typed" and scripts should see one
error to report.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from gpufrag.argtypes import positive_float
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_OK, BadInput, BadInputArgumentParser
from gpufrag.plotting import plots_wanted
from scheduler.core.fragmentation import TargetWorkload
from scheduler.core.gpus import DEVICE_MODES
from scheduler.core.types import MILLI_PER_GPU, NodeSpec, PodRequest
from scheduler.policies import ALL_POLICY_NAMES, POLICY_NAMES
from simulations import defrag_whatif, genai, mig_whatif, report, sweep, timeline, waste_loop
from simulations.events import EventConfig
from simulations.kss import kss_target, kss_workload
from simulations.openb import gpu_spec_texts, load_nodes, load_pods
from simulations.replay import replay, run_label
from simulations.synthetic import synthetic_nodes, synthetic_pods
from simulations.workload import MAX_ARRIVALS, expected_arrivals, tune_workload

# Bounds on what one run may ask for, so a typo is an error and not an hour-long or
# memory-filling run (the openb cluster has 1,213 nodes).
MAX_SYNTHETIC_NODES = 100_000
MAX_SEED = 2**63 - 1


def _items(text: str) -> list[str]:
    """Non-empty items of a comma list; a repeat is refused, since it would only rerun a run."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    doubled = sorted(t for t, n in Counter(items).items() if n > 1)
    if doubled:
        raise argparse.ArgumentTypeError(f"{','.join(doubled)} given more than once")
    return items


def _names(text: str) -> list[str]:
    """A comma-separated list of names (policies)."""
    return _items(text)


def _seeds(text: str) -> list[int]:
    """A comma-separated list of seeds, each in ``0..2^63-1`` (numpy refuses negative seeds)."""
    seeds: list[int] = []
    for item in _items(text):
        if not item.isascii() or not item.isdigit() or len(item) > 19 or int(item) > MAX_SEED:
            raise argparse.ArgumentTypeError(f"{item!r} is not a seed in 0..{MAX_SEED}")
        if int(item) in seeds:
            raise argparse.ArgumentTypeError(f"seed {int(item)} given more than once")
        seeds.append(int(item))
    return seeds


def build_parser() -> BadInputArgumentParser:
    p = BadInputArgumentParser(
        prog="gpufrag whatif",
        description="Replay a cluster trace through each placement policy and compare them. "
        "With no --nodes/--pods, a seeded synthetic cluster shaped like the openb trace is used. "
        "Over time (arrivals, departures, defrag, autoscaling): gpufrag whatif sweep --help.",
    )
    p.add_argument("--nodes", type=Path, help="openb node CSV (sn,cpu_milli,memory_mib,gpu,model)")
    p.add_argument("--pods", type=Path, help="openb pod CSV (name,cpu_milli,...,gpu_spec)")
    p.add_argument("--policies", type=_names, default=list(POLICY_NAMES),
                   help=f"comma-separated, from {','.join(ALL_POLICY_NAMES)} (default: "
                   f"{','.join(POLICY_NAMES)}, the paper's six)")
    p.add_argument("--seeds", type=_seeds, default=[42],
                   help="comma-separated seeds (default: 42)")
    p.add_argument("--tune", type=float, default=1.3,
                   help="total GPU demand as a multiple of capacity (default: 1.3)")
    p.add_argument("--out", type=Path, default=Path("whatif-out"),
                   help="output directory (default: ./whatif-out)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="parallel processes (default: CPU count)")
    p.add_argument("--synthetic-nodes", type=int, default=300,
                   help="node count of the synthetic cluster (default: 300)")
    p.add_argument("--coverage", type=float, default=0.95,
                   help="FGD target workload: most popular specs covering this share of pods")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--kss-compat", action="store_true",
                   help="replay exactly as the FGD authors' simulator (KSS) does for the same "
                   "seed: its arrival order, tuned pods, node tie order, target workload and "
                   "scoring rules (docs/whatif.md)")
    p.add_argument("--device-choice", choices=list(DEVICE_MODES), default="policy",
                   help="who picks the GPU on the chosen node: the policy (default, the device "
                   "plugin path), DRA's first fit ('first-fit'), or DRA's first fit with the "
                   "policy scoring each node for that GPU ('first-fit-scored'; docs/dra.md)")
    p.add_argument("--defrag", action="store_true",
                   help="run the defrag what-if instead (gpufrag whatif --defrag --help; over "
                   "days with the baseline and the bound: --defrag --days N)")
    p.add_argument("--mig", action="store_true",
                   help="run the MIG what-if instead: whole GPUs vs fixed MIG layouts vs the "
                   "layout advisor's (gpufrag whatif --mig --help)")
    return p


def _load(args: argparse.Namespace) -> tuple[str, list[NodeSpec], list[PodRequest]]:
    if (args.nodes is None) != (args.pods is None):
        raise BadInput("--nodes and --pods go together (or give neither for the synthetic run)")
    if args.nodes is None:
        nodes = synthetic_nodes(args.synthetic_nodes, seed=0)
        return "synthetic", nodes, synthetic_pods(2000, seed=0)
    nodes = load_nodes(args.nodes)
    pods = load_pods(args.pods, {n.gpu_product for n in nodes if n.gpu_count})
    return args.pods.stem, nodes, pods


def _validate(args: argparse.Namespace) -> None:
    unknown = [p for p in args.policies if p not in ALL_POLICY_NAMES]
    if unknown:
        raise BadInput(f"unknown policy {', '.join(unknown)}; choose from "
                       f"{','.join(ALL_POLICY_NAMES)}", field="--policies")
    if not 0 < args.tune <= 10:
        raise BadInput(f"--tune {args.tune} outside (0, 10]")
    if args.jobs < 1:
        raise BadInput(f"--jobs {args.jobs} must be >= 1")
    if not 1 <= args.synthetic_nodes <= MAX_SYNTHETIC_NODES:
        raise BadInput(f"--synthetic-nodes {args.synthetic_nodes} outside 1..{MAX_SYNTHETIC_NODES}")
    if not 0 < args.coverage <= 1:
        raise BadInput(f"--coverage {args.coverage} outside (0, 1]")


def run_one(workload: str, nodes: list[NodeSpec], pods: list[PodRequest], policy: str, seed: int,
            tune: float, target: TargetWorkload, kss_compat: bool = False,
            device_mode: str = "policy") -> report.RunRecord:
    """One replay; a top-level function so worker processes can run it. With ``kss_compat``
    the arrivals and tie order are the reference simulator's for ``seed``
    (:mod:`simulations.kss`) and ``target`` should be :func:`~simulations.kss.kss_target`'s.
    ``device_mode``: who picks the GPU on the chosen node
    (:data:`~scheduler.core.gpus.DEVICE_MODES`)."""
    start = time.perf_counter()
    if kss_compat:
        kss = kss_workload(nodes, pods, tune, seed)
        result = replay(nodes, kss.arrivals, policy, seed, target, tie_rank=kss.tie_rank,
                        kss_compat=True, device_mode=device_mode)
        return report.RunRecord(workload, tune, result, time.perf_counter() - start)
    capacity = sum(n.gpu_count for n in nodes) * MILLI_PER_GPU
    arrivals = tune_workload(pods, capacity, tune, seed)
    result = replay(nodes, arrivals, policy, seed, target, device_mode=device_mode)
    return report.RunRecord(workload, tune, result, time.perf_counter() - start)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sweep":
        return sweep_main(argv[1:])
    if argv and argv[0] == "merge":
        return merge_main(argv[1:])
    if "--defrag" in argv:
        rest = [a for a in argv if a != "--defrag"]
        if any(a == "--days" or a.startswith("--days=") for a in rest):
            return waste_loop.main(rest)  # the waste loop over days, beside baseline and bound
        return defrag_whatif.main(rest)
    if "--mig" in argv:
        return mig_whatif.main([a for a in argv if a != "--mig"])
    args = build_parser().parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    args.no_plots = not plots_wanted(args.no_plots, "gpufrag whatif")
    try:
        _validate(args)
        workload, nodes, pods = _load(args)
        if not any(n.gpu_count for n in nodes):
            raise BadInput("the cluster has no GPUs", source=str(args.nodes or "synthetic"))
        capacity = sum(n.gpu_count for n in nodes) * MILLI_PER_GPU
        arrivals = expected_arrivals(pods, capacity, args.tune)
        if arrivals > MAX_ARRIVALS:
            raise BadInput(f"reaching --tune {args.tune} x capacity needs about {arrivals} pods "
                           f"(limit {MAX_ARRIVALS}): the GPU pods ask for too little; lower "
                           "--tune or check gpu_milli", source=str(args.pods or "synthetic"))
        if args.kss_compat and not any(p.gpu_demand_milli for p in pods):
            raise BadInput("--kss-compat tunes by GPU demand, and no pod asks for a GPU",
                           source=str(args.pods or "synthetic"))
        if args.kss_compat:
            texts = gpu_spec_texts(args.pods) if args.pods is not None else {}
            target = kss_target(pods, threshold_pct=round(args.coverage * 100), spec_texts=texts)
        else:
            target = TargetWorkload.from_pods(pods, coverage=args.coverage)
    except BadInput as exc:
        print(f"gpufrag whatif: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"gpufrag whatif: cannot create {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    runs = [(p, s) for p in args.policies for s in args.seeds]
    print(f"what-if: {workload}, {len(nodes)} nodes, {len(pods)} pods, tune {args.tune}, "
          f"{len(runs)} runs on {min(args.jobs, len(runs))} processes", file=sys.stderr)
    started = time.perf_counter()
    records: list[report.RunRecord] = []
    if args.jobs == 1 or len(runs) == 1:
        for i, (policy, seed) in enumerate(runs, 1):
            records.append(run_one(workload, nodes, pods, policy, seed, args.tune, target,
                                   args.kss_compat, args.device_choice))
            _progress(i, len(runs), records[-1])
    else:
        with ProcessPoolExecutor(max_workers=min(args.jobs, len(runs))) as pool:
            futures = [pool.submit(run_one, workload, nodes, pods, p, s, args.tune, target,
                                   args.kss_compat, args.device_choice) for p, s in runs]
            for i, fut in enumerate(as_completed(futures), 1):
                records.append(fut.result())
                _progress(i, len(runs), records[-1])
    labels = [run_label(p, args.device_choice) for p in args.policies]
    records.sort(key=lambda r: (labels.index(r.result.policy), r.result.seed))
    columns = report.columns_for(args.tune)
    summaries = report.summarise(records, columns)
    try:
        report.write_csvs(records, args.out, columns)
        report.write_summary(summaries, args.out, {
            "workload": workload, "nodes": len(nodes), "trace_pods": len(pods),
            "tune": args.tune, "seeds": args.seeds, "kss_compat": args.kss_compat,
            **({} if args.device_choice == "policy" else {"device_choice": args.device_choice}),
            "wall_seconds": round(time.perf_counter() - started, 2),
        })
        if not args.no_plots:
            report.plot(records, args.out, columns, f"{workload}, tune {args.tune}")
    except OSError as exc:  # --out went away or is read-only: the same fix as a bad --out
        print(f"gpufrag whatif: cannot write to {args.out}: {exc.strerror or exc}",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    print(report.table(summaries, columns))
    print(f"\nwrote {args.out}/allocation.csv, frag_ratio.csv, frag_amount.csv, summary.json"
          + ("" if args.no_plots else ", allocation.png, frag_ratio.png"))
    return EXIT_OK


def _progress(done: int, total: int, rec: report.RunRecord) -> None:
    r = rec.result
    print(f"  [{done}/{total}] {r.policy:<15} seed {r.seed}: placed {r.placed}, failed {r.failed}"
          f" ({rec.seconds:.1f}s)", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- sweep, merge
# The most a sweep's --load may ask: a hundred times the cluster's GPU capacity on average is
# already no cluster anyone runs; above it a synthetic workload's arrival rate overflows.
MAX_LOAD = 100.0


def _sweep_load(text: str) -> float:
    value = positive_float(text)
    if value > MAX_LOAD:
        raise argparse.ArgumentTypeError(f"{text!r} is above {MAX_LOAD:g} (x the cluster's "
                                         "GPU capacity)")
    return value


def build_sweep_parser() -> BadInputArgumentParser:
    knobs = ", ".join(EventConfig.knobs())
    p = BadInputArgumentParser(
        prog="gpufrag whatif sweep",
        description="Event-driven replays (arrivals, departures, pending retries, defrag "
        "cycles, autoscaled model Deployments, cold starts) over a grid of policies x knobs x "
        "seeds; one JSON per run in OUT/runs, a comparison table, comparison.csv and "
        "timeline.png. With no --nodes/--pods, a seeded synthetic cluster and workload; with no "
        "GenAI trace, a synthetic serving load. Knobs: " + knobs)
    p.add_argument("--nodes", type=Path, help="openb node CSV")
    p.add_argument("--pods", type=Path, help="openb pod CSV with creation_time, deletion_time")
    p.add_argument("--genai", help="GenAI trace directory, or 'synthetic' (default: "
                   f"{genai.DEFAULT_DIR} when present)")
    p.add_argument("--synthetic-nodes", type=int, default=100,
                   help="node count of the synthetic cluster (default: 100)")
    p.add_argument("--load", type=_sweep_load,
                   help="superimpose time-shifted copies of the trace until it holds this "
                   "share of GPU capacity on average (default: the trace as it is; synthetic: "
                   "0.8)")
    p.add_argument("--start-s", type=float,
                   help="window start, trace seconds (default: the trace's last hours)")
    p.add_argument("--workload-seed", type=int, default=0,
                   help="seed of the copies' offsets and of the synthetic workload (default: 0)")
    p.add_argument("--coverage", type=float, default=0.95,
                   help="FGD target workload coverage (default: 0.95)")
    p.add_argument("--policies", type=_names, help="shorthand for --set policy=...")
    p.add_argument("--seeds", type=_seeds, help="shorthand for --set seed=...")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=V1[,V2...]",
                   help="a knob and its values in the grid (repeatable)")
    p.add_argument("--grid", type=Path, help="YAML/JSON file: knob: [values]")
    p.add_argument("--out", type=Path, default=Path("whatif-sweep"),
                   help="output directory (default: ./whatif-sweep)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="local worker processes (default: CPU count)")
    p.add_argument("--ray", metavar="auto|ADDRESS",
                   help="run on a Ray cluster instead (pip install 'gpufrag[ray]')")
    p.add_argument("--shard", help="i/N: run only the runs whose grid index is i modulo N "
                   "(Indexed Job); then gpufrag whatif merge")
    p.add_argument("--no-plots", action="store_true")
    return p


def _grid(args: argparse.Namespace) -> dict[str, list[object]]:
    grid: dict[str, list[object]] = sweep.read_grid(args.grid) if args.grid else {}
    for text in args.set:
        knob, values = sweep.parse_assignment(text)
        grid[knob] = values
    if args.policies:
        unknown = [p for p in args.policies if p not in ALL_POLICY_NAMES]
        if unknown:
            raise BadInput(f"unknown policy {', '.join(unknown)}; choose from "
                           f"{','.join(ALL_POLICY_NAMES)}", field="--policies")
        grid["policy"] = list(args.policies)
    if args.seeds:
        grid["seed"] = list(args.seeds)
    return grid


def _fail(prog: str, exc: BadInput | OSError, out: Path | None = None) -> int:
    if isinstance(exc, OSError):
        print(f"{prog}: cannot write to {out}: {exc.strerror or exc}", file=sys.stderr)
    else:
        print(f"{prog}: {exc}", file=sys.stderr)
    return EXIT_BAD_INPUT


def sweep_main(argv: Sequence[str]) -> int:
    prog = "gpufrag whatif sweep"
    args = build_sweep_parser().parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    try:
        if args.jobs < 1:
            raise BadInput(f"{args.jobs} must be >= 1", field="--jobs")
        if not 1 <= args.synthetic_nodes <= MAX_SYNTHETIC_NODES:
            raise BadInput(f"{args.synthetic_nodes} outside 1..{MAX_SYNTHETIC_NODES}",
                           field="--synthetic-nodes")
        if not 0 < args.coverage <= 1:
            raise BadInput(f"{args.coverage} outside (0, 1]", field="--coverage")
        if args.ray is not None and args.shard is not None:
            raise BadInput("--ray and --shard are two ways to spread one sweep; pick one")
        shard = sweep.parse_shard(args.shard) if args.shard else None
        configs = sweep.expand(_grid(args), EventConfig())
        hours = max(c.hours for c in configs)
        inputs = sweep.load_inputs(
            nodes_path=args.nodes, pods_path=args.pods, genai=args.genai,
            synthetic_node_count=args.synthetic_nodes, load=args.load, start_s=args.start_s,
            hours=hours, workload_seed=args.workload_seed, coverage=args.coverage)
        args.out.mkdir(parents=True, exist_ok=True)
    except BadInput as exc:
        return _fail(prog, exc)
    except OSError as exc:
        return _fail(prog, exc, args.out)
    for note in inputs.notes:
        print(f"what-if sweep: {note}", file=sys.stderr)
    where = (f"Ray ({args.ray})" if args.ray else f"shard {args.shard}" if shard else
             f"{min(args.jobs, len(configs))} processes")
    print(f"what-if sweep: {len(configs)} runs in the grid, on {where}", file=sys.stderr)
    try:
        outcome = sweep.sweep(inputs, configs, args.out, jobs=args.jobs, ray_address=args.ray,
                              shard=shard)
        if shard is None:  # a shard writes runs only: whether plots can be drawn is moot
            args.no_plots = not plots_wanted(args.no_plots, prog)
            sweep.write_outputs(outcome.records, args.out, f"{inputs.workload} over time",
                                plots=not args.no_plots)
    except BadInput as exc:
        return _fail(prog, exc)
    except OSError as exc:
        return _fail(prog, exc, args.out)
    print(timeline.table(outcome.records))
    done = f"ran {outcome.ran}, skipped {outcome.skipped} already done"
    if shard is None:
        extra = "" if args.no_plots else ", timeline.png"
        print(f"\n{done}; wrote {args.out}/runs/*.json, comparison.csv{extra}")
    else:
        print(f"\n{done}; wrote {args.out}/runs/*.json (then: gpufrag whatif merge {args.out})")
    return EXIT_OK


def merge_main(argv: Sequence[str]) -> int:
    prog = "gpufrag whatif merge"
    p = BadInputArgumentParser(prog=prog, description="Join the runs of sweep shards (or of "
                               "several sweeps) into one comparison.csv, table and plot.")
    p.add_argument("dirs", nargs="+", type=Path, help="sweep output directories")
    p.add_argument("--out", type=Path, help="where to write (default: the first directory)")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    args.no_plots = not plots_wanted(args.no_plots, prog)
    out = args.out or args.dirs[0]
    try:
        records = sweep.collect(args.dirs)
        if not records:
            raise BadInput("no run files found", source=",".join(map(str, args.dirs)))
        workload = str(records[0].get("workload", "what-if"))
        sweep.write_outputs(records, out, f"{workload} over time", plots=not args.no_plots)
    except BadInput as exc:
        return _fail(prog, exc)
    except OSError as exc:
        return _fail(prog, exc, out)
    print(timeline.table(records))
    print(f"\nmerged {len(records)} runs; wrote {out}/comparison.csv"
          + ("" if args.no_plots else ", timeline.png"))
    return EXIT_OK
