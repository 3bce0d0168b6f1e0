"""The ``gpufrag serve`` process: listen, load the model, serve, and drain on SIGTERM.

Order of events, and why:

1. Listen first, with ``/v2/health/live`` 200 and ``/v2/health/ready`` 503, so Kubernetes sees a
   live pod during a long model load (cold start) instead of restarting it.
2. Load (or build) the model in a worker thread, timing it: ``gpufrag_serving_model_load_seconds``.
3. Start the batcher; ready turns 200.
4. On SIGTERM/SIGINT: ready turns 503 and admission closes (new requests get 503 +
   Retry-After, which the client retries on another pod), everything already queued or
   computing is answered, then the listener closes and the process exits 0. If the drain
   outlasts ``--shutdown-timeout-s``, what is still queued gets 503 rather than silence.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from collections.abc import Callable
from pathlib import Path

import structlog
from aiohttp import web

from gpufrag.errors import BadInput
from serving.app import ServerState, build_app
from serving.backends.base import Backend, zeros_like_spec
from serving.backends.select import LoadedBackend, load_backend
from serving.batcher import DynamicBatcher
from serving.config import ServerConfig
from serving.errors import ShuttingDown
from serving.gpu import MemoryGrowthWatch, NvmlProbe, detect_gpus
from serving.metrics import ServingMetrics
from serving.models import default_cache_dir, materialize, model_name
from serving.protocol import ModelInfo
from serving.tensors import TensorSpec

log = structlog.get_logger("serving.server")


def check_limits(backend: Backend, config: ServerConfig) -> None:
    """The batcher must never build a batch the backend cannot take."""
    limit = backend.max_batch_size
    if limit is not None and config.batcher.max_batch_size > limit:
        raise BadInput(f"{config.batcher.max_batch_size} is larger than the model's batch limit "
                       f"{limit} ({backend.kind})", field="--max-batch-size")


def published_inputs(backend: Backend, config: ServerConfig) -> tuple[TensorSpec, ...]:
    """The input specs requests are checked against: the backend's, with ``allow_non_finite``
    set where ``--allow-non-finite`` names the input. Checked here, once the model's inputs
    are known, so a typo in a name fails the start instead of silently allowing nothing."""
    allowed = set(config.allow_non_finite_inputs)
    by_name = {spec.name: spec for spec in backend.inputs}
    for name in config.allow_non_finite_inputs:
        spec = by_name.get(name)
        if spec is None:
            raise BadInput(f"{name!r} is not an input of the model; its inputs: "
                           f"{', '.join(by_name)}", field="--allow-non-finite")
        if spec.dtype.kind != "f":
            raise BadInput(f"input {name!r} is {spec.datatype}, which has no NaN or Inf; "
                           "only FP16/FP32/FP64 inputs can allow them",
                           field="--allow-non-finite")
    return tuple(dataclasses.replace(spec, allow_non_finite=spec.name in allowed)
                 for spec in backend.inputs)


def _load(config: ServerConfig, probe: NvmlProbe | None) -> LoadedBackend:
    cache_dir = config.model_cache_dir or default_cache_dir()
    path: Path = materialize(config.model, cache_dir)
    return load_backend(config.backend, path,
                        gpu_name=probe.names[0] if probe is not None else None,
                        engine_cache_dir=config.engine_cache_dir or cache_dir / "engines",
                        max_batch_size=config.batcher.max_batch_size,
                        intra_op_threads=config.intra_op_threads)


Loader = Callable[[ServerConfig, NvmlProbe | None], LoadedBackend]


async def serve(config: ServerConfig, *, on_listening: Callable[[int], None] | None = None,
                load: Loader | None = None) -> int:
    """Run until SIGTERM/SIGINT; returns the exit code. ``load`` replaces the model loader
    (tests serve a fake backend through the real process lifecycle)."""
    name = config.model_name or model_name(config.model)
    metrics = ServingMetrics(model=name)
    metrics.record_settings(config.batcher)
    probe = detect_gpus()
    if probe is not None:
        metrics.add_gpu_collector(probe)
    state = ServerState(model_name=name, metrics=metrics, max_body_bytes=config.max_body_bytes,
                        retry_after_s=config.batcher.retry_after_s)
    state.set_ready(False)

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    runner = web.AppRunner(build_app(state), handler_cancellation=True, access_log=None,
                           shutdown_timeout=config.shutdown_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    await site.start()
    port = _bound_port(runner, config.port)
    log.info("listening", host=config.host, port=port, model=name)
    if on_listening is not None:
        on_listening(port)

    batcher: DynamicBatcher | None = None
    backend: Backend | None = None
    try:
        loaded = await loop.run_in_executor(None, load or _load, config, probe)
        backend = loaded.backend
        check_limits(backend, config)
        inputs = published_inputs(backend, config)
        metrics.model_load_seconds.labels(name, backend.kind).set(loaded.load_seconds)
        await loop.run_in_executor(None, _warm_up, backend)
        if probe is not None:
            backend = MemoryGrowthWatch(backend, probe,
                                        threshold_mib=config.gpu_memory_growth_warn_mib)
        log.info("model_loaded", model=name, backend=backend.kind,
                 load_seconds=round(loaded.load_seconds, 3),
                 inputs=[s.metadata() for s in backend.inputs])
        batcher = DynamicBatcher(backend, config.batcher, observer=metrics)
        batcher.start()
        state.model = ModelInfo(name=name, platform=backend.kind, inputs=inputs,
                                outputs=backend.outputs,
                                max_batch_size=config.batcher.max_batch_size)
        state.batcher = batcher
        if not stop.is_set():
            state.set_ready(True)
            log.info("ready", model=name, batcher=config.batcher)
        await stop.wait()
        log.info("draining", queued=batcher.depth, computing=batcher.inflight_batches)
        state.shutting_down = True
        state.set_ready(False)
        batcher.close_admission()
        try:
            await asyncio.wait_for(batcher.stop(), timeout=config.shutdown_timeout_s)
        except TimeoutError:
            failed = batcher.fail_pending(ShuttingDown(
                "server shut down before this request was computed; retry",
                retry_after_s=config.batcher.retry_after_s))
            log.error("drain_timed_out", failed=failed, timeout_s=config.shutdown_timeout_s)
        log.info("drained")
        return 0
    finally:
        state.set_ready(False)
        await runner.cleanup()  # waits for in-flight handlers to write their responses
        if backend is not None:
            backend.close()
        if probe is not None:
            probe.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        log.info("stopped")


def _warm_up(backend: Backend) -> None:
    """One small inference, so the first real request does not pay lazy initialisation."""
    rows = backend.static_batch_size or 1
    backend.infer({spec.name: zeros_like_spec(spec, rows) for spec in backend.inputs})


def _bound_port(runner: web.AppRunner, requested: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return requested
