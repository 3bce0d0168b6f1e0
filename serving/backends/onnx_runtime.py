"""ONNX Runtime backend: CPU everywhere, the CUDA execution provider where it is installed.

``onnxruntime`` (CPU build) lists only CPU providers; ``onnxruntime-gpu`` adds
``CUDAExecutionProvider``. We ask for CUDA first when it is available and keep CPU as the
fallback for nodes CUDA cannot run; :attr:`OnnxRuntimeBackend.kind` reports the provider that
actually runs the graph, so the metrics and logs say whether the GPU is in use.

``run`` releases the GIL, so batches computed in the batcher's worker thread leave the event
loop free to accept and parse requests.

A model file ONNX Runtime cannot load (corrupt protobuf, invalid graph, unknown operator,
unsupported IR version) is :class:`gpufrag.errors.BadInput` naming the file and ORT's reason,
so ``gpufrag serve`` reports it in one line with exit code 2 rather than a traceback.

ORT has a logger of its own that writes coloured plain-text lines straight to stderr (graph
warnings such as unused initializers or inserted memcpy nodes, provider libraries that fail to
load), and its Python API offers no way to route them through ours. In a container whose
stderr is JSON lines, one such line breaks every log pipeline that parses them, so ORT's
loggers (the process-wide one and each session's) are told to report only fatal errors
(:func:`ort_log_severity`); what matters from the rest comes back as JSON: load errors are
exceptions (above), and a CUDA provider that is installed but did not take the graph is logged
as ``cuda_provider_inactive``. ``--log-level debug`` lets ORT's warnings through again, as its
own text, for debugging a graph.

One ORT line comes before any severity can be set: on import, ORT's telemetry tries to keep a
device id under ``$XDG_CACHE_HOME`` or ``~/.cache`` and, where HOME is not writable (the
production image: HOME=/nonexistent, read-only root), warns "Failed to persist telemetry
device ID". The only switch that acts before import is ORT's ``ORT_DISABLE_TELEMETRY``
environment variable, so the backend sets it (unless the operator set it) before it first
imports ``onnxruntime``: a model server has no use for the telemetry, and it must not write
files under HOME either.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from gpufrag.errors import BadInput
from serving.backends.base import Array, BaseBackend
from serving.tensors import ONNX_TO_V2, TensorSpec

log = structlog.get_logger("serving.onnxruntime")

CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
# ONNX Runtime's log severities (OrtLoggingLevel): 0 verbose, 1 info, 2 warning, 3 error,
# 4 fatal.
ORT_WARNING, ORT_FATAL = 2, 4
# Read by ORT when it is imported (environment creation); "1" turns its telemetry off.
ORT_TELEMETRY_ENV = "ORT_DISABLE_TELEMETRY"


def ort_log_severity() -> int:
    """The least severe ORT message that may reach stderr: fatal only, unless our own log
    level is debug (then warnings too). Errors are not let through either: ORT's are plain
    text, and each one that matters also raises, which is reported as JSON."""
    return ORT_WARNING if log.is_enabled_for(logging.DEBUG) else ORT_FATAL


def choose_providers(available: list[str], *, allow_cuda: bool = True) -> list[str]:
    """CUDA first when present (and allowed), CPU always last."""
    providers = [CUDA_PROVIDER] if allow_cuda and CUDA_PROVIDER in available else []
    return [*providers, CPU_PROVIDER]


CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> float | None:
    """The CPU quota of this container in CPUs (a Kubernetes CPU limit), None if unlimited
    or unknown. cgroup v2 ``cpu.max`` ("200000 100000" = 2 CPUs, "max 100000" = none), else
    cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 = none)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask (cpuset), capped by the cgroup quota,
    which ``os.cpu_count()`` does not see (a pod limited to 2 CPUs on a 64-core node)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        cpus = min(cpus, max(1, math.ceil(limit)))
    return max(1, cpus)


def default_intra_op_threads() -> int:
    """All cores but one: the event loop needs a core to accept, parse and answer requests
    while a batch computes; ORT's default (every core) starves it on small CPU machines."""
    return max(1, available_cpus() - 1)


def spec_from_onnx(name: str, onnx_type: str, shape: list[Any], *, what: str,
                   source: str | None = None) -> TensorSpec:
    """An ORT NodeArg -> TensorSpec; symbolic or unknown dims become -1. A type the server
    cannot carry is the model's fault, so BadInput (exit 2), naming ``source`` (the file)."""
    datatype = ONNX_TO_V2.get(onnx_type)
    if datatype is None:
        raise BadInput(f"{what} {name!r} has type {onnx_type}, which this server cannot "
                       f"carry over JSON (supported: {', '.join(sorted(ONNX_TO_V2))})",
                       source=source)
    dims = tuple(d if isinstance(d, int) and d > 0 else -1 for d in shape)
    return TensorSpec(name, datatype, dims)


# ORT's error names that mean "this file is not a model ORT can run". FAIL is generic, so it
# counts only while the file is being loaded; EP_FAIL, RUNTIME_EXCEPTION and the rest (a CUDA
# provider failing, memory) are faults and keep their traceback.
_MODEL_ERRORS = ("InvalidProtobuf", "InvalidGraph", "InvalidArgument", "NoSuchFile", "NoModel",
                 "NotImplemented")
_LOAD_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : (?:Load model from .*? failed:)?")
_CPP_LOCATION = re.compile(r"^\S+\.(?:cc|h|cpp):\d+ [^(]*\([^)]*\) ")


def model_load_error(exc: Exception, model_path: Path) -> BadInput | None:
    """``exc`` from ``ort.InferenceSession`` as a one-line BadInput naming the file, or None
    when it is not the model's fault. Matched by class name: ORT's pybind11 classes derive
    straight from Exception and live in a private module."""
    kind = type(exc).__name__
    text = str(exc).strip()
    first_line = text.splitlines()[0] if text else kind
    if kind not in _MODEL_ERRORS and not (kind == "Fail" and "Load model from" in first_line):
        return None
    reason = _CPP_LOCATION.sub("", _LOAD_PREFIX.sub("", first_line)).strip() or kind
    return BadInput(f"model file {str(model_path)!r} cannot be loaded by ONNX Runtime: "
                    f"{reason:.300}", field="--model")


class OnnxRuntimeBackend(BaseBackend):
    def __init__(self, model_path: Path, *, intra_op_threads: int = 0,
                 allow_cuda: bool = True, log_severity: int | None = None) -> None:
        os.environ.setdefault(ORT_TELEMETRY_ENV, "1")  # before the import: module docstring
        import onnxruntime as ort

        severity = ort_log_severity() if log_severity is None else log_severity
        ort.set_default_logger_severity(severity)  # process-wide: environment, providers
        options = ort.SessionOptions()
        options.log_severity_level = severity  # this session: graph checks and optimisers
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = intra_op_threads or default_intra_op_threads()
        options.inter_op_num_threads = 1  # sequential execution: no second pool of threads
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # ORT's pool busy-waits between ops by default; in a server that steals the cores the
        # event loop needs to accept and parse the next requests, so idle threads sleep.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        providers = choose_providers(ort.get_available_providers(), allow_cuda=allow_cuda)
        try:
            self._session = ort.InferenceSession(str(model_path), sess_options=options,
                                                 providers=providers)
        except Exception as exc:
            bad = model_load_error(exc, model_path)
            if bad is None:
                raise
            raise bad from None
        active = self._session.get_providers()
        kind = "onnxruntime-cuda" if CUDA_PROVIDER in active else "onnxruntime-cpu"
        if CUDA_PROVIDER in providers and CUDA_PROVIDER not in active:
            # ORT said why in its own log, which is filtered: say that it happened, in ours.
            log.warning("cuda_provider_inactive", model=str(model_path), active=active,
                        effect="the model runs on the CPU",
                        fix="rerun with --log-level debug to see ONNX Runtime's reason "
                        "(usually a CUDA or cuDNN library it could not load)")
        source = str(model_path)
        inputs = tuple(spec_from_onnx(i.name, i.type, list(i.shape), what="input", source=source)
                       for i in self._session.get_inputs())
        outputs = tuple(spec_from_onnx(o.name, o.type, list(o.shape), what="output",
                                       source=source)
                        for o in self._session.get_outputs())
        self._output_names = [o.name for o in outputs]
        batch_dims = {i.shape[0] for i in self._session.get_inputs() if i.shape}
        fixed = [d for d in batch_dims if isinstance(d, int) and d > 0]
        static = fixed[0] if len(fixed) == 1 and len(batch_dims) == 1 else None
        if static is not None:  # publish -1 anyway: padding makes any batch <= N work
            inputs = tuple(TensorSpec(s.name, s.datatype, (-1, *s.shape[1:])) for s in inputs)
            outputs = tuple(TensorSpec(s.name, s.datatype, (-1, *s.shape[1:])) for s in outputs)
        super().__init__(kind=kind, inputs=inputs, outputs=outputs, static_batch_size=static,
                         max_batch_size=static)

    def infer(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        values = self._session.run(self._output_names, dict(inputs))
        return dict(zip(self._output_names, values, strict=True))

    def close(self) -> None:
        del self._session
