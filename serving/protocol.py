"""The KServe / Triton v2 inference protocol (JSON tensors), parsed and checked in one place.

Everything a client can get wrong is caught here, before the batcher sees the request, and
turned into :class:`serving.errors.InvalidRequest` with a message that quotes the bad value and
what the model expects: malformed JSON, missing/unknown/duplicate tensor names, datatype,
rank and dimension mismatches, element counts that do not match the shape, non-numeric or
out-of-range values, bad ``timeout_ms``. Pure functions over bytes: easy to fuzz.

Tensor data may be flat (row-major) or nested, as the protocol allows; responses are flat.
The binary-data extension is not supported and says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from serving.backends.base import Array
from serving.errors import InvalidRequest
from serving.tensors import TensorSpec

MODEL_VERSION = "1"

# Which JSON-decoded numpy kinds each v2 datatype accepts (b=bool, i/u=integers, f=floats).
_ACCEPTED_KINDS: dict[str, str] = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}


@dataclass(frozen=True)
class ModelInfo:
    """What the HTTP layer publishes and checks requests against."""

    name: str
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int

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


def parse_infer_request(body: bytes, model: ModelInfo, *,
                        timeout_header: str | None = None) -> InferRequest:
    """Decode and check one ``POST /v2/models/{name}/infer`` body against ``model``."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"malformed JSON: {exc}") from None
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

    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidRequest("'inputs' must be a non-empty list of tensors "
                             f"(model {model.name!r} expects: {_names(model.inputs)})")
    specs = {spec.name: spec for spec in model.inputs}
    inputs: dict[str, Array] = {}
    for index, raw in enumerate(raw_inputs):
        name, array = _parse_tensor(raw, index, specs, model)
        if name in inputs:
            raise InvalidRequest(f"input {name!r} is given more than once")
        inputs[name] = array
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

    return InferRequest(request_id=request_id, inputs=inputs,
                        requested_outputs=_parse_requested_outputs(doc.get("outputs"), model),
                        timeout_s=min(timeouts) if timeouts else None)


def _names(specs: tuple[TensorSpec, ...]) -> str:
    return ", ".join(f"{s.name} {s.datatype}{list(s.shape)}" for s in specs)


def _parse_tensor(raw: object, index: int, specs: Mapping[str, TensorSpec],
                  model: ModelInfo) -> tuple[str, Array]:
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
    if "binary_data_size" in (raw.get("parameters") or {}):
        raise InvalidRequest(f"input {name!r} uses the binary data extension, which this "
                             "server does not support; send JSON 'data'")
    data = raw.get("data")
    if not isinstance(data, list):
        raise InvalidRequest(f"input {name!r} needs 'data' as a (flat or nested) list of "
                             f"numbers, got {type(data).__name__}")
    return name, _to_array(name, data, shape, spec)


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
    if target.kind == "f" and count and not np.isfinite(array).all():
        raise InvalidRequest(f"input {name!r} has values out of range for {spec.datatype}")
    return array


def _parse_requested_outputs(raw: object, model: ModelInfo) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InvalidRequest(f"'outputs' must be a list of {{\"name\": ...}}, got {raw!r:.80}")
    known = {spec.name for spec in model.outputs}
    names: list[str] = []
    for index, item in enumerate(raw):
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str):
            raise InvalidRequest(f"outputs[{index}] must be an object with a string 'name'")
        if name not in known:
            raise InvalidRequest(f"unknown output {name!r:.80}; model {model.name!r} has: "
                                 f"{_names(model.outputs)}")
        names.append(name)
    return tuple(names)


def encode_infer_response(model: ModelInfo, request: InferRequest,
                          outputs: Mapping[str, Array]) -> bytes:
    """The v2 response: each output flat, row-major, with its datatype and shape."""
    wanted = request.requested_outputs or tuple(spec.name for spec in model.outputs)
    by_name = {spec.name: spec for spec in model.outputs}
    tensors = []
    for name in wanted:
        value = np.asarray(outputs[name])
        if value.dtype == np.float16:  # orjson serialises fp16 only via a wider type
            flat = value.astype(np.float32).ravel()
        else:
            flat = np.ascontiguousarray(value).ravel()
        tensors.append({"name": name, "datatype": by_name[name].datatype,
                        "shape": list(value.shape), "data": flat})
    doc: dict[str, Any] = {"model_name": model.name, "model_version": MODEL_VERSION,
                           "outputs": tensors}
    if request.request_id is not None:
        doc["id"] = request.request_id
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
