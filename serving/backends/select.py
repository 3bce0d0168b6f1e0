"""Choose and load the backend for ``--backend auto|onnxruntime|tensorrt``, timing the load.

``auto`` takes TensorRT when it is importable *and* a GPU was found, else ONNX Runtime (which
itself uses CUDA when ``onnxruntime-gpu`` is installed). Asking for ``tensorrt`` where it
cannot run is an error with the reason, not a silent fallback: the operator asked for a
specific engine and should learn it is not what runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from serving.backends.base import Backend
from serving.backends.onnx_runtime import OnnxRuntimeBackend
from serving.backends.tensorrt_engine import (
    DEFAULT_OPT_BATCH,
    BackendUnavailable,
    TensorRTBackend,
    tensorrt_unavailable_reason,
)
from serving.cache import CacheState, cache_state

log = structlog.get_logger("serving.backends")


@dataclass(frozen=True)
class LoadedBackend:
    """A loaded backend, how long the load took, and whether it found its cached artefact
    (``cache``: the TensorRT engine; ONNX Runtime caches nothing, so "none")."""

    backend: Backend
    load_seconds: float
    cache: CacheState = "none"


def choose_backend(requested: str, *, gpu_name: str | None) -> str:
    """``onnxruntime`` or ``tensorrt``; raises BackendUnavailable for an impossible request."""
    reason = tensorrt_unavailable_reason()
    if requested == "tensorrt":
        if reason is not None:
            raise BackendUnavailable(reason)
        if gpu_name is None:
            raise BackendUnavailable("the TensorRT backend needs a GPU and NVML found none; "
                                     "use --backend onnxruntime")
        return "tensorrt"
    if requested == "auto" and reason is None and gpu_name is not None:
        return "tensorrt"
    if requested == "auto":
        log.info("backend_auto", chosen="onnxruntime",
                 why=reason or "no GPU found for TensorRT")
    return "onnxruntime"


def load_backend(requested: str, model_path: Path, *, gpu_name: str | None,
                 engine_cache_dir: Path, max_batch_size: int,
                 intra_op_threads: int = 0) -> LoadedBackend:
    """Load the model into its backend, timed (``load_seconds``); the server adds the time
    spent getting the model file (:func:`serving.models.materialize_model`) and exports the
    sum as the load-time gauge."""
    chosen = choose_backend(requested, gpu_name=gpu_name)
    started = time.perf_counter()
    backend: Backend
    engine_cached: bool | None = None
    onnx_backend = OnnxRuntimeBackend(model_path, intra_op_threads=intra_op_threads,
                                      allow_cuda=chosen == "onnxruntime")
    if chosen == "tensorrt":
        # ORT (CPU) only reads the graph's tensor specs here; TensorRT runs it.
        inputs, outputs = onnx_backend.inputs, onnx_backend.outputs
        onnx_backend.close()
        engine = TensorRTBackend(model_path, inputs, outputs, cache_dir=engine_cache_dir,
                                 gpu_name=gpu_name or "unknown",
                                 max_batch=max_batch_size,
                                 opt_batch=min(DEFAULT_OPT_BATCH, max_batch_size))
        engine_cached, backend = engine.engine_cached, engine
    else:
        backend = onnx_backend
    return LoadedBackend(backend, time.perf_counter() - started, cache_state(engine_cached))
