"""Built-in ResNet generators: graph shape, determinism, caching, references."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gpufrag.errors import BadInput
from serving.models import (
    BUILTIN_MODELS,
    build_resnet,
    builtin_path,
    check_model_file,
    materialize,
    materialize_model,
    model_name,
)


def test_resnet_small_runs_on_cpu_with_the_documented_shapes(tmp_path: Path) -> None:
    path = builtin_path("resnet-small", tmp_path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inp,), (out,) = session.get_inputs(), session.get_outputs()
    assert (inp.name, inp.type, inp.shape[1:]) == ("input", "tensor(float)", [3, 32, 32])
    assert (out.name, out.shape[1:]) == ("logits", [10])
    x = np.random.default_rng(0).random((3, 3, 32, 32), dtype=np.float32)
    (logits,) = session.run(None, {"input": x})
    assert logits.shape == (3, 10) and np.isfinite(logits).all()
    assert not np.allclose(logits[0], logits[1])  # different images, different answers


def test_generation_is_deterministic_and_cached(tmp_path: Path) -> None:
    first = builtin_path("resnet-small", tmp_path)
    mtime = first.stat().st_mtime_ns
    again = builtin_path("resnet-small", tmp_path)
    assert again == first and again.stat().st_mtime_ns == mtime  # not rewritten
    other = builtin_path("resnet-small", tmp_path / "elsewhere")
    assert other.read_bytes() == first.read_bytes()  # seeded weights: same bytes
    assert not list(tmp_path.glob(".*.tmp"))  # no temp files left behind


@pytest.mark.slow
def test_resnet50_has_the_resnet50_structure() -> None:
    model = build_resnet(BUILTIN_MODELS["resnet50"])
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == 1 + 3 * (3 + 4 + 6 + 3) + 4  # stem, bottlenecks, 4 projections
    assert sum(1 for n in model.graph.node if n.op_type == "Add") == 16
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    assert 25_000_000 < params < 26_000_000  # ResNet-50's 25.5 M (batch norm folded)
    inferred = onnx.shape_inference.infer_shapes(model)
    (inp,), (out,) = inferred.graph.input, inferred.graph.output
    dims = [d.dim_value or d.dim_param for d in inp.type.tensor_type.shape.dim]
    assert inp.name == "input" and dims == ["N", 3, 224, 224]
    assert out.name == "logits" and out.type.tensor_type.shape.dim[1].dim_value == 1000


def test_resnet_medium_is_resnet18_on_64x64_and_runs() -> None:
    model = build_resnet(BUILTIN_MODELS["resnet-medium"])
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == 1 + 2 * 8 + 3  # stem, two 3x3 per basic block, 3 projections
    assert sum(1 for n in model.graph.node if n.op_type == "Add") == 8
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    assert 11_600_000 < params < 11_800_000  # ResNet-18's 11.7 M (batch norm folded)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (inp,), (out,) = session.get_inputs(), session.get_outputs()
    assert (inp.name, inp.shape[1:], out.shape[1:]) == ("input", [3, 64, 64], [1000])
    x = np.random.default_rng(0).random((2, 3, 64, 64), dtype=np.float32)
    (logits,) = session.run(None, {"input": x})
    assert logits.shape == (2, 1000) and np.isfinite(logits).all()
    assert not np.allclose(logits[0], logits[1])


def test_references_are_checked_before_anything_is_built(tmp_path: Path) -> None:
    assert model_name("builtin:resnet50") == "resnet50"
    with pytest.raises(BadInput, match="unknown built-in model builtin:vgg; known: "
                                       "builtin:resnet50, builtin:resnet-medium, "
                                       "builtin:resnet-small"):
        model_name("builtin:vgg")
    with pytest.raises(BadInput, match="field '--model'.*does not exist"):
        model_name(str(tmp_path / "missing.onnx"))
    onnx_file = tmp_path / "mine.onnx"
    onnx_file.write_bytes(b"x")
    assert model_name(str(onnx_file)) == "mine"
    assert materialize(str(onnx_file), tmp_path) == onnx_file


@pytest.mark.parametrize(("kind", "needle"), [
    ("missing", "does not exist"),
    ("directory", "is a directory; give the .onnx file in it"),
    ("empty", "is empty (0 bytes), not an ONNX model"),
    ("random-bytes", "is not an ONNX model: it does not parse as one"),
    ("truncated", "is not an ONNX model: it does not parse as one"),
    ("tensor-proto", "is not an ONNX model: it does not parse as one"),
    ("no-graph", "is not an ONNX model: it parses, but has no graph"),
    ("empty-graph", "has a graph with 0 inputs and 0 outputs"),
])
def test_a_file_that_is_not_a_model_is_bad_input_naming_it(
        model_file: Callable[[str], Path], kind: str, needle: str) -> None:
    path = model_file(kind)
    with pytest.raises(BadInput) as raised:
        check_model_file(str(path))
    message = str(raised.value)
    assert message.startswith(f"field '--model': model file '{path}' ") and needle in message
    assert "\n" not in message


@pytest.mark.parametrize("kind", ["valid", "unknown-op", "bad-ir-version"])
def test_the_check_passes_what_parses_as_a_graph_and_leaves_the_rest_to_the_runtime(
        model_file: Callable[[str], Path], kind: str) -> None:
    check_model_file(str(model_file(kind)))  # not onnx.checker: no stricter than ORT
    check_model_file("builtin:resnet-small")  # generated by us: nothing to read or check


def test_materialize_says_whether_the_cache_had_the_model(tmp_path: Path) -> None:
    """The server labels its load time with this: generated now = cold, found = warm, a file
    given by path = the cache plays no part."""
    first = materialize_model("builtin:resnet-small", tmp_path)
    again = materialize_model("builtin:resnet-small", tmp_path)
    assert (first.cached, again.cached) == (False, True) and first.path == again.path
    assert materialize("builtin:resnet-small", tmp_path) == first.path
    given = materialize_model(str(first.path), tmp_path / "unused")
    assert (given.path, given.cached) == (first.path, None)
    assert not (tmp_path / "unused").exists()
