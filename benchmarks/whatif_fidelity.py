"""Fidelity, speed and memory of the static what-if simulator on the openb trace.

Prints, per policy, the mean allocation at 100% and 130% arrived demand over N seeds next to the
FGD paper's published means, the difference, and whether the ranking matches; before that, one
FGD replay on one core with the compiled fragmentation kernel and with the numpy form side by
side (each in a fresh process, twice: the first run includes loading the kernel; each engine
by the real command in new processes: ``benchmarks.whatif_first_run``), and the peak RSS of
the whole ``gpufrag whatif`` command for that replay.

    python -m benchmarks.whatif_fidelity [--data DIR] [--seeds 10] [--jobs 2] [--kss-compat]

``--data`` defaults to ``openb/`` under the data root (``GPUFRAG_DATA_ROOT``, see
:mod:`gpufrag.dataroot`).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks import results
from gpufrag.dataroot import ENV, data_root
from scheduler.core import TargetWorkload, fragkernel
from scheduler.policies import POLICY_NAMES
from simulations.cli import run_one
from simulations.kss import kss_target
from simulations.openb import load_nodes, load_pods

# Mean GPU allocation (%) at 130% arrived demand, openb default trace (Weng et al., ATC '23).
PUBLISHED_130 = {"random": 87.47, "dotprod": 90.85, "gpu-clustering": 91.88,
                 "gpu-packing": 92.00, "bestfit": 93.08, "fgd": 95.39}


def _one_fgd_replay(nodes_csv: str, pods_csv: str, kss_compat: bool) -> list[float]:
    """CPU seconds of two FGD replays in this (fresh) process, then its peak RSS (MiB)."""
    nodes = load_nodes(nodes_csv)
    pods = load_pods(pods_csv)
    target = kss_target(pods) if kss_compat else TargetWorkload.from_pods(pods)
    out = []
    for _ in range(2):
        cpu = time.process_time()
        run_one("default", nodes, pods, "fgd", 42, 1.3, target, kss_compat)
        out.append(time.process_time() - cpu)
    return [*out, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024]


def _timed_in_fresh_process(nodes_csv: Path, pods_csv: Path, kss_compat: bool,
                            jit: bool) -> list[float]:
    # Read by the worker at first use: the preferred compiled engine, or the numpy form. The
    # worker is spawned, not forked: a fork inherits this process's engine, chosen once (by
    # fragkernel.engine() here), and would time the compiled kernel as "the numpy form".
    os.environ["GPUFRAG_KERNEL"] = fragkernel.engine() if jit else "numpy"
    try:
        with ProcessPoolExecutor(max_workers=1,
                                 mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(_one_fgd_replay, str(nodes_csv), str(pods_csv),
                               kss_compat).result()
    finally:
        os.environ.pop("GPUFRAG_KERNEL", None)


def _command_peak_rss_mib(nodes_csv: Path, pods_csv: Path,
                          kss_compat: bool) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of ``gpufrag whatif`` for one FGD replay, as run."""
    with tempfile.TemporaryDirectory() as out:
        argv = [sys.executable, "-m", "gpufrag.cli", "whatif", "--nodes", str(nodes_csv),
                "--pods", str(pods_csv), "--policies", "fgd", "--seeds", "42", "--jobs", "1",
                "--out", out, *(["--kss-compat"] if kss_compat else [])]
        started = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        wall = time.perf_counter() - started
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, default=data_root() / "openb")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--kss-compat", action="store_true",
                        help="replay as the FGD authors' simulator does "
                        "(gpufrag whatif --kss-compat)")
    results.add_arguments(parser, "whatif_fidelity")
    args = parser.parse_args(argv)
    start = results.Start.now()
    nodes_csv = args.data / "openb_node_list_gpu_node.csv"
    pods_csv = args.data / "openb_pod_list_default.csv"
    if not nodes_csv.exists():
        print(f"openb trace not found under {args.data}; pass --data or set {ENV}",
              file=sys.stderr)
        return 2
    mode = " (KSS-compatible)" if args.kss_compat else ""

    # Speed and memory first, each in a fresh process with nothing else of ours running.
    jit = _timed_in_fresh_process(nodes_csv, pods_csv, args.kss_compat, jit=True)
    plain = _timed_in_fresh_process(nodes_csv, pods_csv, args.kss_compat, jit=False)
    print(f"one FGD replay{mode}, default trace, tune 1.3, CPU seconds on one core "
          "(first run in a fresh process, second run):")
    print(f"  compiled kernel ({fragkernel.engine()}): {jit[0]:.2f} s, {jit[1]:.2f} s "
          f"(peak RSS {jit[2]:.0f} MiB)")
    print(f"  numpy form:      {plain[0]:.2f} s, {plain[1]:.2f} s (peak RSS {plain[2]:.0f} MiB)")
    print(f"  ratio numpy / compiled (second runs): {plain[1] / jit[1]:.2f}x (target: <= 1 s)")
    wall, rss = _command_peak_rss_mib(nodes_csv, pods_csv, args.kss_compat)
    print(f"whole `gpufrag whatif` command for it (load, replay, CSVs, plots): {wall:.2f} s wall, "
          f"peak RSS {rss:.0f} MiB ({rss * 1.048576:.0f} MB)")
    figures = [
        results.Figure(f"one FGD replay{mode}, {fragkernel.engine()} kernel, CPU on one core, "
                       "second run in the process", round(jit[1], 3), "s",
                       results.Target("<=", 1.0)),
        results.Figure(f"one FGD replay{mode}, {fragkernel.engine()} kernel, first run in a "
                       "fresh process", round(jit[0], 3), "s"),
        results.Figure(f"one FGD replay{mode}, numpy form, second run", round(plain[1], 3), "s"),
        results.Figure("whole `gpufrag whatif` command for one FGD replay, peak RSS",
                       round(rss), "MiB", results.Target("<", 1024)),
    ]

    nodes = load_nodes(nodes_csv)
    pods = load_pods(pods_csv)
    target = kss_target(pods) if args.kss_compat else TargetWorkload.from_pods(pods)
    seeds = list(range(42, 42 + args.seeds))
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {(p, s): pool.submit(run_one, "default", nodes, pods, p, s, 1.3, target,
                                       args.kss_compat)
                   for p in POLICY_NAMES for s in seeds}
        records = {k: f.result() for k, f in futures.items()}
    sweep_s = time.perf_counter() - started

    print(f"\n{len(POLICY_NAMES)} policies x {len(seeds)} seeds{mode} (openb default, tune 1.3): "
          f"{sweep_s:.1f} s wall on {args.jobs} processes (target: <= 300 s)\n")
    head = f"{'policy':<16}{'alloc@100':>10}{'alloc@130':>10}{'±sd':>7}{'paper@130':>10}{'diff':>7}"
    print(head)
    print("-" * len(head))
    means = {}
    for policy in POLICY_NAMES:
        series = np.array([records[(policy, s)].series("allocation", 131) for s in seeds])
        at100, at130 = series[:, 100].mean(), series[:, 130].mean()
        means[policy] = at130
        diff = at130 - PUBLISHED_130[policy]
        print(f"{policy:<16}{at100:>10.2f}{at130:>10.2f}{series[:, 130].std():>7.2f}"
              f"{PUBLISHED_130[policy]:>10.2f}{diff:>+7.2f}")
    ours = sorted(means, key=means.__getitem__, reverse=True)
    paper = sorted(PUBLISHED_130, key=PUBLISHED_130.__getitem__, reverse=True)
    print(f"\nranking (ours):  {' > '.join(ours)}\nranking (paper): {' > '.join(paper)}")
    within = sum(abs(means[p] - PUBLISHED_130[p]) <= 0.5 for p in POLICY_NAMES)
    print(f"within 0.5 pp of the paper at 130%: {within}/{len(POLICY_NAMES)} policies")
    figures.append(results.Figure(
        f"{len(POLICY_NAMES)} policies x {len(seeds)} seeds, wall on {args.jobs} processes",
        round(sweep_s, 1), "s", results.Target("<=", 300.0)))
    for policy in POLICY_NAMES:
        series = np.array([records[(policy, s)].series("allocation", 131) for s in seeds])
        figures += [
            results.Figure(f"{policy}: alloc @100%", round(series[:, 100].mean(), 2), "%"),
            results.Figure(f"{policy}: alloc @130% (±sd {series[:, 130].std():.2f})",
                           round(means[policy], 2), "%"),
            results.Figure(f"{policy}: distance from the paper's {PUBLISHED_130[policy]} "
                           "@130%", round(abs(means[policy] - PUBLISHED_130[policy]), 2), "pp",
                           results.Target("<=", 0.5))]
    figures.append(results.Figure("policies ranked in the paper's order (1 = yes)",
                                  float(ours == paper), "", results.Target(">=", 1.0)))
    results.record(args, "whatif_fidelity", start, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
