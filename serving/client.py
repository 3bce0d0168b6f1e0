"""A v2 inference client whose retries cannot turn an overload into an outage.

Retry rules (each one is there because its absence has taken services down):

- Retry only what may succeed on a second try: 502, 503, 504 and connection errors. A 400 is the
  caller's bug, a 500 the model's; retrying either just repeats it.
- At most ``max_attempts`` (3) attempts, with capped exponential backoff and *full jitter*
  (``uniform(0, min(cap, base * 2**n))``), so clients that failed together do not return
  together.
- Honour ``Retry-After``: the server knows how long its queue takes to drain; wait at least that.
- Never past the caller's deadline: each attempt sends the time left as ``Timeout-Ms`` (so the
  server drops the request rather than compute a stale answer), and a retry whose wait would
  end after the deadline is not made.
- A retry budget (token bucket): every request deposits ``budget_ratio`` (0.1) tokens, every
  retry spends one, so across many requests retries stay near 10% of traffic however bad the
  errors get. Without it three attempts each would triple the load on a server that is already
  shedding load — the retry storm.

``sleep``, ``clock``, ``rng`` and the HTTP ``transport`` are injectable, so tests check the
exact waits, attempts and deadlines without a server or wall-clock time.

``InferenceClient(url, binary=True)`` sends input tensors with the v2 **binary tensor data
extension** (raw little-endian bytes after a JSON header, ``Inference-Header-Content-Length``)
and asks for the outputs the same way: no numbers are printed or parsed as text on either side.
"""

from __future__ import annotations

import email.utils
import math
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import orjson

from serving.backends.base import Array
from serving.errors import InvalidRequest
from serving.protocol import (
    BINARY_CONTENT_TYPE,
    HEADER_LENGTH,
    decode_binary_tensor,
    little_endian,
    parse_header_length,
)
from serving.tensors import NUMPY_TO_V2, V2_TO_NUMPY

RETRYABLE_STATUSES = frozenset({502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0
    budget_ratio: float = 0.1
    budget_capacity: float = 10.0
    budget_initial: float = 2.0
    attempt_timeout_s: float = 30.0  # per attempt, when the caller sets no deadline

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not 0 < self.base_delay_s <= self.max_delay_s:
            raise ValueError("need 0 < base_delay_s <= max_delay_s, got "
                             f"{self.base_delay_s} and {self.max_delay_s}")
        if not 0 <= self.budget_ratio <= 1:
            raise ValueError(f"budget_ratio must be in 0..1, got {self.budget_ratio}")

    def backoff_s(self, retry: int, rng: random.Random) -> float:
        """Full jitter: uniform over [0, min(cap, base * 2**(retry-1))] for retry 1, 2, ..."""
        return rng.uniform(0.0, min(self.max_delay_s, self.base_delay_s * 2 ** (retry - 1)))


class RetryBudget:
    """Token bucket limiting retries to about ``ratio`` of requests (thread-safe)."""

    def __init__(self, *, ratio: float = 0.1, capacity: float = 10.0,
                 initial: float = 2.0) -> None:
        self._ratio = ratio
        self._capacity = capacity
        self._tokens = min(initial, capacity)
        self._lock = threading.Lock()

    def deposit(self) -> None:
        """One request made: earn ``ratio`` of a retry."""
        with self._lock:
            self._tokens = min(self._capacity, self._tokens + self._ratio)

    def try_spend(self) -> bool:
        """Take one retry's token if there is one."""
        with self._lock:
            if self._tokens >= 1.0 - 1e-9:  # ten deposits of 0.1 make a token despite rounding
                self._tokens = max(0.0, self._tokens - 1.0)
                return True
            return False

    @property
    def tokens(self) -> float:
        return self._tokens


# -- errors ----------------------------------------------------------------------------------

class ClientError(Exception):
    """An inference call that did not return outputs."""

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.attempts = attempts


class RequestRejected(ClientError):
    """4xx: the request is wrong for this model; fix it, do not retry."""


class ServerError(ClientError):
    """5xx other than 502/503/504: the model failed on this request."""


class ServerUnavailable(ClientError):
    """502/503/504 or no connection, still so after the retries allowed."""

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 1,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message, status=status, attempts=attempts)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(ClientError):
    """The caller's deadline passed (or would pass before the next attempt)."""


class MalformedResponse(ClientError):
    """A 200 whose body is not a v2 response this client can decode."""


# -- transport -------------------------------------------------------------------------------

@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: Mapping[str, str]
    body: bytes


class TransportConnectionError(Exception):
    """The request never reached the server (refused, reset, DNS): safe to retry."""


class TransportTimeout(Exception):
    """No response in time; the server may still be computing, so this is not retried."""


class Transport(Protocol):
    def __call__(self, method: str, url: str, *, body: bytes | None,
                 headers: Mapping[str, str], timeout_s: float) -> HttpResponse: ...


class RequestsTransport:
    """The default transport: one pooled ``requests.Session``."""

    def __init__(self) -> None:
        import requests

        self._requests = requests
        self._session = requests.Session()

    def __call__(self, method: str, url: str, *, body: bytes | None,
                 headers: Mapping[str, str], timeout_s: float) -> HttpResponse:
        exceptions = self._requests.exceptions
        try:
            response = self._session.request(method, url, data=body, headers=dict(headers),
                                             timeout=timeout_s)
        except exceptions.ConnectTimeout as exc:  # never connected: retryable
            raise TransportConnectionError(str(exc)) from exc
        except exceptions.Timeout as exc:
            raise TransportTimeout(str(exc)) from exc
        except exceptions.ConnectionError as exc:
            raise TransportConnectionError(str(exc)) from exc
        # requests' headers are case-insensitive; keep them so (no dict() copy)
        return HttpResponse(response.status_code, response.headers, response.content)


def header_value(headers: Mapping[str, str], name: str) -> str | None:
    """``headers[name]`` regardless of case (transports differ in what they keep)."""
    value = headers.get(name)
    if value is not None:
        return value
    lowered = name.lower()
    return next((v for k, v in headers.items() if k.lower() == lowered), None)


def parse_retry_after(value: str | None, *, now_epoch_s: float) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date; None if absent or garbled."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - now_epoch_s
    return max(0.0, seconds) if math.isfinite(seconds) else None


# -- the client ------------------------------------------------------------------------------

@dataclass(frozen=True)
class EncodedRequest:
    """An infer request body; ``header_length`` is its JSON part's size when binary follows."""

    body: bytes
    header_length: int | None = None

    def headers(self) -> dict[str, str]:
        if self.header_length is None:
            return {"Content-Type": "application/json"}
        return {"Content-Type": BINARY_CONTENT_TYPE, HEADER_LENGTH: str(self.header_length)}


def encode_inputs(inputs: Mapping[str, Array], *, request_id: str | None = None,
                  outputs: Sequence[str] | None = None, binary: bool = False) -> EncodedRequest:
    """The v2 request for ``inputs``. ``binary``: tensors as raw bytes after the JSON header,
    and every output asked for as binary too."""
    tensors = []
    chunks: list[memoryview] = []
    for name, value in inputs.items():
        array = np.asarray(value)
        datatype = NUMPY_TO_V2.get(array.dtype.newbyteorder("="))
        if datatype is None:
            raise TypeError(f"input {name!r} has dtype {array.dtype}, not a v2 datatype")
        tensor: dict[str, Any] = {"name": name, "shape": list(array.shape),
                                  "datatype": datatype}
        if binary:
            raw = np.ascontiguousarray(array, dtype=little_endian(array.dtype))
            chunks.append(raw.reshape(-1).view(np.uint8).data)
            tensor["parameters"] = {"binary_data_size": raw.nbytes}
        else:
            flat = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
            tensor["data"] = (flat.astype(np.float32) if flat.dtype == np.float16
                              else flat).ravel()
        tensors.append(tensor)
    doc: dict[str, Any] = {"inputs": tensors}
    if request_id is not None:
        doc["id"] = request_id
    if outputs is not None:
        doc["outputs"] = [{"name": name} for name in outputs]
    if binary:
        doc["parameters"] = {"binary_data_output": True}
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not binary:
        return EncodedRequest(header)
    return EncodedRequest(b"".join([header, *chunks]), len(header))


def decode_outputs(body: bytes, header_length: int | None = None) -> dict[str, Array]:
    """A v2 response's outputs as arrays; ``header_length`` (the response's
    ``Inference-Header-Content-Length``) says where binary output data starts."""
    split = len(body) if header_length is None else header_length
    if not 0 <= split <= len(body):
        raise MalformedResponse(f"{HEADER_LENGTH} {split} is outside the {len(body)}-byte body")
    buffer = bytearray(body) if split < len(body) else None  # writeable arrays for the caller
    try:
        doc = orjson.loads(memoryview(body)[:split])
        offset = split
        result: dict[str, Array] = {}
        for tensor in doc["outputs"]:
            dtype = V2_TO_NUMPY[tensor["datatype"]]
            shape = [int(d) for d in tensor["shape"]]
            size = (tensor.get("parameters") or {}).get("binary_data_size")
            if size is None:
                value = np.asarray(tensor["data"], dtype=dtype).reshape(shape)
            else:
                needed = math.prod(shape) * dtype.itemsize
                if buffer is None or size != needed or offset + size > len(body):
                    raise MalformedResponse(f"output {tensor['name']!r}: binary_data_size "
                                            f"{size} for shape {shape} ({needed} bytes) at "
                                            f"offset {offset} of a {len(body)}-byte body")
                value = decode_binary_tensor(buffer, offset, shape, dtype)
                offset += size
            result[tensor["name"]] = value
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise MalformedResponse(f"cannot decode the response: {type(exc).__name__}: "
                                f"{exc}") from None
    return result


def _error_message(response: HttpResponse) -> str:
    try:
        doc = orjson.loads(response.body)
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            return str(doc["error"])
    except orjson.JSONDecodeError:
        pass
    return response.body[:200].decode(errors="replace") or f"HTTP {response.status}"


class InferenceClient:
    """``client.infer("resnet-small", {"input": x}, timeout_s=0.5) -> {"logits": ...}``."""

    def __init__(self, base_url: str, *, policy: RetryPolicy | None = None,
                 budget: RetryBudget | None = None, transport: Transport | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, binary: bool = False) -> None:
        self._base = base_url.rstrip("/")
        self.binary = binary
        self.policy = policy or RetryPolicy()
        self.budget = budget or RetryBudget(ratio=self.policy.budget_ratio,
                                            capacity=self.policy.budget_capacity,
                                            initial=self.policy.budget_initial)
        self._transport: Transport = transport or RequestsTransport()
        self._sleep = sleep
        self._clock = clock
        self._wall_clock = wall_clock
        self._rng = rng or random.Random()
        self.retries = 0

    def infer(self, model: str, inputs: Mapping[str, Array], *,
              timeout_s: float | None = None, outputs: Sequence[str] | None = None,
              request_id: str | None = None) -> dict[str, Array]:
        request = encode_inputs(inputs, request_id=request_id, outputs=outputs,
                                binary=self.binary)
        response = self._call("POST", f"/v2/models/{model}/infer", request.body, timeout_s,
                              request.headers())
        length = header_value(response.headers, HEADER_LENGTH)
        if length is None:
            return decode_outputs(response.body)
        try:
            split = parse_header_length(length, len(response.body))
        except InvalidRequest as exc:
            raise MalformedResponse(f"response {exc.message}") from None
        return decode_outputs(response.body, split)

    def model_metadata(self, model: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = orjson.loads(
            self._call("GET", f"/v2/models/{model}", None, timeout_s).body)
        return doc

    def ready(self, *, timeout_s: float = 2.0) -> bool:
        try:
            response = self._transport("GET", f"{self._base}/v2/health/ready", body=None,
                                       headers={}, timeout_s=timeout_s)
        except (TransportConnectionError, TransportTimeout):
            return False
        return response.status == 200

    def _call(self, method: str, path: str, body: bytes | None, timeout_s: float | None,
              body_headers: Mapping[str, str] | None = None) -> HttpResponse:
        policy = self.policy
        deadline = None if timeout_s is None else self._clock() + timeout_s
        self.budget.deposit()
        attempt = 0
        while True:
            attempt += 1
            headers = dict(body_headers or {})
            remaining = None if deadline is None else deadline - self._clock()
            if remaining is not None:
                if remaining <= 0:
                    raise DeadlineExceeded(f"deadline of {timeout_s}s passed before attempt "
                                           f"{attempt}", attempts=attempt - 1)
                headers["Timeout-Ms"] = str(max(1, math.floor(remaining * 1000)))
            try:
                response = self._transport(method, f"{self._base}{path}", body=body,
                                           headers=headers,
                                           timeout_s=remaining or policy.attempt_timeout_s)
            except TransportConnectionError as exc:
                error = ServerUnavailable(f"cannot reach {self._base}: {exc}", attempts=attempt)
            except TransportTimeout as exc:
                waited = remaining or policy.attempt_timeout_s
                raise DeadlineExceeded(f"no response within {waited:.3f}s: {exc}",
                                       attempts=attempt) from exc
            else:
                if 200 <= response.status < 300:
                    return response
                message = _error_message(response)
                if response.status not in RETRYABLE_STATUSES:
                    kind = RequestRejected if response.status < 500 else ServerError
                    raise kind(f"HTTP {response.status}: {message}", status=response.status,
                               attempts=attempt)
                retry_after = parse_retry_after(header_value(response.headers, "Retry-After"),
                                                now_epoch_s=self._wall_clock())
                error = ServerUnavailable(f"HTTP {response.status}: {message}",
                                          status=response.status, attempts=attempt,
                                          retry_after_s=retry_after)
            delay = self._next_delay(attempt, error)
            if delay is None:
                raise error
            if deadline is not None and self._clock() + delay >= deadline:
                raise DeadlineExceeded(f"{error.message}; a retry after {delay:.3f}s would "
                                       f"pass the {timeout_s}s deadline", status=error.status,
                                       attempts=attempt)
            if not self.budget.try_spend():
                error.message += " (retry budget exhausted: not retrying)"
                error.args = (error.message,)
                raise error
            self.retries += 1
            self._sleep(delay)

    def _next_delay(self, attempt: int, error: ServerUnavailable) -> float | None:
        """The wait before attempt ``attempt + 1``, or None when no attempts are left."""
        if attempt >= self.policy.max_attempts:
            error.message += f" (gave up after {attempt} attempts)"
            error.args = (error.message,)
            return None
        delay = self.policy.backoff_s(attempt, self._rng)
        if error.retry_after_s is not None:
            delay = max(delay, error.retry_after_s)
        return delay
