"""The v2 HTTP layer over a real socket, a real batcher and a fake model.

Covers the protocol's shapes (health, models, metadata, infer, errors), the status mapping
(400/404/413/500/503/504), Retry-After, client-disconnect drops, metrics, and a hypothesis fuzz
of the infer endpoint that must never crash the batcher or leave the queue stuck.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devkit.procs import wait_until
from serving.config import BatcherConfig
from serving.testing import FakeBackend, ThreadedServer

FAST = BatcherConfig(max_batch_size=8, max_queue_delay_s=0.002, max_queue_size=8,
                     default_timeout_s=5.0)


def infer_body(n: int = 1, *, features: int = 4, start: float = 0.0,
               **extra: Any) -> dict[str, Any]:
    data = np.arange(start, start + n * features, dtype=np.float32).tolist()
    return {"inputs": [{"name": "x", "shape": [n, features], "datatype": "FP32", "data": data}],
            **extra}


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedServer]:
    with ThreadedServer(FakeBackend(), FAST, max_body_bytes=64 * 1024) as running:
        yield running


def post(server: ThreadedServer, body: Any, *, raw: bytes | None = None,
         headers: dict[str, str] | None = None, model: str = "fake",
         version: str | None = None) -> requests.Response:
    data = raw if raw is not None else json.dumps(body).encode()
    route = model if version is None else f"{model}/versions/{version}"
    return requests.post(f"{server.url}/v2/models/{route}/infer", data=data,
                         headers=headers or {}, timeout=10)


def metric(server: ThreadedServer, name: str, **labels: str) -> float:
    value = server.state.metrics.registry.get_sample_value(name, {"model": "fake", **labels})
    return float(value or 0.0)


# -- protocol shapes -------------------------------------------------------------------------

def test_health_and_server_metadata(server: ThreadedServer) -> None:
    assert requests.get(f"{server.url}/v2/health/live", timeout=5).json() == {"live": True}
    assert requests.get(f"{server.url}/v2/health/ready", timeout=5).status_code == 200
    meta = requests.get(f"{server.url}/v2", timeout=5).json()
    assert meta["name"] == "gpufrag-serving" and meta["extensions"] == ["binary_tensor_data"]


def test_models_lists_what_is_loaded(server: ThreadedServer) -> None:
    models = requests.get(f"{server.url}/v2/models", timeout=5).json()["models"]
    assert models == [{"name": "fake", "version": "1", "platform": "fake", "state": "READY",
                       "reason": ""}]
    assert requests.get(f"{server.url}/v2/models/fake/ready", timeout=5).status_code == 200


def test_model_metadata_has_datatypes_and_minus_one_batch_dim(server: ThreadedServer) -> None:
    meta = requests.get(f"{server.url}/v2/models/fake", timeout=5).json()
    assert meta["name"] == "fake" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert {o["name"] for o in meta["outputs"]} == {"y", "total"}
    assert meta["max_batch_size"] == 8


def test_infer_returns_v2_outputs(server: ThreadedServer) -> None:
    response = post(server, infer_body(2, start=1.0, id="req-7"))
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    doc = response.json()
    assert doc["model_name"] == "fake" and doc["id"] == "req-7"
    y = next(o for o in doc["outputs"] if o["name"] == "y")
    assert y["datatype"] == "FP32" and y["shape"] == [2, 4]
    assert y["data"] == [2.0 * v for v in range(1, 9)]


# -- model versions: the server serves (and advertises) version "1" --------------------------

@pytest.mark.parametrize("route", ["fake", "fake/versions/1"])
def test_versioned_routes_answer_like_the_unversioned_ones(server: ThreadedServer,
                                                            route: str) -> None:
    base = f"{server.url}/v2/models/{route}"
    meta = requests.get(base, timeout=5)
    assert meta.status_code == 200 and meta.json()["versions"] == ["1"]
    assert meta.json() == requests.get(f"{server.url}/v2/models/fake", timeout=5).json()
    ready = requests.get(f"{base}/ready", timeout=5)
    assert ready.status_code == 200
    assert ready.json() == {"name": "fake", "version": "1", "ready": True}
    response = requests.post(f"{base}/infer", json=infer_body(1, start=1.0), timeout=10)
    assert response.status_code == 200
    doc = response.json()
    assert (doc["model_name"], doc["model_version"]) == ("fake", "1")
    assert next(o for o in doc["outputs"] if o["name"] == "y")["data"] == [2.0, 4.0, 6.0, 8.0]


@pytest.mark.parametrize("version", ["2", "0", "01", "latest", "-1"])
@pytest.mark.parametrize(("method", "suffix"), [("GET", ""), ("GET", "/ready"),
                                                ("POST", "/infer")])
def test_an_unknown_version_is_404_naming_the_one_served(server: ThreadedServer, version: str,
                                                         method: str, suffix: str) -> None:
    response = requests.request(method, f"{server.url}/v2/models/fake/versions/{version}"
                                f"{suffix}", json=infer_body(1), timeout=5)
    assert response.status_code == 404
    assert response.json() == {"error": f"model 'fake' has no version {version!r}; this "
                                        "server serves version '1' only"}


def test_an_unknown_model_is_404_on_versioned_routes_too(server: ThreadedServer) -> None:
    response = requests.get(f"{server.url}/v2/models/other/versions/1/ready", timeout=5)
    assert response.status_code == 404
    assert response.json() == {"error": "unknown model 'other'; this server serves 'fake'"}


def test_model_ready_says_not_ready_with_503_while_loading() -> None:
    with ThreadedServer(FakeBackend(), FAST) as server:
        def loading() -> None:
            server.state.set_ready(False)
            server.state.model = None

        server.call(loading)
        for route in ("fake/ready", "fake/versions/1/ready"):
            response = requests.get(f"{server.url}/v2/models/{route}", timeout=5)
            assert response.status_code == 503
            assert response.json() == {"name": "fake", "version": "1", "ready": False}
        metadata = requests.get(f"{server.url}/v2/models/fake/versions/1", timeout=5)
        assert metadata.status_code == 503 and "still loading" in metadata.json()["error"]


def test_infer_can_select_outputs(server: ThreadedServer) -> None:
    doc = post(server, infer_body(1, outputs=[{"name": "total"}])).json()
    assert [o["name"] for o in doc["outputs"]] == ["total"]
    assert doc["outputs"][0]["data"] == [6.0]


def test_nested_data_is_accepted(server: ThreadedServer) -> None:
    body = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                        "data": [[1, 2, 3, 4], [5, 6, 7, 8]]}]}
    assert post(server, body).status_code == 200


# -- binary tensor data extension -------------------------------------------------------------

def binary_request(x: np.ndarray[Any, Any], *, size: int | None = None,
                   **extra: Any) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": [{
        "name": "x", "shape": list(x.shape), "datatype": "FP32",
        "parameters": {"binary_data_size": x.nbytes if size is None else size}}],
        **extra}).encode()
    return header + x.astype("<f4").tobytes(), {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header))}


def test_binary_request_and_binary_response(server: ThreadedServer) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 2.5
    raw, headers = binary_request(x, parameters={"binary_data_output": True})
    response = post(server, None, raw=raw, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/octet-stream"
    split = int(response.headers["Inference-Header-Content-Length"])
    doc = json.loads(response.content[:split])
    assert [(o["name"], o["shape"], o["parameters"]) for o in doc["outputs"]] == [
        ("y", [2, 4], {"binary_data_size": 32}), ("total", [2, 1], {"binary_data_size": 8})]
    tail = response.content[split:]
    assert np.array_equal(np.frombuffer(tail[:32], "<f4").reshape(2, 4), 2 * x)
    assert np.array_equal(np.frombuffer(tail[32:], "<f4"), x.sum(axis=1))


def test_binary_request_with_a_json_response(server: ThreadedServer) -> None:
    x = np.ones((1, 4), dtype=np.float32)
    raw, headers = binary_request(x, outputs=[{"name": "total"}])
    response = post(server, None, raw=raw, headers=headers)
    assert response.status_code == 200 and "Inference-Header-Content-Length" not in (
        response.headers)
    assert response.json()["outputs"][0]["data"] == [4.0]


@pytest.mark.parametrize(("size", "cut", "length", "needle"), [
    (15, 0, None, "binary_data_size 15; shape [1, 4] FP32 is 16 bytes"),
    (None, 1, None, "needs binary bytes 0..16 but the body has 15 bytes"),
    (None, -3, None, "3 bytes of binary data follow"),
    (None, 0, "-4", "Inference-Header-Content-Length must be the size in bytes"),
    (None, 0, "99999", "Inference-Header-Content-Length must be the size in bytes"),
    (None, 0, "3", "malformed JSON"),
])
def test_malformed_binary_requests_get_400(server: ThreadedServer, size: int | None, cut: int,
                                           length: str | None, needle: str) -> None:
    raw, headers = binary_request(np.ones((1, 4), dtype=np.float32), size=size)
    raw = raw[:-cut] if cut > 0 else raw + b"\0" * -cut
    if length is not None:
        headers["Inference-Header-Content-Length"] = length
    response = post(server, None, raw=raw, headers=headers)
    assert response.status_code == 400 and needle in response.json()["error"]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(length=st.integers(-3, 120).map(str) | st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=8),
    tail=st.binary(max_size=24))
def test_fuzzed_header_lengths_get_200_or_400(server: ThreadedServer, length: str,
                                              tail: bytes) -> None:
    raw, headers = binary_request(np.ones((1, 4), dtype=np.float32))
    headers["Inference-Header-Content-Length"] = length
    response = post(server, None, raw=raw + tail, headers=headers)
    assert response.status_code in {200, 400}, response.text
    assert response.status_code == 400 or not tail


# -- errors: status and message --------------------------------------------------------------

@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"inputs": [{"name": "z", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]}, 400,
     "unknown input 'z'; model 'fake' expects: x FP32[-1, 4]"),
    ({"inputs": [{"name": "x", "shape": [1, 5], "datatype": "FP32", "data": [1] * 5}]}, 400,
     "has shape [1, 5]; the model expects [-1, 4]"),
    ({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "INT64", "data": [1] * 4}]}, 400,
     "datatype 'INT64'; the model expects FP32"),
    ({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1] * 3}]}, 400,
     "has 3 values; shape [1, 4] needs 4"),
    ({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": ["a"] * 4}]}, 400,
     "data must be numbers for FP32"),
    ({"inputs": []}, 400, "'inputs' must be a non-empty list"),
    ({"inputs": [{"name": "x", "shape": [9, 4], "datatype": "FP32", "data": [1] * 36}]}, 400,
     "exceeds the max batch size 8"),
    (infer_body(1, parameters={"timeout_ms": -5}), 400, "timeout_ms must be > 0"),
    (infer_body(1, parameters={"timeout": 0.5}), 400,
     "parameters.timeout must be a whole number of microseconds"),
    (infer_body(1, parameters={"timeout": -1}), 400,
     "parameters.timeout must be a whole number of microseconds"),
    (infer_body(1, outputs=[{"name": "nope"}]), 400, "unknown output 'nope'"),
])
def test_bad_requests_get_400_naming_what_is_wrong(server: ThreadedServer, body: Any,
                                                   status: int, needle: str) -> None:
    response = post(server, body)
    assert response.status_code == status
    assert needle in response.json()["error"]


def test_malformed_json_is_400(server: ThreadedServer) -> None:
    response = post(server, None, raw=b'{"inputs": [')
    assert response.status_code == 400 and "malformed JSON" in response.json()["error"]


def test_unknown_model_is_404(server: ThreadedServer) -> None:
    response = post(server, infer_body(1), model="other")
    assert response.status_code == 404
    assert response.json() == {"error": "unknown model 'other'; this server serves 'fake'"}


def test_unknown_route_is_404_in_the_v2_error_shape(server: ThreadedServer) -> None:
    response = requests.get(f"{server.url}/v3/nothing", timeout=5)
    assert response.status_code == 404 and "error" in response.json()


def test_oversized_body_is_413(server: ThreadedServer) -> None:
    response = post(server, None, raw=b" " * (65 * 1024))
    assert response.status_code == 413
    assert "exceeds the 65536 byte limit (--max-body-bytes)" in response.json()["error"]


def _deflate_raw(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(("encoding", "pack"), [
    ("gzip", gzip.compress), ("deflate", zlib.compress), ("deflate", _deflate_raw),
    ("GZip", gzip.compress), ("identity", lambda data: data)])
def test_compressed_request_bodies_are_inflated(server: ThreadedServer, encoding: str,
                                                pack: Callable[[bytes], bytes]) -> None:
    body = json.dumps(infer_body(2)).encode()
    response = post(server, None, raw=pack(body), headers={"Content-Encoding": encoding})
    assert response.status_code == 200, response.text
    assert response.json() == post(server, infer_body(2)).json()


@pytest.mark.parametrize(("encoding", "raw", "status", "message"), [
    ("br", b"{}", 415, "Content-Encoding 'br' is not supported; send one of gzip, deflate"),
    ("gzip, deflate", b"{}", 415, "is not supported"),
    ("gzip", b"not gzip at all", 400, "the gzip request body is corrupt"),
    ("gzip", gzip.compress(b'{"inputs": []}', mtime=0)[:-12], 400, "ends before its stream does"),
    ("deflate", b"\x00\xff" * 8, 400, "the deflate request body is corrupt"),
    # A bomb: 20 KB on the wire, 20 MB inflated, against a 64 KiB limit.
    # mtime=0: the same bytes in every worker (pytest-xdist compares the test ids).
    ("gzip", gzip.compress(b"0" * (20 * 1024 * 1024), mtime=0), 413,
     "inflates past the 65536 byte"),
])
def test_bad_request_codings_are_refused_naming_what_is_wrong(
        server: ThreadedServer, encoding: str, raw: bytes, status: int, message: str) -> None:
    response = post(server, None, raw=raw, headers={"Content-Encoding": encoding})
    assert response.status_code == status and message in response.json()["error"]


def test_deadline_counts_from_arrival_so_a_tiny_one_expires_before_the_queue(
        server: ThreadedServer) -> None:
    response = post(server, infer_body(1), headers={"Timeout-Ms": "0.000001"})
    assert response.status_code == 504
    assert "while being read and parsed" in response.json()["error"]


def test_bad_timeout_header_is_400(server: ThreadedServer) -> None:
    response = post(server, infer_body(1), headers={"Timeout-Ms": "soon"})
    assert response.status_code == 400 and "header Timeout-Ms" in response.json()["error"]


# -- load shedding, deadlines, faults, disconnects (each with its own server) ----------------

def test_full_queue_gets_503_with_retry_after_at_once() -> None:
    gate = threading.Event()
    config = BatcherConfig(max_batch_size=1, max_queue_delay_s=0.0, max_queue_size=2,
                           default_timeout_s=10.0, retry_after_s=2)
    with ThreadedServer(FakeBackend(gate=gate), config) as server:
        batcher = server.state.batcher
        assert batcher is not None
        pending = [threading.Thread(target=post, args=(server, infer_body(1))) for _ in range(3)]
        # one computing (held by the gate), then two waiting: the first of them handed ahead
        # to the busy worker (a full batch of 1 row), the second queued
        for thread, (batches, waiting) in zip(pending, [(1, 0), (2, 1), (2, 2)], strict=True):
            thread.start()
            _wait_for(lambda c=batches, q=waiting: server.call(
                lambda: (batcher.inflight_batches, batcher.depth)) == (c, q))
        started = time.monotonic()
        response = post(server, infer_body(1))
        elapsed = time.monotonic() - started
        garbage = post(server, None, raw=b'{"inputs": [not json')
        gate.set()
        for thread in pending:
            thread.join(timeout=10)
        assert response.status_code == 503 and response.headers["Retry-After"] == "2"
        assert "queue is full" in response.json()["error"]
        assert elapsed < 5.0  # rejected at once, not after the 10 s queue timeout
        assert garbage.status_code == 503  # shed before the body is read, let alone parsed
        assert metric(server, "gpufrag_serving_requests_total", outcome="rejected") == 2
        assert metric(server, "gpufrag_serving_requests_total", outcome="ok") == 3


@contextmanager
def one_batch_held() -> Iterator[tuple[ThreadedServer, FakeBackend, threading.Event]]:
    """A server of one batch slot, held by a request (row value 1) until the gate is set; the
    gate is set and the held request answered on the way out."""
    gate = threading.Event()
    backend = FakeBackend(gate=gate)
    config = BatcherConfig(max_batch_size=1, max_queue_delay_s=0.0, max_queue_size=4,
                           default_timeout_s=10.0)
    with ThreadedServer(backend, config) as server:
        blocker = threading.Thread(target=post, args=(server, infer_body(1, start=1)))
        blocker.start()  # occupies the only batch slot until the gate opens
        _wait_for(lambda: server.call(lambda: server.state.batcher.inflight_batches) == 1)  # type: ignore[union-attr]
        try:
            yield server, backend, gate
        finally:
            gate.set()
            blocker.join(timeout=10)


def test_request_that_times_out_in_the_queue_gets_504_and_is_not_computed() -> None:
    with one_batch_held() as (server, backend, gate):
        response = post(server, infer_body(1, start=500), headers={"Timeout-Ms": "50"})
        gate.set()
        assert response.status_code == 504
        assert "not computed" in response.json()["error"]
        assert all(float(b["x"][0, 0]) != 500 for b in backend.batch_inputs)
        assert metric(server, "gpufrag_serving_requests_total", outcome="timeout") == 1


@pytest.mark.parametrize(("timeout_us", "status"), [(50_000, 504), (0, 200)])
def test_triton_timeout_parameter_is_a_deadline_in_microseconds(timeout_us: int,
                                                                status: int) -> None:
    """``tritonclient``'s ``infer(timeout=...)``: 50 000 us expires in the queue behind a held
    batch (504, never computed); 0 is Triton's "no timeout of its own", so the request waits
    for the held batch and is answered."""
    with one_batch_held() as (server, backend, gate):
        released = threading.Timer(0.3, gate.set)
        released.start()
        started = time.monotonic()
        response = post(server, infer_body(1, start=500, parameters={"timeout": timeout_us}))
        elapsed = time.monotonic() - started
        released.join()
        assert response.status_code == status, response.text
        computed = any(float(b["x"][0, 0]) == 500 for b in backend.batch_inputs)
        if status == 504:
            assert "not computed" in response.json()["error"] and not computed
            assert elapsed < 0.3  # at its 50 ms deadline, not when the gate opened
        else:
            assert computed and elapsed >= 0.25


def test_backend_error_is_500_for_that_batch_and_the_next_request_succeeds() -> None:
    backend = FakeBackend(fail_when=lambda inputs: bool(inputs["x"][0, 0] == 13))
    with ThreadedServer(backend, FAST) as server:
        failed = post(server, infer_body(1, start=13))
        assert failed.status_code == 500
        assert "injected backend failure" in failed.json()["error"]
        assert post(server, infer_body(1, start=1)).status_code == 200


def test_disconnected_client_is_dropped_before_compute() -> None:
    with one_batch_held() as (server, backend, gate):
        host, port = server.url.removeprefix("http://").split(":")
        payload = json.dumps(infer_body(1, start=700)).encode()
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            raw.sendall(b"POST /v2/models/fake/infer HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Type: application/json\r\n"
                        + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            _wait_for(lambda: server.call(lambda: server.state.batcher.depth) == 1)  # type: ignore[union-attr]
        # the socket is closed: the handler is cancelled and the request is dropped (it was
        # handed ahead to the busy worker, a full batch of 1 row, but had not started)
        _wait_for(lambda: metric(server, "gpufrag_serving_requests_total",
                                 outcome="cancelled") == 1)
        gate.set()
        assert post(server, infer_body(1, start=2)).status_code == 200
        assert all(float(b["x"][0, 0]) != 700 for b in backend.batch_inputs)


def test_metrics_endpoint_exports_the_serving_series(server: ThreadedServer) -> None:
    post(server, infer_body(1))
    text = requests.get(f"{server.url}/metrics", timeout=5).text
    for name in ("gpufrag_serving_queue_depth", "gpufrag_serving_request_duration_seconds",
                 "gpufrag_serving_queue_duration_seconds",
                 "gpufrag_serving_compute_duration_seconds", "gpufrag_serving_batch_size",
                 "gpufrag_serving_requests_total", "gpufrag_serving_batcher_setting"):
        assert name in text
    assert "gpufrag_serving_gpu_" not in text  # no GPU: the series are absent, not zero


def test_not_ready_server_rejects_with_503() -> None:
    with ThreadedServer(FakeBackend(), FAST) as server:
        server.call(lambda: server.state.set_ready(False))
        response = post(server, infer_body(1))
        assert response.status_code == 503 and "Retry-After" in response.headers
        assert requests.get(f"{server.url}/v2/health/ready", timeout=5).status_code == 503


# -- fuzz --------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=6),
                                                                       children, max_size=4),
    max_leaves=30)
tensor = st.fixed_dictionaries({}, optional={
    "name": st.sampled_from(["x", "y", ""]) | st.text(max_size=4),
    "shape": st.lists(st.integers(-2, 6), max_size=4) | json_values,
    "datatype": st.sampled_from(["FP32", "FP16", "INT64", "BOOL", "BYTES"]) | json_values,
    "data": st.lists(st.floats(allow_nan=False, width=32) | st.integers(-5, 5), max_size=30)
    | json_values,
    "parameters": json_values,
})
bodies = st.fixed_dictionaries({}, optional={
    "inputs": st.lists(tensor, max_size=3) | json_values,
    "outputs": st.lists(st.fixed_dictionaries({"name": st.text(max_size=5)}), max_size=2)
    | json_values,
    "parameters": st.fixed_dictionaries({}, optional={"timeout_ms": json_values}) | json_values,
    "id": json_values,
})


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=bodies | json_values)
def test_fuzzed_infer_bodies_get_a_v2_answer_and_never_wedge_the_batcher(
        server: ThreadedServer, body: Any) -> None:
    response = post(server, body)
    assert response.status_code in {200, 400, 413}, response.text
    doc = response.json()
    assert ("outputs" in doc) if response.status_code == 200 else isinstance(doc["error"], str)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_fuzzed_raw_bytes_get_400(server: ThreadedServer, raw: bytes) -> None:
    response = post(server, None, raw=raw)
    assert response.status_code == 400 and "error" in response.json()


def test_after_fuzzing_the_server_still_serves_and_the_queue_is_empty(
        server: ThreadedServer) -> None:
    assert post(server, infer_body(3)).status_code == 200
    assert server.call(lambda: server.state.batcher.depth) == 0  # type: ignore[union-attr]


_wait_for = partial(wait_until, timeout_s=5.0, what="the test's condition",
                    interval_s=0.005)
