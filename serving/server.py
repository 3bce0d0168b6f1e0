"""The ``gpufrag serve`` process: listen, load the model, serve, and drain on SIGTERM.

Order of events, and why:

1. Listen first, with ``/v2/health/live`` 200 and ``/v2/health/ready`` 503, so Kubernetes sees a
   live pod during a long model load (cold start) instead of restarting it.
2. Load (or build) the model in a worker thread, timing it and noting whether the model cache
   had what the load needed: ``gpufrag_serving_model_load_seconds{cache="cold|warm"}``.
3. Start the batcher; ready turns 200.
4. On SIGTERM/SIGINT, in this order, so no accepted request is lost:

   a. readiness turns 503 at once, and every answer from then on carries
      ``Connection: close`` (keep-alive clients reconnect, to another pod);
   b. for ``--drain-delay-s`` requests are still admitted and answered normally: the
      endpoint is being removed from Services and load balancers meanwhile (what a preStop
      ``sleep`` does, without needing one; a second signal ends the delay early);
   c. admission closes: new requests get a fast 503 + Retry-After, which the client retries
      on another pod;
   d. the batcher answers everything queued or computing, and every response is written;
   e. only then the listener closes (what the kernel had already accepted is taken from its
      queue and answered, and connections close only between requests: no accepted request
      is reset; :mod:`serving.http1`) and the process exits 0.

   (d) is bounded by ``--shutdown-timeout-s``: what is still queued then gets 503 rather than
   silence. ``terminationGracePeriodSeconds`` must cover preStop + drain delay + timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from collections.abc import Callable
from typing import Any

import structlog

from gpufrag.errors import BadInput
from gpufrag.httpserve import ListenError
from gpufrag.loops import running_loop_kind
from gpufrag.memdebug import LOOPBACK, DebugListener, start_debug_listener
from gpufrag.nvml import MIB
from serving.app import ServerState
from serving.backends.base import Backend, zeros_like_spec
from serving.backends.select import LoadedBackend, load_backend
from serving.batcher import DynamicBatcher
from serving.cache import cache_state, combine, resolve_model_cache
from serving.config import ServerConfig
from serving.errors import ShuttingDown
from serving.frontend import HttpLimits, front_end
from serving.gpu import MemoryGrowthWatch, NvmlProbe, detect_gpus
from serving.metrics import ServingMetrics
from serving.models import materialize_model, model_name
from serving.protocol import ModelInfo
from serving.tensors import TensorSpec

log = structlog.get_logger("serving.server")

# The front end's wait for answers still being written when the listener closes; the drain has
# already waited for them (within --shutdown-timeout-s), so this is only a last short grace.
LAST_WRITE_GRACE_S = 2.0


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


def load_model(config: ServerConfig, probe: NvmlProbe | None) -> LoadedBackend:
    """The model, loaded into its backend. The time covers getting the model file (a built-in
    one is generated into the cache when missing) as well as the backend's load (a TensorRT
    engine built or deserialised), since both are what a cold start waits for; ``cache`` is
    cold when either had to be made."""
    cache = resolve_model_cache(config.model_cache_dir)
    started = time.perf_counter()
    model = materialize_model(config.model, cache.path)
    loaded = load_backend(config.backend, model.path,
                          gpu_name=probe.names[0] if probe is not None else None,
                          engine_cache_dir=config.engine_cache_dir or cache.path / "engines",
                          max_batch_size=config.batcher.max_batch_size,
                          intra_op_threads=config.intra_op_threads)
    return dataclasses.replace(loaded, load_seconds=time.perf_counter() - started,
                               cache=combine(cache_state(model.cached), loaded.cache))


Loader = Callable[[ServerConfig, NvmlProbe | None], LoadedBackend]


async def serve(config: ServerConfig, *, on_listening: Callable[[int], None] | None = None,
                load: Loader | None = None, limits: HttpLimits | None = None) -> int:
    """Run until SIGTERM/SIGINT; returns the exit code. ``load`` replaces the model loader
    (tests serve a fake backend through the real process lifecycle); ``limits`` the front
    end's header/body/keep-alive bounds."""
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

    server = front_end(state, limits)
    port = await server.start(config.host, config.port)
    log.info("listening", host=config.host, port=port, model=name,
             event_loop=running_loop_kind())
    if on_listening is not None:
        on_listening(port)

    batcher: DynamicBatcher | None = None
    backend: Backend | None = None
    debug: DebugListener | None = None
    try:
        debug = _start_debug(config, probe)
        loaded = await loop.run_in_executor(None, load or load_model, config, probe)
        backend = loaded.backend
        check_limits(backend, config)
        inputs = published_inputs(backend, config)
        metrics.record_model_load(backend=backend.kind, cache=loaded.cache,
                                  seconds=loaded.load_seconds)
        await loop.run_in_executor(None, _warm_up, backend)
        if probe is not None:
            backend = MemoryGrowthWatch(backend, probe,
                                        threshold_mib=config.gpu_memory_growth_warn_mib,
                                        observer=metrics)
        log.info("model_loaded", model=name, backend=backend.kind,
                 load_seconds=round(loaded.load_seconds, 3), cache=loaded.cache,
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
        await _drain(config, state, batcher, stop)
        return 0
    finally:
        state.set_ready(False)
        # The drain itself waited for in-flight answers (state.wait_idle) within
        # --shutdown-timeout-s; this grace is only for what is left after that.
        await server.close(min(config.shutdown_timeout_s, LAST_WRITE_GRACE_S))
        if backend is not None:
            backend.close()
        if debug is not None:
            debug.stop()
        if probe is not None:
            probe.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        log.info("stopped")


def _start_debug(config: ServerConfig, probe: NvmlProbe | None) -> DebugListener | None:
    """The opt-in debug listener (``--debug-port``), reporting each GPU's used memory beside
    the allocation growth; None when it is off."""
    if not config.debug_port:
        return None

    def gpus() -> dict[str, Any]:
        if probe is None:
            return {"gpu_memory_used_mib": None, "gpu": "no GPU: NVML found none"}
        return {"gpu_memory_used_mib": {str(gpu): round(used / MIB, 1) for gpu, used
                                        in probe.memory_used_bytes().items()}}

    try:
        listener = start_debug_listener(config.debug_port, gpus)
    except ListenError as e:  # the port is taken: one line, exit 1, as for --port
        raise OSError(str(e)) from e
    log.info("debug_listening", host=LOOPBACK, port=listener.port, path="/debug/memory")
    return listener


async def _drain(config: ServerConfig, state: ServerState, batcher: DynamicBatcher,
                 stop: asyncio.Event) -> None:
    """Steps (a)-(d) of the module's shutdown order; the caller closes the listener."""
    loop = asyncio.get_running_loop()
    was_ready = state.ready
    state.draining = True  # from here every answer says Connection: close
    state.set_ready(False)
    if was_ready and config.drain_delay_s > 0:  # never ready: no endpoint to wait out
        log.info("drain_delay", seconds=config.drain_delay_s, queued=batcher.depth)
        stop.clear()
        try:
            await asyncio.wait_for(stop.wait(), timeout=config.drain_delay_s)
            log.info("drain_delay_cut_short")
        except TimeoutError:
            pass
    deadline = loop.time() + config.shutdown_timeout_s
    log.info("draining", queued=batcher.depth, computing=batcher.inflight_batches,
             connections_busy=state.active_requests)
    state.shutting_down = True
    batcher.close_admission()
    try:
        await asyncio.wait_for(batcher.stop(), timeout=config.shutdown_timeout_s)
    except TimeoutError:
        failed = batcher.fail_pending(ShuttingDown(
            "server shut down before this request was computed; retry",
            retry_after_s=config.batcher.retry_after_s))
        log.error("drain_timed_out", failed=failed, timeout_s=config.shutdown_timeout_s)
    # The batcher has resolved every future; their callbacks encode and write the answers.
    if not await state.wait_idle(max(deadline - loop.time(), LAST_WRITE_GRACE_S)):
        log.error("drain_timed_out", unwritten=state.active_requests,
                  timeout_s=config.shutdown_timeout_s)
    log.info("drained")


def _warm_up(backend: Backend) -> None:
    """One small inference, so the first real request does not pay lazy initialisation."""
    rows = backend.static_batch_size or 1
    backend.infer({spec.name: zeros_like_spec(spec, rows) for spec in backend.inputs})

