"""The GPU path's one prepared check (#29): run it on a machine with an NVIDIA GPU, read one report.

Every GPU-facing part has so far run only on recorded NVML readings. This script runs them for
real, in one go (under 8 minutes on one GPU with the defaults), and writes ``report.json`` and
``report.md`` to ``--out``:

1. **inventory** — NVML read through the agent's reading (:meth:`gpufrag.nvml.NvmlReader.read`,
   what the agent publishes) and the device plugin's (:func:`node.gpus.read_inventory` and one
   :class:`~node.health.HealthMonitor` pass), compared
   GPU by GPU (UUID, product, memory) with ``nvidia-smi -q`` (its XML form), which also gives
   each GPU's MIG mode (the shared NVML adapter does not read it).
2. **mps** — an MPS control daemon started in a private pipe directory, two share containers'
   processes given the environment the device plugin hands a memory share
   (:func:`node.deviceplugin.allocator.container_response`, over :func:`node.gpus.container_grant`,
   with ``mps=True``), each allocating
   within its limit (must succeed) and past it (must be refused).
3. **tensorrt** — the built-in ResNet-50 ONNX graph (:mod:`serving.models`, generated here:
   nothing is downloaded) built into an FP16 engine with the 1/8/32 profile through the
   serving backend (:func:`serving.backends.select.load_backend`): build time, then a second
   start that must find the engine in the cache.
4. **serving** — ``gpufrag serve`` at max batch 1/8/16/32 under the serving benchmark's load
   generator (:mod:`benchmarks.serving_bench`): throughput at saturation (closed loop), p50 /
   p99 at 70% of it (open-loop Poisson arrivals), GPU utilisation sampled through NVML during
   saturation, GPU memory growth per batch (and the server's own growth alarm count), the
   direct engine throughput (the same backend in-process, no server) and server/direct, beside
   the seed's V100 table.

Without a GPU the same script runs its CPU half: step 4 with ONNX Runtime on the CPU and a small
built-in model (``builtin:resnet-small``), and says for each GPU step, in the report and on
stdout, that it was skipped and why (no NVIDIA driver, no ``nvidia-smi``, TensorRT not
installed, ...). A step that fails is reported as failed with its error; the others still run.
tests/benchmarks/test_gpu_check.py runs the CPU half with tiny settings, so the script cannot
rot. Usage::

    python -m benchmarks.gpu_check                          # GPU: ~6 min; CPU half: ~2 min
    python -m benchmarks.gpu_check --sizes 1,8 --seconds 2 --out gpu-check
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import structlog

from benchmarks import results
from benchmarks.serving_bench import (
    Server,
    closed_loop,
    direct_throughput,
    open_loop,
    percentile_ms,
    request_body,
    saturation_concurrency,
    scrape,
    start_server,
)
from benchmarks.serving_load import raw_request
from gpufrag.nvml import MIB, GpuReadError, NoGpuError, NvmlReader
from node.deviceplugin.allocator import container_response
from node.deviceplugin.config import DevicePluginConfig, Kind
from node.gpus import DeviceNodes, Gpu, read_inventory
from node.health import HealthBoard, HealthMonitor
from serving.backends.base import Backend
from serving.backends.onnx_runtime import OnnxRuntimeBackend
from serving.backends.select import load_backend
from serving.backends.tensorrt_engine import (
    DEFAULT_MAX_BATCH,
    import_cudart,
    tensorrt_unavailable_reason,
)
from serving.gpu import NvmlProbe, detect_gpus
from serving.models import materialize, model_name

log = structlog.get_logger("benchmarks.gpu_check")

# The seed articles' table: ResNet-50 on a V100 with dynamic batching, per max batch size:
# (QPS, p99 ms, GPU utilisation %); and Triton + TensorRT FP16 on an A100 at batch 32.
SEED_V100: Final = {1: (120, 45, 18), 8: (680, 62, 65), 16: (920, 88, 82), 32: (1100, 152, 91)}
A100_TRT_FP16_BATCH32_IMG_S: Final = 2858
GPU_MODEL, CPU_MODEL = "builtin:resnet50", "builtin:resnet-small"
MPS_LIMIT_MIB: Final = 512  # each share's memory limit in the MPS step
GROWTH_COUNTER: Final = "gpufrag_serving_gpu_memory_growth_batches_total"
BATCHES_COUNTER: Final = "gpufrag_serving_batch_size_count"


class Skip(Exception):
    """The step cannot run on this machine; the message says why."""


@dataclass
class Step:
    """One step's outcome: ``ran`` (its figures), ``skipped`` (why) or ``failed`` (the error)."""

    name: str
    title: str
    status: str = "ran"
    why: str = ""
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class Machine:
    """What the check found about the machine, once, before the steps."""

    no_gpu: str | None  # why there is no usable GPU, None when there is one
    gpu_names: list[str]
    nvidia_smi: str | None  # its path
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    python: str = field(default_factory=platform.python_version)


def find_machine() -> Machine:
    """NVML's view (through the shared adapter) and where nvidia-smi is."""
    names: list[str] = []
    no_gpu: str | None = None
    try:
        with NvmlReader() as reader:
            names = [gpu.product for gpu in reader.inventory()]
    except (NoGpuError, GpuReadError) as exc:
        no_gpu = f"no usable NVIDIA GPU: {exc}"
    return Machine(no_gpu, names, shutil.which("nvidia-smi"))


def run_step(step: Step, body: Callable[[Step], None]) -> Step:
    """Run ``body`` (which fills ``step.figures``), timed; a Skip or an error is recorded."""
    started = time.perf_counter()
    try:
        body(step)
    except Skip as skip:
        step.status, step.why = "skipped", str(skip)
    except Exception as exc:
        step.status = "failed"
        step.why = f"{type(exc).__name__}: {exc}"
        step.figures["traceback"] = traceback.format_exc(limit=8)
    step.seconds = round(time.perf_counter() - started, 2)
    verdict = step.status + (f": {step.why}" if step.why else "")
    print(f"[{step.name}] {verdict} ({step.seconds:.1f} s)", flush=True)
    return step


# -- 1. inventory -----------------------------------------------------------------------------

def nvidia_smi_inventory(xml_text: str) -> list[dict[str, Any]]:
    """Each GPU of ``nvidia-smi -q -x``: UUID, product, total memory (MiB), MIG mode."""
    gpus = []
    for gpu in ElementTree.fromstring(xml_text).iter("gpu"):
        total = (gpu.findtext("fb_memory_usage/total") or "").split()
        gpus.append({"uuid": gpu.findtext("uuid", ""), "product": gpu.findtext("product_name", ""),
                     "memory_total_mib": int(total[0]) if total and total[0].isdigit() else None,
                     "mig_mode": gpu.findtext("mig_mode/current_mig", "N/A")})
    return gpus


def compare_inventories(agent: Sequence[dict[str, Any]], plugin: Sequence[Gpu],
                        smi: Sequence[dict[str, Any]]) -> list[str]:
    """Every disagreement between the three views, by UUID (empty: they agree). Memory may
    differ by the driver's reserve: NVML and nvidia-smi read the same counter, so not here."""
    problems = []
    by_uuid = {gpu["uuid"]: gpu for gpu in smi}
    if {g["uuid"] for g in agent} != set(by_uuid) or {g.uuid for g in plugin} != set(by_uuid):
        problems.append(f"GPU sets differ: agent {sorted(g['uuid'] for g in agent)}, device "
                        f"plugin {sorted(g.uuid for g in plugin)}, nvidia-smi {sorted(by_uuid)}")
    for gpu in plugin:
        seen = by_uuid.get(gpu.uuid)
        if seen is None:
            continue
        if gpu.product != seen["product"]:
            problems.append(f"{gpu.uuid}: product {gpu.product!r} vs nvidia-smi "
                            f"{seen['product']!r}")
        if seen["memory_total_mib"] is not None and gpu.memory_total_mib != \
                seen["memory_total_mib"]:
            problems.append(f"{gpu.uuid}: {gpu.memory_total_mib} MiB vs nvidia-smi "
                            f"{seen['memory_total_mib']} MiB")
    return problems


def inventory_step(machine: Machine) -> Callable[[Step], None]:
    def body(step: Step) -> None:
        if machine.no_gpu:
            raise Skip(machine.no_gpu)
        if machine.nvidia_smi is None:
            raise Skip("nvidia-smi is not on PATH (it comes with the NVIDIA driver)")
        with NvmlReader() as reader:
            agent = [{"index": r.index, "uuid": r.uuid, "product": r.product,
                      "memory_total_mib": r.memory_total_mib, "memory_used_mib": r.memory_used_mib,
                      "utilization_pct": r.utilization_pct, "processes": len(r.processes)}
                     for r in reader.read(processes=True)]
            plugin = read_inventory(reader)
            board = HealthBoard(plugin)
            HealthMonitor(lambda: reader, board, log=log).check()
            health = {gpu.uuid: board.is_healthy(gpu.uuid) for gpu in plugin}
        smi = nvidia_smi_inventory(subprocess.run(
            [machine.nvidia_smi, "-q", "-x"], capture_output=True, text=True, timeout=60,
            check=True).stdout)
        problems = compare_inventories(agent, plugin, smi)
        step.figures.update(agent=agent, device_plugin=[asdict(g) for g in plugin],
                            health=health, nvidia_smi=smi, disagreements=problems)
        if problems or not all(health.values()):
            raise RuntimeError("; ".join(problems) or f"unhealthy GPUs: {health}")
    return body


# -- 2. MPS -----------------------------------------------------------------------------------

def mps_client(within_mib: int, past_mib: int) -> dict[str, Any]:
    """In a share container's process: allocate within the MPS limit, then past it."""
    cudart = import_cudart()
    outcome: dict[str, Any] = {}
    for label, mib in (("within", within_mib), ("past", past_mib)):
        error, pointer = cudart.cudaMalloc(mib * MIB)
        outcome[label] = {"mib": mib, "error": str(error), "ok": int(error) == 0}
        if int(error) == 0:
            cudart.cudaFree(pointer)
    return outcome


def mps_step(machine: Machine, python: str) -> Callable[[Step], None]:
    def body(step: Step) -> None:
        if machine.no_gpu:
            raise Skip(machine.no_gpu)
        control = shutil.which("nvidia-cuda-mps-control")
        if control is None:
            raise Skip("nvidia-cuda-mps-control is not on PATH (it comes with the driver)")
        if importlib.util.find_spec("cuda") is None:
            raise Skip("the allocations need the 'cuda-python' package, which is not installed")
        with NvmlReader() as reader:
            gpu = read_inventory(reader)[0]
        config = DevicePluginConfig(node_name="gpu-check", mps=True)
        with tempfile.TemporaryDirectory(prefix="gpufrag-mps-") as tmp:
            env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": f"{tmp}/pipe",
                   "CUDA_MPS_LOG_DIRECTORY": f"{tmp}/log", "CUDA_VISIBLE_DEVICES": gpu.uuid}
            os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"])
            os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"])
            subprocess.run([control, "-d"], env=env, check=True, timeout=30)
            try:
                clients = []
                for share in range(2):
                    allocated = container_response(
                        [gpu], Kind.SHARE, 250, nodes=DeviceNodes({}, (), ()), config=config,
                        memory_mib=MPS_LIMIT_MIB)
                    child_env = {**env, **{k: v for k, v in allocated.envs.items()
                                           if k.startswith("CUDA_MPS_")}}
                    result = subprocess.run(
                        [python, "-m", "benchmarks.gpu_check", "--mps-client",
                         f"{MPS_LIMIT_MIB // 2},{MPS_LIMIT_MIB * 2}"],
                        env=child_env, capture_output=True, text=True, timeout=120, check=True)
                    clients.append({"share": share, "env": dict(allocated.envs),
                                    **json.loads(result.stdout.splitlines()[-1])})
            finally:
                subprocess.run([control], input="quit\n", env=env, text=True, timeout=30,
                               check=False)
        step.figures["clients"] = clients
        wrong = [c["share"] for c in clients if not c["within"]["ok"] or c["past"]["ok"]]
        if wrong:
            raise RuntimeError(f"shares {wrong}: an allocation within the limit failed or one "
                               "past it succeeded")
    return body


# -- 3. TensorRT engine -----------------------------------------------------------------------

def tensorrt_step(machine: Machine, cache: Path) -> Callable[[Step], None]:
    def body(step: Step) -> None:
        if machine.no_gpu:
            raise Skip(machine.no_gpu)
        reason = tensorrt_unavailable_reason()
        if reason is not None:
            raise Skip(reason)
        path = materialize(GPU_MODEL, cache / "models")
        for start in ("first", "second"):
            loaded = load_backend("tensorrt", path, gpu_name=machine.gpu_names[0],
                                  engine_cache_dir=cache / "models" / "engines",
                                  max_batch_size=DEFAULT_MAX_BATCH)
            loaded.backend.close()
            step.figures[start] = {"seconds": round(loaded.load_seconds, 2),
                                   "engine_cache": loaded.cache, "kind": loaded.backend.kind}
        step.figures["profile"] = "batch 1 / 8 / 32 (min / opt / max), FP16"
        if step.figures["second"]["engine_cache"] != "warm":
            raise RuntimeError("the second start did not find the engine in the cache")
    return body


# -- 4. serving -------------------------------------------------------------------------------

class UtilisationSampler:
    """GPU utilisation and used memory sampled through NVML in a thread, every ``interval_s``,
    while a phase runs (serving's probe: the same reads its gauges make)."""

    def __init__(self, probe: NvmlProbe, interval_s: float = 0.1) -> None:
        self._probe = probe
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.util_pct: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            readings = self._probe.read()
            if readings:
                self.util_pct.append(max(r.utilization_pct for r in readings))

    def __enter__(self) -> UtilisationSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def used_mib(probe: NvmlProbe | None) -> float | None:
    return None if probe is None else sum(probe.memory_used_bytes().values()) / MIB


def serving_step(machine: Machine, cache: Path,
                 args: argparse.Namespace) -> Callable[[Step], None]:
    def body(step: Step) -> None:
        on_gpu = machine.no_gpu is None
        trt_reason = tensorrt_unavailable_reason() if on_gpu else machine.no_gpu
        backend = "tensorrt" if trt_reason is None else "onnxruntime"
        model = args.model or (GPU_MODEL if on_gpu else CPU_MODEL)
        path = materialize(model, cache / "models")
        gpu_name = machine.gpu_names[0] if machine.gpu_names else None
        kinds: set[str] = set()

        def open_backend(size: int) -> Callable[[], Backend]:
            def load() -> Backend:  # as gpufrag serve loads it, into the server's caches
                loaded = load_backend(backend, path, gpu_name=gpu_name, max_batch_size=size,
                                      engine_cache_dir=cache / "models" / "engines").backend
                kinds.add(loaded.kind)
                return loaded
            return load

        graph = OnnxRuntimeBackend(path, allow_cuda=False)  # reads the input's shape only
        image_size = graph.inputs[0].shape[-1]
        graph.close()
        request = request_body(image_size, binary=True)
        payload = raw_request("127.0.0.1", f"/v2/models/{model_name(model)}/infer", request.body,
                              request.headers())
        probe = detect_gpus() if on_gpu else None
        step.figures.update(model=model, backend=backend, gpu=machine.gpu_names,
                            why_not_tensorrt=trt_reason, rows=[])
        try:
            for size in args.sizes:
                step.figures["rows"].append(serve_size(model, cache, size, payload, backend,
                                                       probe, image_size, path,
                                                       open_backend(size), args))
                print(f"  max batch {size}: done", flush=True)
        finally:
            if probe is not None:
                probe.close()
            step.figures["backend_kind"] = ", ".join(sorted(kinds))
        step.figures["targets"] = targets(step.figures["rows"])
    return body


def serve_size(model: str, cache: Path, size: int, payload: bytes, backend: str,
               probe: NvmlProbe | None, image_size: int, path: Path,
               open_backend: Callable[[], Backend], args: argparse.Namespace) -> dict[str, Any]:
    """One max batch size: direct throughput, then the server at saturation and at 70%."""
    direct, _ = direct_throughput(path, image_size, size, args.seconds, open_backend)
    server: Server = start_server(model, cache, max_batch=size, delay_ms=args.delay_ms,
                                  queue_size=4096, timeout_ms=30_000, backend=backend)
    try:
        before = scrape(server.url, (GROWTH_COUNTER, BATCHES_COUNTER))
        memory_before = used_mib(probe)
        concurrency = saturation_concurrency(size)
        if probe is not None:
            with UtilisationSampler(probe) as sampler:
                saturation = closed_loop(server, payload, concurrency=concurrency,
                                         seconds=args.seconds)
            util = float(np.mean(sampler.util_pct)) if sampler.util_pct else math.nan
        else:
            saturation = closed_loop(server, payload, concurrency=concurrency,
                                     seconds=args.seconds)
            util = math.nan
        outcomes, sent, _, _ = open_loop(server, payload, rate=0.7 * saturation.rate,
                                         seconds=args.seconds, connections=2 * concurrency)
        after = scrape(server.url, (GROWTH_COUNTER, BATCHES_COUNTER))
        memory_after = used_mib(probe)
    finally:
        server.stop()
    ok = [o.latency_s for o in outcomes if o.status == 200]
    batches = after[BATCHES_COUNTER] - before[BATCHES_COUNTER]
    growth = (None if memory_before is None or memory_after is None or not batches
              else (memory_after - memory_before) / batches)
    seed = SEED_V100.get(size)
    return {"max_batch": size, "qps": round(saturation.rate, 1),
            "p50_ms": round(percentile_ms(ok, 50), 2), "p99_ms": round(percentile_ms(ok, 99), 2),
            "offered_qps": round(0.7 * saturation.rate, 1), "sent_qps": round(sent, 1),
            "failed": len(outcomes) - len(ok),
            "gpu_util_pct": None if math.isnan(util) else round(util, 1),
            "memory_growth_mib_per_batch": None if growth is None else round(growth, 4),
            "growth_alarms": after[GROWTH_COUNTER] - before[GROWTH_COUNTER],
            "batches": batches, "direct_img_s": round(direct, 1),
            "server_over_direct": round(saturation.rate / direct, 3) if direct else None,
            "v100_seed": None if seed is None else {"qps": seed[0], "p99_ms": seed[1],
                                                     "gpu_util_pct": seed[2]}}


# -- the report -------------------------------------------------------------------------------

def targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 29's targets against the serving rows: each with what was measured and whether it
    was met (None where this run has no figure for it, e.g. no batch 8 or no GPU)."""
    by_size = {r["max_batch"]: r for r in rows}
    ratios = [r["server_over_direct"] for r in rows if r["server_over_direct"] is not None]
    batches = sum(r["batches"] for r in rows)
    alarms = sum(r["growth_alarms"] for r in rows)
    p99_8 = by_size[8]["p99_ms"] if 8 in by_size else None
    direct_32 = by_size[32]["direct_img_s"] if 32 in by_size else None
    floor = 3 * A100_TRT_FP16_BATCH32_IMG_S
    return [
        {"target": "server/direct >= 0.9 at every batch size",
         "measured": min(ratios) if ratios else None,
         "met": min(ratios) >= 0.9 if ratios else None},
        {"target": "p99 at max batch 8 < 20 ms", "measured": p99_8,
         "met": p99_8 < 20 if p99_8 is not None else None},
        {"target": f"batch 32 direct >= 3 x {A100_TRT_FP16_BATCH32_IMG_S} img/s = {floor} "
                   "(ResNet-50 FP16, H-class GPU)", "measured": direct_32,
         "met": direct_32 >= floor if direct_32 is not None else None},
        {"target": "GPU memory growth alarm silent over 10,000 batches",
         "measured": f"{alarms:.0f} alarms over {batches:.0f} batches",
         "met": (alarms == 0 and batches >= 10_000) if any(
             r["memory_growth_mib_per_batch"] is not None for r in rows) else None},
    ]


def cell(value: Any, unit: str = "") -> str:
    return "n/a" if value is None else f"{value}{unit}"


def markdown(machine: Machine, steps: Sequence[Step], seconds: float) -> str:
    lines = ["# gpufrag GPU check", "",
             f"Machine: {', '.join(machine.gpu_names) or 'no GPU'} "
             f"({machine.no_gpu or 'NVML read'}); {machine.cpus} CPUs; Python {machine.python}. "
             f"Took {seconds:.0f} s.", "", "| step | status | why | seconds |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {s.title} | {s.status} | {s.why or '-'} | {s.seconds:.1f} |" for s in steps]
    for step in steps:
        if step.status != "ran" or step.name != "serving":
            continue
        f = step.figures
        lines += ["", f"## gpufrag serve: {f['model']} on {f['backend_kind']}", "",
                  "| max batch | QPS | p50 ms | p99 ms | GPU util % | memory growth MiB/batch "
                  "(alarms) | direct img/s | server/direct | V100 seed: QPS / p99 ms / util % |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in f["rows"]:
            seed = r["v100_seed"]
            lines.append(
                f"| {r['max_batch']} | {r['qps']} | {r['p50_ms']} | {r['p99_ms']} | "
                f"{cell(r['gpu_util_pct'])} | {cell(r['memory_growth_mib_per_batch'])} "
                f"({r['growth_alarms']:.0f}) | {r['direct_img_s']} | "
                f"{cell(r['server_over_direct'])} | "
                + ("-" if seed is None else
                   f"{seed['qps']} / {seed['p99_ms']} / {seed['gpu_util_pct']}") + " |")
        if f["why_not_tensorrt"]:
            lines += ["", f"Not TensorRT: {f['why_not_tensorrt']}."]
        lines += ["", "Issue 29's targets (set for ResNet-50 with TensorRT on a GPU; a CPU "
                  "half's figures only show the script works):", "",
                  "| target | measured | met |", "| --- | --- | --- |"]
        lines += [f"| {t['target']} | {cell(t['measured'])} | "
                  f"{'n/a' if t['met'] is None else 'yes' if t['met'] else 'NO'} |"
                  for t in f["targets"]]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("gpu-check"),
                   help="where report.json and report.md go (default: ./gpu-check)")
    p.add_argument("--sizes", default="1,8,16,32",
                   help="max batch sizes to serve at (default 1,8,16,32)")
    p.add_argument("--seconds", type=float, default=8.0,
                   help="seconds per measured phase (default 8)")
    p.add_argument("--delay-ms", type=float, default=2.0, help="max queue delay (default 2)")
    p.add_argument("--model", help=f"model to serve (default {GPU_MODEL} on a GPU, "
                   f"{CPU_MODEL} on the CPU)")
    p.add_argument("--cache", type=Path,
                   help="model and engine cache (default: a fresh temporary directory)")
    p.add_argument("--mps-client", help=argparse.SUPPRESS)  # WITHIN,PAST MiB: the MPS child
    results.add_arguments(p, "gpu_check")
    args = p.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes: {args.sizes!r} is not a comma-separated list of integers")
    if not args.sizes or min(args.sizes) < 1 or args.seconds <= 0:
        p.error("--sizes must be positive integers and --seconds above 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mps_client:
        within, past = (int(v) for v in args.mps_client.split(","))
        print(json.dumps(mps_client(within, past)))
        return 0
    began = time.perf_counter()
    start = results.Start.now()
    machine = find_machine()
    print(f"gpu check: {', '.join(machine.gpu_names) or machine.no_gpu}; "
          f"{'GPU run' if machine.no_gpu is None else 'CPU half only'}", flush=True)
    cache = args.cache or Path(tempfile.mkdtemp(prefix="gpufrag-gpu-check-"))
    steps = [
        run_step(Step("inventory", "NVML inventory: agent, device plugin, nvidia-smi -q"),
                 inventory_step(machine)),
        run_step(Step("mps", "MPS memory limits on two shares"), mps_step(machine, sys.executable)),
        run_step(Step("tensorrt", "TensorRT FP16 engine, profile 1/8/32, cache"),
                 tensorrt_step(machine, cache)),
        run_step(Step("serving", "gpufrag serve under load, beside the V100 table"),
                 serving_step(machine, cache, args)),
    ]
    seconds = time.perf_counter() - began
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"machine": asdict(machine), "seconds": round(seconds, 1),
              "steps": [asdict(s) for s in steps]}
    (args.out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (args.out / "report.md").write_text(markdown(machine, steps, seconds))
    skipped = [s.name for s in steps if s.status == "skipped"]
    failed = [s.name for s in steps if s.status == "failed"]
    print(f"wrote {args.out / 'report.json'} and report.md in {seconds:.0f} s"
          + (f"; skipped: {', '.join(skipped)}" if skipped else "")
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    results.record(args, "gpu_check", start, figures_of(machine, steps),
                   [f"{s.name}: {s.status}" + (f" ({s.why})" if s.why else "") for s in steps])
    return 1 if failed else 0


def figures_of(machine: Machine, steps: Sequence[Step]) -> list[results.Figure]:
    """The serving step's figures for the results file. Issue 29's targets are for ResNet-50
    with TensorRT on a GPU, so they judge a GPU run only; a CPU half's figures are context."""
    on_gpu = machine.no_gpu is None
    figures: list[results.Figure] = []
    for step in steps:
        if step.status != "ran" or step.name != "serving":
            continue
        where = f"{step.figures['model']} on {step.figures['backend_kind']}"
        floor = 3 * A100_TRT_FP16_BATCH32_IMG_S
        for r in step.figures["rows"]:
            size = r["max_batch"]
            if r["server_over_direct"] is not None:
                figures.append(results.Figure(
                    f"{where}, max batch {size}: server/direct", r["server_over_direct"], "",
                    results.Target(">=", 0.9) if on_gpu else None))
            figures.append(results.Figure(
                f"{where}, max batch {size}: p99", r["p99_ms"], "ms",
                results.Target("<", 20.0) if on_gpu and size == 8 else None))
            figures.append(results.Figure(
                f"{where}, max batch {size}: direct", r["direct_img_s"], "img/s",
                results.Target(">=", floor) if on_gpu and size == 32 else None))
    return figures


if __name__ == "__main__":
    sys.exit(main())
