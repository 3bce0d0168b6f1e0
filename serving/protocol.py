"""The KServe / Triton v2 inference protocol, parsed and checked in one place.

Everything a client can get wrong is caught here, before the batcher sees the request, and
turned into :class:`serving.errors.InvalidRequest` with a message that quotes the bad value and
what the model expects: malformed JSON, missing/unknown/duplicate tensor names, datatype,
rank and dimension mismatches, element counts that do not match the shape, non-numeric or
out-of-range values, bad ``timeout_ms`` or ``timeout``, binary sizes that do not add up. Pure
functions over bytes: easy to fuzz.

A request's deadline may come three ways, and the smallest wins (the batcher caps it at
``--default-timeout-ms``): the ``Timeout-Ms`` header and ``parameters.timeout_ms`` (ours, in
milliseconds), and ``parameters.timeout``, Triton's, in microseconds (its schedule-policy
extension; ``tritonclient``'s ``infer(timeout=...)``), where 0 means no deadline of its own.

Tensors travel either as JSON ``data`` (flat row-major or nested; responses flat) or with the
**binary tensor data extension** (Triton's ``binary_tensor_data``, which KServe shares):

- request: the body is a JSON header of ``Inference-Header-Content-Length`` bytes followed by
  the raw little-endian, row-major bytes of every input whose ``parameters`` carry
  ``binary_data_size``, in the order of the ``inputs`` list. Those bytes become arrays with
  ``np.frombuffer`` (no Python numbers, no copy unless misaligned or big-endian host), after
  the size is checked against shape x datatype.
- response: an output asked for with ``"parameters": {"binary_data": true}`` (or every output,
  with the request-level ``"parameters": {"binary_data_output": true}``; a per-output value
  wins) is sent the same way, and the response carries ``Inference-Header-Content-Length``.

BOOL is one byte per element (0 or 1); BYTES is not supported by this server at all.

NaN and +-Inf follow one rule whichever way a tensor travels (:func:`_check_finite`): a float
input rejects them unless its :class:`TensorSpec` has ``allow_non_finite``, and the error names
the input and the first bad element. JSON cannot carry them at all (RFC 8259 has no NaN or
Infinity, and orjson refuses literals that overflow a double), so there a non-finite value can
only be a finite number too large for the datatype, which is "out of range" even where
non-finite values are allowed: the client sent 1e300, not Inf.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import orjson

from serving.backends.base import Array
from serving.errors import InvalidRequest
from serving.tensors import TensorSpec

MODEL_VERSION = "1"
# The HTTP header that gives the JSON part's size when binary tensor data follows it.
HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY_CONTENT_TYPE = "application/octet-stream"

# Which JSON-decoded numpy kinds each v2 datatype accepts (b=bool, i/u=integers, f=floats).
_ACCEPTED_KINDS: dict[str, str] = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}
# Tokens that Python's json.dumps writes for non-finite floats but JSON does not allow; looked
# for only in a body that failed to parse, to say why.
_NON_JSON_NUMBERS = re.compile(rb"\b(?:NaN|Infinity)\b")
_all_true = np.logical_and.reduce
_LITTLE_ENDIAN_HOST = sys.byteorder == "little"


@dataclass(frozen=True)
class ModelInfo:
    """What the HTTP layer publishes and checks requests against."""

    name: str
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int

    @cached_property
    def output_specs(self) -> dict[str, TensorSpec]:
        """The outputs by name (worked out once: every response reads it)."""
        return {spec.name: spec for spec in self.outputs}

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": [MODEL_VERSION],
            "platform": self.platform,
            "inputs": [spec.metadata() for spec in self.inputs],
            "outputs": [spec.metadata() for spec in self.outputs],
            "max_batch_size": self.max_batch_size,
        }


@dataclass(frozen=True)
class InferRequest:
    request_id: str | None
    inputs: dict[str, Array]
    requested_outputs: tuple[str, ...] | None
    timeout_s: float | None
    binary_outputs: frozenset[str] = frozenset()  # outputs to answer as raw bytes


@dataclass(frozen=True)
class EncodedResponse:
    """A response body; ``header_length`` is the JSON part's size when binary data follows."""

    body: bytes
    header_length: int | None


def little_endian(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The wire dtype of the binary extension (little-endian; 1-byte types have no order)."""
    if dtype.itemsize == 1 or (_LITTLE_ENDIAN_HOST and dtype.isnative):
        return dtype  # (as it is: a new equal dtype per call costs more than the check)
    return dtype.newbyteorder("<")


@dataclass(frozen=True, slots=True)
class WireLayout:
    """How a tensor of one shape and dtype lies in a binary body, worked out once: what
    :func:`decode_binary_tensor` reads per call, kept by a request plan so that a repeat
    pays only for the read."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    wire: np.dtype[Any]  # the little-endian dtype on the wire
    count: int  # elements
    convert: bool  # a big-endian host converts after reading

    @classmethod
    def of(cls, shape: list[int] | tuple[int, ...], dtype: np.dtype[Any]) -> WireLayout:
        wire = little_endian(dtype)
        return cls(tuple(shape), dtype, wire, math.prod(shape), wire != dtype)

    def read(self, buffer: bytes | bytearray | memoryview, offset: int) -> Array:
        """The tensor at ``buffer[offset:]``, without a copy where possible: an unaligned
        slice is copied (backends and numpy are faster on aligned data), a big-endian host
        converts."""
        array = np.frombuffer(buffer, dtype=self.wire, count=self.count, offset=offset)
        if not array.flags.aligned:
            array = array.copy()
        if self.convert:
            array = array.astype(self.dtype)
        return array.reshape(self.shape)


def parse_header_length(value: str, body_size: int) -> int:
    """``Inference-Header-Content-Length``: a decimal byte count within the body."""
    text = value.strip()
    if (not (text.isascii() and text.isdigit()) or len(text) > 18
            or int(text) > body_size):
        raise InvalidRequest(f"header {HEADER_LENGTH} must be the size in bytes of the JSON "
                             f"part of the body (0..{body_size}), got {value!r:.40}")
    return int(text)


def decode_binary_tensor(buffer: bytes | bytearray | memoryview, offset: int, shape: list[int],
                         dtype: np.dtype[Any]) -> Array:
    """``shape`` x ``dtype`` read from ``buffer[offset:]`` (:meth:`WireLayout.read`)."""
    return WireLayout.of(shape, dtype).read(buffer, offset)


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


def parse_timeout_ms(value: object, where: str) -> float:
    """A positive number of milliseconds -> seconds; anything else is named and rejected."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise InvalidRequest(
                f"{where} must be a number of milliseconds, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{where} must be a number of milliseconds, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise InvalidRequest(f"{where} must be > 0 milliseconds, got {value!r}")
    return float(value) / 1000.0


# Triton's request parameter ``timeout`` is an unsigned 64-bit count of microseconds, 0 meaning
# "no timeout of its own" (Triton's HTTP server reads it with MemberAsUInt; its C API:
# TRITONSERVER_InferenceRequestSetTimeoutMicroseconds, default 0 = none).
_UINT64_MAX = (1 << 64) - 1


def parse_timeout_us(value: object) -> float | None:
    """Triton's ``parameters.timeout`` (what ``tritonclient``'s ``infer(timeout=...)`` sends):
    whole microseconds -> seconds, 0 -> None (the server's default deadline, as in Triton).
    Anything but a non-negative integer is rejected, as Triton rejects it, rather than
    guessed: a float or a string here usually means a client that thinks in other units."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _UINT64_MAX:
        raise InvalidRequest("parameters.timeout must be a whole number of microseconds "
                             f"(0 = the server's default, as in Triton), got {value!r:.40}; "
                             "for milliseconds use parameters.timeout_ms")
    return value / 1_000_000 if value else None


@dataclass(frozen=True, slots=True)
class _BinaryInput:
    """One binary input's place in a body and how to read and check it."""

    name: str
    offset: int
    size: int
    layout: WireLayout
    boolean: bool  # BOOL: every byte must be 0 or 1
    finite_only: bool  # a float input that rejects NaN/Inf (:func:`_check_finite`)
    spec: TensorSpec

    @classmethod
    def of(cls, name: str, offset: int, size: int, shape: list[int],
           spec: TensorSpec) -> _BinaryInput:
        dtype = spec.dtype
        return cls(name, offset, size, WireLayout.of(shape, dtype), dtype.kind == "b",
                   dtype.kind == "f" and not spec.allow_non_finite, spec)

    def decode(self, body: bytes) -> Array:
        """The input's checked bytes -> its array, NaN/Inf checked: what a binary input costs
        once its place in the body is known."""
        if self.boolean and self.size:  # one byte per element; else not a boolean
            raw_bytes = np.frombuffer(body, dtype=np.uint8, count=self.size, offset=self.offset)
            if int(raw_bytes.max()) > 1:
                raise InvalidRequest(f"input {self.name!r} is BOOL: each byte must be 0 or 1")
        array = self.layout.read(body, self.offset)
        if self.finite_only:
            _check_finite(self.name, array, self.spec)
        return array


@dataclass(frozen=True, slots=True)
class _Plan:
    """A checked binary request minus its tensor bytes: where each input lies in the body."""

    inputs: tuple[_BinaryInput, ...]
    template: InferRequest  # everything but ``inputs``

    def apply(self, body: bytes) -> InferRequest:
        template = self.template
        return InferRequest(template.request_id, {item.name: item.decode(body)
                                                  for item in self.inputs},
                            template.requested_outputs, template.timeout_s,
                            template.binary_outputs)


class RequestPlans:
    """Checked binary requests by the exact bytes of their JSON header (and the body's size
    and ``Timeout-Ms``), so a client that sends the same header every time — tritonclient,
    KServe's client, this project's — pays for the JSON parse and the checks once: a repeat
    only reads its tensors from the body and checks them for NaN/Inf (measured in
    docs/serving.md). Requests with JSON ``data`` are never planned. Bounded: cleared when
    ``max_entries`` is reached (a client that varies its header, e.g. a fresh ``id`` per
    request, gets no benefit and costs a dict insert)."""

    def __init__(self, max_entries: int = 256) -> None:
        self._plans: dict[tuple[bytes, int, str | None], _Plan] = {}
        self._max_entries = max_entries
        self._model: ModelInfo | None = None

    def __len__(self) -> int:
        return len(self._plans)

    def get(self, model: ModelInfo, key: tuple[bytes, int, str | None]) -> _Plan | None:
        if model is not self._model:  # plans hold specs of one model
            self._plans.clear()
            self._model = model
        return self._plans.get(key)

    def put(self, key: tuple[bytes, int, str | None], plan: _Plan) -> None:
        if len(self._plans) >= self._max_entries:
            self._plans.clear()
        self._plans[key] = plan


def parse_infer_request(body: bytes, model: ModelInfo, *,
                        timeout_header: str | None = None,
                        header_length: str | None = None,
                        plans: RequestPlans | None = None) -> InferRequest:
    """Decode and check one ``POST /v2/models/{name}/infer`` body against ``model``.

    ``header_length`` is the ``Inference-Header-Content-Length`` header, if sent: the body's
    first that many bytes are JSON and the rest is binary tensor data. ``plans`` (one per
    model) remembers binary requests already checked; the answer is the same with or without.
    """
    if header_length is None:
        return _parse(body, body, model, timeout_header, None)
    split = parse_header_length(header_length, len(body))
    key = None
    if plans is not None:
        key = (body[:split], len(body), timeout_header)
        plan = plans.get(model, key)
        if plan is not None:
            return plan.apply(body)
    binary = _BinaryData(body, split)
    header = memoryview(body)[:split]  # orjson reads buffers: no copy of the JSON part
    request = _parse(body, header, model, timeout_header, binary)
    if key is not None and plans is not None and len(binary.taken) == len(request.inputs):
        # every input binary: a plan
        plans.put(key, _Plan(tuple(binary.taken), dataclasses.replace(request, inputs={})))
    return request


def _parse(body: bytes, header: bytes | memoryview, model: ModelInfo,
           timeout_header: str | None, binary: _BinaryData | None) -> InferRequest:
    try:
        doc = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        hint = ""
        if _NON_JSON_NUMBERS.search(header):
            hint = ("; NaN and Infinity are not JSON numbers: send finite values, or send the "
                    "tensor as binary data if the model allows non-finite values for it")
        raise InvalidRequest(f"malformed JSON: {exc}{hint}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest(f"request body must be a JSON object, got {type(doc).__name__}")

    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest(f"'id' must be a string, got {request_id!r}")

    timeouts: list[float] = []
    if timeout_header is not None:
        timeouts.append(parse_timeout_ms(timeout_header, "header Timeout-Ms"))
    parameters = doc.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidRequest(f"'parameters' must be an object, got {parameters!r:.80}")
    if "timeout_ms" in parameters:
        timeouts.append(parse_timeout_ms(parameters["timeout_ms"], "parameters.timeout_ms"))
    if "timeout" in parameters:
        triton_timeout = parse_timeout_us(parameters["timeout"])
        if triton_timeout is not None:
            timeouts.append(triton_timeout)

    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidRequest("'inputs' must be a non-empty list of tensors "
                             f"(model {model.name!r} expects: {_names(model.inputs)})")
    specs = {spec.name: spec for spec in model.inputs}
    inputs: dict[str, Array] = {}
    for index, raw in enumerate(raw_inputs):
        name, array = _parse_tensor(raw, index, specs, model, binary)
        if name in inputs:
            raise InvalidRequest(f"input {name!r} is given more than once")
        inputs[name] = array
    if binary is not None:
        binary.check_all_used()
    missing = [name for name in specs if name not in inputs]
    if missing:
        raise InvalidRequest(f"missing input {missing[0]!r}; model {model.name!r} expects: "
                             f"{_names(model.inputs)}")
    batch = {name: a.shape[0] for name, a in inputs.items()}
    if len(set(batch.values())) > 1:
        raise InvalidRequest(f"inputs disagree on the batch dimension (dim 0): {batch}")
    rows = next(iter(batch.values()))
    if rows > model.max_batch_size:
        raise InvalidRequest(f"batch dimension {rows} exceeds the max batch size "
                             f"{model.max_batch_size}; split the request")

    binary_default = parameters.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise InvalidRequest("parameters.binary_data_output must be true or false, got "
                             f"{binary_default!r:.40}")
    requested, binary_outputs = _parse_requested_outputs(doc.get("outputs"), model,
                                                         binary_default)
    return InferRequest(request_id=request_id, inputs=inputs, requested_outputs=requested,
                        timeout_s=min(timeouts) if timeouts else None,
                        binary_outputs=binary_outputs)


class _BinaryData:
    """The binary part of a body, handed out to inputs in order (each slice checked)."""

    def __init__(self, body: bytes, start: int) -> None:
        self.body = body
        self.start = start
        self.cursor = start
        self.taken: list[_BinaryInput] = []  # in body order

    def take(self, name: str, size: int, shape: list[int], spec: TensorSpec) -> _BinaryInput:
        """Where input ``name``'s ``size`` bytes lie; moves past them."""
        offset, end = self.cursor, self.cursor + size
        if end > len(self.body):
            have = len(self.body) - self.start
            raise InvalidRequest(f"input {name!r} needs binary bytes {offset - self.start}.."
                                 f"{end - self.start} but the body has {have} bytes after its "
                                 f"{self.start}-byte JSON header ({HEADER_LENGTH})")
        self.cursor = end
        item = _BinaryInput.of(name, offset, size, shape, spec)
        self.taken.append(item)
        return item

    def check_all_used(self) -> None:
        extra = len(self.body) - self.cursor
        if extra:
            used = self.cursor - self.start
            raise InvalidRequest(f"{extra} bytes of binary data follow the inputs' "
                                 f"binary_data_size total of {used}; the sizes must add up "
                                 f"to the body after the {self.start}-byte JSON header")


def _names(specs: tuple[TensorSpec, ...]) -> str:
    return ", ".join(f"{s.name} {s.datatype}{list(s.shape)}" for s in specs)


def _parse_tensor(raw: object, index: int, specs: Mapping[str, TensorSpec],
                  model: ModelInfo, binary: _BinaryData | None) -> tuple[str, Array]:
    if not isinstance(raw, dict):
        raise InvalidRequest(f"inputs[{index}] must be an object with name, shape, datatype "
                             f"and data, got {raw!r:.80}")
    name = raw.get("name")
    if not isinstance(name, str):
        raise InvalidRequest(f"inputs[{index}].name must be a string, got {name!r:.80}")
    spec = specs.get(name)
    if spec is None:
        raise InvalidRequest(f"unknown input {name!r:.80}; model {model.name!r} expects: "
                             f"{_names(model.inputs)}")
    datatype = raw.get("datatype")
    if datatype != spec.datatype:
        raise InvalidRequest(f"input {name!r} has datatype {datatype!r:.40}; the model expects "
                             f"{spec.datatype}")
    shape = raw.get("shape")
    if (not isinstance(shape, list) or not shape
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise InvalidRequest(f"input {name!r} shape must be a non-empty list of non-negative "
                             f"integers, got {shape!r:.80}")
    expected = spec.shape
    if len(shape) != len(expected) or any(
            want not in (-1, got) for got, want in zip(shape, expected, strict=True)):
        raise InvalidRequest(f"input {name!r} has shape {shape}; the model expects "
                             f"{list(expected)} (-1 = any size)")
    if shape[0] < 1:
        raise InvalidRequest(f"input {name!r} has batch dimension 0; send at least one row")
    parameters = raw.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise InvalidRequest(f"input {name!r} parameters must be an object, got "
                             f"{parameters!r:.80}")
    if parameters and "shared_memory_region" in parameters:
        raise InvalidRequest(f"input {name!r} uses the shared-memory extension, which this "
                             "server does not support; send JSON 'data' or binary data")
    if parameters and "binary_data_size" in parameters:
        return name, _binary_tensor(name, raw, parameters["binary_data_size"], shape, spec,
                                    binary)
    data = raw.get("data")
    if not isinstance(data, list):
        raise InvalidRequest(f"input {name!r} needs 'data' as a (flat or nested) list of "
                             f"numbers, got {type(data).__name__}")
    return name, _to_array(name, data, shape, spec)


def _binary_tensor(name: str, raw: dict[str, Any], size: object, shape: list[int],
                   spec: TensorSpec, binary: _BinaryData | None) -> Array:
    if binary is None:
        raise InvalidRequest(f"input {name!r} has binary_data_size but the request has no "
                             f"{HEADER_LENGTH} header; send the JSON part's size in it")
    if "data" in raw:
        raise InvalidRequest(f"input {name!r} has both 'data' and binary_data_size; send one")
    dtype = spec.dtype
    needed = math.prod(shape) * dtype.itemsize
    if isinstance(size, bool) or not isinstance(size, int) or size != needed:
        raise InvalidRequest(f"input {name!r} has binary_data_size {size!r:.40}; shape {shape} "
                             f"{spec.datatype} is {needed} bytes")
    return binary.take(name, size, shape, spec).decode(binary.body)


def _to_array(name: str, data: list[Any], shape: list[int], spec: TensorSpec) -> Array:
    count = math.prod(shape)
    try:
        decoded = np.asarray(data)
    except (ValueError, OverflowError, TypeError):
        raise InvalidRequest(f"input {name!r} data is ragged or not numeric; expected "
                             f"{count} numbers for shape {shape}") from None
    if decoded.size != count:
        raise InvalidRequest(f"input {name!r} has {decoded.size} values; shape {shape} needs "
                             f"{count}")
    target = spec.dtype
    accepted = _ACCEPTED_KINDS.get(target.kind, "")
    if count and decoded.dtype.kind not in accepted:
        wanted = {"b": "booleans", "i": "integers", "u": "integers", "f": "numbers"}
        raise InvalidRequest(f"input {name!r} data must be {wanted.get(target.kind, target)} "
                             f"for {spec.datatype}; got {decoded.dtype.kind!r}-kind values "
                             f"such as {decoded.ravel()[0]!r:.40}")
    if target.kind in "iu" and count:
        info = np.iinfo(target.type)  # type: ignore[type-var]  # kind checked just above
        low, high = decoded.min(), decoded.max()
        if low < info.min or high > info.max:
            raise InvalidRequest(f"input {name!r} values {low}..{high} are out of range for "
                                 f"{spec.datatype}")
    with np.errstate(over="ignore", invalid="ignore"):
        array = decoded.astype(target, copy=False).reshape(shape)
    _check_finite(name, array, spec, sent=decoded)
    return array


def _check_finite(name: str, array: Array, spec: TensorSpec, *,
                  sent: Array | None = None) -> None:
    """The NaN/Inf rule, the same for JSON and binary tensors: a float input must be finite
    unless ``spec.allow_non_finite``. One ``np.isfinite`` pass over float arrays only (none
    at all for a binary input that allows non-finite values); locating the first bad element
    costs something only for a request that is rejected anyway.

    ``sent`` is the JSON-decoded array before the cast to the datatype: an element finite there
    but not here overflowed the datatype, which is out of range whatever the input allows.
    """
    if array.dtype.kind != "f" or not array.size or (spec.allow_non_finite and sent is None):
        return
    finite = np.isfinite(array)
    if _all_true(finite, axis=None):  # (ndarray.all() adds a Python call on top of this)
        return
    finite = finite.reshape(-1)
    if sent is not None:
        overflowed = ~finite & np.isfinite(sent).reshape(-1)
        if overflowed.any():
            index = int(np.argmax(overflowed))
            value = sent.reshape(-1)[index].item()
            raise InvalidRequest(f"input {name!r} value {value!r:.40} at element {index} is "
                                 f"out of range for {spec.datatype} (largest "
                                 f"{float(np.finfo(array.dtype).max):g})")
        if spec.allow_non_finite:
            return
    index = int(np.argmin(finite))  # the first False, in row-major order
    value = float(array.flat[index])
    text = "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    where = [int(i) for i in np.unravel_index(index, array.shape)]
    raise InvalidRequest(f"input {name!r} has {text} at element {index} (index {where}); "
                         f"this {spec.datatype} input accepts only finite values: replace "
                         "NaN and Inf before sending")


def _parse_requested_outputs(raw: object, model: ModelInfo, binary_default: bool
                             ) -> tuple[tuple[str, ...] | None, frozenset[str]]:
    """The outputs asked for (None = all) and which of them go back as binary data."""
    if raw is None:
        everything = frozenset(spec.name for spec in model.outputs)
        return None, everything if binary_default else frozenset()
    if not isinstance(raw, list):
        raise InvalidRequest(f"'outputs' must be a list of {{\"name\": ...}}, got {raw!r:.80}")
    known = {spec.name for spec in model.outputs}
    names: list[str] = []
    binary: set[str] = set()
    for index, item in enumerate(raw):
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str):
            raise InvalidRequest(f"outputs[{index}] must be an object with a string 'name'")
        if name not in known:
            raise InvalidRequest(f"unknown output {name!r:.80}; model {model.name!r} has: "
                                 f"{_names(model.outputs)}")
        parameters = item.get("parameters")
        if parameters is None:
            parameters = {}
        elif not isinstance(parameters, dict):
            raise InvalidRequest(f"output {name!r} parameters must be an object, got "
                                 f"{parameters!r:.80}")
        if "classification" in parameters:
            raise InvalidRequest(f"output {name!r} asks for classification, which this server "
                                 "does not support; take the top classes from the logits")
        wants_binary = parameters.get("binary_data", binary_default)
        if not isinstance(wants_binary, bool):
            raise InvalidRequest(f"output {name!r} parameters.binary_data must be true or "
                                 f"false, got {wants_binary!r:.40}")
        if wants_binary:
            binary.add(name)
        names.append(name)
    return tuple(names), frozenset(binary)


def encode_infer_response(model: ModelInfo, request: InferRequest,
                          outputs: Mapping[str, Array]) -> EncodedResponse:
    """The v2 response: each output with its datatype and shape, its values flat and
    row-major, either as JSON ``data`` or (binary outputs) as raw bytes after the JSON."""
    by_name = model.output_specs
    wanted = request.requested_outputs or by_name
    tensors = []
    chunks: list[bytes | memoryview] = []
    for name in wanted:
        value = np.asarray(outputs[name])
        tensor: dict[str, Any] = {"name": name, "datatype": by_name[name].datatype,
                                  "shape": list(value.shape)}
        if name in request.binary_outputs:
            raw = np.ascontiguousarray(value, dtype=little_endian(value.dtype))
            chunks.append(raw.data)  # (C-contiguous: bytes.join reads it as it lies)
            tensor["parameters"] = {"binary_data_size": raw.nbytes}
        elif value.dtype == np.float16:  # orjson serialises fp16 only via a wider type
            tensor["data"] = value.astype(np.float32).ravel()
        else:
            tensor["data"] = np.ascontiguousarray(value).ravel()
        tensors.append(tensor)
    doc: dict[str, Any] = {"model_name": model.name, "model_version": MODEL_VERSION,
                           "outputs": tensors}
    if request.request_id is not None:
        doc["id"] = request.request_id
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return EncodedResponse(header, None)
    return EncodedResponse(b"".join([header, *chunks]), len(header))
