"""Latency of the extender's filter and prioritize for pods asking MIG instances, over HTTP.

A cluster of MIG nodes (8 H100s each, every node cut in one full layout of the family drawn at
random, as NVIDIA's MIG manager applies a ``devices: all`` config; a share of the instances
held by bound pods asking them) is written as a snapshot and served by ``gpufrag extender
--cluster-snapshot``, the production server; then driven as kube-scheduler drives an extender
with ``nodeCacheCapable: true``: filter with every node's name, prioritize with those that
passed (``filter.answer: feasible``), and the deciding filter apart (``decide``, the default).
The server and the measurement are :mod:`benchmarks.extender_latency`'s.

    python -m benchmarks.mig_extender_latency [--sizes 1000] [--requests 500] [--held 0.6]
"""

from __future__ import annotations

import argparse
import http.client
import random
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

import numpy as np
import orjson

from benchmarks import results
from benchmarks.extender_latency import call, free_port, ms, sequential, start_server, stop_server
from scheduler.core.mig import MIG_MODELS
from scheduler.core.mig_layout import full_layouts
from scheduler.kube.mignodes import mig_node_to_k8s, mig_pod_to_k8s
from scheduler.kube.snapshot import write_snapshot

GPUS = 8
PRODUCT, MEMORY_MIB = "NVIDIA-H100-80GB-HBM3", 81_559
MAX_NODES = 20_000
ASKED = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


def build(size: int, held: float, seed: int, folder: Path) -> tuple[Path, list[str], int]:
    rng = random.Random(seed)
    layouts = full_layouts(MIG_MODELS["H100-80GB"])
    nodes, pods = [], []
    for n in range(size):
        name = f"mig-{n:05d}"
        counts = {p: c * GPUS for p, c in rng.choice(layouts).counts}
        nodes.append(mig_node_to_k8s(name, PRODUCT, MEMORY_MIB, GPUS, counts))
        pods += [mig_pod_to_k8s(f"{name}-{p}-{i}", {p: 1}, node=name, namespace="bench")
                 for p, c in counts.items() for i in range(c) if rng.random() < held]
    path = folder / f"mig-{size}.json"
    write_snapshot(path, nodes, pods)
    return path, [n["metadata"]["name"] for n in nodes], len(pods)


def _usage(message: str) -> NoReturn:
    """A one-line usage error naming what is wrong, exit 2."""
    print(f"mig_extender_latency: {message}", file=sys.stderr)
    raise SystemExit(2)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        _usage(f"--sizes must be node counts separated by commas, got {text!r}")
    if not all(1 <= s <= MAX_NODES for s in sizes):
        _usage(f"--sizes must be 1..{MAX_NODES} nodes each, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000")
    parser.add_argument("--requests", default="500", help="sequential, per verb")
    parser.add_argument("--held", default="0.6", help="share of instances in use, 0..1")
    parser.add_argument("--threads", default="8", help="server request threads")
    parser.add_argument("--seed", default="1")
    results.add_arguments(parser, "mig_extender_latency")
    args = parser.parse_args(argv)
    start = results.Start.now()
    figures: list[results.Figure] = []
    sizes = _sizes(args.sizes)
    try:
        requests, threads, seed = int(args.requests), int(args.threads), int(args.seed)
        held = float(args.held)
    except ValueError:
        _usage(f"--requests, --threads and --seed must be integers and --held a number, got "
               f"{args.requests!r}, {args.threads!r}, {args.seed!r}, {args.held!r}")
    if requests < 1 or threads < 1:
        _usage(f"--requests and --threads must be at least 1, got {requests}, {threads}")
    if not 0 <= held <= 1:
        _usage(f"--held must be in [0, 1], got {held}")
    print(f"gpufrag extender over HTTP, MIG pods ({', '.join(ASKED)}), {GPUS} H100 per node")
    print(f"{'nodes':>6} {'pods':>6}  {'verb':<11} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'1st/shape p50 ms':>16}")
    with tempfile.TemporaryDirectory(prefix="gpufrag-mig-bench-") as folder:
        for size in sizes:
            snapshot, names, placed = build(size, held, seed, Path(folder))
            bodies = [orjson.dumps({"Pod": mig_pod_to_k8s(f"ask-{p}", {p: 1}, namespace="bench"),
                                    "Nodes": None, "NodeNames": names}) for p in ASKED]
            rows: list[tuple[str, np.ndarray, list[float]]] = []
            for answer in ("feasible", "decide"):
                port = free_port()
                server = start_server(snapshot, port, threads, "warning", answer)
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                    first, prioritize, first_p = [], [], []
                    for body in bodies:
                        elapsed, data = call(conn, "/filter", body)
                        first.append(elapsed)
                        if answer == "feasible":
                            passed = orjson.loads(data)["NodeNames"] or names[:1]
                            prioritize.append(orjson.dumps({
                                "Pod": orjson.loads(body)["Pod"], "Nodes": None,
                                "NodeNames": passed}))
                            first_p.append(call(conn, "/prioritize", prioritize[-1])[0])
                    conn.close()
                    if answer == "feasible":
                        rows.append(("filter", sequential(port, "/filter", bodies,
                                                          requests), first))
                        rows.append(("prioritize", sequential(port, "/prioritize", prioritize,
                                                              requests), first_p))
                    else:
                        rows.append(("filter*", sequential(port, "/filter", bodies,
                                                           requests), first))
                finally:
                    stop_server(server)
            for verb, lat, first_times in rows:
                print(f"{size:>6} {placed:>6}  {verb:<11} {ms(lat, 50):>7.2f} "
                      f"{ms(lat, 99):>7.2f} {ms(first_times, 50):>16.2f}")
                name = "filter (decide)" if verb == "filter*" else verb
                # No target was set for MIG pods; the figures are said beside extender_latency's.
                figures += [
                    results.Figure(f"{name} p50, {size:,} nodes", round(ms(lat, 50), 2), "ms"),
                    results.Figure(f"{name} p99, {size:,} nodes", round(ms(lat, 99), 2), "ms")]
    print("filter: filter.answer feasible (every node with a free instance); filter*: "
          "decide (the default: one node, assumed; a pod filtered again first drops it)")
    results.record(args, "mig_extender_latency", start, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
