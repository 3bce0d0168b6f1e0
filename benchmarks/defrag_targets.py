"""Issue 43's waste-loop targets over 14 simulated days, against the same run's bound and baseline.

``gpufrag whatif --defrag --days 14`` on openb (``openb_pod_list_default`` on its own timeline,
rotated copies to 85% of GPU capacity on average) with the GenAI per-pod memory series, for
seed 42 and two more seeds, default knobs: rollouts every 7 days, a cycle an hour, evictions at
most 1% of the running GPU pods in any 24 hours (the controller's daily budget), a workload at
most once a day, a node no target within a day of giving a pod nor a source within a day of
receiving one (the controller's node cooldown), right-sizing evictions only for pods holding
1.5x their admitted share or more that have not restarted for 2 days.
Each run has three arms (:mod:`simulations.waste_loop`): the baseline (random scheduler, no
right-sizing, no defrag), the waste loop, and the bound (every eligible pod at its admitted
share at every cycle, no eviction). "After 14 days" is the mean over the last simulated day.

Targets, per seed: idle ratio within 2 pp of the bound; trigger off on at least the bound's
share of nodes minus 5 pp; free whole GPUs at least the baseline's + 80%, at equal work (each
arm's free whole GPUs less the whole GPUs its pending pods ask: the random baseline leaves
multi-GPU pods pending, and the GPUs they wait for would count as free otherwise; the raw figure
is reported beside it); pending GPU pods no more than the baseline's; evictions at most 1% of
the running GPU pods in any day, counted as the controller's daily budget counts them
(:func:`defrag.controller.budget.worst_day_ratio`: at every cycle that evicts, the evictions of
the 24 hours up to it over the running GPU pods that cycle read); no pod moved twice within a
day; no node defrag made flap (a move's source and target within a day, or a landing turned its
trigger on again within a day of going off: without the pods landed there, it would have stayed
at or below the threshold; the trigger's own swings, which the baseline shows as much, are
reported without a target); readings of right-sized pods above the share they held
at most 1% (out of sample); every over-share raised within a cycle (the replacement admitted at
the raised share); no pod beyond its share for longer than a cycle. Then the sweep over the
rollout cadence (1, 3, 7, 14, 30 days, seed 42): how many targets hold at each, as context (the
verdict is the default cadence's).

    .venv/bin/python -m benchmarks.defrag_targets [--data DIR] [--days 14] [--seeds 42,43,44]
        [--rollouts 1,3,7,14,30] [--jobs 2] [--out DIR]

``--data`` defaults to the data root (``GPUFRAG_DATA_ROOT``, see :mod:`gpufrag.dataroot`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from benchmarks import results
from gpufrag.dataroot import ENV, data_root
from scheduler.core.types import NodeSpec
from simulations.defrag_whatif import GENAI_FILE, GENAI_GPU_GIB, with_gpu_memory
from simulations.openb import load_nodes
from simulations.rightsizing import MemoryTrace, read_memory_trace
from simulations.waste_loop import (
    BASELINE,
    BOUND,
    LOOP,
    LoopResult,
    LoopSettings,
    load_window,
    plot,
    run_loop,
    table,
    targets,
)

DEFAULT_SEEDS = (42, 43, 44)
DEFAULT_ROLLOUTS = (1.0, 3.0, 7.0, 14.0, 30.0)
LOAD = 0.85


def _numbers(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _run(job: tuple[list[NodeSpec], Path, MemoryTrace, LoopSettings, str]
         ) -> tuple[LoopResult, float]:
    nodes, pods_csv, trace, settings, workload = job
    started = time.perf_counter()
    timed = load_window(nodes, pods_csv, days=settings.days, load=LOAD, seed=settings.seed)
    result = run_loop(nodes, timed, trace, settings, workload=workload)
    return result, time.perf_counter() - started


def figures_of(result: LoopResult, seed: int) -> list[results.Figure]:
    """The judged figures of one seed's run (each with the issue's target) and its context."""
    days = result.settings.days
    base, loop, bound = result.arms[BASELINE], result.arms[LOOP], result.arms[BOUND]
    nodes = max(loop.gpu_nodes, 1)
    idle, idle_bound = loop.mean("idle_ratio", days), bound.mean("idle_ratio", days)
    off = 1 - loop.mean("trigger_on", days) / nodes
    off_bound = 1 - bound.mean("trigger_on", days) / nodes
    free, free_base = loop.spare_whole_gpus(days), base.spare_whole_gpus(days)
    raw, raw_base = loop.mean("free_whole_gpus", days), base.mean("free_whole_gpus", days)
    kills = loop.oom_kills
    s = f"seed {seed}"
    t = results.Target
    return [
        results.Figure(f"{s}: idle ratio above the bound's ({100 * idle:.1f}% vs "
                       f"{100 * idle_bound:.1f}%; baseline "
                       f"{100 * base.mean('idle_ratio', days):.1f}%)",
                       100 * (idle - idle_bound), "pp", t("<=", 2.0)),
        results.Figure(f"{s}: trigger off, below the bound's share of nodes ({100 * off:.1f}% vs "
                       f"{100 * off_bound:.1f}%)", 100 * (off_bound - off), "pp", t("<=", 5.0)),
        results.Figure(f"{s}: free whole GPUs over the baseline's at equal work, once the "
                       f"pending pods took theirs ({free:.0f} vs {free_base:.0f})",
                       100 * (free - free_base) / max(free_base, 1.0), "%", t(">=", 80.0)),
        results.Figure(f"{s}: free whole GPUs over the baseline's, raw ({raw:.0f} vs "
                       f"{raw_base:.0f}; the baseline's pending pods ask "
                       f"{base.mean('pending_whole_gpus', days):.0f})",
                       100 * (raw - raw_base) / max(raw_base, 1.0), "%"),
        results.Figure(f"{s}: pending GPU pods over the baseline's ("
                       f"{loop.mean('pending_gpu_pods', days):.1f} vs "
                       f"{base.mean('pending_gpu_pods', days):.1f})",
                       loop.mean("pending_gpu_pods", days) - base.mean("pending_gpu_pods", days),
                       "pods", t("<=", 0.0)),
        results.Figure(f"{s}: evictions in any 24 hours, the most, over the running GPU pods "
                       f"the cycle read ({loop.evictions} in {days:g} days)",
                       100 * loop.max_day_eviction_ratio(),
                       "% of running GPU pods", t("<=", 1.0)),
        results.Figure(f"{s}: pods moved twice within a day", loop.moved_twice_within_day,
                       "pods", t("<=", 0.0)),
        results.Figure(f"{s}: nodes defrag made flap (a move's source and target within a "
                       "day, or a landing turned it on again within a day)",
                       len(loop.flapped), "nodes", t("<=", 0.0)),
        results.Figure(f"{s}: nodes whose trigger went on, off, on within a day, any cause "
                       f"(baseline, which never moves a pod: {len(base.oscillated)})",
                       len(loop.oscillated), "nodes"),
        results.Figure(f"{s}: readings above the share held, out of sample "
                       f"({loop.over_share.over} of {loop.over_share.samples})",
                       100 * loop.over_share.ratio, "%", t("<=", 1.0)),
        results.Figure(f"{s}: over-shares not raised within a cycle (of {kills} killed out "
                       "of memory)", kills - loop.raised_within_cycle, "pods", t("<=", 0.0)),
        results.Figure(f"{s}: pods beyond their share for longer than a cycle",
                       loop.beyond_one_cycle, "pods", t("<=", 0.0)),
        results.Figure(f"{s}: evictions that freed a whole GPU on their source (of "
                       f"{loop.evictions}; only to right-size: "
                       f"{loop.rightsizing_only_evictions})", loop.packing_evictions,
                       "evictions"),
        results.Figure(f"{s}: whole GPUs freed by the moves, net, over {days:g} days",
                       loop.whole_gpus_freed_by_moves, "GPUs"),
        *(results.Figure(f"{s}: idle memory at the end held by pods {holder} (bound "
                         f"{100 * bound.idle_held_by.get(holder, 0.0):.1f}%)",
                         100 * share, "% of reserved")
          for holder, share in loop.idle_held_by.items()),
        results.Figure(f"{s}: GPU-hours given back by right-sizing (bound "
                       f"{bound.gpu_hours_given_back(result.settings.interval_s):,.0f})",
                       loop.gpu_hours_given_back(result.settings.interval_s), "GPU-h"),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=data_root())
    p.add_argument("--days", type=float, default=14.0)
    p.add_argument("--seeds", type=lambda x: [int(v) for v in _numbers(x)],
                   default=list(DEFAULT_SEEDS))
    p.add_argument("--rollouts", type=_numbers, default=list(DEFAULT_ROLLOUTS),
                   help="rollout cadences (days) of the sweep, at the first seed")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    p.add_argument("--out", type=Path, help="write each run's waste_loop.png here")
    results.add_arguments(p, "defrag_targets")
    args = p.parse_args(argv)
    start = results.Start.now()
    nodes_csv = args.data / "openb" / "openb_node_list_gpu_node.csv"
    pods_csv = args.data / "openb" / "openb_pod_list_default.csv"
    memory_csv = args.data / "genai" / GENAI_FILE
    missing = [str(f) for f in (nodes_csv, pods_csv, memory_csv) if not f.is_file()]
    if missing:
        print(f"trace files not found: {', '.join(missing)}; pass --data or set {ENV}",
              file=sys.stderr)
        return 2
    nodes = with_gpu_memory(load_nodes(nodes_csv), 32)
    trace = read_memory_trace(memory_csv, GENAI_GPU_GIB)
    default = LoopSettings(days=args.days)
    runs = [replace(default, seed=s) for s in args.seeds]
    runs += [replace(default, seed=args.seeds[0], rollout_days=r) for r in args.rollouts
             if r != default.rollout_days]
    jobs = [(nodes, pods_csv, trace, s, pods_csv.stem) for s in runs]
    started = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            done = list(pool.map(_run, jobs))
    else:
        done = [_run(j) for j in jobs]
    wall = time.perf_counter() - started
    figures: list[results.Figure] = []
    by_rollout: dict[float, LoopResult] = {}
    for (result, seconds), settings in zip(done, runs, strict=True):
        print(table(result))
        print(f"  ({seconds:.0f} s)\n")
        if args.out is not None:
            plot(result, args.out / f"seed{settings.seed}-rollout{settings.rollout_days:g}")
        if settings.rollout_days == default.rollout_days:
            figures += figures_of(result, settings.seed)
        if settings.seed == args.seeds[0]:
            by_rollout[settings.rollout_days] = result
    for rollout in sorted(by_rollout):
        result = by_rollout[rollout]
        found = targets(result)
        missed = ", ".join(t.name for t in found if not t.met) or "none"
        loop, bound = result.arms[LOOP], result.arms[BOUND]
        line = (f"rollouts every {rollout:g} days (seed {args.seeds[0]}): targets met "
                f"(of {len(found)}; missed: {missed})")
        print(f"{line}: {sum(t.met for t in found)}; idle "
              f"{loop.mean('idle_ratio', args.days):.1%} (bound "
              f"{bound.mean('idle_ratio', args.days):.1%}), evictions {loop.evictions}")
        figures.append(results.Figure(line, sum(t.met for t in found), "targets"))
        figures.append(results.Figure(
            f"rollouts every {rollout:g} days: idle ratio above the bound's", 100 * (
                loop.mean("idle_ratio", args.days) - bound.mean("idle_ratio", args.days)),
            "pp"))
    figures.append(results.Figure(
        f"wall time, {len(runs)} runs of {args.days:g} days x 3 arms on {args.jobs} "
        f"process(es)", wall, "s"))
    results.record(args, "defrag_targets", start, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
