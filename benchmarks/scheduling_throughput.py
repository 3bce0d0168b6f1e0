"""Scheduling throughput on the real control plane: gpufrag-scheduler in each mode it supports,
beside the same kube-scheduler without an extender and beside the zero-cost extender (Go, no
logic, the same verbs and configuration), in one run, on the same fake cluster and pods.

    python -m benchmarks.scheduling_throughput [--nodes 1000] [--pods 2000] [--rounds 3]
        [--rows default,zero-one,gpufrag-decide,zero-all,gpufrag-feasible]

Rows (each with its own scheduler process, started just before its run and stopped after, so
no idle scheduler's or extender's watches share the cores with the one measured):

- ``default``: kube-scheduler alone (the 1.0 reference);
- ``zero-one`` / ``gpufrag-decide``: filter + bind, the filter answering one node (gpufrag's
  deciding filter, ``filter.answer: decide``; kube-scheduler skips scoring);
- ``zero-all`` / ``gpufrag-feasible``: filter + prioritize + bind, the filter passing every
  node it fits (``filter.answer: feasible``);
- ``pyzero-one`` / ``pyzero-all``: the zero-cost extender's verbs on gpufrag's own Python
  stack (devkit/pyzero.py: the same server, Flask and binder, no logic): the floor of any
  Flask extender here, read against the Go row (what the stack costs) and gpufrag against it
  (what gpufrag's own work costs);
- ``gpufrag-decide-0.5ms`` (only when named): the deciding filter with a 0.5 ms thread switch
  interval instead of ``server.switch_interval_s``' default (Python's 5 ms);

Each gpufrag row is printed with its ratio to the default scheduler and to the zero-cost
extender of the same mode: how close gpufrag comes to the limit of the extender design.

The rows run in ``--rounds`` rounds, each round every row once, in an order rotated from round
to round; a ratio is taken within each round (the rows of one round ran minutes apart, under
the same background load) and the verdict is read on the median round. On a shared machine one
round alone moved a row's ratio between 0.63 and 1.35.
Every scheduler gets the same client QPS (so the API rate limit is not what is compared) and
scores every node (percentageOfNodesToScore 100). Pods are created up front; the clock runs
from the first create to the last bind observed. For each run it also prints the CPU each
process spent per pod: on a small machine they all share the same cores, so that is where the
difference comes from.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import kubernetes
import orjson
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import results
from benchmarks.procstat import cpu_seconds
from devkit.build import build_control_plane
from devkit.controlplane import ControlPlane
from devkit.extender import ExtenderProcess, ZeroExtenderProcess, gpufrag_scheduler_config
from devkit.procs import wait_until
from devkit.stack import gpu_pod
from gpufrag.conventions import SCHEDULER_NAME
from scheduler.core.types import MILLI_PER_GPU

QPS = "clientConnection:\n  qps: 1000\n  burst: 2000\n"
PLAIN = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
  - schedulerName: {name}
"""


@dataclass(frozen=True)
class Row:
    """One measured configuration: its name, its label and the zero-cost row it is read
    against (gpufrag rows only)."""

    name: str
    label: str
    reference: str = ""
    settings: tuple[str, ...] = ()  # gpufrag rows: extra ``--set`` assignments
    floor: str = ""  # gpufrag rows: the Python zero-cost row of the same mode
    baseline: str = "default"  # the kube-scheduler-alone row its rate is divided by
    # Pods ask their GPUs through DRA claims (benchmarks/dra_throughput.py): gpufrag's
    # extender is asked about every pod (no managedResources: a DRA pod requests none).
    dra: bool = False


ROWS = {
    "default": Row("default", "default kube-scheduler (no extender)"),
    "zero-one": Row("zero-one", "zero-cost extender: filter (one node) + bind"),
    "pyzero-one": Row("pyzero-one", "zero-cost on gpufrag's Python stack: one + bind",
                      "zero-one"),
    "gpufrag-decide": Row("gpufrag-decide", "gpufrag: filter decides (one node) + bind",
                          "zero-one", floor="pyzero-one"),
    "zero-all": Row("zero-all", "zero-cost extender: filter (all) + prioritize + bind"),
    "pyzero-all": Row("pyzero-all", "zero-cost on gpufrag's Python stack: all + prio + bind",
                      "zero-all"),
    "gpufrag-feasible": Row("gpufrag-feasible",
                            "gpufrag: filter (feasible) + prioritize + bind", "zero-all",
                            floor="pyzero-all"),
}
# Rows run only when named in --rows: one setting's effect, read against the same mode's row.
EXTRA_ROWS = {
    "gpufrag-decide-0.5ms": Row("gpufrag-decide-0.5ms",
                                "gpufrag: filter decides, 0.5 ms switch interval",
                                "zero-one", ("server.switch_interval_s=0.0005",)),
}


class Served:
    """The scheduler (and extender) of one row, started and stopped around its run."""

    def __init__(self, plane: ControlPlane, row: Row, folder: Path, *,
                 ready_timeout_s: float = 60.0) -> None:
        self.plane, self.row, self.folder = plane, row, folder
        self.ready_timeout_s = ready_timeout_s  # gpufrag's extender lists the whole cluster
        self.extender: ExtenderProcess | ZeroExtenderProcess | None = None
        self.extender_ready_s = math.nan  # its start to ready (gpufrag rows)
        self.scheduler_name = (SCHEDULER_NAME if row.name.startswith("gpufrag")
                               else f"bench-{row.name}")

    def start(self) -> None:
        log = self.folder / f"{self.row.name}.log"
        config = PLAIN.format(name=self.scheduler_name)
        if self.row.name.startswith(("zero", "pyzero")):
            engine, mode = self.row.name.split("-", 1)
            self.extender = ZeroExtenderProcess(
                self.plane, log, mode=mode,
                engine="python" if engine == "pyzero" else "go").start()
            config = gpufrag_scheduler_config(self.extender.url, name=self.scheduler_name,
                                              prioritize=mode == "all")
        elif self.row.name.startswith("gpufrag"):
            answer = self.row.name.split("-")[1]
            settings = [arg for setting in self.row.settings for arg in ("--set", setting)]
            # Logging at info, as in production: the verbs then log nothing on success.
            started = time.perf_counter()
            self.extender = ExtenderProcess(self.plane, log, log_level="info", extra_args=(
                "--threads", "16", "--set", f"filter.answer={answer}", *settings)).start(
                    timeout_s=self.ready_timeout_s)
            self.extender_ready_s = time.perf_counter() - started
            config = gpufrag_scheduler_config(self.extender.url, name=self.scheduler_name,
                                              prioritize=answer == "feasible",
                                              managed=not self.row.dra)
        self.plane.start_scheduler(f"bench-{self.row.name}", config + QPS)

    def stop(self) -> None:
        self.plane.stop_scheduler(f"bench-{self.row.name}")
        if self.extender is not None:
            self.extender.stop()

    def thread_cpu(self) -> dict[str, float]:
        """gpufrag's extender CPU seconds by thread so far (empty for the other rows)."""
        if not isinstance(self.extender, ExtenderProcess):
            return {}
        return {sample.labels["thread"]: sample.value
                for family in text_string_to_metric_families(self.extender.metrics())
                if family.name == "gpufrag_thread_cpu_seconds"
                for sample in family.samples}

    def pids(self) -> dict[str, int]:
        found = {name: c.process.pid for name, c in self.plane.components.items()}
        found |= {"kube-scheduler": self.plane.schedulers[f"bench-{self.row.name}"].process.pid}
        if self.extender is not None and self.extender.process is not None:
            found["extender"] = self.extender.process.pid
        return found


def cpu_by_process(pids: dict[str, int]) -> dict[str, float]:
    # With descendants: anything a process forks counts as its own.
    cpu = {name: cpu_seconds(pid, descendants=True) for name, pid in pids.items()}
    cpu["this client"] = cpu_seconds(os.getpid())  # the rest are its children
    return cpu


def run(plane: ControlPlane, scheduler: str, pods: list[dict[str, Any]], ns: str,
        measure: Callable[[], dict[str, float]]) -> tuple[float, dict[str, float]]:
    """Seconds to bind every pod, and the CPU seconds each process spent meanwhile
    (the pods' deletion included)."""
    core = kubernetes.client.CoreV1Api(plane.api_client())
    bodies = [{**body, "spec": {**body["spec"], "schedulerName": scheduler}} for body in pods]
    before = measure()
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda b: core.create_namespaced_pod(ns, b), bodies))

    def all_bound() -> bool:
        # Only the pods still unbound, as raw JSON: listing and deserialising all of them every
        # half second cost the API server and this client more CPU per pod than a scheduler,
        # and more for whichever run takes longer, on the cores the schedulers share.
        answer: Any = core.list_namespaced_pod(ns, field_selector="spec.nodeName=",
                                               _preload_content=False)  # raw: no models
        return not orjson.loads(answer.data)["items"]

    wait_until(all_bound, timeout_s=1800, what=f"{len(pods)} pods bound by {scheduler}",
               interval_s=0.5)
    elapsed = time.perf_counter() - started
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    wait_until(lambda: not core.list_namespaced_pod(ns).items, timeout_s=600, what="pods gone")
    after = measure()
    return elapsed, {k: after[k] - before.get(k, 0.0) for k in after}


def refused_binds(folder: Path, row: str) -> int:
    """Binds gpufrag refused in a row (each one a warning in its log; none expected)."""
    path = folder / f"{row}.log"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if '"refused"' in line)


def ratios(times: dict[str, list[float]], row: str, reference: str) -> list[float]:
    """``row``'s rate over ``reference``'s, round by round (the same round's runs only)."""
    return [ref / mine for mine, ref in zip(times[row], times[reference], strict=True)]


# Issue 47's targets (DESIGN.md, "Speed is part of the extender's contract"): gpufrag against
# the zero-cost extender of its mode (the limit of the extender design), the deciding filter
# against kube-scheduler alone, and the extender's CPU per pod against the zero-cost one's.
ZERO_COST_TARGET = 0.95
DEFAULT_TARGET = 1.3
CPU_TARGET = 1.5


def print_rates(rows: list[Row], times: dict[str, list[float]], nodes: int,
                pods: int) -> list[results.Figure]:
    """Per row: the median round's seconds and pods/s, and its ratios to the default and to
    the zero-cost extender (median round, and every round's in brackets); returned as the
    run's figures, each ratio judged against its target."""
    figures: list[results.Figure] = []
    def ratio_text(row: str, reference: str) -> str:
        if reference not in times:
            return "-"
        each = ratios(times, row, reference)
        return (f"{statistics.median(each):.2f} "
                f"[{' '.join(f'{r:.2f}' for r in each)}]")

    rounds = len(next(iter(times.values())))
    print(f"\n{nodes} fake nodes x 8 GPUs, {pods} GPU pods (half whole GPUs, half shares), "
          f"same kube-scheduler build and client QPS, one row at a time, {rounds} rounds "
          "(median round; each round's ratio in brackets):")
    print(f"  {'row':<52} {'s':>7} {'pods/s':>8}  {'÷ default':<24} {'÷ zero-cost':<24}")
    for row in rows:
        seconds = statistics.median(times[row.name])
        vs_default = ratio_text(row.name, row.baseline)
        vs_zero = ratio_text(row.name, row.reference) if row.reference else ""
        print(f"  {row.label:<52} {seconds:>7.1f} {pods / seconds:>8.1f}  {vs_default:<24} "
              f"{vs_zero:<24}")
        figures.append(results.Figure(f"{row.name}: {pods:,} pods on {nodes:,} nodes, "
                                      "pods/s (median round)", round(pods / seconds, 1),
                                      "pods/s"))
    if any(row.reference or row.name == "gpufrag-decide" for row in rows):
        print(f"  targets (median round): gpufrag ÷ its zero-cost extender >= "
              f"{ZERO_COST_TARGET} in each mode; the deciding filter ÷ default >= "
              f"{DEFAULT_TARGET}")
    for row in rows:
        if row.name.startswith("pyzero") and row.reference in times:
            got = statistics.median(ratios(times, row.name, row.reference))
            print(f"  {row.name} ÷ {row.reference}: {got:.2f} (the floor of a Flask extender "
                  "on gpufrag's server)")
            figures.append(results.Figure(f"{row.name} ÷ {row.reference} (median round)",
                                          round(got, 2), ""))
        if not row.name.startswith("gpufrag"):
            continue
        if row.floor in times:
            got = statistics.median(ratios(times, row.name, row.floor))
            print(f"  {row.name} ÷ {row.floor}: {got:.2f}")
            figures.append(results.Figure(f"{row.name} ÷ {row.floor} (median round)",
                                          round(got, 2), ""))
        for reference in (row.baseline, row.reference):
            if reference and reference in times:
                got = statistics.median(ratios(times, row.name, reference))
                bound = (ZERO_COST_TARGET if reference == row.reference
                         else DEFAULT_TARGET if row.name == "gpufrag-decide" else None)
                verdict = ("" if bound is None else ": met" if got >= bound
                           else f": missed by {bound - got:.2f}")
                print(f"  {row.name} ÷ {reference}: {got:.2f}{verdict}")
                figures.append(results.Figure(
                    f"{row.name} ÷ {reference} (median round)", round(got, 2), "",
                    None if bound is None else results.Target(">=", bound)))
    return figures


def extender_cpu(rows: list[Row], cpu: dict[str, dict[str, float]]) -> list[results.Figure]:
    """The extender's CPU per pod beside its zero-cost extender's, for each gpufrag row (the
    deciding filter's judged: what the extender costs the cores kube-scheduler shares)."""
    figures: list[results.Figure] = []
    named: set[str] = set()

    def cpu_figure(name: str) -> None:
        if name not in named:
            named.add(name)
            figures.append(results.Figure(f"{name}: extender CPU per pod (mean of rounds)",
                                          round(cpu[name].get("extender", 0.0), 2), "ms"))

    for row in rows:
        if not row.name.startswith(("gpufrag", "pyzero")) or row.reference not in cpu:
            continue
        mine, zero = cpu[row.name].get("extender", 0.0), cpu[row.reference].get("extender", 0.0)
        cpu_figure(row.name)
        cpu_figure(row.reference)
        if zero > 0:
            got = mine / zero
            bound = CPU_TARGET if row.name == "gpufrag-decide" else None
            print(f"  {row.name}: extender CPU per pod {mine:.2f} ms, {got:.2f} x "
                  f"{row.reference}'s {zero:.2f} ms"
                  + ("" if bound is None else f" (target <= {bound})"))
            figures.append(results.Figure(
                f"{row.name} extender CPU per pod ÷ {row.reference}'s", round(got, 2), "",
                None if bound is None else results.Target("<=", bound)))
    return figures


def extender_threads(threads: dict[str, dict[str, float]]) -> list[results.Figure]:
    """gpufrag's extender CPU per pod by thread (its ``gpufrag_thread_cpu_seconds_total``):
    the event loop (HTTP for every verb, filter and prioritize themselves), the watches, the
    bind threads; what the zero-cost extenders have no counterpart for is the watches."""
    figures: list[results.Figure] = []
    for row, by_thread in threads.items():
        shown = {name: ms for name, ms in sorted(by_thread.items(), key=lambda kv: -kv[1])
                 if ms >= 0.01}
        print(f"  {row}: extender CPU per pod by thread: "
              + ", ".join(f"{name} {ms:.2f} ms" for name, ms in shown.items()))
        figures += [results.Figure(f"{row}: extender CPU per pod, thread {name} "
                                   "(mean of rounds)", round(ms, 2), "ms")
                    for name, ms in shown.items()]
    return figures


PRODUCTS = ("T4", "A10", "V100M32", "G2")
GPUS_PER_NODE = 8
GPU_MEMORY_MIB = 16_384
SHARES = (230, 470, 650, 810)


def create_nodes(plane: ControlPlane, count: int) -> list[str]:
    """The fake cluster: ``count`` nodes of 8 GPUs, the products in turn."""
    names = [f"bench-{i:05d}" for i in range(count)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: plane.create_gpu_node(
            names[i], GPUS_PER_NODE, PRODUCTS[i % len(PRODUCTS)], GPU_MEMORY_MIB,
            cpu_milli=96_000, memory_mib=512 * 1024), range(count)))
    return names


def pod_shapes(count: int) -> list[int]:
    """Each pod's GPU in milli, the same every run: half whole GPUs (1000), half shares."""
    rng = random.Random(1)
    return [MILLI_PER_GPU if rng.random() < 0.5 else rng.choice(SHARES) for _ in range(count)]


@dataclass
class Measured:
    """What the rounds measured, per row: seconds per round, CPU ms per pod by process (mean
    of rounds), binds refused (gpufrag rows) and the extender's CPU ms per pod by thread (mean
    of rounds; gpufrag rows)."""

    times: dict[str, list[float]]
    cpu: dict[str, dict[str, float]]
    refused: dict[str, int]
    threads: dict[str, dict[str, float]]


def measure_rows(plane: ControlPlane, rows: list[Row], pods: list[dict[str, Any]], ns: str,
                 rounds: int, folder: Path,
                 settle: Callable[[], None] | None = None) -> Measured:
    """Every row once per round, the order rotated each round, each with its own scheduler
    (and extender) started just before its run and stopped after. ``settle``: called after
    each run, once its pods are gone (what a row leaves behind that the next must not see)."""
    times: dict[str, list[float]] = {row.name: [] for row in rows}
    cpu: dict[str, dict[str, float]] = {row.name: {} for row in rows}
    refused: dict[str, int] = {}
    threads: dict[str, dict[str, float]] = {}
    count = len(pods)
    for round_ in range(rounds):
        shift = round_ % len(rows)
        for row in rows[shift:] + rows[:shift]:
            served = Served(plane, row, folder)
            served.start()
            try:
                print(f"round {round_ + 1}/{rounds}: running {row.name} (load "
                      f"average {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
                threads_before = served.thread_cpu()
                elapsed, spent = run(plane, served.scheduler_name, pods, ns,
                                     partial(cpu_by_process, served.pids()))
                for name, seconds in served.thread_cpu().items():
                    by_thread = threads.setdefault(row.name, {})
                    by_thread[name] = by_thread.get(name, 0.0) + (
                        seconds - threads_before.get(name, 0.0)) * 1000 / count
            finally:
                served.stop()
            if settle is not None:
                settle()
            times[row.name].append(elapsed)
            for k, v in spent.items():
                cpu[row.name][k] = cpu[row.name].get(k, 0.0) + v * 1000 / count
            if row.name.startswith("gpufrag"):
                refused[row.name] = refused_binds(folder, row.name)
    return Measured(
        times, {name: {k: v / rounds for k, v in c.items()} for name, c in cpu.items()},
        refused, {name: {k: v / rounds for k, v in by_thread.items()}
                  for name, by_thread in threads.items()})


def print_cpu(rows: list[Row], cpu: dict[str, dict[str, float]], rounds: int) -> None:
    """CPU per pod by process, a column per row."""
    print(f"\nCPU per pod (ms), each run including its pods' deletion, mean of "
          f"{rounds} rounds:")
    names = sorted({k for c in cpu.values() for k in c})
    print(f"  {'process':<22} " + " ".join(f"{r.name:>16}" for r in rows))
    for name in names:
        print(f"  {name:<22} " + " ".join(f"{cpu[r.name].get(name, 0.0):>16.1f}" for r in rows))
    print(f"  {'total':<22} " + " ".join(f"{sum(cpu[r.name].values()):>16.1f}" for r in rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rows", default=",".join(ROWS),
                        help=f"rows to run, in order (of {', '.join(ROWS)}; also "
                             f"{', '.join(EXTRA_ROWS)})")
    parser.add_argument("--rounds", type=int, default=3,
                        help="every row once per round, the order rotated each round")
    results.add_arguments(parser, "scheduling_throughput")
    args = parser.parse_args(argv)
    start = results.Start.now()
    known = ROWS | EXTRA_ROWS
    unknown = [r for r in args.rows.split(",") if r and r not in known]
    if unknown or args.rounds < 1:
        parser.error(f"unknown rows {unknown} (of {', '.join(known)})" if unknown
                     else "--rounds must be at least 1")
    rows = [known[r] for r in args.rows.split(",") if r]
    binary = build_control_plane()
    with ControlPlane(binary, complete_pods=False) as plane, \
            tempfile.TemporaryDirectory() as tmp:
        print(f"control plane up in {plane.startup_s:.1f}s; creating {args.nodes} nodes",
              file=sys.stderr)
        create_nodes(plane, args.nodes)
        ns = plane.create_namespace("bench")
        pods = [gpu_pod(f"p-{i:05d}", gpus=1, cpu="2") if milli == MILLI_PER_GPU else
                gpu_pod(f"p-{i:05d}", milli=milli, cpu="2")
                for i, milli in enumerate(pod_shapes(args.pods))]
        measured = measure_rows(plane, rows, pods, ns, args.rounds, Path(tmp))
    times, cpu, refused, threads = measured.times, measured.cpu, measured.refused, measured.threads
    figures = print_rates(rows, times, args.nodes, args.pods)
    print(f"  load average at the end: {' / '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"(1 / 5 / 15 min) on {os.cpu_count()} CPUs")
    for name, count in refused.items():
        print(f"  {name}: {count} binds refused in all rounds (and retried by kube-scheduler)")
    print_cpu(rows, cpu, args.rounds)
    figures += extender_cpu(rows, cpu)
    figures += extender_threads(threads)
    results.record(args, "scheduling_throughput", start, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
