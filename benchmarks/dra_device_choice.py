"""How much of FGD's gain survives DRA's first fit inside the node (issue 45's what-if table).

Under Dynamic Resource Allocation kube-scheduler's structured allocator, not the policy, picks
the GPU inside the chosen node: the first device in ResourceSlice order whose remaining
capacity fits (docs/dra.md). Four ways to place, on the FGD paper's static replay (openb, tune
1.3, the same seeded arrivals and tie order for every row):

- ``fgd``: FGD chooses the node and the GPU (the device-plugin path, today);
- ``fgd/first-fit``: FGD chooses the node as today, the GPU is DRA's first fit;
- ``fgd/first-fit-scored``: FGD scores each node for the GPU first fit will give there, and
  that GPU is taken (what an extender that knows the allocator's rule can do, with no write);
- ``kube-default/first-fit``: DRA alone: kube-scheduler's own node scores, first fit inside.

Figures per trace and row, mean over the seeds: unallocated GPU share of capacity at 130%
arrived demand (the paper's end point; 100 − allocation), the fragmentation ratio at 100%, and
how much of FGD's gain over DRA alone (allocation at 130%) each row keeps.

The static replay never lets a pod leave, so GPUs fill from index 0 up and first fit rarely
differs from FGD's pick. Over time, departures open holes that first fit fills in the order
pods left. So the same four rows also run on the event-driven replay
(:mod:`simulations.events`): openb default's last 24 hours, rotated copies of the trace to
``--loads`` of GPU capacity held on average, pods leaving at their trace times, and
kube-scheduler's queue and backoff. Defrag and the serving Deployments are off, so every
placement is the row's. Figures: the mean GPU allocation, the mean fragmentation ratio,
pending pod-hours, and the share of FGD's cut in pending pod-hours (against DRA alone) that
each row keeps. No targets: this measures what the DRA build should rest on.

    python -m benchmarks.dra_device_choice [--data DIR] [--seeds 10] [--jobs 2]
                                           [--traces default,gpushare40,multigpu20]
                                           [--loads 0.9,1.0] [--hours 24]
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks import results
from benchmarks.whatif_matrix import PAPER_TRACES, load_trace
from gpufrag.dataroot import ENV, data_root
from simulations import sweep
from simulations.cli import run_one
from simulations.events import EventConfig, run_events
from simulations.replay import run_label

# (policy, device mode): the table's rows, in order.
ROWS = (("fgd", "policy"), ("fgd", "first-fit"), ("fgd", "first-fit-scored"),
        ("kube-default", "first-fit"))
BASELINE = ("kube-default", "first-fit")  # DRA alone
# openb default and the two variants that move device choice most: more GPU shares (where the
# GPU inside a node is a choice) and more multi-GPU pods (whole GPUs, first fit either way).
DEFAULT_TRACES = ("default", "gpushare40", "multigpu20")
SEED0 = 42  # the paper's seeds: 42, 43, ...
END, AT100 = 130, 100
OVER_TIME_TRACE = "default"
_inputs: dict[tuple[str, float, float], sweep.Inputs] = {}


def _replay(data: str, trace: str, policy: str, mode: str,
            seed: int) -> tuple[str, str, int, float, float]:
    """One replay in a worker: allocation at 130% and fragmentation ratio at 100% arrived."""
    nodes, pods, target = load_trace(data, trace)
    record = run_one(trace, nodes, pods, policy, seed, END / 100, target, device_mode=mode)
    return (trace, run_label(policy, mode), seed,
            float(record.series("allocation", END + 1)[END]),
            float(record.series("frag_ratio", END + 1)[AT100]))


def _over_time(data: str, load: float, hours: float, policy: str, mode: str,
               seed: int) -> tuple[float, str, int, float, float, float]:
    """One event-driven run in a worker (inputs read once per worker and load): mean
    allocation %, mean fragmentation ratio (%) and pending pod-hours."""
    key = (data, load, hours)
    if key not in _inputs:
        base = Path(data)
        _inputs[key] = sweep.load_inputs(
            nodes_path=base / "openb_node_list_gpu_node.csv",
            pods_path=base / f"openb_pod_list_{OVER_TIME_TRACE}.csv", genai="synthetic",
            synthetic_node_count=1, load=load, start_s=None, hours=hours, workload_seed=0,
            coverage=0.95)
    inputs = _inputs[key]
    config = EventConfig(policy=policy, seed=seed, hours=hours, defrag_interval_min=0,
                         serving=False)
    totals = run_events(inputs.nodes, inputs.timed, config, target=inputs.target,
                        workload=inputs.workload, device_mode=mode).totals
    return (load, run_label(policy, mode), seed, float(totals["mean_allocation_pct"]),
            100.0 * float(totals["mean_frag_ratio"]), float(totals["pending_pod_s"]) / 3600.0)


def _loads(text: str) -> list[float]:
    try:
        loads = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        loads = []
    if not loads or not all(0 < v <= 2 for v in loads):
        raise argparse.ArgumentTypeError(f"loads in (0, 2] separated by commas, got {text!r}")
    return loads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, default=data_root() / "openb")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--traces", default=",".join(DEFAULT_TRACES),
                        help="comma-separated, from the paper's traces (default: %(default)s)")
    parser.add_argument("--loads", type=_loads, default=[0.9, 1.0],
                        help="over time: GPU capacity held on average, one run set each "
                        "(default: 0.9,1.0)")
    parser.add_argument("--hours", type=float, default=24.0,
                        help="over time: the window, hours (default: %(default)s)")
    results.add_arguments(parser, "dra_device_choice")
    args = parser.parse_args(argv)
    traces = [t for t in args.traces.split(",") if t]
    unknown = [t for t in traces if t not in PAPER_TRACES]
    if unknown or not traces:
        parser.error(f"--traces: unknown {', '.join(unknown) or '(none given)'}; choose from "
                     f"{','.join(PAPER_TRACES)}")
    if not 1 <= args.seeds <= 100 or args.jobs < 1 or not 0 < args.hours <= 24 * 7:
        parser.error("--seeds must be 1..100, --jobs at least 1 and --hours in (0, 168]")
    missing = [t for t in traces if not (args.data / f"openb_pod_list_{t}.csv").exists()]
    if missing or not (args.data / "openb_node_list_gpu_node.csv").exists():
        print(f"openb trace(s) {', '.join(missing) or 'node list'} not found under {args.data}; "
              f"pass --data or set {ENV}", file=sys.stderr)
        return 2
    start = results.Start.now()
    seeds = range(SEED0, SEED0 + args.seeds)
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(_replay, str(args.data), t, p, m, s)
                   for t in traces for p, m in ROWS for s in seeds]
        done = [f.result() for f in futures]
        wall_s = time.perf_counter() - started
        timed = [pool.submit(_over_time, str(args.data), load, args.hours, p, m, s)
                 for load in args.loads for p, m in ROWS for s in seeds]
        over_time = [f.result() for f in timed]
    over_time_s = time.perf_counter() - started - wall_s
    alloc: dict[tuple[str, str], list[float]] = {}
    ratio: dict[tuple[str, str], list[float]] = {}
    for trace, label, _, at_end, frag in done:
        alloc.setdefault((trace, label), []).append(at_end)
        ratio.setdefault((trace, label), []).append(frag)

    figures: list[results.Figure] = []
    base = run_label(*BASELINE)
    print(f"{len(done)} replays ({len(traces)} traces x {len(ROWS)} rows x {args.seeds} seeds, "
          f"tune {END / 100}) in {wall_s:.1f} s on {args.jobs} processes\n")
    head = (f"{'trace':<12}{'row':<24}{f'unalloc@{END}%':>13}{'±sd':>6}"
            f"{f'frag@{AT100}%':>11}{'gain kept':>11}")
    print(head + "\n" + "-" * len(head))
    for trace in traces:
        fgd_end = float(np.mean(alloc[(trace, "fgd")]))
        base_end = float(np.mean(alloc[(trace, base)]))
        for policy, mode in ROWS:
            label = run_label(policy, mode)
            values = np.array(alloc[(trace, label)])
            unalloc = 100.0 - float(values.mean())
            frag = float(np.mean(ratio[(trace, label)]))
            kept = (100.0 * (float(values.mean()) - base_end) / (fgd_end - base_end)
                    if fgd_end != base_end else float("nan"))
            print(f"{trace:<12}{label:<24}{unalloc:>13.2f}{values.std():>6.2f}{frag:>11.2f}"
                  f"{kept:>10.1f}%")
            figures += [
                results.Figure(f"{trace}, {label}: unallocated GPU @{END}% arrived "
                               f"(±sd {values.std():.2f})", round(unalloc, 2), "%"),
                results.Figure(f"{trace}, {label}: fragmentation ratio @{AT100}% arrived",
                               round(frag, 2), "%")]
            if (policy, mode) not in (("fgd", "policy"), BASELINE) and np.isfinite(kept):
                figures.append(results.Figure(
                    f"{trace}, {label}: share of FGD's gain over DRA alone kept @{END}%",
                    round(kept, 1), "%"))
    figures.append(results.Figure(f"{len(done)} replays, wall on {args.jobs} processes",
                                  round(wall_s, 1), "s"))
    figures += _over_time_figures(over_time, args)
    figures.append(results.Figure(f"{len(over_time)} runs over time, wall on {args.jobs} "
                                  "processes", round(over_time_s, 1), "s"))
    results.record(args, "dra_device_choice", start, figures,
                   notes=[f"seeds {SEED0}..{SEED0 + args.seeds - 1}; rows: "
                          + ", ".join(run_label(p, m) for p, m in ROWS)])
    return 0


def _over_time_figures(runs: list[tuple[float, str, int, float, float, float]],
                       args: argparse.Namespace) -> list[results.Figure]:
    """Print the over-time table and return its figures."""
    by: dict[tuple[float, str], list[tuple[float, float, float]]] = {}
    for load, label, _, alloc, frag, pending_h in runs:
        by.setdefault((load, label), []).append((alloc, frag, pending_h))
    print(f"\nover time: {OVER_TIME_TRACE}, {args.hours:g} h, departures, no defrag, "
          f"{args.seeds} seeds")
    head = (f"{'load':<6}{'row':<24}{'alloc %':>9}{'frag %':>8}{'pending pod-h':>15}{'±sd':>8}"
            f"{'cut kept':>10}")
    print(head + "\n" + "-" * len(head))
    figures: list[results.Figure] = []
    base = run_label(*BASELINE)
    where = f"{OVER_TIME_TRACE} over {args.hours:g} h"
    for load in args.loads:
        pending_fgd = float(np.mean([r[2] for r in by[(load, "fgd")]]))
        pending_base = float(np.mean([r[2] for r in by[(load, base)]]))
        for policy, mode in ROWS:
            label = run_label(policy, mode)
            values = np.array(by[(load, label)])
            alloc, frag, pending = (float(v) for v in values.mean(axis=0))
            sd = float(values[:, 2].std())
            kept = (100.0 * (pending_base - pending) / (pending_base - pending_fgd)
                    if pending_base != pending_fgd else float("nan"))
            print(f"{load:<6g}{label:<24}{alloc:>9.2f}{frag:>8.2f}{pending:>15.1f}{sd:>8.1f}"
                  f"{kept:>9.1f}%")
            name = f"{where} at load {load:g}, {label}"
            figures += [
                results.Figure(f"{name}: mean GPU allocation", round(alloc, 2), "%"),
                results.Figure(f"{name}: mean fragmentation ratio", round(frag, 2), "%"),
                results.Figure(f"{name}: pending pod-hours (±sd {sd:.1f})", round(pending, 1),
                               "h")]
            if (policy, mode) not in (("fgd", "policy"), BASELINE) and np.isfinite(kept):
                figures.append(results.Figure(
                    f"{name}: share of FGD's cut in pending pod-hours (vs DRA alone) kept",
                    round(kept, 1), "%"))
    return figures


if __name__ == "__main__":
    sys.exit(main())
