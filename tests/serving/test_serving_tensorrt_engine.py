"""TensorRT's pure logic (profiles, cache keys, availability). The engine itself needs a GPU
and the tensorrt package; here we check that its absence is detected and reported."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest

from serving.backends import tensorrt_engine as trt_engine
from serving.backends.tensorrt_engine import (
    BackendUnavailable,
    ProfileShapes,
    TensorRTBackend,
    engine_cache_key,
    engine_path,
    model_sha256,
    optimization_profile,
)
from serving.tensors import TensorSpec
from tests import skips

IMAGE = TensorSpec("input", "FP32", (-1, 3, 224, 224))


def test_default_profile_is_min_1_opt_8_max_32_for_3x224x224() -> None:
    assert optimization_profile([IMAGE]) == [ProfileShapes(
        "input", (1, 3, 224, 224), (8, 3, 224, 224), (32, 3, 224, 224))]


@pytest.mark.parametrize(("max_batch", "opt"), [(4, 4), (8, 8), (64, 8)])
def test_opt_is_clamped_into_the_range(max_batch: int, opt: int) -> None:
    (profile,) = optimization_profile([IMAGE], max_batch=max_batch)
    assert profile.opt[0] == opt and profile.max[0] == max_batch


def test_profiles_cover_every_input() -> None:
    mask = TensorSpec("mask", "BOOL", (-1, 16))
    assert [p.name for p in optimization_profile([IMAGE, mask])] == ["input", "mask"]


@pytest.mark.parametrize(("inputs", "kwargs", "message"), [
    ([TensorSpec("input", "FP32", (-1, 3, -1, -1))], {}, "dynamic non-batch dims"),
    ([IMAGE], {"min_batch": 0}, "1 <= min batch"),
    ([IMAGE], {"min_batch": 9, "max_batch": 8}, "min batch \\(9\\) <= max batch \\(8\\)"),
])
def test_bad_profiles_are_refused(inputs: list[TensorSpec], kwargs: dict[str, int],
                                  message: str) -> None:
    with pytest.raises(ValueError, match=message):
        optimization_profile(inputs, **kwargs)


KEY_ARGS = {"model_sha": "ab" * 32, "tensorrt_version": "10.3.0", "gpu_name": "NVIDIA H100",
            "fp16": True, "profile": optimization_profile([IMAGE])}


@pytest.mark.parametrize(("field", "value"), [
    ("model_sha", "cd" * 32), ("tensorrt_version", "10.4.0"), ("gpu_name", "NVIDIA L4"),
    ("fp16", False), ("profile", optimization_profile([IMAGE], max_batch=16)),
])
def test_cache_key_changes_with_everything_that_invalidates_an_engine(field: str,
                                                                       value: object) -> None:
    changed = {**KEY_ARGS, field: value}
    assert engine_cache_key(**KEY_ARGS) != engine_cache_key(**changed)  # type: ignore[arg-type]


def test_cache_key_is_stable_and_the_path_names_the_model() -> None:
    key = engine_cache_key(**KEY_ARGS)  # type: ignore[arg-type]
    assert key == engine_cache_key(**KEY_ARGS) and len(key) == 64  # type: ignore[arg-type]
    path = engine_path(Path("/cache"), "ab" * 32, key)
    assert path.name == f"{'ab' * 8}-{key[:16]}.engine"


def test_model_sha256_hashes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"onnx bytes")
    assert model_sha256(path) == hashlib.sha256(b"onnx bytes").hexdigest()


@skips.skip_if(importlib.util.find_spec("tensorrt") is not None, skips.TENSORRT_PRESENT)
def test_absence_is_reported_clearly(tmp_path: Path) -> None:
    reason = trt_engine.tensorrt_unavailable_reason()
    assert reason is not None and "'tensorrt' package" in reason
    assert "--backend onnxruntime" in reason
    with pytest.raises(BackendUnavailable, match="not installed"):
        TensorRTBackend(tmp_path / "m.onnx", [IMAGE], [], cache_dir=tmp_path, gpu_name="x")


def test_missing_cuda_python_is_reported_too(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(trt_engine.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "tensorrt" else (
                            None if name == "cuda" else real(name, *a)))
    reason = trt_engine.tensorrt_unavailable_reason()
    assert reason is not None and "'cuda-python' package" in reason
