"""``gpufrag whatif sweep``: event-driven replays over a grid of policies x knobs x seeds.

Every point of the grid is one :class:`simulations.events.EventConfig`; every run is written to
``OUT/runs/<policy>-seed<seed>-<run id>.json`` atomically as it finishes. The run id hashes the
run's knobs and a fingerprint of its inputs (trace files, window, load), so a rerun skips what
is already there and redoes only what changed or never finished. Three ways to run it:

- **local processes** (default): ``--jobs`` worker processes, each given the inputs once;
- **Ray** (``--ray auto|ADDRESS``, ``pip install 'gpufrag[ray]'``): one task per run on the
  cluster ``ray.init(address=...)`` connects to; results come back to this process, which
  writes them as the local path does;
- **a Kubernetes Indexed Job** (``manifests/jobs/whatif-sweep.yaml``): pod ``i`` of ``N`` runs
  ``--shard i/N`` (every run whose grid index is ``i`` modulo ``N``) into a shared volume, and
  ``gpufrag whatif merge DIR`` builds the comparison from all of them.

The workload is the same for every run of a sweep (drawn once with ``--workload-seed``), so runs
differ only in their knobs and seeds: the seed moves the tie order, the random policy and the
draws of memory use, busy time and start times.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TextIO

import yaml

from gpufrag.dataroot import fallback_line
from gpufrag.errors import BadInput
from scheduler.core.fragmentation import TargetWorkload
from scheduler.core.types import MILLI_PER_GPU, NodeSpec
from simulations import timeline
from simulations.defrag_whatif import GENAI_FILE, genai_fractions
from simulations.events import EventConfig, FloatArray, knob_value, run_events
from simulations.genai import DEFAULT_DIR, ServingTrace, load_serving_trace, synthetic_serving_trace
from simulations.openb import load_nodes
from simulations.synthetic import synthetic_nodes
from simulations.timed import (
    TimedPod,
    copies_for_load,
    load_timed_pods,
    mean_demand_milli,
    synthetic_timed,
    window,
)

MAX_RUNS = 10_000
RUNS_DIR = "runs"


# ----------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Inputs:
    """What every run of a sweep shares: the cluster, the timed workload, the GenAI series."""

    workload: str
    nodes: list[NodeSpec]
    timed: list[TimedPod]
    serving_trace: ServingTrace
    memory_fractions: FloatArray | None
    target: TargetWorkload
    fingerprint: str
    notes: tuple[str, ...] = ()


def _file_id(path: Path) -> list[object]:
    stat = path.stat()
    return [str(path), stat.st_size, stat.st_mtime_ns]


def load_inputs(*, nodes_path: Path | None, pods_path: Path | None, genai: str | None,
                synthetic_node_count: int, load: float | None, start_s: float | None,
                hours: float, workload_seed: int, coverage: float) -> Inputs:
    """The trace (or the synthetic cluster) cut to the window the sweep needs."""
    if (nodes_path is None) != (pods_path is None):
        raise BadInput("--nodes and --pods go together (or give neither for the synthetic run)")
    notes: list[str] = []
    genai_dir = DEFAULT_DIR if genai is None else Path(genai)
    use_genai = genai != "synthetic" and (genai is not None or DEFAULT_DIR.is_dir())
    if use_genai:
        serving = load_serving_trace(genai_dir)
        memory_file = genai_dir / GENAI_FILE
        fractions = genai_fractions(memory_file) if memory_file.is_file() else None
        notes.append(f"serving load from {genai_dir}")
    else:
        serving, fractions = synthetic_serving_trace(workload_seed), None
        notes.append("serving load synthetic (--genai synthetic)" if genai is not None
                     else f"serving load: {fallback_line(DEFAULT_DIR, 'GenAI trace')}")
    described: list[object] = [hours, load, start_s, workload_seed, coverage,
                               _file_id(genai_dir / "qps.csv") if use_genai else "synthetic"]
    if nodes_path is None or pods_path is None:
        nodes = synthetic_nodes(synthetic_node_count, seed=0)
        capacity = sum(n.gpu_count for n in nodes) * MILLI_PER_GPU
        chosen = 0.8 if load is None else load
        timed = synthetic_timed(capacity, hours, chosen, workload_seed)
        workload = "synthetic"
        described += ["synthetic", synthetic_node_count]
        notes.append(f"synthetic cluster of {len(nodes)} nodes, load {chosen:g}")
    else:
        nodes = load_nodes(nodes_path)
        products = {n.gpu_product for n in nodes if n.gpu_count}
        trace = load_timed_pods(pods_path, products, set(serving.versions))
        capacity = sum(n.gpu_count for n in nodes) * MILLI_PER_GPU
        if not capacity:
            raise BadInput("the cluster has no GPUs", source=str(nodes_path))
        end = max(t.arrive_s for t in trace)
        start = end - hours * 3600.0 if start_s is None else start_s
        copies = 1 if load is None else copies_for_load(trace, capacity, load)
        timed = window(trace, start, hours, copies=copies, seed=workload_seed)
        workload = pods_path.stem
        described += [_file_id(nodes_path), _file_id(pods_path), start]
        held = mean_demand_milli(trace, end - min(t.arrive_s for t in trace) + 1.0) * copies
        notes.append(f"{workload}: window from {start:.0f} s for {hours:g} h, {copies} "
                     f"cop{'y' if copies == 1 else 'ies'} of the trace, {len(timed)} pods, "
                     f"~{100 * held / capacity:.1f}% of GPU capacity held on average"
                     + ("" if load is not None else " (raise it with --load)"))
    requests = [t.pod for t in timed]
    if not requests:
        raise BadInput("no pod of the trace is alive in the window; check --start-s and --hours")
    target = TargetWorkload.from_pods(requests, coverage=coverage)
    fingerprint = hashlib.sha256(json.dumps(described, default=str).encode()).hexdigest()[:16]
    return Inputs(workload=workload, nodes=nodes, timed=timed, serving_trace=serving,
                  memory_fractions=fractions, target=target, fingerprint=fingerprint,
                  notes=tuple(notes))


# ----------------------------------------------------------------------------- the grid
def parse_assignment(text: str) -> tuple[str, list[object]]:
    """``knob=v1,v2`` -> (knob, values); the knob must be one of ``EventConfig``'s."""
    knob, sep, values = text.partition("=")
    knob = knob.strip()
    if not sep or not knob:
        raise BadInput(f"{text!r} is not knob=value[,value...]", field="--set")
    items = [v for v in values.split(",") if v.strip()] if values.strip() else []
    if not items:
        raise BadInput(f"no value for {knob!r}", field="--set")
    return knob, [knob_value(knob, v) for v in items]


def read_grid(path: Path) -> dict[str, list[object]]:
    """A grid file: a YAML (or JSON) mapping of knob -> value or list of values."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror or exc}", source=str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise BadInput(f"not YAML: {getattr(exc, 'problem', exc)}", source=str(path),
                       row=None if mark is None else mark.line + 1) from None
    if not isinstance(data, dict):
        raise BadInput("expected a mapping of knob: [values]", source=str(path))
    grid: dict[str, list[object]] = {}
    for knob, values in data.items():
        listed = values if isinstance(values, list) else [values]
        if not listed:
            raise BadInput(f"no value for {knob!r}", source=str(path), field=str(knob))
        try:
            grid[str(knob)] = [knob_value(str(knob), _text(v)) for v in listed]
        except BadInput as exc:
            raise BadInput(str(exc), source=str(path)) from None
    return grid


def _text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def expand(grid: dict[str, list[object]], base: EventConfig | None = None) -> list[EventConfig]:
    """Every combination of ``grid``, in a stable order (the order knobs were given)."""
    base = base or EventConfig()
    knobs = list(grid)
    count = 1
    for listed in grid.values():
        count *= len(listed)
    if count > MAX_RUNS:
        raise BadInput(f"the grid has {count} runs (limit {MAX_RUNS}); narrow it")
    known = {f.name for f in fields(EventConfig)}
    configs: list[EventConfig] = []
    for combo in itertools.product(*(grid[k] for k in knobs)):
        values: dict[str, Any] = dict(zip(knobs, combo, strict=True))
        assert set(values) <= known  # knob_value checked the names
        config = EventConfig(**{**config_dict(base), **values})
        configs.append(config.validate())
    return configs


def config_dict(config: EventConfig) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in fields(config)}


def run_id(config: EventConfig, fingerprint: str) -> str:
    text = json.dumps([fingerprint, config_dict(config)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def run_path(out: Path, config: EventConfig, fingerprint: str) -> Path:
    return out / RUNS_DIR / f"{config.policy}-seed{config.seed}-{run_id(config, fingerprint)}.json"


def parse_shard(text: str) -> tuple[int, int]:
    """``i/N`` with ``0 <= i < N``."""
    index, sep, total = text.partition("/")
    if not sep or not index.strip().isdigit() or not total.strip().isdigit():
        raise BadInput(f"{text!r} is not i/N (e.g. 0/4)", field="--shard")
    i, n = int(index), int(total)
    if not 0 <= i < n:
        raise BadInput(f"{text!r}: the index must be in 0..{n - 1}", field="--shard")
    return i, n


# ----------------------------------------------------------------------------- running
def run_record(inputs: Inputs, config: EventConfig) -> dict[str, Any]:
    """One run as the JSON record the sweep writes (a top-level function for workers)."""
    result = run_events(inputs.nodes, inputs.timed, config, serving_trace=inputs.serving_trace,
                        memory_fractions=inputs.memory_fractions, target=inputs.target,
                        workload=inputs.workload)
    return {"run_id": run_id(config, inputs.fingerprint), "fingerprint": inputs.fingerprint,
            **result.as_dict()}


_WORKER_INPUTS: Inputs | None = None


def _init_worker(inputs: Inputs) -> None:
    global _WORKER_INPUTS
    _WORKER_INPUTS = inputs


def _worker_run(config: EventConfig) -> dict[str, Any]:
    assert _WORKER_INPUTS is not None
    return run_record(_WORKER_INPUTS, config)


class Progress:
    """A progress bar on stderr (redrawn in place on a terminal, one line per run elsewhere)."""

    WIDTH = 30

    def __init__(self, total: int, skipped: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.skipped = skipped
        self.done = 0
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self.tty = self.stream.isatty()
        if total:
            self._draw("")

    def _draw(self, last: str) -> None:
        filled = self.WIDTH * (self.done + self.skipped) // max(self.total + self.skipped, 1)
        elapsed = time.monotonic() - self.started
        text = (f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.done}/{self.total} runs"
                f"{f' ({self.skipped} already done)' if self.skipped else ''} "
                f"{elapsed:5.0f}s {last}")
        if self.tty:
            self.stream.write(f"\r{text[:150]:<150}")
            if self.done == self.total:
                self.stream.write("\n")
        elif last:
            self.stream.write(text + "\n")
        self.stream.flush()

    def advance(self, last: str) -> None:
        self.done += 1
        self._draw(last)


def _run_local(inputs: Inputs, configs: Sequence[EventConfig], jobs: int
               ) -> Iterator[dict[str, Any]]:
    if jobs == 1 or len(configs) == 1:
        for config in configs:
            yield run_record(inputs, config)
        return
    with ProcessPoolExecutor(max_workers=min(jobs, len(configs)), initializer=_init_worker,
                             initargs=(inputs,)) as pool:
        futures = [pool.submit(_worker_run, c) for c in configs]
        for future in as_completed(futures):
            yield future.result()


RAY_CONNECT_TIMEOUT_S = 5.0


def _check_reachable(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Refuse at once an ``ADDRESS`` (``host:port`` or ``ray://host:port``) where nothing
    listens: Ray itself would keep retrying for minutes before it gives up. ``auto`` (a local
    cluster Ray finds itself) is left to Ray."""
    target = address.removeprefix("ray://")
    if address == "auto" or ":" not in target:
        return
    host, _, port = target.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise BadInput(f"{address!r} is not auto, HOST:PORT or ray://HOST:PORT",
                       field="--ray") from None
    try:
        socket.create_connection((host.strip("[]"), number), timeout=timeout_s).close()
    except OSError as exc:
        raise BadInput(f"cannot connect to the Ray cluster at {address!r}: nothing answers "
                       f"there within {timeout_s:g} s ({exc})", field="--ray") from None


def _run_ray(inputs: Inputs, configs: Sequence[EventConfig], address: str
             ) -> Iterator[dict[str, Any]]:
    """One Ray task per run; results stream back as they finish."""
    try:
        import ray
    except ImportError:
        raise BadInput("--ray needs Ray: pip install 'gpufrag[ray]'", field="--ray") from None
    started_here = not ray.is_initialized()
    if started_here:
        _check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except ConnectionError as exc:
            raise BadInput(f"cannot connect to the Ray cluster at {address!r}: {exc}",
                           field="--ray") from None
    try:
        task = ray.remote(num_cpus=1)(run_record)
        shared = ray.put(inputs)
        pending = [task.remote(shared, c) for c in configs]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                record: dict[str, Any] = ray.get(ref)
                yield record
    finally:
        if started_here:
            ray.shutdown()


@dataclass
class SweepOutcome:
    records: list[dict[str, Any]]
    ran: int
    skipped: int


def sweep(inputs: Inputs, configs: Sequence[EventConfig], out: Path, *, jobs: int = 1,
          ray_address: str | None = None, shard: tuple[int, int] | None = None,
          stream: TextIO | None = None,
          runner: Callable[[Inputs, Sequence[EventConfig]], Iterable[dict[str, Any]]] | None
          = None) -> SweepOutcome:
    """Run the grid's runs (this shard's, when sharded) that ``out`` does not hold yet."""
    mine = [c for i, c in enumerate(configs) if shard is None or i % shard[1] == shard[0]]
    records: dict[str, dict[str, Any]] = {}
    todo: list[EventConfig] = []
    for config in mine:
        path = run_path(out, config, inputs.fingerprint)
        existing = timeline.read_run(path) if path.is_file() else None
        if existing is not None and existing["run_id"] == run_id(config, inputs.fingerprint):
            records[existing["run_id"]] = existing
        else:
            todo.append(config)
    progress = Progress(len(todo), len(mine) - len(todo), stream)
    if runner is None:
        def runner(i: Inputs, c: Sequence[EventConfig]) -> Iterable[dict[str, Any]]:
            if ray_address is not None:
                return _run_ray(i, c, ray_address)
            return _run_local(i, c, jobs)
    by_id = {run_id(c, inputs.fingerprint): c for c in todo}
    for record in runner(inputs, todo) if todo else ():
        config = by_id[record["run_id"]]
        timeline.write_atomic(run_path(out, config, inputs.fingerprint),
                              json.dumps(record, indent=1) + "\n")
        records[record["run_id"]] = record
        totals = record["totals"]
        progress.advance(f"{config.policy} seed {config.seed}: alloc "
                         f"{totals['mean_allocation_pct']:.1f}%, wait p99 "
                         f"{totals['wait_p99_s']:.0f}s ({record['seconds']:.1f}s, "
                         f"{record.get('cpu_seconds', 0):.1f}s CPU)")
    order = {run_id(c, inputs.fingerprint): i for i, c in enumerate(mine)}
    ordered = sorted(records.values(), key=lambda r: order[r["run_id"]])
    return SweepOutcome(ordered, ran=len(todo), skipped=len(mine) - len(todo))


# ----------------------------------------------------------------------------- merging
def collect(directories: Sequence[Path]) -> list[dict[str, Any]]:
    """Every run file under ``DIR/runs`` (or ``DIR`` itself) of each directory, once each,
    in a stable order (by knobs)."""
    found: dict[str, dict[str, Any]] = {}
    for directory in directories:
        where = directory / RUNS_DIR if (directory / RUNS_DIR).is_dir() else directory
        if not where.is_dir():
            raise BadInput("not a directory of sweep results", source=str(directory))
        for path in sorted(where.glob("*.json")):
            record = timeline.read_run(path)
            if record is not None:
                found.setdefault(record["run_id"], record)
    return sorted(found.values(), key=lambda r: json.dumps(r["config"], sort_keys=True))


def write_outputs(records: Sequence[dict[str, Any]], out: Path, title: str,
                  plots: bool = True) -> list[Path]:
    """comparison.csv (and timeline.png) for ``records``."""
    out.mkdir(parents=True, exist_ok=True)
    written = [timeline.write_comparison(records, out)]
    if plots and records:
        written.append(timeline.plot(records, out, title))
    return written


def same_results(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> bool:
    """Equal runs, ignoring time taken (what a Ray or sharded sweep must reproduce)."""
    def strip(r: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in r.items() if k not in ("seconds", "cpu_seconds")}

    def key(r: dict[str, Any]) -> str:
        return str(r["run_id"])

    return [strip(r) for r in sorted(a, key=key)] == [strip(r) for r in sorted(b, key=key)]


__all__ = ["Inputs", "collect", "expand", "knob_value", "load_inputs", "parse_assignment",
           "parse_shard", "read_grid", "run_record", "same_results", "sweep", "write_outputs"]
