"""TensorRT backend: an FP16 engine built from the ONNX model, cached on disk, run on the GPU.

Only usable where ``tensorrt`` (and ``cuda-python`` for device memory) import and a GPU is
present. Both imports are guarded: :func:`tensorrt_unavailable_reason` says in one sentence
why the backend cannot run here, and ``--backend auto`` then falls back to ONNX Runtime.

The pure parts are separate functions, unit-tested without TensorRT:

- :func:`optimization_profile` — the dynamic-shape profile: batch min 1, opt 8, max 32 by
  default, the other dimensions fixed from the model (3x224x224 for ResNet-50).
- :func:`engine_cache_key` — an engine is only valid for the same model bytes, TensorRT
  version, GPU model, precision and profile, so all of them go into the key (a SHA-256); the
  file name starts with the model's own hash so stale engines of one model are easy to find.

Engines take tens of seconds to minutes to build; the cache turns every later cold start into a
deserialisation (seconds). Writes are atomic (temp file + rename), so two pods sharing a cache
volume never read a half-written engine.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from serving.backends.base import Array, BaseBackend
from serving.tensors import TensorSpec

log = structlog.get_logger("serving.tensorrt")

DEFAULT_MIN_BATCH, DEFAULT_OPT_BATCH, DEFAULT_MAX_BATCH = 1, 8, 32
WORKSPACE_BYTES = 4 << 30


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run on this machine; the message says why and what to do."""


@dataclass(frozen=True)
class ProfileShapes:
    """One input's (min, opt, max) shapes for a TensorRT optimisation profile."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def optimization_profile(inputs: Sequence[TensorSpec], *, min_batch: int = DEFAULT_MIN_BATCH,
                         opt_batch: int = DEFAULT_OPT_BATCH,
                         max_batch: int = DEFAULT_MAX_BATCH) -> list[ProfileShapes]:
    """Dynamic batch, fixed everything else: e.g. input [-1,3,224,224] -> [1|8|32, 3,224,224].

    ``opt_batch`` is clamped into [min, max] (a max batch of 4 gets opt 4). Non-batch dims must
    be known: a profile cannot be guessed for a dynamic image size.
    """
    if not 1 <= min_batch <= max_batch:
        raise ValueError(f"profile needs 1 <= min batch ({min_batch}) <= max batch ({max_batch})")
    opt = min(max(opt_batch, min_batch), max_batch)
    profile = []
    for spec in inputs:
        features = spec.shape[1:]
        if any(d < 1 for d in features):
            raise ValueError(f"input {spec.name!r} has dynamic non-batch dims {list(spec.shape)};"
                             " TensorRT needs them fixed to build a profile")
        profile.append(ProfileShapes(spec.name, (min_batch, *features), (opt, *features),
                                     (max_batch, *features)))
    return profile


def model_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def engine_cache_key(*, model_sha: str, tensorrt_version: str, gpu_name: str, fp16: bool,
                     profile: Sequence[ProfileShapes]) -> str:
    """SHA-256 over everything that makes a serialised engine valid to reuse."""
    payload = json.dumps({
        "model": model_sha, "tensorrt": tensorrt_version, "gpu": gpu_name, "fp16": fp16,
        "profile": [[p.name, list(p.min), list(p.opt), list(p.max)] for p in profile],
    }, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def engine_path(cache_dir: Path, model_sha: str, key: str) -> Path:
    return cache_dir / f"{model_sha[:16]}-{key[:16]}.engine"


def tensorrt_unavailable_reason() -> str | None:
    """None when TensorRT can be tried here, else why not (one sentence, with the fix)."""
    for module, package in (("tensorrt", "tensorrt"), ("cuda", "cuda-python")):
        if importlib.util.find_spec(module) is None:
            return (f"the TensorRT backend needs the '{package}' package, which is not "
                    "installed; install it on a GPU node or use --backend onnxruntime")
    return None


def import_cudart() -> Any:
    """cuda-python's CUDA runtime module (raises ImportError where it is not installed)."""
    try:
        return importlib.import_module("cuda.bindings.runtime")  # cuda-python >= 12.6
    except ImportError:
        return importlib.import_module("cuda.cudart")


def _import_tensorrt() -> tuple[Any, Any]:
    reason = tensorrt_unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(reason)
    return importlib.import_module("tensorrt"), import_cudart()


def build_engine(trt: Any, onnx_bytes: bytes, profile: Sequence[ProfileShapes], *,
                 fp16: bool = True, workspace_bytes: int = WORKSPACE_BYTES) -> bytes:
    """Parse ONNX, add one optimisation profile, build a serialised (FP16) engine."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"):  # implicit in TRT >= 10
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BackendUnavailable(f"TensorRT could not parse the ONNX model: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    trt_profile = builder.create_optimization_profile()
    for shapes in profile:
        trt_profile.set_shape(shapes.name, shapes.min, shapes.opt, shapes.max)
    config.add_optimization_profile(trt_profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BackendUnavailable("TensorRT failed to build an engine (see its log above)")
    return bytes(serialized)


def _check(result: Any) -> Any:
    """cuda-python returns (error, *values); raise on error, return the value(s)."""
    error, *values = result if isinstance(result, tuple) else (result,)
    if int(error) != 0:
        raise RuntimeError(f"CUDA call failed: {error}")
    return values[0] if len(values) == 1 else values


class TensorRTBackend(BaseBackend):
    """Runs a cached (or freshly built) FP16 engine; one execution context, one CUDA stream."""

    def __init__(self, model_path: Path, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], *, cache_dir: Path, gpu_name: str,
                 max_batch: int = DEFAULT_MAX_BATCH, opt_batch: int = DEFAULT_OPT_BATCH,
                 fp16: bool = True) -> None:
        trt, cudart = _import_tensorrt()
        self._trt, self._cudart = trt, cudart
        profile = optimization_profile(inputs, opt_batch=opt_batch, max_batch=max_batch)
        sha = model_sha256(model_path)
        key = engine_cache_key(model_sha=sha, tensorrt_version=str(trt.__version__),
                               gpu_name=gpu_name, fp16=fp16, profile=profile)
        path = engine_path(cache_dir, sha, key)
        # Warm start (a deserialisation) or cold (a build): exported with the load time.
        self.engine_cached = path.exists()
        if self.engine_cached:
            log.info("tensorrt_engine_cached", path=path.name)
            data = path.read_bytes()
        else:
            log.info("tensorrt_engine_building", fp16=fp16, profile=[p.max for p in profile])
            data = build_engine(trt, model_path.read_bytes(), profile, fp16=fp16)
            cache_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".engine-", dir=cache_dir)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self._engine = self._runtime.deserialize_cuda_engine(data)
        self._context = self._engine.create_execution_context()
        self._stream = _check(cudart.cudaStreamCreate())
        self._lock = threading.Lock()  # one context: one batch at a time on it
        self._buffers: dict[str, int] = {}
        for spec in (*inputs, *outputs):
            dtype = np.dtype(trt.nptype(self._engine.get_tensor_dtype(spec.name)))
            per_row = int(np.prod(spec.shape[1:])) * dtype.itemsize
            self._buffers[spec.name] = int(_check(cudart.cudaMalloc(per_row * max_batch)))
            self._context.set_tensor_address(spec.name, self._buffers[spec.name])
        super().__init__(kind="tensorrt-fp16" if fp16 else "tensorrt-fp32", inputs=inputs,
                         outputs=outputs, max_batch_size=max_batch)

    def infer(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        cudart = self._cudart
        h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        d2h = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        with self._lock:
            for name, value in inputs.items():
                host = np.ascontiguousarray(value)
                self._context.set_input_shape(name, host.shape)
                _check(cudart.cudaMemcpyAsync(self._buffers[name], host.ctypes.data,
                                              host.nbytes, h2d, self._stream))
            if not self._context.execute_async_v3(self._stream):
                raise RuntimeError("TensorRT execute_async_v3 failed")
            results: dict[str, Array] = {}
            for spec in self.outputs:
                shape = tuple(self._context.get_tensor_shape(spec.name))
                host = np.empty(shape, dtype=spec.dtype)
                _check(cudart.cudaMemcpyAsync(host.ctypes.data, self._buffers[spec.name],
                                              host.nbytes, d2h, self._stream))
                results[spec.name] = host
            _check(cudart.cudaStreamSynchronize(self._stream))
        return results

    def close(self) -> None:
        for pointer in self._buffers.values():
            self._cudart.cudaFree(pointer)
        self._buffers.clear()
        self._cudart.cudaStreamDestroy(self._stream)
