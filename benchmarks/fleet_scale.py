"""Fleet scale on the real control plane: kwok GPU nodes of the openb mix, pods from the openb
trace, scheduled by gpufrag-scheduler (deciding filter) beside the default scheduler and the
zero-cost extender in the same run, on the same fleet and the same pods.

    python -m benchmarks.fleet_scale [--nodes 1000,5000 --pods 10000,50000] [--max-demand 0.75]
        [--residents 0,0] [--data DIR] [--seed 0]
        [--failover-kills 10 --arrivals-per-s 5]

With no arguments a small fleet (CI size). ``--nodes`` and ``--pods`` are paired lists, one run
per pair, each on a fresh control plane (devkit.fleet says how the fleet is drawn, and why the
pods stop at ``--max-demand`` of the fleet's GPUs). Per size it prints, each row beside its
references: pods/s (÷ default, ÷ zero-cost), pods bound and not, GPU allocation and FGD
fragmentation reached (and the static what-if's for the same pods through the same placement
code), GPUs over-committed, kube-scheduler's own scheduling-algorithm p50/p99 (it has no
extender metric: the filter call is inside that figure, so the extender's cost is the
difference to the default row), and each process's CPU per pod. For gpufrag also: the
extender's RSS, its own filter p50/p99, the watch lag (a pod created to the extender's
``/metrics`` counting it, scrape included), and the time to ready after a restart at that size
(a full relist), and one ``gpufrag defrag --dry-run`` cycle. With ``--failover-kills``, the
same pods once more under two gpufrag-scheduler replicas whose leader is killed while they
arrive (devkit.failover). With two sizes or more, how each figure grew against the node count.

``--residents`` (paired with ``--nodes``): pods bound before the rows, straight to their nodes
(devkit.fleet: GPU pods of the same draw scattered over the fleet, then per-node system pods),
so a 5,000-node fleet holds 50,000 pods without an hour of scheduling them one by one here: the
extender lists, caches and watches them all, the rows place their pods among them, and the
placement columns count them, as does the what-if, which starts from them too.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import kubernetes
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import results
from benchmarks.procstat import peak_rss_command, read_peak_rss_mib
from benchmarks.scheduling_throughput import ROWS, Row, Served, cpu_by_process
from devkit.build import build_control_plane
from devkit.controlplane import ControlPlane
from devkit.extender import ExtenderProcess
from devkit.failover import FailoverResult, run_failover
from devkit.fleet import (
    DEFAULT_MAX_DEMAND,
    MOVABLE_REPLICAS,
    OPENB_DIR,
    Fleet,
    Placement,
    create_movable,
    create_nodes,
    create_pods,
    create_residents,
    delete_movable,
    delete_pods,
    finish_neighbours,
    list_reservations,
    make_fleet,
    movable_ready,
    placement,
    pod_body,
    publish_usage,
    quantile,
    resident_state,
    settled,
    start_kwok,
    wait_running,
)
from devkit.procs import http_get, insecure_tls, wait_until
from devkit.stack import install_defrag_namespace, install_reservations_crd
from gpufrag.dataroot import fallback_line
from scheduler.core import TargetWorkload
from simulations.replay import replay

FLEET_ROWS = (ROWS["default"], ROWS["zero-one"], ROWS["gpufrag-decide"])
CI_NODES, CI_PODS = 40, 400
MAX_NODES, MAX_PODS = 50_000, 200_000
ALGORITHM = "scheduler_scheduling_algorithm_duration_seconds"
EXTENDER_LATENCY = "gpufrag_extender_request_duration_seconds"
LAG_PROBES = 20
# Targets of issue 26 (at 5,000 nodes / 50,000 pods).
TARGET_RSS_MIB = 1024.0
TARGET_READY_S = 30.0
TARGET_FILTER_P99_MS = 10.0
TARGET_LAG_P99_MS = 1000.0
TARGET_VS_ZERO = 0.85
TARGET_DEFRAG_S = 60.0
# The real defrag cycle: its budgets, the Deployments it may move, and how much of its share
# each of their replicas, and every other pod, uses.
MAX_EVICTIONS = 10
DEFRAG_BUDGETS = ("--max-evictions-total", str(MAX_EVICTIONS),
                  "--max-evictions-per-namespace", str(MAX_EVICTIONS),
                  "--max-evictions-per-node", "2")
MOVABLE_DEPLOYMENTS = 20
IDLE_USED = 0.2
BUSY_USED = 0.9
DEFAULT_ARRIVALS_PER_S = 5.0
MAX_ARRIVALS_PER_S = 1000.0
MAX_KILLS = 100
# Seconds per 1,000 resident pods allowed for their creation and for kwok to run them, and for
# an extender to list them at start.
RESIDENT_S_PER_1000 = 60.0


@dataclass
class RowResult:
    """What one scheduler did with the fleet's pods."""

    seconds: float
    placed: Placement
    cpu_ms_per_pod: dict[str, float]
    algorithm_ms: tuple[float, float]  # kube-scheduler's p50, p99
    running_s: float  # the last bind to kwok having every bound pod Running
    extender: dict[str, float] = field(default_factory=dict)  # gpufrag's own figures


@dataclass
class SizeResult:
    fleet: Fleet
    rows: dict[str, RowResult]
    whatif: tuple[float, float]  # FGD allocation %, fragmentation %
    load: tuple[float, float, float]
    failover: FailoverResult | None = None
    residents: str = ""  # what the fleet held before the rows (the defrag step finishes some)
    held: int = 0  # pods in the fleet: the measured ones and the residents


def histogram(text: str, name: str, match: Callable[[dict[str, str]], bool] = lambda _: True
              ) -> list[tuple[float, float]]:
    """A Prometheus histogram's cumulative (le, count) buckets, summed over the series
    ``match`` accepts."""
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == f"{name}_bucket" and match(sample.labels):
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return sorted(buckets.items())


def p50_p99_ms(buckets: list[tuple[float, float]]) -> tuple[float, float]:
    return quantile(buckets, 0.5) * 1000, quantile(buckets, 0.99) * 1000


def scheduler_metrics(plane: ControlPlane, process_name: str) -> str:
    port = plane.schedulers[process_name].port
    status, body = http_get(f"https://127.0.0.1:{port}/metrics", context=insecure_tls(),
                            token=plane.token, timeout_s=30)
    if status != 200:
        raise RuntimeError(f"kube-scheduler /metrics answered {status}: {body[:200]}")
    return body


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` (Linux), NaN when unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def metric_sum(text: str, name: str) -> float:
    """The sum of a metric family's samples (a counter's ``_total``, or a gauge)."""
    return sum(s.value for f in text_string_to_metric_families(text) if f.name == name
               for s in f.samples if not s.name.endswith("_created"))


def extender_pods(extender: ExtenderProcess) -> float:
    return metric_sum(extender.metrics(), "gpufrag_extender_pods")


def counted(extender: ExtenderProcess, pods: float) -> bool:
    return extender_pods(extender) == pods


def watch_lag_ms(plane: ControlPlane, extender: ExtenderProcess, namespace: str, node: str
                 ) -> list[float]:
    """Create-to-counted times of pods bound straight to ``node`` (no GPU, 1m CPU), as the
    extender's /metrics shows them: the watch's delivery plus the cache's update, plus one
    scrape at most."""
    core = kubernetes.client.CoreV1Api(plane.api_client())
    lags = []
    for i in range(LAG_PROBES):
        before = extender_pods(extender)
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"lag-{i}"},
                "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0, "containers": [
                    {"name": "main", "image": "gpufrag-e2e:none",
                     "resources": {"requests": {"cpu": "1m"}}}]}}
        create_pods(plane, namespace, [body])
        created = time.perf_counter()
        wait_until(partial(counted, extender, before + 1), timeout_s=60,
                   what="the extender to count a new pod", interval_s=0.005)
        lags.append((time.perf_counter() - created) * 1000)
        core.delete_namespaced_pod(f"lag-{i}", namespace, grace_period_seconds=0)
        wait_until(partial(counted, extender, before), timeout_s=60,
                   what="the extender to drop a deleted pod", interval_s=0.01)
    return lags


def apiserver_requests(plane: ControlPlane) -> dict[str, float]:
    """The API server's requests so far, by verb (all clients)."""
    status, body = http_get(f"{plane.server}/metrics", context=insecure_tls(),
                            token=plane.token, timeout_s=30)
    if status != 200:
        raise RuntimeError(f"kube-apiserver /metrics answered {status}: {body[:200]}")
    verbs: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        if family.name == "apiserver_request":
            for sample in family.samples:
                if sample.name == "apiserver_request_total":
                    verb = sample.labels.get("verb", "")
                    verbs[verb] = verbs.get(verb, 0.0) + sample.value
    return verbs


def defrag_cycle(plane: ControlPlane, namespace: str, *, dry_run: bool) -> dict[str, float]:
    """One ``gpufrag defrag`` cycle over the fleet (``--dry-run``, or a real one with the
    budgets of :data:`DEFRAG_BUDGETS`): wall time, peak RSS, exit code, moves planned and,
    when real, moves by outcome, and the API server's requests by verb meanwhile (all
    clients). Keys start ``defrag_`` (``defrag_real_`` for a real cycle)."""
    before = apiserver_requests(plane)
    started = time.perf_counter()
    kind = "dry-run" if dry_run else "real"
    log_path = plane.logs_dir / f"defrag-{kind}.log"
    peak_path = str(plane.logs_dir / f"defrag-{kind}.peak")
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [*peak_rss_command("gpufrag.cli", peak_path), "defrag", "--kubeconfig",
             str(plane.kubeconfig_path), "--namespaces", namespace, "--move-not-actionable",
             "--output", "json", *(("--dry-run",) if dry_run else DEFRAG_BUDGETS)],
            stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        out = process.stdout.read() if process.stdout is not None else b""
        process.wait()
    wall = time.perf_counter() - started
    if process.returncode:
        tail = log_path.read_text(errors="replace").splitlines()[-5:]
        print(f"gpufrag defrag exited {process.returncode}; the end of its log:",
              *tail, sep="\n  ", file=sys.stderr, flush=True)
    after = apiserver_requests(plane)
    docs = [json.loads(line) for line in out.splitlines() if line.startswith(b"{")]
    moves = sum(len(d.get("moves", [])) for d in docs if d.get("kind") == "plan")
    prefix = "defrag_" if dry_run else "defrag_real_"
    figures = {"s": wall, "rss_mib": read_peak_rss_mib(peak_path),
               "exit": float(process.returncode), "moves": float(moves)}
    for doc in docs:
        if doc.get("kind") == "result" and not dry_run:
            for move in doc.get("moves") or []:
                outcome = f"outcome_{str(move.get('outcome')).replace(' ', '_')}"
                figures[outcome] = figures.get(outcome, 0.0) + 1
    figures |= {f"api_{verb}": after[verb] - before.get(verb, 0.0) for verb in after
                if after[verb] - before.get(verb, 0.0) >= 1}
    return {prefix + k: v for k, v in figures.items()}


def real_defrag(plane: ControlPlane, served: Served, namespace: str, fleet: Fleet,
                deployments: int, timeout_s: float) -> dict[str, float]:
    """A real defrag cycle with budgets over the fleet: ``deployments`` Deployments placed
    by this row's scheduler; the GPU pods without a controller beside their replicas (the
    row's and residents) finished (deleted); every node's usage annotation written as its
    agent would (the replicas using :data:`IDLE_USED` of what they reserve, every other pod
    :data:`BUSY_USED`, so the nodes the replicas are left alone on are over the trigger); one
    cycle, then the time until every Deployment is back at full replicas and the
    reservations it left."""
    names = create_movable(plane, namespace, deployments, served.scheduler_name, timeout_s)
    finished = finish_neighbours(plane, namespace, fleet, timeout_s)
    movable = f"{namespace}/movable-"
    written = publish_usage(plane, lambda key: IDLE_USED if key.startswith(movable)
                            else BUSY_USED)
    figures = {"defrag_finished_pods": float(finished), "defrag_usage_nodes": float(written),
               "defrag_movable": float(deployments)}
    figures |= defrag_cycle(plane, namespace, dry_run=False)
    started = time.perf_counter()
    wait_until(lambda: movable_ready(plane, namespace, names), timeout_s=timeout_s,
               what="every movable Deployment back at full replicas", interval_s=0.5)
    figures["defrag_real_back_s"] = time.perf_counter() - started
    figures["defrag_real_reservations_left"] = float(len(list_reservations(plane)))
    return figures


def gpufrag_figures(plane: ControlPlane, served: Served, namespace: str, node: str,
                    folder: Path) -> dict[str, float]:
    """RSS, the extender's own filter latency, watch lag and the time to ready after a restart
    (a new process listing the whole fleet), with every pod of the row still bound."""
    extender = served.extender
    assert isinstance(extender, ExtenderProcess) and extender.process is not None
    figures = {"rss_mib": rss_mib(extender.process.pid)}
    text = extender.metrics()
    filter_ms = p50_p99_ms(histogram(text, EXTENDER_LATENCY,
                                     lambda labels: labels.get("verb") == "filter"))
    # Decisions that held no GPU: the watch behind kube-scheduler's informer in the burst.
    figures["unassumed"] = metric_sum(text, "gpufrag_extender_unassumed_decisions")
    figures["watch_waits_timed_out"] = metric_sum(text,
                                                  "gpufrag_extender_watch_waits_timed_out")
    figures["filter_p50_ms"], figures["filter_p99_ms"] = filter_ms
    scrape = time.perf_counter()
    extender.metrics()
    figures["scrape_ms"] = (time.perf_counter() - scrape) * 1000
    figures |= defrag_cycle(plane, namespace, dry_run=True)
    lags = watch_lag_ms(plane, extender, namespace, node)
    figures["lag_p50_ms"] = statistics.median(lags)
    figures["lag_max_ms"] = max(lags)
    extender.stop()
    restarted = ExtenderProcess(plane, folder / "gpufrag-restarted.log", log_level="info",
                                extra_args=extender.extra_args, port=extender.port)
    started = time.perf_counter()
    restarted.start(timeout_s=600)
    figures["ready_s"] = time.perf_counter() - started
    figures["rss_restarted_mib"] = rss_mib(restarted.process.pid if restarted.process else 0)
    served.extender = restarted  # stopped with the row
    return figures


def run_row(plane: ControlPlane, fleet: Fleet, row: Row, namespace: str, target: TargetWorkload,
            kwok_pid: int, folder: Path) -> RowResult:
    served = Served(plane, row, folder, ready_timeout_s=60 + ready_allowance_s(fleet))
    served.start()
    try:
        pids = served.pids() | {"kwok": kwok_pid}
        before = cpu_by_process(pids)
        started = time.perf_counter()
        create_pods(plane, namespace, (pod_body(p, served.scheduler_name) for p in fleet.pods))
        wait_until(lambda: settled(plane, namespace) is not None,
                   timeout_s=60 + len(fleet.pods), what=f"{row.name}: every pod bound or "
                   "found unschedulable", interval_s=0.5)
        seconds = time.perf_counter() - started
        after = cpu_by_process(pids)
        bound_at = time.perf_counter()
        algorithm = p50_p99_ms(histogram(scheduler_metrics(plane, f"bench-{row.name}"),
                                         ALGORITHM))
        placed = placement(plane, fleet, namespace, target)
        wait_running(plane, namespace, placed.bound, timeout_s=60 + len(fleet.pods) / 10)
        running_s = time.perf_counter() - bound_at
        extender: dict[str, float] = {}
        if row.name.startswith("gpufrag"):
            extender = gpufrag_figures(plane, served, namespace, fleet.nodes[0].name, folder)
            extender["ready_first_s"] = served.extender_ready_s
            # Their replicas on at most half the nodes.
            deployments = min(MOVABLE_DEPLOYMENTS,
                              len(fleet.nodes) // (2 * MOVABLE_REPLICAS)) or 1
            extender |= real_defrag(plane, served, namespace, fleet, deployments,
                                    120 + len(fleet.pods) / 10)
    finally:
        served.stop()
        delete_movable(plane, namespace)
    delete_pods(plane, namespace, timeout_s=60 + len(fleet.pods) / 10)
    spent = {k: (after[k] - before.get(k, 0.0)) * 1000 / len(fleet.pods) for k in after}
    return RowResult(seconds, placed, spent, algorithm, running_s, extender)


def describe_residents(fleet: Fleet) -> str:
    """The residents in a few words ('' when none)."""
    drawn = [r for r in fleet.residents if r.gpus is not None]
    demand = sum(r.pod.gpu_demand_milli for r in drawn) / fleet.capacity_milli
    return (f"{len(fleet.residents)} resident pods ({len(drawn)} of the draw, "
            f"{len(fleet.residents) - len(drawn)} system pods; GPU demand {100 * demand:.0f}%)"
            if fleet.residents else "")


def ready_allowance_s(fleet: Fleet) -> float:
    return RESIDENT_S_PER_1000 * len(fleet.residents) / 1000


def run_size(binary: Path, fleet: Fleet, seed: int, *, kills: int = 0,
             arrivals_per_s: float = DEFAULT_ARRIVALS_PER_S, kwok: Path | None = None
             ) -> SizeResult:
    target = TargetWorkload.from_pods(fleet.pods)
    residents = describe_residents(fleet)
    held = len(fleet.pods) + len(fleet.residents)
    # The what-if places the same pods from the same start (the residents on their GPUs).
    replayed = replay(fleet.nodes, fleet.pods, "fgd", seed, target, resident_state(fleet))
    whatif = (float(replayed.allocation_pct[-1]), float(replayed.frag_amount_pct[-1]))
    rows: dict[str, RowResult] = {}
    with ControlPlane(binary, complete_pods=False) as plane, \
            tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        create_nodes(plane, fleet.nodes)
        print(f"{len(fleet.nodes)} nodes created in {time.perf_counter() - started:.0f}s",
              file=sys.stderr, flush=True)
        install_reservations_crd(plane)  # the extender and defrag list reservations
        install_defrag_namespace(plane)  # where reservations, hints and defrag state live
        kwok_process = start_kwok(plane, kwok)
        try:
            started = time.perf_counter()
            create_residents(plane, fleet, timeout_s=60 + ready_allowance_s(fleet))
            if fleet.residents:
                print(f"{len(fleet.residents)} resident pods created and Running in "
                      f"{time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True)
            namespace = plane.create_namespace("fleet")
            for row in FLEET_ROWS:
                print(f"running {row.name} (load average {os.getloadavg()[0]:.1f})",
                      file=sys.stderr, flush=True)
                done = rows[row.name] = run_row(plane, fleet, row, namespace, target,
                                                kwok_process.process.pid, Path(tmp))
                # Each row's figures as it ends: a long run cut short still says something.
                print(f"  {row.name}: {done.placed.bound} bound in {done.seconds:.1f}s, "
                      f"{done.placed} {done.extender}", file=sys.stderr, flush=True)
            failover = None
            if kills:
                print(f"failover: {kills} leader kills", file=sys.stderr, flush=True)
                failover = run_failover(plane, fleet, plane.create_namespace("failover"),
                                        Path(tmp), kills=kills, per_s=arrivals_per_s)
        finally:
            kwok_process.stop()
    return SizeResult(fleet, rows, whatif, os.getloadavg(), failover, residents, held)


def by_prefix(figures: dict[str, float], prefix: str) -> str:
    """The figures whose keys start with ``prefix``, as ``name count`` pairs."""
    return ", ".join(f"{k.removeprefix(prefix)} {v:.0f}" for k, v in sorted(figures.items())
                     if k.startswith(prefix))


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def print_size(result: SizeResult) -> list[results.Figure]:
    """Print one size's table and targets; return its figures (judged at the target's size)."""
    fleet, rows = result.fleet, result.rows
    gpus = fleet.capacity_milli // 1000
    residents = f", among {result.residents}" if result.residents else ""
    print(f"\n{len(fleet.nodes)} kwok nodes ({fleet.source} mix, {gpus} GPUs), "
          f"{len(fleet.pods)} pods of {fleet.asked_pods} asked ({fleet.source} pods; GPU demand "
          f"{100 * fleet.demand_milli / fleet.capacity_milli:.0f}% of the fleet's GPUs)"
          f"{residents}; "
          f"load average {' / '.join(f'{x:.1f}' for x in result.load)} on {os.cpu_count()} "
          "CPUs")
    print(f"  {'row':<16} {'s':>7} {'pods/s':>7} {'÷default':>8} {'÷zero':>6} {'bound':>6} "
          f"{'unbound':>7} {'alloc%':>6} {'frag%':>6} {'stranded':>8} "
          f"{'algo p50/p99 ms':>16} {'running s':>9}")
    rate = {name: r.placed.bound / r.seconds for name, r in rows.items()}
    for name, r in rows.items():
        vs_default = rate[name] / rate["default"] if name != "default" else 1.0
        vs_zero = f"{rate[name] / rate['zero-one']:6.2f}" if name.startswith("gpufrag") else ""
        print(f"  {name:<16} {r.seconds:>7.1f} {rate[name]:>7.1f} {vs_default:>8.2f} "
              f"{vs_zero:>6} {r.placed.bound:>6} {r.placed.unbound:>7} "
              f"{r.placed.allocation_pct:>6.1f} {r.placed.frag_pct:>6.2f} "
              f"{r.placed.stranded:>8} "
              f"{r.algorithm_ms[0]:>7.1f}/{r.algorithm_ms[1]:<8.1f} {r.running_s:>9.1f}")
    print(f"  {'what-if fgd':<16} {'':>7} {'':>7} {'':>8} {'':>6} {'':>6} {'':>7} "
          f"{result.whatif[0]:>6.1f} {result.whatif[1]:>6.2f}  (static replay, same pods"
          f"{', from the residents' if fleet.residents else ''})")
    names = sorted({k for r in rows.values() for k in r.cpu_ms_per_pod})
    print("  CPU per pod (ms): " + "; ".join(
        f"{name}: " + " ".join(f"{p}={r.cpu_ms_per_pod.get(p, 0.0):.1f}" for p in names
                               if r.cpu_ms_per_pod.get(p, 0.0) >= 0.05)
        for name, r in rows.items()))
    g = rows["gpufrag-decide"].extender
    print(f"  gpufrag extender: RSS {g['rss_mib']:.0f} MiB (after a restart "
          f"{g['rss_restarted_mib']:.0f} MiB); ready {g['ready_first_s']:.1f}s after its start, "
          f"{g['ready_s']:.1f}s after a restart; own "
          f"filter p50/p99 {g['filter_p50_ms']:.2f}/{g['filter_p99_ms']:.2f} ms; watch lag "
          f"p50/max {g['lag_p50_ms']:.0f}/{g['lag_max_ms']:.0f} ms over {LAG_PROBES} pods "
          f"(one /metrics scrape {g['scrape_ms']:.0f} ms included); decisions that held no "
          f"GPU {g['unassumed']:.0f} ({g['watch_waits_timed_out']:.0f} waits for the watch "
          "ran out)")
    api = by_prefix(g, "defrag_api_")
    print(f"  defrag --dry-run cycle: {g['defrag_s']:.1f}s, peak RSS {g['defrag_rss_mib']:.0f} "
          f"MiB, exit {g['defrag_exit']:.0f}, {g['defrag_moves']:.0f} moves planned; API "
          f"requests meanwhile (all clients): {api}")
    real_api, outcomes = by_prefix(g, "defrag_real_api_"), by_prefix(g, "defrag_real_outcome_")
    print(f"  defrag real cycle ({' '.join(DEFRAG_BUDGETS)}; {g['defrag_movable']:.0f} "
          f"Deployments of {MOVABLE_REPLICAS} movable replicas, "
          f"{g['defrag_finished_pods']:.0f} pods beside them finished, usage written on "
          f"{g['defrag_usage_nodes']:.0f} nodes, replicas at {IDLE_USED:.0%} of their share, "
          f"other pods at {BUSY_USED:.0%}): "
          f"{g['defrag_real_s']:.1f}s, peak RSS {g['defrag_real_rss_mib']:.0f} MiB, exit "
          f"{g['defrag_real_exit']:.0f}, {g['defrag_real_moves']:.0f} moves planned, outcomes: "
          f"{outcomes or 'none'}; every Deployment back {g['defrag_real_back_s']:.1f}s later, "
          f"{g['defrag_real_reservations_left']:.0f} reservations left; API requests "
          f"meanwhile: {real_api}")
    if result.failover is not None:
        f = result.failover
        print(f"  failover (two replicas, kube-scheduler's leader election, lease 15 s; the "
              f"leader and its extender SIGKILLed {len(f.first_bind_s)} times while pods "
              f"arrived): {f.bound} of {f.pods} pods bound, {f.lost} lost, "
              f"{f.double_assigned} GPUs given twice, {f.reserved_taken} pods on the "
              f"{f.reserved} GPUs reserved throughout; first bind after a kill: median "
              f"{statistics.median(f.first_bind_s):.1f}s, max {max(f.first_bind_s):.1f}s")
    gain = rows["default"].placed.frag_pct - rows["gpufrag-decide"].placed.frag_pct
    print("  targets (issue 26, judged at 5,000 nodes / 50,000 pods):")
    print(f"    extender RSS < 1 GiB: {met(g['rss_mib'] < TARGET_RSS_MIB)}; ready after "
          f"restart <= 30 s: {met(g['ready_s'] <= TARGET_READY_S)}; watch lag p99 < 1 s: "
          f"{met(g['lag_max_ms'] < TARGET_LAG_P99_MS)} (max of {LAG_PROBES})")
    print(f"    filter p99 <= 10 ms (extender's own): "
          f"{met(g['filter_p99_ms'] <= TARGET_FILTER_P99_MS)}; gpufrag ÷ zero-cost >= 0.85: "
          f"{met(rate['gpufrag-decide'] / rate['zero-one'] >= TARGET_VS_ZERO)}; defrag "
          f"dry-run cycle < 60 s: {met(g['defrag_s'] < TARGET_DEFRAG_S)}")
    print(f"    FGD gain over the default scheduler: {gain:+.2f} points of fragmentation "
          f"(gpufrag {rows['gpufrag-decide'].placed.frag_pct:.2f}% vs default "
          f"{rows['default'].placed.frag_pct:.2f}%; the what-if's FGD {result.whatif[1]:.2f}%)")
    size = f"{len(fleet.nodes):,} nodes"
    judged = len(fleet.nodes) >= 5000  # issue 26's targets are for 5,000 nodes / 50,000 pods

    def target(comparison: results.Comparison, bound: float) -> results.Target | None:
        return results.Target(comparison, bound) if judged else None

    figures = [
        results.Figure(f"{size}: extender RSS", round(g["rss_mib"]), "MiB",
                       target("<", TARGET_RSS_MIB)),
        results.Figure(f"{size}: extender ready after a restart", round(g["ready_s"], 1), "s",
                       target("<=", TARGET_READY_S)),
        results.Figure(f"{size}: watch lag, max of {LAG_PROBES}", round(g["lag_max_ms"]), "ms",
                       target("<", TARGET_LAG_P99_MS)),
        results.Figure(f"{size}: extender's own filter p99", round(g["filter_p99_ms"], 2), "ms",
                       target("<=", TARGET_FILTER_P99_MS)),
        results.Figure(f"{size}: gpufrag ÷ zero-cost extender",
                       round(rate["gpufrag-decide"] / rate["zero-one"], 2), "",
                       target(">=", TARGET_VS_ZERO)),
        results.Figure(f"{size}: defrag dry-run cycle", round(g["defrag_s"], 1), "s",
                       target("<", TARGET_DEFRAG_S)),
        results.Figure(f"{size}: fragmentation, gpufrag", rows["gpufrag-decide"].placed.frag_pct,
                       "%"),
        results.Figure(f"{size}: fragmentation, default scheduler",
                       rows["default"].placed.frag_pct, "%"),
        results.Figure(f"{size}: fragmentation, what-if FGD", result.whatif[1], "%")]
    if result.failover is not None:
        f = result.failover
        figures += [
            results.Figure(f"{size}: failover, pods lost", f.lost, "", results.Target("<=", 0)),
            results.Figure(f"{size}: failover, GPUs given twice", f.double_assigned, "",
                           results.Target("<=", 0)),
            results.Figure(f"{size}: failover, pods on the reserved GPUs", f.reserved_taken, "",
                           results.Target("<=", 0))]
    return figures


def print_growth(results: Sequence[SizeResult]) -> None:
    """Each figure's growth from the smallest size to each larger one, beside the nodes'."""
    small = results[0]
    def figures(r: SizeResult) -> dict[str, float]:
        g, gpufrag = r.rows["gpufrag-decide"].extender, r.rows["gpufrag-decide"]
        return {"extender RSS": g["rss_mib"], "ready after restart": g["ready_s"],
                "extender filter p99": g["filter_p99_ms"],
                "kube-scheduler algorithm p99 (gpufrag)": gpufrag.algorithm_ms[1],
                "watch lag p50": g["lag_p50_ms"],
                "extender CPU per pod": gpufrag.cpu_ms_per_pod.get("extender", math.nan),
                "defrag dry-run cycle": g["defrag_s"],
                "pods/s (gpufrag)": gpufrag.placed.bound / gpufrag.seconds}

    base = figures(small)
    for big in results[1:]:
        scale = len(big.fleet.nodes) / len(small.fleet.nodes)
        print(f"\ngrowth from {len(small.fleet.nodes)} to {len(big.fleet.nodes)} nodes "
              f"(x{scale:.1f} nodes, x{big.held / small.held:.1f} pods held):")
        for name, value in figures(big).items():
            ratio = value / base[name] if base[name] else math.nan
            shape = ("falls" if ratio < 0.67 else "flat" if ratio < 1.5
                     else "sub-linear" if ratio < 0.8 * scale
                     else "linear" if ratio <= 1.25 * scale else "worse than linear")
            print(f"  {name:<40} x{ratio:.2f}  ({shape})")


def _counts(text: str, flag: str, high: int, low: int = 1) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(low <= v <= high for v in values):
        _usage(f"{flag} must be counts {low}..{high} separated by commas, got {text!r}")
    return values


def _usage(message: str) -> None:
    print(f"fleet_scale: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default=str(CI_NODES), help="node counts, comma-separated")
    parser.add_argument("--pods", default=str(CI_PODS), help="pod counts, paired with --nodes")
    parser.add_argument("--residents", default="", help="pods bound before the rows, paired "
                        "with --nodes (default none)")
    parser.add_argument("--max-demand", default=str(DEFAULT_MAX_DEMAND),
                        help="stop drawing pods at this share of the fleet's GPUs (0..1]")
    parser.add_argument("--data", default=str(OPENB_DIR), help="openb trace folder (default: "
                        "openb/ under the data root, GPUFRAG_DATA_ROOT; the synthetic fleet of "
                        "the same shape when absent)")
    parser.add_argument("--seed", default="0")
    parser.add_argument("--failover-kills", default="0",
                        help="after the rows, kill the gpufrag-scheduler leader this many times "
                        "(two replicas) while the pods arrive again")
    parser.add_argument("--arrivals-per-s", default=str(DEFAULT_ARRIVALS_PER_S),
                        help="pods created per second during the failover run")
    results.add_arguments(parser, "fleet_scale")
    args = parser.parse_args(argv)
    start = results.Start.now()
    nodes = _counts(args.nodes, "--nodes", MAX_NODES)
    pods = _counts(args.pods, "--pods", MAX_PODS)
    residents = (_counts(args.residents, "--residents", MAX_PODS, low=0) if args.residents
                 else [0] * len(nodes))
    if len(nodes) != len(pods) or len(nodes) != len(residents):
        _usage(f"--nodes, --pods and --residents pair up: {len(nodes)} node counts, "
               f"{len(pods)} pod counts, {len(residents)} resident counts")
    try:
        max_demand, seed = float(args.max_demand), int(args.seed)
        kills, arrivals_per_s = int(args.failover_kills), float(args.arrivals_per_s)
    except ValueError:
        _usage(f"--max-demand and --arrivals-per-s must be numbers, --seed and "
               f"--failover-kills integers, got {args.max_demand!r}, {args.arrivals_per_s!r}, "
               f"{args.seed!r}, {args.failover_kills!r}")
    if not 0 < max_demand <= 1:
        _usage(f"--max-demand must be in (0, 1], got {max_demand}")
    if not 0 <= kills <= MAX_KILLS or not 0 < arrivals_per_s <= MAX_ARRIVALS_PER_S:
        _usage(f"--failover-kills must be 0..{MAX_KILLS} and --arrivals-per-s in "
               f"(0, {MAX_ARRIVALS_PER_S}], got {kills}, {arrivals_per_s}")
    binary = build_control_plane()
    done: list[SizeResult] = []
    figures: list[results.Figure] = []
    for n, p, r in zip(nodes, pods, residents, strict=True):
        fleet = make_fleet(n, p, seed=seed, data_dir=Path(args.data), max_demand=max_demand,
                           residents=r)
        if fleet.source == "synthetic":
            print(f"fleet_scale: {fallback_line(Path(args.data), 'openb trace')}",
                  file=sys.stderr)
        done.append(run_size(binary, fleet, seed, kills=kills, arrivals_per_s=arrivals_per_s))
        figures += print_size(done[-1])
        sys.stdout.flush()
    if len(done) > 1:
        print_growth(done)
    results.record(args, "fleet_scale", start, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
