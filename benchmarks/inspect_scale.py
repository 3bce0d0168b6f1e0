"""``gpufrag inspect`` on a large cluster: wall time and peak memory, each in a fresh process.

The cluster is the extender latency benchmark's (synthetic openb node mix, filled to
``--occupancy`` of the GPU share), written as a snapshot. Each round runs, one after the other
in new processes: the reference, which only reads the snapshot file
(``benchmarks.snapshot_read``, the floor any command reading it pays), and
``gpufrag inspect --snapshot FILE -o json``, then the same with ``--summary --plot FILE.png``
(the fleet in a few lines and in one picture, from the same read; the picture is the compact
form, a pixel row per node). Prints the median of ``--rounds`` rounds, the peak RSS of each,
inspect's ratio to the reference, and the picture's size, with the load average.

    python -m benchmarks.inspect_scale [--nodes 5000] [--rounds 3] [--occupancy 0.75]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks import results
from benchmarks.extender_latency import build_cluster
from benchmarks.procstat import peak_rss_command, read_peak_rss_mib


def run(module: str, args: list[str], folder: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of ``python -m module args`` in a new process (its
    own peak: see ``benchmarks.procstat.peak_rss_command``)."""
    report = os.path.join(folder, "peak")
    started = time.perf_counter()
    process = subprocess.run([*peak_rss_command(module, report), *args],
                             stdout=subprocess.DEVNULL, check=False)
    seconds = time.perf_counter() - started
    if process.returncode:
        raise SystemExit(f"{module} exited {process.returncode}")
    return seconds, read_peak_rss_mib(report)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.inspect_scale",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--occupancy", type=float, default=0.75)
    p.add_argument("--seed", type=int, default=0)
    results.add_arguments(p, "inspect_scale")
    args = p.parse_args(argv)
    start = results.Start.now()
    if args.nodes < 1 or args.rounds < 1 or not 0.0 < args.occupancy < 1.0:
        p.error("--nodes and --rounds must be >= 1, --occupancy in (0, 1)")
    with tempfile.TemporaryDirectory() as folder:
        cluster = build_cluster(args.nodes, args.occupancy, args.seed, Path(folder))
        snapshot = str(cluster.snapshot)
        reference, inspect, fleet, rss_ref, rss_inspect, rss_fleet = [], [], [], 0.0, 0.0, 0.0
        picture = Path(folder) / "fleet.png"
        for _ in range(args.rounds):
            seconds, rss_ref = run("benchmarks.snapshot_read", [snapshot], folder)
            reference.append(seconds)
            seconds, rss_inspect = run("gpufrag.cli", ["inspect", "--snapshot", snapshot,
                                                       "-o", "json"], folder)
            inspect.append(seconds)
            seconds, rss_fleet = run("gpufrag.cli", ["inspect", "--snapshot", snapshot,
                                                     "--summary", "--plot", str(picture),
                                                     "-o", "json"], folder)
            fleet.append(seconds)
        picture_kib = picture.stat().st_size / 1024
    ref, ins = statistics.median(reference), statistics.median(inspect)
    both = statistics.median(fleet)
    print(f"cluster: {args.nodes:,} nodes, {cluster.pods_placed:,} pods, "
          f"{cluster.gpu_allocated:.0%} of the GPU share allocated; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"read the snapshot only (reference): {ref:.2f} s median of {args.rounds} "
          f"{[round(s, 2) for s in reference]}, peak RSS {rss_ref:.0f} MiB")
    print(f"gpufrag inspect -o json:            {ins:.2f} s median of {args.rounds} "
          f"{[round(s, 2) for s in inspect]}, peak RSS {rss_inspect:.0f} MiB")
    print(f"gpufrag inspect --summary --plot:   {both:.2f} s median of {args.rounds} "
          f"{[round(s, 2) for s in fleet]}, peak RSS {rss_fleet:.0f} MiB, picture "
          f"{picture_kib:.0f} KiB")
    print(f"inspect / reference: {ins / ref:.2f}x")
    size = f"{args.nodes:,} nodes, {cluster.pods_placed:,} pods"
    # No target figure was ever set for inspect: the figures are said, not judged.
    results.record(args, "inspect_scale", start, [
        results.Figure(f"gpufrag inspect -o json, {size}, median of {args.rounds}",
                       round(ins, 2), "s"),
        results.Figure("gpufrag inspect -o json, peak RSS", round(rss_inspect), "MiB"),
        results.Figure(f"gpufrag inspect --summary --plot FILE.png, {size}, median of "
                       f"{args.rounds}", round(both, 2), "s"),
        results.Figure("gpufrag inspect --summary --plot FILE.png, peak RSS", round(rss_fleet),
                       "MiB"),
        results.Figure("the picture (PNG, a pixel row per node)", round(picture_kib), "KiB"),
        results.Figure("reading the snapshot alone (reference)", round(ref, 2), "s"),
        results.Figure("reading the snapshot alone, peak RSS", round(rss_ref), "MiB"),
    ])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
