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
    RequestPlans,
    encode_infer_response,
    parse_infer_request,
    parse_timeout_ms,
)
from serving.tensors import V2_TO_NUMPY, TensorSpec

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


@pytest.mark.parametrize(("parameters", "header", "timeout_s"), [
    ({"timeout": 250_000}, None, 0.25),              # Triton's: microseconds
    ({"timeout": 1}, None, 1e-6),
    ({"timeout": 0}, None, None),                    # Triton: 0 = no timeout of its own
    ({"timeout": 0, "timeout_ms": 40}, None, 0.04),  # ... so the others still apply
    ({"timeout": 50_000, "timeout_ms": 40}, None, 0.04),
    ({"timeout": 30_000, "timeout_ms": 40}, None, 0.03),
    ({"timeout": 30_000}, "20", 0.02),
    ({"timeout": 2**64 - 1}, None, (2**64 - 1) / 1e6),  # uint64 max: capped by the batcher
])
def test_triton_timeout_parameter_is_microseconds_and_the_smallest_deadline_wins(
        parameters: dict[str, Any], header: str | None, timeout_s: float | None) -> None:
    parsed = parse_infer_request(body(parameters=parameters), MODEL, timeout_header=header)
    assert parsed.timeout_s == (None if timeout_s is None else pytest.approx(timeout_s))


@pytest.mark.parametrize("value", ["-1", "1.5", "1000.0", "1e3", '"1000"', "true", "null",
                                   "[1]", str(2**64)])
def test_a_triton_timeout_that_is_not_whole_microseconds_is_refused(value: str) -> None:
    """Triton's HTTP server reads it as an unsigned 64-bit integer and refuses anything else;
    so do we, rather than guess at units (a float is usually someone thinking in seconds)."""
    raw = body().replace(b'{"inputs"', b'{"parameters":{"timeout":' + value.encode() + b'},'
                         b'"inputs"', 1)
    with pytest.raises(InvalidRequest) as raised:
        parse_infer_request(raw, MODEL)
    assert raised.value.status == 400
    assert raised.value.message.startswith("parameters.timeout must be a whole number of "
                                           "microseconds (0 = the server's default")
    assert "timeout_ms" in raised.value.message


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
       "parameters": {"binary_data_size": 16}}, IDS],
     "has binary_data_size but the request has no Inference-Header-Content-Length header"),
    ([{**IDS, "parameters": {"shared_memory_region": "r"}}], "shared-memory extension"),
    ([{**IDS, "parameters": 5}], "input 'ids' parameters must be an object"),
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
    encoded = encode_infer_response(MODEL, request, outputs)
    assert encoded.header_length is None
    doc = orjson.loads(encoded.body)
    assert doc == {"model_name": "m", "model_version": "1", "id": "abc", "outputs": [
        {"name": "out", "datatype": "FP16", "shape": [2, 2], "data": [1.5, 2.0, 3.0, 4.0]},
        {"name": "flag", "datatype": "BOOL", "shape": [2], "data": [True, False]},
    ]}


def test_response_keeps_only_requested_outputs() -> None:
    request = InferRequest(request_id=None, inputs={}, requested_outputs=("flag",),
                           timeout_s=None)
    doc = orjson.loads(encode_infer_response(
        MODEL, request, {"out": np.zeros((1, 2), np.float16), "flag": np.array([True])}).body)
    assert [o["name"] for o in doc["outputs"]] == ["flag"] and "id" not in doc


# -- binary tensor data extension -------------------------------------------------------------

IMAGE = np.array([[[0.5, -1.0], [3.25, 1e-3]]], dtype=np.float32)
IDS_ARRAY = np.array([[7, -8, 2**31 - 1]], dtype=np.int32)


def binary_input(name: str, array: np.ndarray[Any, Any], datatype: str,
                 size: object = None) -> dict[str, Any]:
    return {"name": name, "shape": list(array.shape), "datatype": datatype,
            "parameters": {"binary_data_size": array.nbytes if size is None else size}}


def framed(doc: dict[str, Any], *chunks: bytes) -> tuple[bytes, str]:
    """(body, Inference-Header-Content-Length) for a JSON header followed by ``chunks``."""
    header = orjson.dumps(doc)
    return header + b"".join(chunks), str(len(header))


def test_binary_inputs_decode_straight_into_numpy() -> None:
    raw, length = framed({"inputs": [binary_input("image", IMAGE, "FP32"),
                                     binary_input("ids", IDS_ARRAY, "INT32")]},
                         IMAGE.astype("<f4").tobytes(), IDS_ARRAY.astype("<i4").tobytes())
    parsed = parse_infer_request(raw, MODEL, header_length=length)
    assert parsed.inputs["image"].dtype == np.float32 and parsed.inputs["ids"].dtype == np.int32
    assert np.array_equal(parsed.inputs["image"], IMAGE)
    assert np.array_equal(parsed.inputs["ids"], IDS_ARRAY)
    assert parsed.binary_outputs == frozenset()


def test_binary_and_json_inputs_mix_in_one_request() -> None:
    raw, length = framed({"inputs": [IDS, binary_input("image", IMAGE, "FP32")]},
                         IMAGE.tobytes())
    parsed = parse_infer_request(raw, MODEL, header_length=length)
    assert np.array_equal(parsed.inputs["image"], IMAGE)
    assert parsed.inputs["ids"].tolist() == [[1, 2, 3]]


def test_header_length_equal_to_the_body_means_all_json() -> None:
    raw = body()
    parsed = parse_infer_request(raw, MODEL, header_length=f" {len(raw)} ")
    assert parsed.inputs["ids"].tolist() == [[1, 2, 3]]


def test_unaligned_binary_data_is_copied_to_an_aligned_array() -> None:
    doc: dict[str, Any] = {"inputs": [binary_input("image", IMAGE, "FP32"), IDS]}
    for pad in range(4):  # the JSON header's length decides the alignment of what follows
        doc["id"] = "x" * pad
        raw, length = framed(doc, IMAGE.tobytes())
        image = parse_infer_request(raw, MODEL, header_length=length).inputs["image"]
        assert image.flags.aligned and np.array_equal(image, IMAGE)


BOOL_MODEL = ModelInfo(name="b", platform="test", inputs=(TensorSpec("mask", "BOOL", (-1, 3)),),
                       outputs=(TensorSpec("n", "INT64", (-1,)),), max_batch_size=4)


def test_binary_bool_is_one_byte_per_element_zero_or_one() -> None:
    raw, length = framed({"inputs": [{"name": "mask", "shape": [1, 3], "datatype": "BOOL",
                                      "parameters": {"binary_data_size": 3}}]}, b"\x01\x00\x01")
    assert parse_infer_request(raw, BOOL_MODEL, header_length=length).inputs[
        "mask"].tolist() == [[True, False, True]]
    with pytest.raises(InvalidRequest, match="each byte must be 0 or 1"):
        parse_infer_request(raw[:-1] + b"\x02", BOOL_MODEL, header_length=length)


def test_a_planned_binary_request_is_parsed_exactly_like_a_fresh_one() -> None:
    """RequestPlans skips the JSON header's parse and checks on a repeat; the tensors are
    still read from each body and still checked, so the answer never differs."""
    plans = RequestPlans()
    doc = {"inputs": [binary_input("image", IMAGE, "FP32"), binary_input("ids", IDS_ARRAY,
                                                                           "INT32")],
           "parameters": {"timeout_ms": 250, "binary_data_output": True}}
    first, length = framed(doc, IMAGE.astype("<f4").tobytes(), IDS_ARRAY.astype("<i4").tobytes())
    parse_infer_request(first, MODEL, header_length=length, plans=plans)
    assert len(plans) == 1
    other = (IMAGE + 1).astype("<f4").tobytes() + (IDS_ARRAY * 2).astype("<i4").tobytes()
    repeat = first[:int(length)] + other
    planned = parse_infer_request(repeat, MODEL, header_length=length, plans=plans)
    fresh = parse_infer_request(repeat, MODEL, header_length=length)
    assert len(plans) == 1  # the repeat used the plan
    assert planned.timeout_s == fresh.timeout_s == 0.25
    assert planned.binary_outputs == fresh.binary_outputs == frozenset({"out", "flag"})
    for name in ("image", "ids"):
        assert planned.inputs[name].dtype == fresh.inputs[name].dtype
        assert np.array_equal(planned.inputs[name], fresh.inputs[name])
    assert np.array_equal(planned.inputs["image"], IMAGE + 1)
    nan = (np.full_like(IMAGE, np.nan).astype("<f4").tobytes()
           + IDS_ARRAY.astype("<i4").tobytes())
    with pytest.raises(InvalidRequest, match="input 'image' has NaN at element 0"):
        parse_infer_request(first[:int(length)] + nan, MODEL, header_length=length,
                            plans=plans)
    with pytest.raises(InvalidRequest, match="bytes of binary data follow"):  # other size
        parse_infer_request(repeat + b"\0" * 4, MODEL, header_length=length, plans=plans)
    with pytest.raises(InvalidRequest, match="header Timeout-Ms"):  # another header
        parse_infer_request(repeat, MODEL, header_length=length, plans=plans,
                            timeout_header="soon")


def test_a_planned_bool_input_still_checks_its_bytes() -> None:
    plans = RequestPlans()
    raw, length = framed({"inputs": [{"name": "mask", "shape": [1, 3], "datatype": "BOOL",
                                      "parameters": {"binary_data_size": 3}}]}, b"\x01\x00\x01")
    parse_infer_request(raw, BOOL_MODEL, header_length=length, plans=plans)
    with pytest.raises(InvalidRequest, match="each byte must be 0 or 1"):
        parse_infer_request(raw[:-1] + b"\x02", BOOL_MODEL, header_length=length, plans=plans)


def test_requests_with_json_data_are_not_planned() -> None:
    plans = RequestPlans()
    raw, length = framed({"inputs": [IDS, binary_input("image", IMAGE, "FP32")]},
                         IMAGE.tobytes())
    parse_infer_request(raw, MODEL, header_length=length, plans=plans)
    assert len(plans) == 0


# -- NaN and Inf: one rule for JSON and binary tensors ----------------------------------------

def vector_model(datatype: str, *, allow_non_finite: bool = False) -> ModelInfo:
    spec = TensorSpec("v", datatype, (-1, 3), allow_non_finite=allow_non_finite)
    return ModelInfo(name="v", platform="test", inputs=(spec,),
                     outputs=(TensorSpec("o", "FP32", (-1,)),), max_batch_size=4)


def binary_vector(values: list[list[float]], datatype: str) -> tuple[bytes, str]:
    array = np.array(values, dtype=V2_TO_NUMPY[datatype]).astype(
        V2_TO_NUMPY[datatype].newbyteorder("<"))
    return framed({"inputs": [binary_input("v", array, datatype)]}, array.tobytes())


NON_FINITE = [
    ("FP32", [[1, 2, 3], [4, float("nan"), 6]], "input 'v' has NaN at element 4 (index [1, 1])"),
    ("FP32", [[float("inf"), 2, float("nan")]], "input 'v' has +Inf at element 0 (index [0, 0])"),
    ("FP16", [[1, 2, float("-inf")]], "input 'v' has -Inf at element 2 (index [0, 2])"),
    ("FP64", [[0, float("nan"), 0]], "input 'v' has NaN at element 1 (index [0, 1])"),
]


@pytest.mark.parametrize(("datatype", "values", "needle"), NON_FINITE)
def test_binary_nan_and_inf_are_rejected_naming_the_input_and_first_element(
        datatype: str, values: list[list[float]], needle: str) -> None:
    raw, length = binary_vector(values, datatype)
    with pytest.raises(InvalidRequest) as raised:
        parse_infer_request(raw, vector_model(datatype), header_length=length)
    assert needle in raised.value.message and raised.value.status == 400
    assert f"this {datatype} input accepts only finite values" in raised.value.message


@pytest.mark.parametrize(("datatype", "values", "needle"), NON_FINITE)
def test_json_nan_and_inf_are_rejected_too_with_the_reason(
        datatype: str, values: list[list[float]], needle: str) -> None:
    del needle  # JSON has no NaN: the body is not JSON, and the message says so
    doc = {"inputs": [tensor("v", [len(values), 3], datatype, values)]}
    raw = json.dumps(doc).encode()  # Python writes NaN/Infinity, which JSON does not allow
    with pytest.raises(InvalidRequest) as raised:
        parse_infer_request(raw, vector_model(datatype, allow_non_finite=True))
    assert raised.value.message.startswith("malformed JSON: ")
    assert "NaN and Infinity are not JSON numbers" in raised.value.message


@pytest.mark.parametrize(("datatype", "values", "needle"), NON_FINITE)
def test_an_input_that_allows_non_finite_values_gets_them_as_sent(
        datatype: str, values: list[list[float]], needle: str) -> None:
    raw, length = binary_vector(values, datatype)
    parsed = parse_infer_request(raw, vector_model(datatype, allow_non_finite=True),
                                 header_length=length)
    expected = np.array(values, dtype=V2_TO_NUMPY[datatype])
    np.testing.assert_array_equal(parsed.inputs["v"], expected)  # NaN == NaN here


@pytest.mark.parametrize("allow_non_finite", [False, True])
def test_a_json_number_too_large_for_the_datatype_is_out_of_range_even_where_inf_is_allowed(
        allow_non_finite: bool) -> None:
    raw = orjson.dumps({"inputs": [tensor("v", [1, 3], "FP16", [1, 70000, 3])]})
    with pytest.raises(InvalidRequest) as raised:
        parse_infer_request(raw, vector_model("FP16", allow_non_finite=allow_non_finite))
    assert raised.value.message == ("input 'v' value 70000 at element 1 is out of range for "
                                    "FP16 (largest 65504)")


def test_finite_and_integer_binary_inputs_are_untouched_by_the_rule() -> None:
    raw, length = binary_vector([[1, -2, 3.5]], "FP32")
    assert parse_infer_request(raw, vector_model("FP32"), header_length=length).inputs[
        "v"].tolist() == [[1, -2, 3.5]]
    raw, length = binary_vector([[1, -2, 3]], "INT32")
    assert parse_infer_request(raw, vector_model("INT32"), header_length=length).inputs[
        "v"].tolist() == [[1, -2, 3]]


def test_orjson_still_refuses_every_non_finite_json_number() -> None:
    """The JSON path relies on this: were it to change, NaN would need the binary rule."""
    for literal in (b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400"):
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(literal)


@pytest.mark.parametrize(("inputs", "chunks", "needle"), [
    ([binary_input("image", IMAGE, "FP32", size=15), IDS], [IMAGE.tobytes()[:15]],
     "input 'image' has binary_data_size 15; shape [1, 2, 2] FP32 is 16 bytes"),
    ([binary_input("image", IMAGE, "FP32", size=-16), IDS], [],
     "binary_data_size -16"),
    ([binary_input("image", IMAGE, "FP32", size="16"), IDS], [IMAGE.tobytes()],
     "binary_data_size '16'"),
    ([binary_input("image", IMAGE, "FP32", size=True), IDS], [IMAGE.tobytes()],
     "binary_data_size True"),
    ([binary_input("image", IMAGE, "FP32"), IDS], [IMAGE.tobytes()[:10]],
     "input 'image' needs binary bytes 0..16 but the body has 10 bytes after its"),
    ([binary_input("image", IMAGE, "FP32"), IDS], [IMAGE.tobytes(), b"\0\0\0"],
     "3 bytes of binary data follow the inputs' binary_data_size total of 16"),
    ([tensor("image", [1, 2, 2], "FP32", [1, 2, 3, 4]), IDS], [b"junk"],
     "4 bytes of binary data follow the inputs' binary_data_size total of 0"),
    ([{**binary_input("image", IMAGE, "FP32"), "data": [1, 2, 3, 4]}, IDS], [IMAGE.tobytes()],
     "has both 'data' and binary_data_size"),
    ([binary_input("image", IMAGE, "FP32"), binary_input("ids", IDS_ARRAY, "INT32")],
     [IMAGE.tobytes(), IDS_ARRAY.tobytes()[:-1]],
     "input 'ids' needs binary bytes 16..28 but the body has 27 bytes"),
    ([binary_input("image", IMAGE, "FP64"), IDS], [IMAGE.tobytes()],
     "datatype 'FP64'; the model expects FP32"),
    ([{**binary_input("image", IMAGE, "FP32"), "shape": [1, 2, 3]}, IDS], [IMAGE.tobytes()],
     "has shape [1, 2, 3]; the model expects [-1, 2, 2]"),
])
def test_bad_binary_sizes_are_named(inputs: list[Any], chunks: list[bytes], needle: str) -> None:
    raw, length = framed({"inputs": inputs}, *chunks)
    with pytest.raises(InvalidRequest) as raised:
        parse_infer_request(raw, MODEL, header_length=length)
    assert needle in raised.value.message and raised.value.status == 400


@pytest.mark.parametrize("length", ["-1", "abc", "", "1e3", "0x10", "+5", "٣", "9" * 30, "10000"])
def test_bad_header_lengths_are_named(length: str) -> None:
    with pytest.raises(InvalidRequest, match="Inference-Header-Content-Length must be the size "
                                             "in bytes of the JSON part of the body"):
        parse_infer_request(body(), MODEL, header_length=length)


@settings(max_examples=150, deadline=None)
@given(length=st.integers(-5, 400).map(str) | st.text(max_size=12),
       tail=st.binary(max_size=40))
def test_fuzzed_header_length_parses_or_is_rejected_cleanly(length: str, tail: bytes) -> None:
    raw, _ = framed({"inputs": [binary_input("image", IMAGE, "FP32"), IDS]}, IMAGE.tobytes())
    try:
        parsed = parse_infer_request(raw + tail, MODEL, header_length=length)
    except InvalidRequest as exc:
        assert exc.message
        return
    assert not tail and np.array_equal(parsed.inputs["image"], IMAGE)


@pytest.mark.parametrize(("parameters", "outputs", "binary"), [
    ({}, None, set()),
    ({"binary_data_output": True}, None, {"out", "flag"}),
    ({"binary_data_output": True}, [{"name": "out", "parameters": {"binary_data": False}},
                                    {"name": "flag"}], {"flag"}),
    ({}, [{"name": "out", "parameters": {"binary_data": True}}, {"name": "flag"}], {"out"}),
])
def test_binary_outputs_per_output_or_for_the_request(parameters: dict[str, Any],
                                                      outputs: Any, binary: set[str]) -> None:
    extra: dict[str, Any] = {"parameters": parameters}
    if outputs is not None:
        extra["outputs"] = outputs
    assert parse_infer_request(body(**extra), MODEL).binary_outputs == binary


@pytest.mark.parametrize(("extra", "needle"), [
    ({"parameters": {"binary_data_output": 1}}, "binary_data_output must be true or false"),
    ({"outputs": [{"name": "out", "parameters": {"binary_data": "yes"}}]},
     "binary_data must be true or false"),
    ({"outputs": [{"name": "out", "parameters": []}]}, "parameters must be an object"),
    ({"outputs": [{"name": "out", "parameters": {"classification": 3}}]},
     "classification, which this server does not support"),
])
def test_bad_output_parameters_are_named(extra: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidRequest, match=needle):
        parse_infer_request(body(**extra), MODEL)


def test_binary_response_has_json_header_then_raw_bytes_in_output_order() -> None:
    request = InferRequest(request_id=None, inputs={}, requested_outputs=None, timeout_s=None,
                           binary_outputs=frozenset({"out", "flag"}))
    out = np.array([[1.5, 2], [3, -4]], dtype=np.float16)
    flag = np.array([True, False])
    encoded = encode_infer_response(MODEL, request, {"out": out, "flag": flag})
    assert encoded.header_length is not None
    doc = orjson.loads(encoded.body[:encoded.header_length])
    assert doc["outputs"] == [
        {"name": "out", "datatype": "FP16", "shape": [2, 2],
         "parameters": {"binary_data_size": 8}},
        {"name": "flag", "datatype": "BOOL", "shape": [2], "parameters": {"binary_data_size": 2}},
    ]
    assert encoded.body[encoded.header_length:] == out.astype("<f2").tobytes() + b"\x01\x00"


def test_binary_and_json_outputs_mix_in_one_response() -> None:
    request = InferRequest(request_id="r", inputs={}, requested_outputs=("flag", "out"),
                           timeout_s=None, binary_outputs=frozenset({"out"}))
    out = np.arange(4, dtype=np.float16).reshape(2, 2)[:, ::-1]  # not contiguous
    encoded = encode_infer_response(MODEL, request, {"out": out, "flag": np.array([True])})
    assert encoded.header_length is not None
    doc = orjson.loads(encoded.body[:encoded.header_length])
    assert doc["outputs"][0] == {"name": "flag", "datatype": "BOOL", "shape": [1],
                                 "data": [True]}
    assert encoded.body[encoded.header_length:] == np.ascontiguousarray(out).tobytes()


@settings(max_examples=120, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda kids: st.lists(kids, max_size=6) | st.dictionaries(
        st.sampled_from(["inputs", "name", "shape", "datatype", "data", "parameters", "id",
                         "outputs", "timeout_ms", "timeout", "image", "ids"])
        | st.text(max_size=4),
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
