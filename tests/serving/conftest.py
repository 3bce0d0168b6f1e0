"""Shared builders for the serving tests.

``model_file(kind)`` writes one ``.onnx`` file of a named kind (good, or broken in one specific
way) under the test's tmp dir, so the pre-flight check, the ONNX Runtime backend and the CLI
can each keep their own table of ``(kind, what the error must say)``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

ModelFile = Callable[[str], Path]


def _relu_model(*, op: str = "Relu", ir_version: int = 8,
                unused_initializer: bool = False) -> onnx.ModelProto:
    extra = [helper.make_tensor("unused", TensorProto.FLOAT, [2], [1.0, 2.0])]
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        initializer=extra if unused_initializer else None)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    return model


def _contents(kind: str) -> bytes:
    """The bytes of a file of ``kind`` (every kind but ``missing`` and ``directory``)."""
    good = _relu_model().SerializeToString()
    if kind == "valid":
        return good
    if kind == "empty":
        return b""
    if kind == "random-bytes":  # what a failed download or a wrong file looks like
        return np.random.default_rng(7).integers(0, 256, 300, dtype=np.uint8).tobytes()
    if kind == "truncated":
        return good[:-7]
    if kind == "tensor-proto":  # valid protobuf, but a tensor, not a model
        return helper.make_tensor("t", TensorProto.FLOAT, [2], [1.0, 2.0]).SerializeToString()
    if kind == "no-graph":  # a ModelProto that parses but carries no graph
        return onnx.ModelProto(ir_version=8).SerializeToString()
    if kind == "empty-graph":
        model = onnx.ModelProto(ir_version=8)
        model.graph.name = "nothing"
        return model.SerializeToString()
    if kind == "unknown-op":  # parses; only ONNX Runtime knows it cannot run it
        return _relu_model(op="Frobnicate").SerializeToString()
    if kind == "bad-ir-version":
        return _relu_model(ir_version=99).SerializeToString()
    if kind == "unused-initializer":  # valid, but ONNX Runtime's own logger warns about it
        return _relu_model(unused_initializer=True).SerializeToString()
    raise ValueError(f"unknown model file kind {kind!r}")


@pytest.fixture
def model_file(tmp_path: Path) -> ModelFile:
    def make(kind: str) -> Path:
        path = tmp_path / f"{kind}.onnx"
        if kind == "directory":
            path.mkdir()
        elif kind != "missing":
            path.write_bytes(_contents(kind))
        return path

    return make
