"""``gpufrag demo``: the whole path, working together, on a local control plane in a few minutes.

What it runs, in order, and why each piece is the real one:

1. **A fragmented "before" cluster.** Fake GPU nodes of mixed products on the real control plane
   (:mod:`gpufrag.devcluster`), long-running batch pods, and model Deployments whose first
   replicas were *bound directly* where a spreading scheduler puts them (the emptiest node, a
   fresh GPU each) — the state a cluster is in before gpufrag is installed.
2. **gpufrag-scheduler**: the upstream kube-scheduler calling ``gpufrag extender`` (filter,
   prioritize, bind) as a subprocess. Traffic grows, the Deployments scale up, and each new
   replica is placed by FGD blended with model-version affinity. Cold loads avoided are counted
   from the extender's own bind log: a replica bound to a node that already ran its model
   version skips the image pull and weight load.
3. **Serving**: one ``gpufrag serve --model builtin:resnet-small`` process per Deployment stands
   in for its pods (real HTTP, real dynamic batching, a real model on the CPU), driven by an
   open-loop Poisson load generator; request p99 is measured from each request's scheduled send
   time, so a stalled server cannot hide its queueing.
4. **GPU memory** goes through the node agent's own code path (``defrag.agent.cli.main`` with its
   NVML hook): NVML readings → pid → cgroup → pod → the ``gpufrag.io/gpu-usage`` annotation on
   each Node. Without a GPU (the usual case on a laptop or CI) the NVML answers are replayed from
   recorded per-model figures, and the demo says so; with a GPU, a stand-in's live NVML reading
   replaces its model's recorded figure.
5. **One defrag cycle**: ``gpufrag defrag`` against the cluster, not a dry run. It plans moves,
   writes placement hints, evicts through the Eviction API (PDBs respected), and the extender
   steers each replacement to the hinted node.
6. **Before/after**: fragmentation ratio, waste ratio, free whole GPUs (measured by the defrag
   controller's own functions from what the API server holds), cold loads avoided, request p99 —
   printed as a table, written to ``DIR/demo_summary.json`` and plotted to ``DIR/demo.png``.

Everything it starts is stopped at the end or on Ctrl-C / SIGTERM; ``--keep-running`` leaves the
cluster up (with the extender, the scheduler and the stand-ins) until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TextIO

import kubernetes
import numpy as np

from defrag.agent.nvml import GpuReading
from gpufrag import conventions as cv
from gpufrag.devcluster import (
    BINARY_ENV,
    BuildError,
    ControlPlane,
    ControlPlaneError,
    ExtenderProcess,
    build_control_plane,
    gpufrag_scheduler_config,
    wait_until,
)
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, BadInput

PROG = "gpufrag demo"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
MIB = 1024 * 1024
MILLI_PER_GPU = 1000
NODE_LABEL = "demo.gpufrag.io/node"  # on every demo node, to tell them from others
MIN_NODES, MAX_NODES = 4, 64
WAIT_S = 90.0
STANDIN_MODEL = "builtin:resnet-small"

# -----------------------------------------------------------------------------------------------
# The scenario (plain data)


@dataclass(frozen=True, slots=True)
class NodeShape:
    """A GPU node type: the GFD product label, NVML's name for the GPU, count and memory."""

    short: str
    product: str
    nvml_name: str
    gpus: int
    gpu_memory_mib: int


A100 = NodeShape("a100", "NVIDIA-A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 8, 81_920)
V100 = NodeShape("v100", "Tesla-V100-SXM2-32GB", "Tesla V100-SXM2-32GB", 8, 32_768)
A10 = NodeShape("a10", "NVIDIA-A10", "NVIDIA A10", 4, 23_028)
T4 = NodeShape("t4", "Tesla-T4", "Tesla T4", 4, 15_360)
SHAPES: tuple[NodeShape, ...] = (A100, V100, A10, T4)


@dataclass(frozen=True, slots=True)
class ModelDeployment:
    """One model's Deployment: its GPU share, how many replicas the spreading scheduler placed
    (``legacy_replicas``), how many traffic later asks for (``replicas``), and the GPU memory one
    replica uses (``used_mib``, the recorded NVML figure)."""

    name: str
    model: str
    version: str
    gpu_milli: int
    legacy_replicas: int
    replicas: int
    used_mib: int
    products: tuple[str, ...] = ()  # acceptable GPU products (gpufrag.io/gpu-spec); () = any


# Shares are requested generously, as they are in practice (sized for the largest batch and
# the biggest GPU the model might land on), so most replicas leave much of their reservation idle.
DEPLOYMENTS: tuple[ModelDeployment, ...] = (
    ModelDeployment("chat", "llama-3-8b-instruct", "3.1", 500, 3, 4, 14_500,
                    (A100.product, V100.product)),
    ModelDeployment("embed", "bge-large-en", "1.5", 250, 5, 7, 1_400),
    ModelDeployment("rerank", "bge-reranker-base", "2", 300, 3, 4, 2_100),
    ModelDeployment("vision", "resnet50", "1", 200, 3, 4, 900),
)


@dataclass(frozen=True, slots=True)
class BatchPod:
    """A long-running bare pod on whole GPUs (training, a notebook): never moved by defrag."""

    name: str
    gpus: int
    used_fraction: float  # of each GPU's memory, the recorded NVML figure


BATCH_PODS: tuple[BatchPod, ...] = (
    BatchPod("finetune-a", 4, 0.92),
    BatchPod("train-a", 2, 0.88),
    BatchPod("train-b", 1, 0.90),
    BatchPod("notebook-a", 1, 0.35),
)


def node_layout(count: int) -> list[tuple[str, NodeShape]]:
    """``count`` nodes cycling through the products: demo-a100-0, demo-v100-0, ..."""
    seen: dict[str, int] = {}
    nodes = []
    for i in range(count):
        shape = SHAPES[i % len(SHAPES)]
        index = seen.get(shape.short, 0)
        seen[shape.short] = index + 1
        nodes.append((f"demo-{shape.short}-{index}", shape))
    return nodes


# -----------------------------------------------------------------------------------------------
# The "before" placement: what a spreading scheduler does with GPU pods (pure)


@dataclass(frozen=True, slots=True)
class LegacyPod:
    """A pod to place the spreading way: ``whole`` GPUs, or a ``milli`` share of one GPU."""

    key: str
    whole: int = 0
    milli: int = 0
    products: tuple[str, ...] = ()


def spread_placement(nodes: Sequence[tuple[str, NodeShape]], pods: Sequence[LegacyPod],
                     rng: random.Random) -> dict[str, tuple[str, tuple[int, ...]]]:
    """key -> (node, GPUs): each pod on the feasible node with the largest free GPU fraction
    (kube-scheduler's LeastAllocated), a share on that node's emptiest GPU, whole GPUs on the
    lowest-index idle ones; ties by a seeded node order. Raises BadInput when a pod fits nowhere.

    This is the fragmenting baseline: every replica opens a fresh GPU while one is left.
    """
    free = {name: [MILLI_PER_GPU] * shape.gpus for name, shape in nodes}
    order = [name for name, _ in nodes]
    rank = {name: i for i, name in enumerate(rng.sample(order, len(order)))}
    placed: dict[str, tuple[str, tuple[int, ...]]] = {}
    for pod in pods:
        best: tuple[tuple[float, int], str, tuple[int, ...]] | None = None
        for name, shape in nodes:
            if pod.products and shape.product not in pod.products:
                continue
            gpus = _fit(free[name], pod)
            if gpus is None:
                continue
            key = (-sum(free[name]) / (MILLI_PER_GPU * shape.gpus), rank[name])
            if best is None or key < best[0]:
                best = (key, name, gpus)
        if best is None:
            raise BadInput(f"{pod.key} fits on no node; use more nodes (--nodes)", field="nodes")
        _, name, gpus = best
        for g in gpus:
            free[name][g] -= MILLI_PER_GPU if pod.whole else pod.milli
        placed[pod.key] = (name, gpus)
    return placed


def _fit(free: Sequence[int], pod: LegacyPod) -> tuple[int, ...] | None:
    if pod.whole:
        idle = [g for g, f in enumerate(free) if f == MILLI_PER_GPU]
        return tuple(idle[:pod.whole]) if len(idle) >= pod.whole else None
    fitting = [g for g, f in enumerate(free) if f >= pod.milli]
    if not fitting:
        return None
    return (max(fitting, key=lambda g: (free[g], -g)),)


# -----------------------------------------------------------------------------------------------
# Cold loads (pure)

ModelKey = tuple[str, str]  # (model, version)


@dataclass
class ColdLoads:
    """Replica placements, in bind order, split into warm (the node already ran that model
    version: image pulled, weights in the page cache) and cold. ``ran`` is what each node has
    run so far and carries over from one phase to the next."""

    ran: set[tuple[str, str, str]] = field(default_factory=set)  # (node, model, version)
    placements: int = 0
    avoided: int = 0

    def place(self, node: str, key: ModelKey) -> bool:
        """Count one placement; True when it was warm."""
        entry = (node, *key)
        warm = entry in self.ran
        self.ran.add(entry)
        self.placements += 1
        self.avoided += warm
        return warm

    def phase(self) -> ColdLoads:
        """A fresh count that remembers what already ran."""
        return ColdLoads(ran=set(self.ran))

    def as_dict(self) -> dict[str, int]:
        return {"placements": self.placements, "cold_loads_avoided": self.avoided,
                "cold_loads": self.placements - self.avoided}


# -----------------------------------------------------------------------------------------------
# Recorded NVML, replayed through the node agent


@dataclass(frozen=True, slots=True)
class _Memory:
    used: int
    total: int


@dataclass(frozen=True, slots=True)
class _Utilization:
    gpu: int


@dataclass(frozen=True, slots=True)
class _Process:
    pid: int
    usedGpuMemory: int | None  # NVML's name


@dataclass(frozen=True, slots=True)
class RecordedGpu:
    """One GPU as NVML reports it (bytes): identity, memory, utilisation, processes."""

    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    utilization_pct: int
    processes: tuple[tuple[int, int], ...] = ()  # (host pid, used bytes)


class ReplayNvml:
    """The pynvml calls the agent makes (:class:`defrag.agent.nvml.NvmlApi`), answered from
    recorded readings of one node — what the agent sees on a node without a real GPU here."""

    def __init__(self, gpus: Sequence[RecordedGpu]) -> None:
        self.gpus = list(gpus)

    @staticmethod
    def _gpu(handle: object) -> RecordedGpu:
        if not isinstance(handle, RecordedGpu):
            raise TypeError(f"not a handle of this NVML: {handle!r}")
        return handle

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: object) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> _Memory:
        gpu = self._gpu(handle)
        return _Memory(used=gpu.used_bytes, total=gpu.total_bytes)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> _Utilization:
        return _Utilization(self._gpu(handle).utilization_pct)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[_Process]:
        return [_Process(pid, used) for pid, used in self._gpu(handle).processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: object) -> list[_Process]:
        return []


@dataclass(frozen=True, slots=True)
class GpuPod:
    """A pod bound to a node, as the recorded readings need it."""

    uid: str
    gpus: tuple[int, ...]
    used_mib_per_gpu: int


class FakeProcRoot:
    """``<root>/<pid>/cgroup`` files naming each pod's cgroup the way the kubelet's systemd driver
    does, so the agent's pid -> pod lookup (``--proc-root``) runs unchanged."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._pids: dict[str, int] = {}

    def pid_of(self, uid: str) -> int:
        pid = self._pids.get(uid)
        if pid is None:
            pid = self._pids[uid] = 200_000 + len(self._pids)
            cgroup = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                      f"{uid.replace('-', '_')}.slice/cri-containerd-{uuid.uuid4().hex}.scope\n")
            (self.root / str(pid)).mkdir(parents=True, exist_ok=True)
            (self.root / str(pid) / "cgroup").write_text(cgroup)
        return pid


def recorded_gpus(node: str, shape: NodeShape, pods: Sequence[GpuPod],
                  pid_of: Callable[[str], int]) -> list[RecordedGpu]:
    """The NVML readings of one node: each pod's process on each of its GPUs."""
    gpus = []
    for g in range(shape.gpus):
        processes = tuple((pid_of(p.uid), p.used_mib_per_gpu * MIB)
                          for p in pods if g in p.gpus)
        used = sum(b for _, b in processes)
        gpus.append(RecordedGpu(
            uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{g}')}", name=shape.nvml_name,
            total_bytes=shape.gpu_memory_mib * MIB, used_bytes=used,
            utilization_pct=min(100, 30 * len(processes)), processes=processes))
    return gpus


def live_model_memory(readings: Sequence[GpuReading], pids: Mapping[str, int]) -> dict[str, int]:
    """Deployment -> the GPU memory its stand-in process uses now, summed over the GPUs NVML
    lists it on (stand-ins not on any GPU are left out)."""
    used: dict[int, int] = {}
    for reading in readings:
        for process in reading.processes:
            used[process.pid] = used.get(process.pid, 0) + process.memory_used_mib
    return {name: used[pid] for name, pid in pids.items() if pid in used}


# -----------------------------------------------------------------------------------------------
# Stand-ins: gpufrag serve processes, and an open-loop load generator


@dataclass
class StandIn:
    """``gpufrag serve --model builtin:resnet-small`` serving one Deployment's traffic."""

    deployment: str
    process: subprocess.Popen[bytes]
    log_path: Path
    port: int = 0
    load_s: float = math.nan  # the server's own cold-start measurement

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, deployment: str, log_path: Path) -> StandIn:
        env = {**os.environ, "GPUFRAG_LOG_FORMAT": "json"}
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "gpufrag.cli", "serve", "--model", STANDIN_MODEL,
                 "--model-name", deployment, "--host", "127.0.0.1", "--port", "0",
                 "--intra-op-threads", "1", "--max-queue-delay-ms", "2"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)
        return cls(deployment, process, log_path)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        def ready() -> bool | None:
            events = {}
            for line in self.log_path.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    with contextlib.suppress(json.JSONDecodeError):
                        record = json.loads(line)
                        events[record.get("event")] = record
            if self.process.poll() is not None:
                raise ControlPlaneError(f"gpufrag serve for {self.deployment} exited with "
                                        f"{self.process.returncode}; see {self.log_path}")
            if "listening" in events:
                self.port = int(events["listening"]["port"])
            if "model_loaded" in events:
                self.load_s = float(events["model_loaded"].get("load_seconds", math.nan))
            return "ready" in events or None

        wait_until(ready, timeout_s=timeout_s, what=f"gpufrag serve for {self.deployment}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


@dataclass(frozen=True, slots=True)
class LoadResult:
    """One open-loop run: latency from each request's scheduled send time, errors (non-200 or
    no answer), and the mean batch size the servers formed (their own histogram)."""

    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    mean_batch: float
    p99_ms_by_deployment: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "errors": self.errors,
                "p50_ms": _round(self.p50_ms, 2), "p99_ms": _round(self.p99_ms, 2),
                "mean_batch": _round(self.mean_batch, 2),
                "p99_ms_by_deployment": {k: _round(v, 2)
                                         for k, v in self.p99_ms_by_deployment.items()}}


def _round(value: float, digits: int) -> float | None:
    return None if math.isnan(value) else round(value, digits)


def run_load(targets: Sequence[tuple[str, str]], *, rate_per_target: float, seconds: float,
             seed: int) -> LoadResult:
    """Poisson arrivals at ``rate_per_target`` per (url, model) for ``seconds``, each to a
    seeded-random target; arrivals never wait for answers (open loop)."""
    return asyncio.run(_open_loop(targets, rate_per_target, seconds, seed))


async def _open_loop(targets: Sequence[tuple[str, str]], rate_per_target: float,
                     seconds: float, seed: int) -> LoadResult:
    import aiohttp

    from serving.client import encode_inputs

    rng = random.Random(seed)
    image = np.random.default_rng(seed).random((1, 3, 32, 32), dtype=np.float32)
    request = encode_inputs({"input": image}, binary=True)
    headers = {**request.headers(), "Timeout-Ms": "2000"}
    timeout = aiohttp.ClientTimeout(total=5.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        batches_before = [await _batch_histogram(session, url) for url, _ in targets]

        async def send(target: int, scheduled: float) -> tuple[int, float, bool]:
            url, model = targets[target]
            try:
                async with session.post(f"{url}/v2/models/{model}/infer", data=request.body,
                                        headers=headers) as response:
                    await response.read()
                    ok = response.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            return target, time.perf_counter() - scheduled, ok

        for t in range(len(targets)):  # one warm request each: connections and the model
            await send(t, time.perf_counter())
        tasks: list[asyncio.Task[tuple[int, float, bool]]] = []
        start = time.perf_counter()
        at = 0.0
        while True:
            at += rng.expovariate(rate_per_target * len(targets))
            if at >= seconds:
                break
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(rng.randrange(len(targets)), start + at)))
        outcomes = list(await asyncio.gather(*tasks))
        batches_after = [await _batch_histogram(session, url) for url, _ in targets]
    latencies = [s for _, s, ok in outcomes if ok]
    by_target: dict[str, float] = {}
    for t, (_, model) in enumerate(targets):
        mine = [s for i, s, ok in outcomes if ok and i == t]
        by_target[model] = _percentile_ms(mine, 99)
    batch_sum = sum(a[0] - b[0] for a, b in zip(batches_after, batches_before, strict=True))
    batch_n = sum(a[1] - b[1] for a, b in zip(batches_after, batches_before, strict=True))
    return LoadResult(requests=len(outcomes), errors=sum(1 for *_, ok in outcomes if not ok),
                      p50_ms=_percentile_ms(latencies, 50), p99_ms=_percentile_ms(latencies, 99),
                      mean_batch=batch_sum / batch_n if batch_n else math.nan,
                      p99_ms_by_deployment=by_target)


async def _batch_histogram(session: Any, url: str) -> tuple[float, float]:
    """(sum, count) of the server's ``gpufrag_serving_batch_size`` histogram."""
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    found = {"gpufrag_serving_batch_size_sum": 0.0, "gpufrag_serving_batch_size_count": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in found:
            found[name] += float(line.rsplit(" ", 1)[1])
    return found["gpufrag_serving_batch_size_sum"], found["gpufrag_serving_batch_size_count"]


def _percentile_ms(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else math.nan


# -----------------------------------------------------------------------------------------------
# Options, phases, the summary


@dataclass(frozen=True, slots=True)
class DemoOptions:
    out: Path = Path("demo-out")
    nodes: int = 8
    seed: int = 0
    load_s: float = 5.0  # seconds of load per phase
    rate_per_s: float = 20.0  # requests per second to each stand-in
    keep_running: bool = False

    def validate(self) -> DemoOptions:
        if not MIN_NODES <= self.nodes <= MAX_NODES:
            raise BadInput(f"must be in {MIN_NODES}..{MAX_NODES}, got {self.nodes}",
                           field="--nodes")
        if not 0.5 <= self.load_s <= 120:
            raise BadInput(f"must be in 0.5..120 seconds, got {self.load_s}", field="--load-s")
        if not 1 <= self.rate_per_s <= 500:
            raise BadInput(f"must be in 1..500 requests/s, got {self.rate_per_s}",
                           field="--rate")
        return self


@dataclass
class Phase:
    """The cluster and the serving path at one point: before or after the defrag cycle."""

    measured: dict[str, Any]  # defrag.measure.Summary.as_dict()
    layout: dict[str, list[int]]  # node -> allocated milli per GPU
    load: LoadResult
    placement: dict[str, int]  # ColdLoads.as_dict() of the placements this phase stands for
    placed_by: str

    def as_dict(self) -> dict[str, Any]:
        return {**self.measured, **self.placement, "placed_by": self.placed_by,
                **self.load.as_dict()}


@dataclass
class DemoSummary:
    options: DemoOptions
    nodes: list[dict[str, Any]]
    gpu_memory_source: str
    before: Phase
    after: Phase
    deployments: list[dict[str, Any]]
    defrag: dict[str, Any]
    standins: list[dict[str, Any]]
    phases_s: dict[str, float]
    runtime_s: float
    extender_url: str = ""
    namespace: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.options.seed, "nodes": self.nodes,
            "gpu_memory_source": self.gpu_memory_source,
            "before": self.before.as_dict(), "after": self.after.as_dict(),
            "layout": {"before": self.before.layout, "after": self.after.layout},
            "namespace": self.namespace, "extender_url": self.extender_url,
            "deployments": self.deployments, "defrag": self.defrag, "standins": self.standins,
            "load": {"seconds": self.options.load_s, "rate_per_standin": self.options.rate_per_s,
                     "open_loop": True},
            "phases_s": self.phases_s, "runtime_s": round(self.runtime_s, 1),
        }


ROWS: tuple[tuple[str, str, Callable[[Phase], str]], ...] = (
    ("fragmentation ratio (FGD)", "lower",
     lambda p: f"{p.measured['frag_ratio']:.1%} ({p.measured['frag_gpus']:.2f} GPUs)"),
    ("waste ratio (reserved, unused)", "lower",
     lambda p: f"{p.measured['waste_ratio']:.1%} ({p.measured['wasted_gib']:.0f} GiB)"),
    ("free whole GPUs", "higher", lambda p: str(p.measured["free_whole_gpus"])),
    ("cold loads avoided by affinity", "higher",
     lambda p: f"{p.placement['cold_loads_avoided']} of {p.placement['placements']} "
               f"({p.placed_by})"),
    ("request p99 (ms)", "lower",
     lambda p: f"{p.load.p99_ms:.1f} (p50 {p.load.p50_ms:.1f})"),
    ("requests (errors)", "", lambda p: f"{p.load.requests} ({p.load.errors})"),
    ("mean batch size", "", lambda p: f"{p.load.mean_batch:.2f}"),
)


def summary_table(summary: DemoSummary) -> str:
    b, a = summary.before, summary.after
    cells = [(name, fmt(b), fmt(a)) for name, _, fmt in ROWS]
    w0 = max(len(c[0]) for c in cells)
    w1 = max(len(c[1]) for c in [*cells, ("", "before defrag", "")])
    lines = [f"  {'':<{w0}}  {'before defrag':<{w1}}  after defrag",
             "  " + "-" * (w0 + w1 + 16)]
    lines += [f"  {n:<{w0}}  {x:<{w1}}  {y}" for n, x, y in cells]
    return "\n".join(lines)


def write_plot(summary: DemoSummary, path: Path) -> None:
    """Per-GPU allocation before/after (the fragmentation you can see) and the headline bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = list(summary.before.layout)
    width = max(len(v) for v in summary.before.layout.values())
    fig = plt.figure(figsize=(15, 8.5), constrained_layout=True)
    grid = fig.add_gridspec(2, 5, height_ratios=[1.25, 1])
    for col, (label, phase) in enumerate((("before defrag", summary.before),
                                          ("after defrag", summary.after))):
        ax = fig.add_subplot(grid[0, :2] if col == 0 else grid[0, 3:])
        cells = np.full((len(nodes), width), np.nan)
        for i, node in enumerate(nodes):
            row = phase.layout.get(node, [])
            cells[i, :len(row)] = row
        image = ax.imshow(cells, cmap="viridis", vmin=0, vmax=MILLI_PER_GPU, aspect="auto")
        for (i, g), value in np.ndenumerate(cells):
            if value > 0:
                ax.text(g, i, f"{value:.0f}", ha="center", va="center", fontsize=7,
                        color="black" if value > MILLI_PER_GPU * 0.6 else "white")
        ax.set_yticks(range(len(nodes)), nodes, fontsize=8)
        ax.set_xticks(range(width), [str(g) for g in range(width)], fontsize=8)
        ax.set_xlabel("GPU index")
        ax.set_title(f"{label}: allocated milli-GPU per GPU "
                     f"({phase.measured['free_whole_gpus']} whole GPUs free)", fontsize=10)
    fig.colorbar(image, ax=fig.axes[-1], shrink=0.8, label="allocated milli-GPU")
    notes = fig.add_subplot(grid[0, 2])
    notes.axis("off")
    notes.text(0.0, 0.95, _plot_note(summary), va="top", fontsize=8, family="monospace",
               wrap=True)
    bars: list[tuple[str, float, float]] = [
        ("fragmentation ratio", summary.before.measured["frag_ratio"],
         summary.after.measured["frag_ratio"]),
        ("waste ratio", summary.before.measured["waste_ratio"],
         summary.after.measured["waste_ratio"]),
        ("free whole GPUs", summary.before.measured["free_whole_gpus"],
         summary.after.measured["free_whole_gpus"]),
        ("placements that avoided a cold load",
         summary.before.placement["cold_loads_avoided"] / max(1, summary.before.placement[
             "placements"]),
         summary.after.placement["cold_loads_avoided"] / max(1, summary.after.placement[
             "placements"])),
        ("request p99 (ms)", summary.before.load.p99_ms, summary.after.load.p99_ms),
    ]
    for i, (title, before, after) in enumerate(bars):
        ax = fig.add_subplot(grid[1, i])
        ax.bar(["before", "after"], [before, after], color=["#b0b0b0", "#2a7ab9"])
        ax.set_title(title, fontsize=10)
        for x, v in enumerate((before, after)):
            text = f"{v:.0f}" if title.startswith("free") or "ms" in title else f"{v:.1%}"
            ax.annotate(text, (x, v), ha="center", va="bottom", fontsize=9)
    fig.suptitle(f"gpufrag demo: {len(nodes)} fake GPU nodes, one defrag cycle "
                 f"(seed {summary.options.seed}; GPU memory: {summary.gpu_memory_source})",
                 fontsize=11)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_note(summary: DemoSummary) -> str:
    d = summary.defrag
    return (f"defrag: {d['moves_planned']} moves planned\n"
            f"  {d['landed_on_hint']} replacements on the\n  hinted node\n"
            f"before: spread placement\n  ({summary.before.placement['placements']} replicas)\n"
            f"after: gpufrag-scheduler\n  ({summary.after.placement['placements']} replicas:\n"
            f"  scale-up + defrag)\n"
            f"stand-ins: {len(summary.standins)} x\n  gpufrag serve\n  {STANDIN_MODEL}")


# -----------------------------------------------------------------------------------------------
# The run


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which and where its log is."""


class Demo:
    """One run of the demo against ``plane``; everything it starts is stopped by :meth:`close`
    (also on an exception or Ctrl-C)."""

    def __init__(self, options: DemoOptions, plane: ControlPlane, *, owns_plane: bool,
                 out: TextIO, nvml: Any = None) -> None:
        self.options = options
        self.plane = plane
        self.owns_plane = owns_plane
        self.out = out
        self.nvml = nvml  # the live NVML binding; None: pynvml (tests pass a recorded fake)
        self.started = time.monotonic()
        # Typed as Any: the client's models make every field Optional and its methods want
        # model objects where the API takes plain manifests (dicts) just as well.
        self.api: Any = plane.api_client()
        self.core: Any = kubernetes.client.CoreV1Api(self.api)
        self.apps: Any = kubernetes.client.AppsV1Api(self.api)
        self.policy: Any = kubernetes.client.PolicyV1Api(self.api)
        self.namespace = "gpufrag-demo" if owns_plane else f"gpufrag-demo-{uuid.uuid4().hex[:6]}"
        self.nodes = node_layout(options.nodes)
        self.shapes = dict(self.nodes)
        self.logs_dir = options.out / "logs"
        self.work_dir = Path(tempfile.mkdtemp(prefix="gpufrag-demo-"))
        self.proc = FakeProcRoot(self.work_dir / "proc")
        self.extender: ExtenderProcess | None = None
        self.scheduler_process = f"gpufrag-demo-{uuid.uuid4().hex[:6]}"
        self.standins: list[StandIn] = []
        self.created_nodes: list[str] = []
        self.created_hints_namespace = False
        self.model_used_mib = {d.name: d.used_mib for d in DEPLOYMENTS}
        self.gpu_memory_source = "recorded"
        self.phases_s: dict[str, float] = {}
        self._phase_started = time.monotonic()
        self._legacy_counts = ColdLoads()
        self._binds_seen = 0

    # -- narration -------------------------------------------------------------------------

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {message}", file=self.out, flush=True)

    def detail(self, message: str) -> None:
        print(f"          {message}", file=self.out, flush=True)

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.phases_s[name] = round(now - self._phase_started, 1)
        self._phase_started = now

    # -- the steps -------------------------------------------------------------------------

    def run(self) -> DemoSummary:
        self.options.out.mkdir(parents=True, exist_ok=True)
        # A fresh logs/ each run: the steps read the extender's and the stand-ins' logs back.
        shutil.rmtree(self.logs_dir, ignore_errors=True)
        self.logs_dir.mkdir(parents=True)
        self._make_nodes()
        legacy = self._legacy_state()
        self.standins = [StandIn.start(d.name, self.logs_dir / f"serve-{d.name}.log")
                         for d in DEPLOYMENTS]
        self.lap("before_state")

        self._start_gpufrag_scheduler()
        scale_up = self._scale_up(legacy)
        self.lap("gpufrag_scheduler")

        self._ready_standins()
        self.lap("serving")

        self._publish_usage("before")
        before_measure, before_layout = self._measure()
        before_load = self._load("before")
        before = Phase(before_measure, before_layout, before_load, self._legacy_counts.as_dict(),
                       "spread placement")
        self.lap("measure_before")

        defrag = self._defrag()
        self._wait_deployments()
        self._wait_binds_logged(self._binds_seen + sum(1 for m in defrag["moves"]
                                                       if m.get("landed_on")))
        replacements = self._count_replacements(scale_up)
        self.lap("defrag")

        self._publish_usage("after")
        after_measure, after_layout = self._measure()
        after_load = self._load("after")
        after = Phase(after_measure, after_layout, after_load, replacements.as_dict(),
                      "gpufrag-scheduler")
        self.lap("measure_after")

        summary = DemoSummary(
            options=self.options,
            nodes=[{"name": n, "product": s.product, "gpus": s.gpus,
                    "gpu_memory_mib": s.gpu_memory_mib} for n, s in self.nodes],
            gpu_memory_source=self.gpu_memory_source, before=before, after=after,
            deployments=self._deployment_status(), defrag=defrag,
            standins=[{"deployment": s.deployment, "url": s.url, "model": STANDIN_MODEL,
                       "model_load_s": _round(s.load_s, 3)} for s in self.standins],
            phases_s=self.phases_s, runtime_s=time.monotonic() - self.started,
            extender_url=self.extender.url if self.extender is not None else "",
            namespace=self.namespace)
        self._report(summary)
        return summary

    def _make_nodes(self) -> None:
        existing = {n.metadata.name for n in self.core.list_node().items}
        clash = sorted(existing & {name for name, _ in self.nodes})
        if clash:
            raise DemoError(f"nodes {', '.join(clash)} already exist on this cluster; remove "
                            "them or run the demo on its own control plane")
        self.plane.create_namespace(self.namespace)
        if cv.HINTS_NAMESPACE not in {n.metadata.name for n in self.core.list_namespace().items}:
            self.plane.create_namespace(cv.HINTS_NAMESPACE)
            self.created_hints_namespace = True
        for name, shape in self.nodes:
            self.plane.create_gpu_node(name, shape.gpus, shape.product, shape.gpu_memory_mib,
                                       cpu_milli=96_000, memory_mib=512 * 1024,
                                       labels={NODE_LABEL: "true"})
            self.created_nodes.append(name)
        counts: dict[NodeShape, int] = {}
        for _, shape in self.nodes:
            counts[shape] = counts.get(shape, 0) + 1
        self.say(f"1/6 cluster: {len(self.nodes)} fake GPU nodes on the local control plane "
                 f"({self.plane.server}): " + ", ".join(
                     f"{n} x {s.product} ({s.gpus} GPUs, {s.gpu_memory_mib // 1024} GiB)"
                     for s, n in counts.items()))

    def _legacy_state(self) -> ColdLoads:
        """Batch pods and the Deployments' first replicas, bound where spreading puts them."""
        rng = random.Random(self.options.seed)
        for d in DEPLOYMENTS:
            self.apps.create_namespaced_deployment(self.namespace, deployment_manifest(d))
            self.policy.create_namespaced_pod_disruption_budget(self.namespace, {
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": d.name},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": d.name}}}})
        pending = wait_until(lambda: self._pending_replicas(), timeout_s=WAIT_S,
                             what="the Deployments' first replicas to be created")
        batch = [LegacyPod(f"batch/{b.name}", whole=b.gpus) for b in BATCH_PODS]
        replicas = [LegacyPod(key, milli=d.gpu_milli, products=d.products)
                    for key, d in sorted(pending.items())]
        rng.shuffle(batch)
        rng.shuffle(replicas)
        placed = spread_placement(self.nodes, batch + replicas, rng)

        from scheduler.kube.binder import KubeBinder
        from scheduler.kube.convert import DEFAULT_NAMES

        for b in BATCH_PODS:
            node, gpus = placed[f"batch/{b.name}"]
            self.core.create_namespaced_pod(self.namespace, batch_pod_manifest(b, node, gpus))
        binder = KubeBinder(self.api, DEFAULT_NAMES)
        counts = ColdLoads()
        for pod in replicas:  # in placement order: the order the cold loads happened
            node, gpus = placed[pod.key]
            name, uid = pod.key.split("/")
            binder.bind(self.namespace, name, uid, node, gpus)
            d = pending[pod.key]
            counts.place(node, (d.model, d.version))
        self._legacy_counts = counts
        self._wait_running(sum(d.legacy_replicas for d in DEPLOYMENTS) + len(BATCH_PODS))
        spread = len({placed[p.key] for p in replicas})
        self.say(f"   before: {len(BATCH_PODS)} batch pods ({sum(b.gpus for b in BATCH_PODS)} "
                 f"whole GPUs) and {len(replicas)} replicas of {len(DEPLOYMENTS)} model "
                 f"Deployments bound directly where a spreading scheduler puts them "
                 f"({spread} GPUs opened for {len(replicas)} GPU shares); "
                 f"{counts.avoided} of {counts.placements} replicas landed warm")
        return counts

    def _pending_replicas(self) -> dict[str, ModelDeployment] | None:
        """uid-keyed ``name/uid`` -> Deployment of every pod, once all first replicas exist."""
        by_app = {d.name: d for d in DEPLOYMENTS}
        found: dict[str, ModelDeployment] = {}
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            d = by_app.get((pod.metadata.labels or {}).get("app", ""))
            if d is not None and not pod.spec.node_name:
                found[f"{pod.metadata.name}/{pod.metadata.uid}"] = d
        wanted = sum(d.legacy_replicas for d in DEPLOYMENTS)
        return found if len(found) == wanted else None

    def _start_gpufrag_scheduler(self) -> None:
        self.extender = ExtenderProcess(self.plane, self.logs_dir / "extender.log")
        self.extender.start()
        self.plane.start_scheduler(self.scheduler_process,
                                   gpufrag_scheduler_config(self.extender.url))
        self.say(f"   gpufrag-scheduler: kube-scheduler + gpufrag extender (filter, prioritize, "
                 f"bind) at {self.extender.url}; log {self.extender.log_path}")

    def _scale_up(self, legacy: ColdLoads) -> ColdLoads:
        self.say("2/6 traffic grows: the model Deployments scale up; gpufrag-scheduler places "
                 "the new replicas (FGD + model-version affinity)")
        for d in DEPLOYMENTS:
            self.apps.patch_namespaced_deployment_scale(d.name, self.namespace,
                                                        {"spec": {"replicas": d.replicas}})
        self._wait_running(sum(d.replicas for d in DEPLOYMENTS) + len(BATCH_PODS))
        self._wait_binds_logged(sum(d.replicas - d.legacy_replicas for d in DEPLOYMENTS))
        counts = legacy.phase()
        for node, d, warm in self._binds(counts, since=0):
            self.detail(f"{d.name:<7} {d.model}:{d.version} -> {node:<12} "
                        f"{'warm: ran this version already' if warm else 'cold load'}")
        self._binds_seen = len(self._bind_events())
        self.say(f"   cold loads avoided by affinity: {counts.avoided} of {counts.placements} "
                 f"new replicas (spread placement: {legacy.avoided} of {legacy.placements})")
        return counts

    def _bind_events(self) -> list[dict[str, Any]]:
        assert self.extender is not None
        prefix = f"{self.namespace}/"
        return [r for r in self.extender.log_events("bind")
                if str(r.get("pod", "")).startswith(prefix) and not r.get("refused")]

    def _wait_binds_logged(self, count: int) -> None:
        """The extender logs a bind just after the Binding is made: wait for the line."""
        wait_until(lambda: len(self._bind_events()) >= count or None, timeout_s=30,
                   what=f"{count} binds in the extender's log")

    def _binds(self, counts: ColdLoads, since: int) -> Iterator[tuple[str, ModelDeployment, bool]]:
        """The extender's binds in this namespace from the ``since``-th on, in bind order,
        counted into ``counts``."""
        for record in self._bind_events()[since:]:
            name = str(record["pod"]).split("/", 1)[1]
            d = next((d for d in DEPLOYMENTS if name.startswith(f"{d.name}-")), None)
            if d is not None:
                node = str(record["node"])
                yield node, d, counts.place(node, (d.model, d.version))

    def _count_replacements(self, counts: ColdLoads) -> ColdLoads:
        """Add the defrag cycle's replacements to the scale-up's count: together they are what
        gpufrag-scheduler placed."""
        for node, d, warm in self._binds(counts, since=self._binds_seen):
            self.detail(f"replacement {d.name:<7} -> {node:<12} "
                        f"{'warm: ran this version already' if warm else 'cold load'}")
        return counts

    def _ready_standins(self) -> None:
        for s in self.standins:
            s.wait_ready()
        self.say(f"3/6 serving: {len(self.standins)} x 'gpufrag serve --model {STANDIN_MODEL}' "
                 "stand in for the Deployments' pods (real HTTP, dynamic batching, ONNX model "
                 "on this machine)")
        for s in self.standins:
            self.detail(f"{s.deployment:<7} {s.url}/v2/models/{s.deployment}  "
                        f"(model loaded in {s.load_s:.3f}s)")

    def _live_memory(self) -> None:
        """With a GPU here, a stand-in's live NVML reading replaces its model's recorded
        figure (it is what that model's replicas would use)."""
        from defrag.agent.nvml import GpuReadError, NoGpuError, NvmlReader

        reader = NvmlReader(self.nvml)
        try:
            reader.open()
        except (NoGpuError, GpuReadError) as e:
            self.detail(f"no GPU on this machine ({e}):")
            self.detail("GPU memory comes from RECORDED NVML readings (per-model figures), "
                        "replayed through the node agent")
            return
        try:
            readings = reader.read()
        finally:
            reader.close()
        live = live_model_memory(readings, {s.deployment: s.process.pid for s in self.standins})
        self.model_used_mib.update(live)
        names = ", ".join(sorted({r.product for r in readings}))
        if live:
            self.gpu_memory_source = "nvml (live, stand-ins) + recorded"
            self.detail(f"GPU present ({names}): live NVML readings of the stand-ins set "
                        f"{', '.join(f'{k}={v} MiB' for k, v in sorted(live.items()))}; "
                        "the other figures are recorded")
        else:
            self.detail(f"GPU present ({names}) but the stand-ins run on the CPU: GPU memory "
                        "comes from RECORDED NVML readings, replayed through the node agent")

    def _publish_usage(self, phase: str) -> None:
        """Run the node agent once per node (its CLI, with the replayed NVML as its hook)."""
        from defrag.agent import cli as agent_cli
        from defrag.agent.cgroup import KubePodLister
        from defrag.agent.publish import KubeClusterWriter

        if phase == "before":
            self.say("4/6 GPU memory: 'gpufrag agent --once' per node publishes the "
                     f"{cv.ANNOTATION_GPU_USAGE} annotation (NVML -> pid -> cgroup -> pod)")
            self._live_memory()
        pods = self._gpu_pods()
        for node, shape in self.nodes:
            nvml = ReplayNvml(recorded_gpus(node, shape, pods.get(node, []), self.proc.pid_of))
            code = agent_cli.main(
                ["--node-name", node, "--once", "--metrics-port", "0", "--proc-root",
                 str(self.proc.root), "--log-level", "warning"],
                nvml=nvml, writer=KubeClusterWriter(self.api, node_name=node),
                pod_lister=KubePodLister(self.api, node))
            if code != EXIT_OK:
                raise DemoError(f"the node agent failed on {node} (exit {code})")
        attributed = sum(len(v) for v in pods.values())
        self.detail(f"agent published {len(self.nodes)} nodes, {attributed} pods attributed "
                    f"({phase} the defrag cycle)")

    def _gpu_pods(self) -> dict[str, list[GpuPod]]:
        """node -> the demo's pods on it, with their GPUs and recorded memory per GPU."""
        by_app = {d.name: d for d in DEPLOYMENTS}
        batch = {b.name: b for b in BATCH_PODS}
        found: dict[str, list[GpuPod]] = {}
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            meta, node = pod.metadata, pod.spec.node_name
            text = (meta.annotations or {}).get(cv.ANNOTATION_GPU_INDICES, "")
            if not node or meta.deletion_timestamp is not None or not text:
                continue
            gpus = tuple(int(g) for g in text.split(","))
            d = by_app.get((meta.labels or {}).get("app", ""))
            if d is not None:
                used = self.model_used_mib[d.name]
            elif meta.name in batch:
                used = int(batch[meta.name].used_fraction * self.shapes[node].gpu_memory_mib)
            else:
                continue
            found.setdefault(node, []).append(GpuPod(meta.uid, gpus, used))
        return found

    def _measure(self) -> tuple[dict[str, Any], dict[str, list[int]]]:
        """Waste and fragmentation with the defrag controller's own functions, on what the API
        server holds for the demo's nodes (the agent's annotations included)."""
        from defrag.measure import measure
        from defrag.snapshot import UsageSource, build_snapshot
        from scheduler.core import TargetWorkload

        nodes = [self.api.sanitize_for_serialization(n) for n in
                 self.core.list_node(label_selector=f"{NODE_LABEL}=true").items]
        names = {n["metadata"]["name"] for n in nodes}
        pods = [self.api.sanitize_for_serialization(p)
                for p in self.core.list_pod_for_all_namespaces().items
                if p.spec.node_name in names]
        snap, problems = build_snapshot(nodes, pods, [], UsageSource(8, time.time()))
        if problems or snap.notes:
            raise DemoError("the cluster could not be read as the defrag controller reads it: "
                            + "; ".join([*problems, *(n.reason for n in snap.notes)]))
        state = snap.state
        workload = TargetWorkload.from_pods([p.pod for p in state.pods.values()])
        summary = measure(state, snap.usage, workload).summary.as_dict()
        layout = {name: [int(MILLI_PER_GPU - f)
                         for f in state.gpu_free[state.index[name], :self.shapes[name].gpus]]
                  for name, _ in self.nodes}
        return summary, layout

    def _load(self, phase: str) -> LoadResult:
        targets = [(s.url, s.deployment) for s in self.standins]
        result = run_load(targets, rate_per_target=self.options.rate_per_s,
                          seconds=self.options.load_s,
                          seed=self.options.seed + (0 if phase == "before" else 1))
        self.detail(f"load ({phase}): {result.requests} requests, open loop at "
                    f"{self.options.rate_per_s * len(targets):.0f}/s for "
                    f"{self.options.load_s:.0f}s: p50 {result.p50_ms:.1f} ms, p99 "
                    f"{result.p99_ms:.1f} ms, {result.errors} errors, mean batch "
                    f"{result.mean_batch:.2f}")
        return result

    def _wait_pdbs(self) -> None:
        def allowed() -> bool | None:
            for d in DEPLOYMENTS:
                status = self.policy.read_namespaced_pod_disruption_budget_status(
                    d.name, self.namespace).status
                if status is None or (status.disruptions_allowed or 0) < 1:
                    return None
            return True

        wait_until(allowed, timeout_s=WAIT_S, what="the disruption controller to count the "
                                                   "Deployments' ready pods")

    def _defrag(self) -> dict[str, Any]:
        self._wait_pdbs()
        self.say("5/6 one defrag cycle: 'gpufrag defrag' (not a dry run) plans moves, writes "
                 "placement hints, evicts through the Eviction API; the extender follows the "
                 "hints")
        command = [sys.executable, "-m", "gpufrag.cli", "defrag", "--kubeconfig",
                   str(self.plane.kubeconfig_path), "--namespaces", self.namespace,
                   "--output", "json", "--max-evictions-total", "8",
                   "--max-evictions-per-node", "2", "--max-evictions-per-namespace", "8",
                   "--bind-timeout-s", str(int(WAIT_S))]
        log_path = self.logs_dir / "defrag.log"
        env = {**os.environ, "GPUFRAG_LOG_FORMAT": "json"}
        with log_path.open("ab") as log:
            done = subprocess.run(command, stdout=subprocess.PIPE, stderr=log, env=env,
                                  stdin=subprocess.DEVNULL, timeout=600, check=False)
        (self.logs_dir / "defrag-output.jsonl").write_bytes(done.stdout)
        docs = [json.loads(line) for line in done.stdout.decode().splitlines()
                if line.startswith("{")]
        plan = next((d for d in docs if d.get("kind") == "plan"), None)
        result = next((d for d in docs if d.get("kind") == "result"), None)
        if plan is None or result is None:
            raise DemoError(f"gpufrag defrag exited {done.returncode} without a plan and a "
                            f"result; see {log_path}")
        moves = result["moves"]
        landed = sum(1 for m in moves if m.get("landed_on") and m["landed_on"] == m["target"])
        triggered = plan.get("triggered", {})
        self.detail(f"{len(triggered)} nodes triggered (waste ratio above 25%, or stranded "
                    f"share blocking a pending pod): {', '.join(sorted(triggered))}")
        self.detail(f"{'pod':<30} {'GPU':>5} {'from':<12} {'hinted':<12} {'landed on':<12}"
                    f" {'freed':>5}")
        for planned, m in zip(plan["moves"], moves, strict=False):
            self.detail(f"{m['pod'].split('/', 1)[1]:<30} {planned['gpu_milli']:>4}m "
                        f"{planned['source']:<12} {m['target']:<12} "
                        f"{m.get('landed_on') or m['outcome']:<12} {planned['freed_gpus']:>5}"
                        + ("  hint followed" if m.get("landed_on") == m["target"] else ""))
        for reason, count in plan.get("skipped", {}).items():
            self.detail(f"not moved: {count} x {reason}")
        self.say(f"   defrag exit {done.returncode}: {len(plan['moves'])} moves planned, "
                 f"{len(moves)} carried out, {landed} replacements landed on the hinted node; "
                 f"log {log_path}")
        return {"exit_code": done.returncode, "moves_planned": len(plan["moves"]),
                "moves": [{**m, "source": p["source"], "gpu_milli": p["gpu_milli"],
                           "freed_gpus": p["freed_gpus"], "reason": p["reason"]}
                          for p, m in zip(plan["moves"], moves, strict=False)],
                "landed_on_hint": landed, "triggered": triggered,
                "not_moved": plan.get("skipped", {}), "skipped": result.get("skipped", []),
                "counts": result.get("counts", {}), "predicted": {
                    "before": result.get("before"), "after": result.get("after")}}

    def _wait_running(self, count: int) -> None:
        def settled() -> bool | None:
            pods = self.core.list_namespaced_pod(self.namespace).items
            live = [p for p in pods if p.metadata.deletion_timestamp is None]
            running = [p for p in live if p.spec.node_name and p.status is not None
                       and p.status.phase == "Running"]
            return (len(running) == len(live) == count) or None

        wait_until(settled, timeout_s=WAIT_S, what=f"{count} running pods in {self.namespace}")

    def _wait_deployments(self) -> None:
        def full() -> bool | None:
            for d in DEPLOYMENTS:
                status = self.apps.read_namespaced_deployment_status(d.name,
                                                                     self.namespace).status
                if (status.ready_replicas or 0) != d.replicas or (
                        status.available_replicas or 0) != d.replicas:
                    return None
            return True

        wait_until(full, timeout_s=WAIT_S, what="every Deployment back at full replicas")
        self._wait_running(sum(d.replicas for d in DEPLOYMENTS) + len(BATCH_PODS))

    def _deployment_status(self) -> list[dict[str, Any]]:
        rows = []
        for d in DEPLOYMENTS:
            status = self.apps.read_namespaced_deployment_status(d.name, self.namespace).status
            rows.append({"name": d.name, "model": d.model, "version": d.version,
                         "gpu_milli": d.gpu_milli, "replicas": d.replicas,
                         "ready_replicas": status.ready_replicas or 0,
                         "available_replicas": status.available_replicas or 0,
                         "used_mib": self.model_used_mib[d.name]})
        return rows

    def _report(self, summary: DemoSummary) -> None:
        out = self.options.out
        (out / "demo_summary.json").write_text(json.dumps(summary.as_dict(), indent=2) + "\n")
        write_plot(summary, out / "demo.png")
        self.say("6/6 before / after the defrag cycle (measured from the API server with the "
                 "defrag controller's functions):")
        print(summary_table(summary), file=self.out)
        print(f"  GPU memory: {summary.gpu_memory_source} NVML readings, through the node agent."
              f"\n  p99: {len(self.standins)} gpufrag serve stand-ins on this machine, which the "
              "defrag cycle does not move; it shows\n  the serving path stayed healthy, and its "
              "change is this machine's noise, not a placement effect.", file=self.out)
        self.say(f"wrote {out / 'demo_summary.json'} and {out / 'demo.png'} "
                 f"(runtime {summary.runtime_s:.0f}s)")

    # -- keep running, teardown --------------------------------------------------------------

    def wait_for_interrupt(self) -> None:
        kubectl = self.plane.binary.parent / "kubectl"
        print(f"\nthe cluster keeps running; Ctrl-C stops everything.\n"
              f"  export KUBECONFIG={self.plane.kubeconfig_path}\n"
              f"  {kubectl} -n {self.namespace} get pods -o wide\n"
              f"  {kubectl} get nodes -L {cv.LABEL_GPU_PRODUCT}", file=self.out, flush=True)
        for s in self.standins:
            print(f"  curl {s.url}/v2/models/{s.deployment}", file=self.out)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(1.0)
        print("stopping everything the demo started ...", file=self.out, flush=True)

    def close(self) -> None:
        """Stop what this run started; on a shared control plane also delete what it made."""
        for s in self.standins:
            with contextlib.suppress(Exception):
                s.stop()
        with contextlib.suppress(Exception):
            self.plane.stop_scheduler(self.scheduler_process)
        if self.extender is not None:
            with contextlib.suppress(Exception):
                self.extender.stop()
        if not self.owns_plane:
            with contextlib.suppress(kubernetes.client.ApiException):
                self.core.delete_namespace(self.namespace)
            for name in self.created_nodes:
                with contextlib.suppress(kubernetes.client.ApiException):
                    self.core.delete_node(name)
            if self.created_hints_namespace:
                with contextlib.suppress(kubernetes.client.ApiException):
                    self.core.delete_namespace(cv.HINTS_NAMESPACE)
        shutil.rmtree(self.work_dir, ignore_errors=True)


def deployment_manifest(d: ModelDeployment) -> dict[str, Any]:
    labels = {"app": d.name, cv.LABEL_MODEL: d.model, cv.LABEL_MODEL_VERSION: d.version}
    annotations = {cv.ANNOTATION_GPU_SPEC: "|".join(d.products)} if d.products else {}
    milli = str(d.gpu_milli)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": d.name, "labels": labels},
        "spec": {"replicas": d.legacy_replicas, "selector": {"matchLabels": {"app": d.name}},
                 "template": {"metadata": {"labels": labels, "annotations": annotations},
                              "spec": {
                                  "schedulerName": cv.SCHEDULER_NAME,
                                  "terminationGracePeriodSeconds": 0,
                                  "containers": [{
                                      "name": "server",
                                      "image": f"gpufrag-demo/{d.model}:{d.version}",
                                      "resources": {
                                          "requests": {"cpu": "1", "memory": "2Gi",
                                                       cv.RESOURCE_GPU_MILLI: milli},
                                          "limits": {cv.RESOURCE_GPU_MILLI: milli}}}]}}},
    }


def batch_pod_manifest(b: BatchPod, node: str, gpus: tuple[int, ...]) -> dict[str, Any]:
    whole = str(b.gpus)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": b.name, "labels": {"demo.gpufrag.io/kind": "batch"},
                     "annotations": {cv.ANNOTATION_GPU_INDICES: ",".join(map(str, gpus))}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "gpufrag-demo/batch:latest",
                                 "resources": {"requests": {"cpu": "4", "memory": "16Gi",
                                                            cv.RESOURCE_GPU: whole},
                                               "limits": {cv.RESOURCE_GPU: whole}}}]},
    }


def run_demo(options: DemoOptions, *, plane: ControlPlane | None = None,
             out: TextIO | None = None, nvml: Any = None,
             progress: TextIO | None = None) -> DemoSummary:
    """Run the demo; on its own control plane (built and started here, stopped at the end)
    unless ``plane`` is given, in which case only what the demo made is removed."""
    out = out if out is not None else sys.stdout
    with contextlib.ExitStack() as stack:
        owns = plane is None
        if plane is None:
            binary = build_control_plane(progress=progress if progress is not None else sys.stderr)
            started = time.monotonic()
            print("starting the local control plane (etcd, kube-apiserver, controller-manager, "
                  "kube-scheduler) ...", file=out, flush=True)
            plane = stack.enter_context(ControlPlane(binary))
            print(f"control plane up in {time.monotonic() - started:.1f}s", file=out, flush=True)
        demo = Demo(options, plane, owns_plane=owns, out=out, nvml=nvml)
        stack.callback(demo.close)
        summary = demo.run()
        if options.keep_running:
            demo.wait_for_interrupt()
        return summary
    raise AssertionError("unreachable")  # pragma: no cover  (mypy: the with block returns)


# -----------------------------------------------------------------------------------------------
# CLI


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise BadInput(message)


def build_parser() -> argparse.ArgumentParser:
    d = DemoOptions()
    p = _Parser(prog=PROG, description="Show the whole gpufrag path on a local control plane: "
                "fragmented fake GPU nodes, gpufrag-scheduler with model affinity, gpufrag serve "
                "stand-ins under load, GPU memory through the node agent, one defrag cycle, and "
                "a before/after summary (table, JSON, PNG).")
    p.add_argument("--out", type=Path, default=d.out,
                   help="where demo_summary.json, demo.png and logs/ go (default: %(default)s)")
    p.add_argument("--nodes", type=int, default=d.nodes,
                   help=f"fake GPU nodes, {MIN_NODES}..{MAX_NODES} (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed,
                   help="seed of the spread placement order and the load (default: %(default)s)")
    p.add_argument("--load-s", type=float, default=d.load_s,
                   help="seconds of open-loop load before and after (default: %(default)s)")
    p.add_argument("--rate", type=float, default=d.rate_per_s,
                   help="requests per second to each stand-in (default: %(default)s)")
    p.add_argument("--keep-running", action="store_true",
                   help="leave the cluster, scheduler and stand-ins up until Ctrl-C and print "
                        "the kubeconfig")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        options = DemoOptions(out=args.out, nodes=args.nodes, seed=args.seed,
                              load_s=args.load_s, rate_per_s=args.rate,
                              keep_running=args.keep_running).validate()
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except BadInput as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not os.environ.get(BINARY_ENV) and shutil.which("go") is None:
        print(f"{PROG}: Go is not installed (no 'go' on PATH): the local control plane is built "
              f"from upstream Kubernetes with Go >= 1.26; install Go, or set {BINARY_ENV} to a "
              "binary built by tests/e2e/cluster/build", file=sys.stderr)
        return EXIT_FAILURE

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)  # clean up as on Ctrl-C
    try:
        summary = run_demo(options)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; everything it started is stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BuildError as e:
        print(f"{PROG}: building the control plane failed: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except BadInput as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (DemoError, ControlPlaneError, TimeoutError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_FAILURE
    if summary.defrag["exit_code"] != 0:
        print(f"{PROG}: the defrag cycle exited {summary.defrag['exit_code']}; see "
              f"{options.out / 'logs' / 'defrag.log'}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
