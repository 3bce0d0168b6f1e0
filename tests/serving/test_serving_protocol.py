"""v2 request parsing and response encoding, as pure functions (plus a fuzz of the parser)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.errors import InvalidRequest
from serving.protocol import (
    InferRequest,
    ModelInfo,
    encode_infer_response,
    parse_infer_request,
    parse_timeout_ms,
)
from serving.tensors import TensorSpec

MODEL = ModelInfo(
    name="m", platform="test",
    inputs=(TensorSpec("image", "FP32", (-1, 2, 2)), TensorSpec("ids", "INT32", (-1, 3))),
    outputs=(TensorSpec("out", "FP16", (-1, 2)), TensorSpec("flag", "BOOL", (-1,))),
    max_batch_size=4,
)


def body(**overrides: Any) -> bytes:
    doc: dict[str, Any] = {"inputs": [
        {"name": "image", "shape": [1, 2, 2], "datatype": "FP32", "data": [0.5, 1, 2, 3]},
        {"name": "ids", "shape": [1, 3], "datatype": "INT32", "data": [1, 2, 3]},
    ]}
    doc.update(overrides)
    return orjson.dumps(doc)


def tensor(name: str, shape: list[int], datatype: str, data: Any) -> dict[str, Any]:
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


IDS = tensor("ids", [1, 3], "INT32", [1, 2, 3])


def test_parses_a_valid_request_into_typed_arrays() -> None:
    parsed = parse_infer_request(body(id="r1", parameters={"timeout_ms": 250}), MODEL)
    assert parsed.request_id == "r1" and parsed.timeout_s == 0.25
    assert parsed.inputs["image"].dtype == np.float32
    assert parsed.inputs["image"].shape == (1, 2, 2)
    assert parsed.inputs["ids"].dtype == np.int32
    assert parsed.requested_outputs is None


def test_header_and_parameter_timeouts_take_the_smaller() -> None:
    parsed = parse_infer_request(body(parameters={"timeout_ms": 250}), MODEL,
                                 timeout_header="100")
    assert parsed.timeout_s == pytest.approx(0.1)


@pytest.mark.parametrize(("inputs", "needle"), [
    ([tensor("image", [1, 2, 2], "FP32", [1, 2, 3, 4])], "missing input 'ids'"),
    ([tensor("image", [1, 2, 2], "FP32", [1, 2, 3, 4])] * 2 + [IDS], "more than once"),
    ([tensor("image", [2, 2, 2], "FP32", [1] * 8), IDS], "disagree on the batch dimension"),
    ([tensor("image", [0, 2, 2], "FP32", []), IDS], "batch dimension 0"),
    ([tensor("image", [1, 2], "FP32", [1, 2]), IDS], "the model expects [-1, 2, 2]"),
    ([tensor("image", [1, 2, 2], "FP32", [[1, 2], [3]]), IDS], "ragged or not numeric"),
    ([tensor("image", [1, 2, 2], "FP32", [1, 2, 3, None]), IDS], "must be numbers"),
    ([tensor("image", [1, 2, 2], "FP32", [1e300] * 4), IDS], "out of range for FP32"),
    ([tensor("image", [1, 2, 2], "FP32", [1, 2, 3, 4]),
      tensor("ids", [1, 3], "INT32", [1.5, 2, 3])], "must be integers for INT32"),
    ([tensor("image", [1, 2, 2], "FP32", [1, 2, 3, 4]),
      tensor("ids", [1, 3], "INT32", [2**40, 2, 3])], "out of range for INT32"),
    ([tensor("image", [1, 2, 2], "FP32", "1,2,3,4"), IDS], "needs 'data' as a"),
    ([tensor("image", [1, True, 2], "FP32", [1, 2, 3, 4]), IDS], "non-negative integers"),
    ([{"name": "image", "shape": [1, 2, 2], "datatype": "FP32",
       "parameters": {"binary_data_size": 16}}, IDS], "binary data extension"),
    (["image"], "inputs[0] must be an object"),
    ([tensor("image", [5, 2, 2], "FP32", [1] * 20),
      tensor("ids", [5, 3], "INT32", [1] * 15)], "exceeds the max batch size 4"),
])
def test_bad_inputs_are_named(inputs: list[Any], needle: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse_infer_request(orjson.dumps({"inputs": inputs}), MODEL)
    assert needle in raised.value.message
    assert raised.value.status == 400


@pytest.mark.parametrize(("raw", "needle"), [
    (b"[]", "must be a JSON object"),
    (b"{", "malformed JSON"),
    (body(id=5), "'id' must be a string"),
    (body(parameters=[]), "'parameters' must be an object"),
    (body(parameters={"timeout_ms": "abc"}), "must be a number of milliseconds"),
    (body(parameters={"timeout_ms": True}), "must be a number of milliseconds"),
    (body(parameters={"timeout_ms": 0}), "must be > 0 milliseconds"),
    (body(outputs={"name": "out"}), "'outputs' must be a list"),
    (body(outputs=[{"name": "nope"}]), "unknown output 'nope'"),
    (body(outputs=[3]), "outputs[0] must be an object"),
])
def test_bad_documents_are_named(raw: bytes, needle: str) -> None:
    with pytest.raises(InvalidRequest, match=None) as raised:
        parse_infer_request(raw, MODEL)
    assert needle in raised.value.message


def test_parse_timeout_ms_accepts_numeric_strings() -> None:
    assert parse_timeout_ms(" 20 ", "h") == pytest.approx(0.02)
    with pytest.raises(InvalidRequest, match="inf"):
        parse_timeout_ms("inf", "h")


def test_response_is_flat_row_major_with_datatypes_and_id() -> None:
    request = InferRequest(request_id="abc", inputs={}, requested_outputs=None, timeout_s=None)
    outputs = {"out": np.array([[1.5, 2], [3, 4]], dtype=np.float16),
               "flag": np.array([True, False])}
    doc = orjson.loads(encode_infer_response(MODEL, request, outputs))
    assert doc == {"model_name": "m", "model_version": "1", "id": "abc", "outputs": [
        {"name": "out", "datatype": "FP16", "shape": [2, 2], "data": [1.5, 2.0, 3.0, 4.0]},
        {"name": "flag", "datatype": "BOOL", "shape": [2], "data": [True, False]},
    ]}


def test_response_keeps_only_requested_outputs() -> None:
    request = InferRequest(request_id=None, inputs={}, requested_outputs=("flag",),
                           timeout_s=None)
    doc = orjson.loads(encode_infer_response(
        MODEL, request, {"out": np.zeros((1, 2), np.float16), "flag": np.array([True])}))
    assert [o["name"] for o in doc["outputs"]] == ["flag"] and "id" not in doc


@settings(max_examples=120, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda kids: st.lists(kids, max_size=6) | st.dictionaries(
        st.sampled_from(["inputs", "name", "shape", "datatype", "data", "parameters", "id",
                         "outputs", "timeout_ms", "image", "ids"]) | st.text(max_size=4),
        kids, max_size=5),
    max_leaves=40))
def test_parser_only_ever_raises_invalid_request(doc: Any) -> None:
    try:
        raw = orjson.dumps(doc)
    except (TypeError, orjson.JSONEncodeError):
        return
    try:
        parsed = parse_infer_request(raw, MODEL)
    except InvalidRequest:
        return
    assert set(parsed.inputs) == {"image", "ids"}


numbers = st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.booleans()


@settings(max_examples=100, deadline=None)
@given(shape=st.lists(st.integers(-1, 5), min_size=0, max_size=4),
       datatype=st.sampled_from(["FP32", "INT32", "FP16", "BOOL"]),
       data=st.lists(numbers, max_size=24) | st.lists(st.lists(numbers, max_size=4), max_size=6),
       ids_data=st.lists(numbers, max_size=6))
def test_nearly_valid_tensors_parse_or_are_rejected_cleanly(
        shape: list[int], datatype: str, data: Any, ids_data: Any) -> None:
    raw = json.dumps({"inputs": [tensor("image", shape, datatype, data),
                                 tensor("ids", [1, 3], "INT32", ids_data)]}).encode()
    try:
        parsed = parse_infer_request(raw, MODEL)
    except InvalidRequest as exc:
        assert exc.message
        return
    image = parsed.inputs["image"]
    assert image.dtype == np.float32 and image.shape[1:] == (2, 2)
    assert np.isfinite(image).all()
