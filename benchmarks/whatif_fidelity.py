"""Fidelity and speed of the what-if simulator on the openb trace.

Prints, per policy, the mean allocation at 100% and 130% arrived demand over N seeds next to the
FGD paper's published means, the difference, and whether the ranking matches; then the time and
peak memory of one FGD replay on one core, and the wall time of the whole sweep.

    python -m benchmarks.whatif_fidelity [--data ../shared/data/openb] [--seeds 10] [--jobs 2]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from scheduler.core import TargetWorkload
from scheduler.policies import POLICY_NAMES
from simulations.cli import run_one
from simulations.openb import load_nodes, load_pods

# Mean GPU allocation (%) at 130% arrived demand, openb default trace (Weng et al., ATC '23).
PUBLISHED_130 = {"random": 87.47, "dotprod": 90.85, "gpu-clustering": 91.88,
                 "gpu-packing": 92.00, "bestfit": 93.08, "fgd": 95.39}


def _one_fgd_replay(nodes_csv: str, pods_csv: str) -> tuple[float, float, float]:
    """CPU seconds and wall seconds of one FGD replay, and this process's peak RSS (MiB)."""
    nodes = load_nodes(nodes_csv)
    pods = load_pods(pods_csv)
    target = TargetWorkload.from_pods(pods)
    wall, cpu = time.perf_counter(), time.process_time()
    run_one("default", nodes, pods, "fgd", 42, 1.3, target)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return cpu, wall, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/openb"))
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    nodes_csv = args.data / "openb_node_list_gpu_node.csv"
    pods_csv = args.data / "openb_pod_list_default.csv"
    if not nodes_csv.exists():
        print(f"openb trace not found under {args.data}; pass --data", file=sys.stderr)
        return 2

    # Speed and memory first, in a fresh process with nothing else of ours running.
    with ProcessPoolExecutor(max_workers=1) as pool:
        job = pool.submit(_one_fgd_replay, str(nodes_csv), str(pods_csv))
        cpu_s, wall_s, rss_mib = job.result()
    print(f"one FGD replay, default trace, tune 1.3: {cpu_s:.2f} s CPU, {wall_s:.2f} s wall, "
          f"peak RSS {rss_mib:.0f} MiB (targets: <= 5 s on one core, < 1024 MiB)")

    nodes = load_nodes(nodes_csv)
    pods = load_pods(pods_csv)
    target = TargetWorkload.from_pods(pods)
    seeds = list(range(42, 42 + args.seeds))
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {(p, s): pool.submit(run_one, "default", nodes, pods, p, s, 1.3, target)
                   for p in POLICY_NAMES for s in seeds}
        records = {k: f.result() for k, f in futures.items()}
    sweep_s = time.perf_counter() - started

    print(f"\n{len(POLICY_NAMES)} policies x {len(seeds)} seeds (openb default, tune 1.3): "
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
