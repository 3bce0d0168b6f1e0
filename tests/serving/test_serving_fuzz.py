"""Fuzzing ``POST /v2/models/{name}/infer``: whatever the body, the parser returns a request
that satisfies the model or raises :class:`InvalidRequest`, and the HTTP app answers 400 with
``{"error": ...}``, never 500.

Bodies are near-valid on purpose, so the fuzz reaches the deep checks instead of stopping at
"missing input": JSON with random shapes, datatypes and values (NaN, Infinity, numbers past any
datatype, nested junk), and binary tensor data with wrong ``binary_data_size`` values, wrong or
enormous ``Inference-Header-Content-Length`` values, truncated or padded bodies, and NaN/Inf in
the raw bytes. Each example has a deadline (a slow path is a bug: the parser runs on the event
loop), and a size claimed far beyond the body must be refused before anything is allocated.
"""

from __future__ import annotations

import json
import math
import tracemalloc
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

import numpy as np
import orjson
import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.backends.base import Array
from serving.config import BatcherConfig
from serving.errors import InvalidRequest
from serving.protocol import HEADER_LENGTH, InferRequest, ModelInfo, parse_infer_request
from serving.tensors import TensorSpec
from serving.testing import ThreadedServer

DEADLINE = timedelta(milliseconds=500)
TEN_GB = 10 * 2**30
# What parsing a few-KB body may allocate at most, whatever sizes it claims.
PARSE_MEMORY_LIMIT_BYTES = 1 << 20

MODEL = ModelInfo(
    name="fuzz", platform="fuzz",
    inputs=(TensorSpec("image", "FP32", (-1, 2, 2)),
            TensorSpec("ids", "INT64", (-1, 3)),
            TensorSpec("flags", "BOOL", (-1, 2)),
            TensorSpec("mask", "FP16", (-1, -1), allow_non_finite=True)),
    outputs=(TensorSpec("score", "FP32", (-1, 1)),),
    max_batch_size=4,
)
SPECS = {spec.name: spec for spec in MODEL.inputs}
DATATYPES = ["BOOL", "UINT8", "INT8", "INT32", "INT64", "UINT64", "FP16", "FP32", "FP64",
             "BYTES"]

# -- strategies ----------------------------------------------------------------------------

# Numbers JSON can and cannot carry: json.dumps writes NaN/Infinity tokens and any integer.
json_numbers = (st.floats() | st.integers(-(10**400), 10**400) | st.integers(-5, 5)
                | st.sampled_from([1e308, -1e308, 3.5e38, 65520.0, 2**63, 2**64, -(2**63) - 1])
                | st.booleans())
junk = st.recursive(
    st.none() | st.booleans() | st.text(max_size=6) | json_numbers,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10)


def faults(kinds: list[str]) -> st.SearchStrategy[frozenset[str]]:
    """At most two named faults per example; none (a valid request) shrinks first. One or two
    at a time reach the deep checks, where a pile of faults would stop at the first one."""
    return st.lists(st.sampled_from(kinds), max_size=2, unique=True).map(frozenset)


def _fitting(spec: TensorSpec) -> st.SearchStrategy[Any]:
    """Values of ``spec``'s datatype, finite (what JSON can carry)."""
    dtype = spec.dtype
    if dtype.kind == "f":
        return st.floats(width=16 if dtype.itemsize == 2 else 32, allow_nan=False,
                         allow_infinity=False)
    if dtype.kind == "b":
        return st.booleans()
    info = np.iinfo(dtype)
    return st.integers(int(info.min), int(info.max))


def _dims(draw: st.DrawFn, spec: TensorSpec, rows: int) -> list[int]:
    return [rows, *(d if d > 0 else draw(st.integers(1, 3)) for d in spec.shape[1:])]


def _values(draw: st.DrawFn, spec: TensorSpec, dims: list[int]) -> list[Any]:
    count = math.prod(dims)
    values: list[Any] = draw(st.lists(_fitting(spec), min_size=count, max_size=count))
    return values


JSON_FAULTS = ["name", "shape", "datatype", "value", "data", "parameters", "drop-key", "rows",
               "missing", "duplicate", "inputs", "document", "timeout", "outputs", "id",
               "truncate", "splice"]


@st.composite
def json_bodies(draw: st.DrawFn) -> bytes:
    """A v2 request as Python's json module writes it (so NaN, Infinity and 400-digit
    integers are possible), with up to two faults, each in one place."""
    broken = draw(faults(JSON_FAULTS))
    rows = draw(st.integers(0, 6)) if "rows" in broken else draw(
        st.integers(1, MODEL.max_batch_size))
    victim = draw(st.sampled_from([spec.name for spec in MODEL.inputs]))
    tensors: list[dict[str, Any]] = []
    for spec in MODEL.inputs:
        dims = _dims(draw, spec, rows)
        flat = _values(draw, spec, dims)
        hit = spec.name == victim
        if hit and "value" in broken and flat:  # a number JSON allows but the type may not
            flat[draw(st.integers(0, len(flat) - 1))] = draw(json_numbers)
        data: Any = flat
        if flat and draw(st.booleans()):
            data = np.array(flat, dtype=object).reshape(dims).tolist()  # nested, row-major
        tensor: dict[str, Any] = {"name": spec.name, "shape": dims, "datatype": spec.datatype,
                                  "data": data}
        if hit and "name" in broken:
            tensor["name"] = draw(st.text(max_size=4) | junk)
        if hit and "shape" in broken:
            tensor["shape"] = draw(st.lists(st.integers(-2, 6), max_size=4) | junk)
        if hit and "datatype" in broken:
            tensor["datatype"] = draw(st.sampled_from(DATATYPES) | junk)
        if hit and "data" in broken:
            tensor["data"] = draw(st.lists(json_numbers, max_size=6) | junk)
        if hit and "parameters" in broken:
            tensor["parameters"] = draw(junk | st.fixed_dictionaries(
                {"binary_data_size": json_numbers}))
        if hit and "drop-key" in broken:
            del tensor[draw(st.sampled_from(sorted(tensor)))]
        tensors.append(tensor)
    tensors = draw(st.permutations(tensors))
    if "missing" in broken:
        tensors = tensors[1:]
    if "duplicate" in broken:
        tensors = [*tensors, tensors[0]]
    doc: Any = {"inputs": draw(junk) if "inputs" in broken else tensors}
    if "timeout" in broken:
        doc["parameters"] = {"timeout_ms": draw(junk)}
    if "outputs" in broken:
        doc["outputs"] = draw(junk | st.lists(st.fixed_dictionaries(
            {"name": st.sampled_from(["score", "nope"])}, optional={"parameters": junk}),
            max_size=2))
    if "id" in broken:
        doc["id"] = draw(junk)
    if "document" in broken:
        doc = draw(junk)
    raw = json.dumps(doc).encode()
    if "truncate" in broken:
        raw = raw[:draw(st.integers(0, len(raw)))]
    if "splice" in broken:
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=3)) + raw[at:]
    return raw


BINARY_FAULTS = ["non-finite", "bool-byte", "size-off", "size-huge", "size-junk", "as-json",
                 "truncate", "pad", "length-off", "length-huge", "length-junk", "output-flag"]


@st.composite
def binary_requests(draw: st.DrawFn) -> tuple[bytes, str]:
    """(body, Inference-Header-Content-Length) for the binary tensor data extension, with up
    to two faults: NaN/Inf in the raw floats, a BOOL byte > 1, wrong ``binary_data_size``
    values, a tensor sent as JSON among binary ones, bytes cut off or left over, and wrong,
    enormous or unreadable header lengths."""
    broken = draw(faults(BINARY_FAULTS))
    rows = draw(st.integers(1, MODEL.max_batch_size))
    victim = draw(st.sampled_from([spec.name for spec in MODEL.inputs]))
    float_victim = draw(st.sampled_from(["image", "mask"]))  # mask allows NaN, image not
    tensors: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for spec in draw(st.permutations(MODEL.inputs)):
        hit = spec.name == victim
        dims = _dims(draw, spec, rows)
        values = _values(draw, spec, dims)
        if spec.name == float_victim and "non-finite" in broken:
            values[draw(st.integers(0, len(values) - 1))] = draw(
                st.sampled_from([math.nan, math.inf, -math.inf]))
        array = np.array(values, dtype=spec.dtype).reshape(dims)
        tensor: dict[str, Any] = {"name": spec.name, "shape": dims, "datatype": spec.datatype}
        if hit and "as-json" in broken:  # json.dumps writes NaN for NaN: not JSON
            tensor["data"] = array.tolist()
            tensors.append(tensor)
            continue
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        if "bool-byte" in broken and spec.dtype.kind == "b":
            raw = raw[:-1] + b"\x02"  # neither 0 nor 1
        size: Any = len(raw)
        if hit and "size-off" in broken:
            size = draw(st.integers(-3, len(raw) + 8))
        if hit and "size-huge" in broken:
            size = draw(st.sampled_from([TEN_GB, 2**63]))
        if hit and "size-junk" in broken:
            size = draw(junk)
        tensor["parameters"] = {"binary_data_size": size}
        tensors.append(tensor)
        chunks.append(raw)
    doc: dict[str, Any] = {"inputs": tensors}
    if "output-flag" in broken:
        doc["parameters"] = {"binary_data_output": draw(junk)}
    elif draw(st.booleans()):
        doc["parameters"] = {"binary_data_output": draw(st.booleans())}
    header = json.dumps(doc).encode()
    body = header + b"".join(chunks)
    if "truncate" in broken:  # mostly inside the binary part, sometimes into the header
        body = body[:draw(st.integers(len(header), len(body)) | st.integers(0, len(body)))]
    if "pad" in broken:
        body += draw(st.binary(min_size=1, max_size=9))
    length = str(len(header))
    if "length-off" in broken:
        length = str(len(header) + draw(st.integers(-8, 8)))
    if "length-huge" in broken:
        length = draw(st.sampled_from([str(TEN_GB), str(2**63), "9" * 30]))
    if "length-junk" in broken:
        length = draw(st.sampled_from([" 12 ", "0x10", "1e3", "", "-0", "+4"])
                      | st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126),
                                max_size=6))
    return body, length


# -- the property ---------------------------------------------------------------------------

def parse_or_reject(body: bytes, header_length: str | None) -> InferRequest | InvalidRequest:
    """The parser's answer; anything but InvalidRequest propagates and fails the test."""
    try:
        return parse_infer_request(body, MODEL, header_length=header_length)
    except InvalidRequest as exc:
        return exc


def assert_satisfies_the_model(parsed: InferRequest) -> None:
    """What a request that parsed guarantees to the batcher and the backend."""
    assert set(parsed.inputs) == set(SPECS)
    rows = {array.shape[0] for array in parsed.inputs.values()}
    assert len(rows) == 1 and 1 <= rows.pop() <= MODEL.max_batch_size
    for name, array in parsed.inputs.items():
        spec = SPECS[name]
        assert array.dtype == spec.dtype and array.ndim == len(spec.shape)
        assert all(want in (-1, got) for got, want in zip(array.shape, spec.shape, strict=True))
        if spec.dtype.kind == "f" and not spec.allow_non_finite:
            assert np.isfinite(array).all(), name


def check(body: bytes, header_length: str | None) -> None:
    answer = parse_or_reject(body, header_length)
    if isinstance(answer, InvalidRequest):
        assert answer.message and answer.status == 400
    else:
        assert_satisfies_the_model(answer)


@settings(max_examples=300, deadline=DEADLINE)
@given(body=json_bodies())
def test_fuzzed_json_bodies_parse_into_a_valid_request_or_raise_invalid_request(
        body: bytes) -> None:
    check(body, None)


@settings(max_examples=300, deadline=DEADLINE)
@given(request=binary_requests())
def test_fuzzed_binary_bodies_parse_into_a_valid_request_or_raise_invalid_request(
        request: tuple[bytes, str]) -> None:
    check(*request)


def test_non_finite_values_only_reach_the_input_that_allows_them() -> None:
    """The rule the property above checks, shown once: NaN in ``mask`` passes, in ``image``
    it is a 400 naming the input and the element."""
    ids, flags = np.zeros((1, 3), np.int64), np.zeros((1, 2), np.bool_)

    def request(image: Array, mask: Array) -> tuple[bytes, str]:
        arrays = {"image": image, "ids": ids, "flags": flags, "mask": mask}
        header = orjson.dumps({"inputs": [
            {"name": n, "shape": list(a.shape), "datatype": SPECS[n].datatype,
             "parameters": {"binary_data_size": a.nbytes}} for n, a in arrays.items()]})
        return header + b"".join(a.tobytes() for a in arrays.values()), str(len(header))

    finite_image = np.ones((1, 2, 2), np.float32)
    nan_mask = np.array([[np.nan, np.inf]], np.float16)
    parsed = parse_or_reject(*request(finite_image, nan_mask))
    assert isinstance(parsed, InferRequest)
    assert np.isnan(parsed.inputs["mask"][0, 0]) and np.isinf(parsed.inputs["mask"][0, 1])
    nan_image = finite_image.copy()
    nan_image[0, 1, 0] = np.nan
    rejected = parse_or_reject(*request(nan_image, nan_mask))
    assert isinstance(rejected, InvalidRequest)
    assert "input 'image' has NaN at element 2 (index [0, 1, 0])" in rejected.message


# -- sizes claimed beyond the body ----------------------------------------------------------

def claimed(where: str, claim: int) -> tuple[bytes, str | None]:
    """A small request that claims ``claim`` bytes (or elements) in one place."""
    image = np.ones((1, 2, 2), np.float32)
    tensors: list[dict[str, Any]] = [
        {"name": "ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]},
        {"name": "flags", "shape": [1, 2], "datatype": "BOOL", "data": [True, False]},
        {"name": "mask", "shape": [1, 2], "datatype": "FP16", "data": [0.5, 1]},
        {"name": "image", "shape": [1, 2, 2], "datatype": "FP32",
         "parameters": {"binary_data_size": image.nbytes}},
    ]
    if where == "mask-elements-binary":  # a dynamic dim sized to match a huge data size
        elements = max(1, claim // 2)
        tensors[2] = {"name": "mask", "shape": [1, elements], "datatype": "FP16",
                      "parameters": {"binary_data_size": elements * 2}}
    elif where == "batch-rows-binary":
        tensors[3]["shape"] = [claim, 2, 2]
        tensors[3]["parameters"] = {"binary_data_size": claim * 16}
    elif where == "mask-elements-json":
        tensors[2]["shape"] = [1, claim]
    header = json.dumps({"inputs": tensors}).encode()  # orjson writes no ints past 64 bits
    length = str(claim) if where == "header-length" else str(len(header))
    return header + image.tobytes(), length


CLAIMS = ["header-length", "mask-elements-binary", "batch-rows-binary", "mask-elements-json"]


def refused_within_memory(body: bytes, header_length: str | None) -> tuple[str, int]:
    """(the InvalidRequest message, peak bytes traced while parsing)."""
    tracemalloc.start()
    try:
        with pytest.raises(InvalidRequest) as raised:
            parse_infer_request(body, MODEL, header_length=header_length)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return raised.value.message, peak


@pytest.mark.parametrize(("where", "needle"), [
    ("header-length", "Inference-Header-Content-Length must be the size in bytes"),
    ("mask-elements-binary", "input 'mask' needs binary bytes 0..10737418240 but the body "
                             "has 16 bytes"),
    ("batch-rows-binary", "input 'image' needs binary bytes 0..171798691840"),
    ("mask-elements-json", "input 'mask' has 2 values; shape [1, 10737418240] needs"),
])
def test_a_ten_gb_claim_is_refused_before_allocating(where: str, needle: str) -> None:
    message, peak = refused_within_memory(*claimed(where, TEN_GB))
    assert needle in message
    assert peak < PARSE_MEMORY_LIMIT_BYTES


@settings(max_examples=80, deadline=DEADLINE)
@given(where=st.sampled_from(CLAIMS), claim=st.integers(2**31, 2**62))
def test_any_huge_claim_is_refused_quickly_and_within_bounded_memory(where: str,
                                                                     claim: int) -> None:
    message, peak = refused_within_memory(*claimed(where, claim))
    assert message and peak < PARSE_MEMORY_LIMIT_BYTES


# -- the same bodies through the HTTP app ---------------------------------------------------

class ScoreBackend:
    """A backend for MODEL: ``score`` is the sum of each row of ``image``."""

    kind = "fuzz"
    inputs = MODEL.inputs
    outputs = MODEL.outputs
    static_batch_size: int | None = None
    max_batch_size: int | None = None

    def infer(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        image = inputs["image"]
        return {"score": image.reshape(len(image), -1).sum(axis=1, keepdims=True)}

    def close(self) -> None:
        pass


class InProcessApp:
    """The real front end, a real batcher and :class:`ScoreBackend` on 127.0.0.1 (a
    :class:`ThreadedServer`), driven over one keep-alive connection."""

    def __init__(self) -> None:
        config = BatcherConfig(max_batch_size=MODEL.max_batch_size, max_queue_delay_s=0.0,
                               default_timeout_s=5.0)
        self.server = ThreadedServer(ScoreBackend(), config, model_name=MODEL.name)
        self.state = self.server.state
        self.session = requests.Session()

    def post(self, body: bytes, header_length: str | None) -> tuple[int, Any]:
        headers = {} if header_length is None else {HEADER_LENGTH: header_length}
        response = self.session.post(f"{self.server.url}/v2/models/{MODEL.name}/infer",
                                     data=body, headers=headers, timeout=10)
        kind = response.headers.get("Content-Type", "")
        return response.status_code, (orjson.loads(response.content)
                                      if kind.startswith("application/json")
                                      else response.content)


@pytest.fixture(scope="module")
def app() -> Iterator[InProcessApp]:
    running = InProcessApp()
    with running.server, running.session:
        yield running


def assert_http_answer(app: InProcessApp, body: bytes, header_length: str | None) -> None:
    """The parser is the oracle: its InvalidRequest must come back as that 400, word for word;
    a request it accepts is answered (200, or 504 if its own timeout_ms ran out).

    Whitespace around a header value is not part of the value over HTTP (RFC 9110's OWS: the
    parser strips it, and clients refuse to send it), so the value is compared as sent."""
    if header_length is not None:
        header_length = header_length.strip(" \t")
    status, doc = app.post(body, header_length)
    expected = parse_or_reject(body, header_length)
    if isinstance(expected, InvalidRequest):
        assert (status, doc) == (400, {"error": expected.message})
    else:
        assert status in {200, 504}, doc


@settings(max_examples=60, deadline=DEADLINE)
@given(request=json_bodies().map(lambda body: (body, None)) | binary_requests())
def test_fuzzed_bodies_through_the_app_get_the_parsers_400_never_a_500(
        app: InProcessApp, request: tuple[bytes, str | None]) -> None:
    assert_http_answer(app, *request)


@pytest.mark.parametrize(("body", "header_length", "needle"), [
    (b'{"inputs": [{"name": "image", "shape": [1, 2, 2], "datatype": "FP32", '
     b'"data": [NaN, 1, 2, Infinity]}]}', None, "NaN and Infinity are not JSON numbers"),
    (b'{"inputs": [{"name": "mask", "shape": [1, 1], "datatype": "FP16", "data": [1e400]}]}',
     None, "number is infinity when parsed as double"),
    (*claimed("header-length", TEN_GB), "Inference-Header-Content-Length must be the size"),
    (*claimed("mask-elements-binary", TEN_GB), "needs binary bytes 0..10737418240"),
    (claimed("batch-rows-binary", 1)[0][:-5], claimed("batch-rows-binary", 1)[1],
     "input 'image' needs binary bytes 0..16 but the body has 11 bytes"),
])
def test_nasty_bodies_through_the_app_are_400_with_a_json_error(
        app: InProcessApp, body: bytes, header_length: str | None, needle: str) -> None:
    status, doc = app.post(body, header_length)
    assert status == 400 and set(doc) == {"error"} and needle in doc["error"]


def test_after_the_fuzz_the_app_still_answers_and_nothing_is_queued(app: InProcessApp) -> None:
    body, length = claimed("batch-rows-binary", 1)
    status, _ = app.post(body, length)
    assert status == 200
    assert app.state.batcher is not None and app.state.batcher.depth == 0
