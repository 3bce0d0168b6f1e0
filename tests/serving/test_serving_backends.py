"""ONNX Runtime backend and backend selection (TensorRT's own logic: test_serving_tensorrt)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import structlog
from onnx import TensorProto, helper

from gpufrag.errors import BadInput
from serving.backends import select
from serving.backends.onnx_runtime import (
    CPU_PROVIDER,
    CUDA_PROVIDER,
    ORT_FATAL,
    ORT_TELEMETRY_ENV,
    ORT_WARNING,
    OnnxRuntimeBackend,
    choose_providers,
    model_load_error,
    ort_log_severity,
    spec_from_onnx,
)
from serving.backends.tensorrt_engine import BackendUnavailable
from serving.models import builtin_path
from serving.tensors import TensorSpec


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return builtin_path("resnet-small", tmp_path_factory.mktemp("models"))


def test_onnx_runtime_backend_describes_and_runs_the_model(small_model: Path) -> None:
    backend = OnnxRuntimeBackend(small_model, intra_op_threads=1)
    assert backend.kind == "onnxruntime-cpu"  # no CUDA provider in the CPU wheel
    assert backend.inputs == (TensorSpec("input", "FP32", (-1, 3, 32, 32)),)
    assert backend.outputs == (TensorSpec("logits", "FP32", (-1, 10)),)
    assert backend.static_batch_size is None and backend.max_batch_size is None
    x = np.zeros((5, 3, 32, 32), dtype=np.float32)
    assert backend.infer({"input": x})["logits"].shape == (5, 10)
    backend.close()


def test_batched_and_single_results_agree(small_model: Path) -> None:
    """Batching must not change answers: row i of a batch == that image alone."""
    backend = OnnxRuntimeBackend(small_model, intra_op_threads=1)
    x = np.random.default_rng(1).random((4, 3, 32, 32), dtype=np.float32)
    batched = backend.infer({"input": x})["logits"]
    single = np.concatenate([backend.infer({"input": x[i:i + 1]})["logits"] for i in range(4)])
    np.testing.assert_allclose(batched, single, rtol=1e-4, atol=1e-5)


def test_a_fixed_batch_graph_is_reported_as_static(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "fixed.onnx"
    onnx.save(model, str(path))
    backend = OnnxRuntimeBackend(path)
    assert backend.static_batch_size == 4 and backend.max_batch_size == 4
    assert backend.inputs == (TensorSpec("x", "FP32", (-1, 3)),)  # padding makes any N <= 4 ok


@pytest.mark.parametrize(("available", "allow_cuda", "expected"), [
    ([CPU_PROVIDER], True, [CPU_PROVIDER]),
    ([CUDA_PROVIDER, CPU_PROVIDER], True, [CUDA_PROVIDER, CPU_PROVIDER]),
    ([CUDA_PROVIDER, CPU_PROVIDER], False, [CPU_PROVIDER]),
    (["TensorrtExecutionProvider", CUDA_PROVIDER, CPU_PROVIDER], True,
     [CUDA_PROVIDER, CPU_PROVIDER]),
])
def test_choose_providers(available: list[str], allow_cuda: bool, expected: list[str]) -> None:
    assert choose_providers(available, allow_cuda=allow_cuda) == expected


def test_spec_from_onnx_maps_types_and_symbolic_dims() -> None:
    assert spec_from_onnx("a", "tensor(float16)", ["N", 3, None], what="input") == TensorSpec(
        "a", "FP16", (-1, 3, -1))
    with pytest.raises(BadInput, match="m.onnx: input 's' has type tensor\\(string\\)"):
        spec_from_onnx("s", "tensor(string)", [1], what="input", source="m.onnx")


@pytest.mark.parametrize(("kind", "needle"), [
    ("unknown-op", "No Op registered for Frobnicate"),
    ("bad-ir-version", "Unsupported model IR version: 99"),
    ("random-bytes", "Protobuf parsing failed"),
    ("no-graph", "No graph was found in the protobuf"),
    ("missing", "File doesn't exist"),
])
def test_a_model_onnx_runtime_cannot_load_is_one_line_of_bad_input(
        model_file: Callable[[str], Path], kind: str, needle: str) -> None:
    path = model_file(kind)
    with pytest.raises(BadInput) as raised:
        OnnxRuntimeBackend(path, intra_op_threads=1)
    message = str(raised.value)
    assert message.startswith(f"field '--model': model file '{path}' cannot be loaded by "
                              "ONNX Runtime: ")
    assert needle in message and "\n" not in message
    assert "[ONNXRuntimeError]" not in message and "model.cc" not in message


@pytest.mark.parametrize(("severity", "ort_says"), [(ORT_FATAL, False), (ORT_WARNING, True)])
def test_onnx_runtime_s_own_log_lines_are_filtered_by_severity(
        model_file: Callable[[str], Path], capfd: pytest.CaptureFixture[str],
        severity: int, ort_says: bool) -> None:
    """ORT writes coloured plain text to file descriptor 2 (not through Python): at the
    server's severity nothing reaches stderr, which must stay JSON lines; at warning level
    (--log-level debug) its warning about the unused initializer comes through."""
    capfd.readouterr()
    backend = OnnxRuntimeBackend(model_file("unused-initializer"), intra_op_threads=1,
                                 log_severity=severity)
    backend.infer({"x": np.ones((1, 2), dtype=np.float32)})
    err = capfd.readouterr().err
    assert ("Removing initializer 'unused'" in err) is ort_says, err
    if not ort_says:
        assert err == ""


@pytest.mark.parametrize(("preset", "after"), [(None, "1"), ("0", "0")])
def test_onnx_runtime_telemetry_is_switched_off_unless_the_operator_chose(
        small_model: Path, monkeypatch: pytest.MonkeyPatch, preset: str | None,
        after: str) -> None:
    """ORT reads it on import, before any logger setting applies (see the module docstring);
    this process imported ORT long ago, so the subprocess test checks the effect."""
    if preset is None:
        monkeypatch.delenv(ORT_TELEMETRY_ENV, raising=False)
    else:
        monkeypatch.setenv(ORT_TELEMETRY_ENV, preset)
    OnnxRuntimeBackend(small_model, intra_op_threads=1).close()
    assert os.environ[ORT_TELEMETRY_ENV] == after


@pytest.mark.parametrize(("level", "severity"), [
    (logging.INFO, ORT_FATAL), (logging.WARNING, ORT_FATAL), (logging.DEBUG, ORT_WARNING)])
def test_ort_severity_follows_our_log_level(level: int, severity: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))
    try:
        assert ort_log_severity() == severity
    finally:
        structlog.reset_defaults()


def test_runtime_faults_are_not_mistaken_for_a_bad_model() -> None:
    class EPFail(Exception):  # named like ORT's: a provider failing is a fault, not input
        pass

    class Fail(Exception):
        pass

    path = Path("m.onnx")
    assert model_load_error(EPFail("CUDA failure 2: out of memory"), path) is None
    assert model_load_error(Fail("[ONNXRuntimeError] : 1 : FAIL : bad alloc"), path) is None
    assert model_load_error(RuntimeError("anything"), path) is None
    loading = model_load_error(Fail("[ONNXRuntimeError] : 1 : FAIL : Load model from m.onnx "
                                    "failed:opset 99 is unknown"), path)
    assert loading is not None and str(loading).endswith("ONNX Runtime: opset 99 is unknown")


@pytest.mark.parametrize(("requested", "trt_reason", "gpu", "expected"), [
    ("auto", "no tensorrt", None, "onnxruntime"),
    ("auto", "no tensorrt", "NVIDIA H100", "onnxruntime"),
    ("auto", None, None, "onnxruntime"),
    ("auto", None, "NVIDIA H100", "tensorrt"),
    ("onnxruntime", None, "NVIDIA H100", "onnxruntime"),
    ("tensorrt", None, "NVIDIA H100", "tensorrt"),
])
def test_choose_backend(monkeypatch: pytest.MonkeyPatch, requested: str,
                        trt_reason: str | None, gpu: str | None, expected: str) -> None:
    monkeypatch.setattr(select, "tensorrt_unavailable_reason", lambda: trt_reason)
    assert select.choose_backend(requested, gpu_name=gpu) == expected


def test_asking_for_tensorrt_where_it_cannot_run_says_why() -> None:
    # Here tensorrt is not installed: the real reason is reported, not a silent fallback.
    with pytest.raises(BackendUnavailable, match="'tensorrt' package, which is not installed"):
        select.choose_backend("tensorrt", gpu_name="NVIDIA H100")


def test_tensorrt_without_a_gpu_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(select, "tensorrt_unavailable_reason", lambda: None)
    with pytest.raises(BackendUnavailable, match="needs a GPU and NVML found none"):
        select.choose_backend("tensorrt", gpu_name=None)


def test_load_backend_times_the_load(small_model: Path, tmp_path: Path) -> None:
    loaded = select.load_backend("auto", small_model, gpu_name=None,
                                 engine_cache_dir=tmp_path, max_batch_size=8)
    assert loaded.load_seconds > 0 and loaded.backend.kind == "onnxruntime-cpu"
    assert loaded.cache == "none"  # ONNX Runtime reads the file as it is: nothing cached


def test_default_threads_leave_a_core_for_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    from serving.backends import onnx_runtime

    monkeypatch.setattr(onnx_runtime, "available_cpus", lambda: 16)
    assert onnx_runtime.default_intra_op_threads() == 15
    monkeypatch.setattr(onnx_runtime, "available_cpus", lambda: 1)
    assert onnx_runtime.default_intra_op_threads() == 1


@pytest.mark.parametrize(("files", "limit"), [
    ({"cpu.max": "200000 100000\n"}, 2.0),
    ({"cpu.max": "150000 100000\n"}, 1.5),
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({"cpu.max": "garbled"}, None),
    ({}, None),
])
def test_cgroup_cpu_limit_reads_v2_then_v1(tmp_path: Path, files: dict[str, str],
                                           limit: float | None) -> None:
    from serving.backends import onnx_runtime

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert onnx_runtime.cgroup_cpu_limit(tmp_path) == limit


def test_available_cpus_is_capped_by_the_container_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    from serving.backends import onnx_runtime

    monkeypatch.setattr(onnx_runtime.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(onnx_runtime, "cgroup_cpu_limit", lambda: 1.5)
    assert onnx_runtime.available_cpus() == 2  # a 1.5-CPU limit still runs on 2 cores
    monkeypatch.setattr(onnx_runtime, "cgroup_cpu_limit", lambda: None)
    assert onnx_runtime.available_cpus() == 64
