"""``gpufrag inspect`` on a large cluster: wall time and peak memory, each in a fresh process.

The cluster is the extender latency benchmark's (synthetic openb node mix, filled to
``--occupancy`` of the GPU share), written as a snapshot. Each round runs, one after the other
in new processes: the reference, which only reads the snapshot file
(``scheduler.kube.snapshot.read_snapshot``, the floor any command reading it pays), and
``gpufrag inspect --snapshot FILE -o json``. Prints the median of ``--rounds`` rounds, the
peak RSS of each, and inspect's ratio to the reference, with the load average.

    python -m benchmarks.inspect_scale [--nodes 5000] [--rounds 3] [--occupancy 0.75]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.extender_latency import build_cluster

READ_ONLY = ("import sys\nfrom scheduler.kube.snapshot import read_snapshot\n"
             "read_snapshot(sys.argv[1])\n")


def run(command: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of ``command`` in a new process (its own rusage)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise SystemExit(f"{command[:4]} exited {process.returncode}")
    return seconds, usage.ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.inspect_scale",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--occupancy", type=float, default=0.75)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.nodes < 1 or args.rounds < 1 or not 0.0 < args.occupancy < 1.0:
        p.error("--nodes and --rounds must be >= 1, --occupancy in (0, 1)")
    with tempfile.TemporaryDirectory() as folder:
        cluster = build_cluster(args.nodes, args.occupancy, args.seed, Path(folder))
        snapshot = str(cluster.snapshot)
        reference, inspect, rss_ref, rss_inspect = [], [], 0.0, 0.0
        for _ in range(args.rounds):
            seconds, rss_ref = run([sys.executable, "-c", READ_ONLY, snapshot])
            reference.append(seconds)
            seconds, rss_inspect = run([sys.executable, "-m", "gpufrag.cli", "inspect",
                                        "--snapshot", snapshot, "-o", "json"])
            inspect.append(seconds)
    ref, ins = statistics.median(reference), statistics.median(inspect)
    print(f"cluster: {args.nodes:,} nodes, {cluster.pods_placed:,} pods, "
          f"{cluster.gpu_allocated:.0%} of the GPU share allocated; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"read the snapshot only (reference): {ref:.2f} s median of {args.rounds} "
          f"{[round(s, 2) for s in reference]}, peak RSS {rss_ref:.0f} MiB")
    print(f"gpufrag inspect -o json:            {ins:.2f} s median of {args.rounds} "
          f"{[round(s, 2) for s in inspect]}, peak RSS {rss_inspect:.0f} MiB")
    print(f"inspect / reference: {ins / ref:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
