"""How long does planning one defrag cycle take on a big cluster? Target: <= 2 s on one core
for 5,000 nodes and 50,000 pods.

The cluster: ``synthetic_nodes(5000)`` (the openb node mix, ~25,000 GPUs), filled at random
(the fragmentation a fragmentation-blind scheduler leaves) with 50,000 pods — 15% CPU-only,
65% GPU shares (openb's share sizes), 20% one whole GPU — each using a Beta(10.8, 11.7) share
of what it reserves (the GenAI trace's shape), so nearly every node is over the 25% idle memory
threshold and every small pod is a candidate. Timed: ``defrag.controller.planner.plan`` end to end
(measure, triggers, candidates, ranking, scoring with FGD through the core's ``choose``, the
predicted "after", restoring the snapshot), best of ``--repeat`` runs, for the CronJob's
default budget (10 evictions) and bigger ones.

    .venv/bin/python benchmarks/defrag_planner.py [--nodes 5000] [--pods 50000]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, as the target says
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from benchmarks import results
from defrag.controller.config import DefragConfig, Limits
from defrag.controller.model import Snapshot, snapshot_of_state
from defrag.controller.planner import plan
from scheduler.core import ClusterState, PodRequest, TargetWorkload
from scheduler.policies import make_policy
from simulations.defrag_whatif import with_gpu_memory
from simulations.rightsizing import SYNTHETIC_BETA
from simulations.synthetic import SHARE_CPU, SHARE_MILLI, WHOLE_CPU, synthetic_nodes

TARGET_S = 2.0


def build(node_count: int, pod_count: int, seed: int = 0) -> tuple[Snapshot, TargetWorkload]:
    rng = np.random.default_rng(seed)
    nodes = with_gpu_memory(synthetic_nodes(node_count, seed=seed), 32)
    state = ClusterState(nodes)
    share_milli = np.array([m for m, _ in SHARE_MILLI])
    share_p = np.array([w for _, w in SHARE_MILLI])
    share_cpu = np.array([c for c, _ in SHARE_CPU])
    whole_cpu = np.array([c for c, _ in WHOLE_CPU])
    pending: list[PodRequest] = []
    used: dict[str, float] = {}
    placed = attempts = 0
    width = state.gpu_width
    while placed < pod_count and attempts < 2 * pod_count:
        attempts += 1
        kind = rng.random()
        if kind < 0.15:
            pod = PodRequest(f"p{attempts}", namespace="bench", cpu_milli=4000, memory_mib=8192)
        elif kind < 0.80:
            pod = PodRequest(f"p{attempts}", namespace="bench",
                             cpu_milli=int(rng.choice(share_cpu)), memory_mib=4096, num_gpu=1,
                             gpu_milli=int(rng.choice(share_milli, p=share_p / share_p.sum())))
        else:
            pod = PodRequest(f"p{attempts}", namespace="bench",
                             cpu_milli=int(rng.choice(whole_cpu)), memory_mib=8192, num_gpu=1,
                             gpu_milli=1000)
        for row in rng.integers(0, state.size, size=8):  # a random node that fits, if any
            row = int(row)
            if state.cpu_left[row] < pod.cpu_milli or state.mem_left[row] < pod.memory_mib:
                continue
            gpus: tuple[int, ...] = ()
            if pod.wants_gpu:
                fits = np.flatnonzero(state.gpu_free[row, :width] >= pod.gpu_milli)
                fits = fits[fits < state.gpu_count[row]]
                if fits.size == 0:
                    continue
                gpus = (int(rng.choice(fits)),)
            state.place(pod, row, gpus, check=False)
            if pod.wants_gpu:
                used[f"bench/{pod.name}"] = float(rng.beta(*SYNTHETIC_BETA)) * (
                    pod.gpu_milli / 1000 * float(state.gpu_memory_mib[row]))
            placed += 1
            break
        else:
            if pod.wants_gpu and len(pending) < 500:
                pending.append(pod)
    snap = snapshot_of_state(state, used, pending=pending)
    requests = [p.pod for p in state.pods.values()] + pending
    return snap, TargetWorkload.from_pods(requests)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods", type=int, default=50_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--budgets", default="10,100", help="comma-separated --max-evictions-total")
    results.add_arguments(p, "defrag_planner")
    args = p.parse_args(argv)
    start = results.Start.now()
    figures: list[results.Figure] = []
    started = time.perf_counter()
    snap, workload = build(args.nodes, args.pods)
    gpus = int(snap.state.gpu_count[: snap.state.size].sum())
    print(f"cluster: {snap.state.size} nodes, {gpus} GPUs, {len(snap.state.pods)} pods placed, "
          f"{len(snap.pending)} pending (built in {time.perf_counter() - started:.1f}s)")
    policy = make_policy("fgd", workload=workload)
    worst = 0.0
    for budget in (int(b) for b in args.budgets.split(",")):
        config = DefragConfig(limits=Limits(per_node=2, per_namespace=budget, total=budget))
        times = []
        result = None
        for _ in range(args.repeat):
            t = time.perf_counter()
            result = plan(snap, policy, workload, config)
            times.append(time.perf_counter() - t)
        assert result is not None
        best = min(times)
        worst = max(worst, best) if budget == 10 else worst
        figures.append(results.Figure(
            f"plan, budget {budget}, {args.nodes:,} nodes / {args.pods:,} pods (best of "
            f"{args.repeat})", round(best, 3), "s",
            results.Target("<=", TARGET_S) if budget == 10 else None))
        print(f"  budget {budget:>4}: plan {best:.3f}s (best of {args.repeat}; "
              f"runs {', '.join(f'{x:.3f}' for x in times)}), {len(result.moves)} moves, "
              f"{result.scored} scored, {len(result.triggered)} triggered nodes, free whole "
              f"GPUs {result.before.free_whole_gpus} -> {result.after.free_whole_gpus}")
    verdict = "met" if worst <= TARGET_S else "NOT met"
    print(f"target: <= {TARGET_S:g}s for the default budget on one core: {verdict} "
          f"({worst:.3f}s)")
    results.record(args, "defrag_planner", start, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
