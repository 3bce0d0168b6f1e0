"""The client's retry rules, with a scripted transport, a fake clock and a seeded rng."""

from __future__ import annotations

import random
import time as walltime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pytest

from serving.client import (
    DeadlineExceeded,
    HttpResponse,
    InferenceClient,
    MalformedResponse,
    RequestRejected,
    RetryBudget,
    RetryPolicy,
    ServerError,
    ServerUnavailable,
    TransportConnectionError,
    TransportTimeout,
    decode_outputs,
    encode_inputs,
    parse_retry_after,
)

OK_BODY = orjson.dumps({"model_name": "m", "outputs": [
    {"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]})
X = {"x": np.ones((1, 2), dtype=np.float32)}


def ok() -> HttpResponse:
    return HttpResponse(200, {}, OK_BODY)


def status(code: int, retry_after: str | None = None) -> HttpResponse:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return HttpResponse(code, headers, orjson.dumps({"error": f"status {code}"}))


@dataclass
class Script:
    """A transport answering from a list; records each call's headers and the clock."""

    answers: list[HttpResponse | Exception]
    clock: FakeTime
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, method: str, url: str, *, body: bytes | None,
                 headers: Mapping[str, str], timeout_s: float) -> HttpResponse:
        self.calls.append({"at": self.clock.now, "headers": dict(headers),
                           "timeout_s": timeout_s})
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


@dataclass
class FakeTime:
    now: float = 100.0
    slept: list[float] = field(default_factory=list)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def client(answers: list[HttpResponse | Exception], *, policy: RetryPolicy | None = None,
           budget: RetryBudget | None = None, seed: int = 1
           ) -> tuple[InferenceClient, Script, FakeTime]:
    time = FakeTime()
    script = Script(answers, time)
    c = InferenceClient("http://server", policy=policy,
                        budget=budget or RetryBudget(ratio=0.1, capacity=100, initial=100),
                        transport=script, sleep=time.sleep, clock=time.clock,
                        wall_clock=lambda: 1_700_000_000.0, rng=random.Random(seed))
    return c, script, time


def test_success_needs_one_attempt_and_decodes_outputs() -> None:
    c, script, time = client([ok()])
    result = c.infer("m", X)
    assert result["y"].tolist() == [[1.0, 2.0]] and result["y"].dtype == np.float32
    assert len(script.calls) == 1 and time.slept == []


@pytest.mark.parametrize("code", [502, 503, 504])
def test_retryable_statuses_are_retried(code: int) -> None:
    c, script, _ = client([status(code), ok()])
    c.infer("m", X)
    assert len(script.calls) == 2 and c.retries == 1


def test_connection_errors_are_retried() -> None:
    c, script, _ = client([TransportConnectionError("refused"), ok()])
    c.infer("m", X)
    assert len(script.calls) == 2


@pytest.mark.parametrize(("answer", "error"), [
    (status(400), RequestRejected), (status(404), RequestRejected),
    (status(413), RequestRejected), (status(500), ServerError),
])
def test_other_statuses_are_not_retried(answer: HttpResponse, error: type[Exception]) -> None:
    c, script, _ = client([answer, ok()])
    with pytest.raises(error, match=f"HTTP {answer.status}: status {answer.status}"):
        c.infer("m", X)
    assert len(script.calls) == 1


def test_read_timeouts_are_not_retried() -> None:
    c, script, _ = client([TransportTimeout("read timed out"), ok()])
    with pytest.raises(DeadlineExceeded):
        c.infer("m", X)
    assert len(script.calls) == 1


def test_at_most_three_attempts() -> None:
    c, script, _ = client([status(503)])
    with pytest.raises(ServerUnavailable, match="gave up after 3 attempts") as raised:
        c.infer("m", X)
    assert len(script.calls) == 3 and raised.value.attempts == 3 and raised.value.status == 503


def test_backoff_is_capped_exponential_with_full_jitter() -> None:
    policy = RetryPolicy(max_attempts=6, base_delay_s=0.1, max_delay_s=0.3)
    c, _, time = client([status(503)], policy=policy, seed=7)
    with pytest.raises(ServerUnavailable):
        c.infer("m", X)
    rng = random.Random(7)
    caps = [0.1, 0.2, 0.3, 0.3, 0.3]  # base * 2**n, capped at max_delay_s
    assert time.slept == pytest.approx([rng.uniform(0, cap) for cap in caps])


def test_jitter_spreads_waits_over_the_whole_window() -> None:
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=1.0)
    waits = [policy.backoff_s(1, random.Random(seed)) for seed in range(400)]
    assert min(waits) < 0.05 and max(waits) > 0.95  # full jitter, not +-10% around a value


def test_retry_after_is_honoured_as_a_minimum_wait() -> None:
    c, _, time = client([status(503, retry_after="2"), ok()])
    c.infer("m", X)
    assert time.slept == [2.0]


def test_retry_after_as_http_date() -> None:
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:23 GMT",
                             now_epoch_s=1_700_000_000.0) == pytest.approx(3.0)
    assert parse_retry_after("garbage", now_epoch_s=0) is None
    assert parse_retry_after("-5", now_epoch_s=0) == 0.0


def test_each_attempt_carries_the_time_left_as_timeout_ms() -> None:
    c, script, _ = client([status(503, retry_after="0.1"), ok()])
    c.infer("m", X, timeout_s=1.0)
    assert [call["headers"]["Timeout-Ms"] for call in script.calls] == ["1000", "900"]
    assert script.calls[1]["timeout_s"] == pytest.approx(0.9)


def test_never_retries_past_the_deadline() -> None:
    c, script, time = client([status(503, retry_after="5"), ok()])
    with pytest.raises(DeadlineExceeded, match="would pass the 1.0s deadline") as raised:
        c.infer("m", X, timeout_s=1.0)
    assert len(script.calls) == 1 and time.slept == [] and raised.value.status == 503


def test_no_attempt_starts_after_the_deadline() -> None:
    time = FakeTime()

    def slow_503(method: str, url: str, *, body: bytes | None, headers: Mapping[str, str],
                 timeout_s: float) -> HttpResponse:
        time.now += 0.2  # the attempt itself takes 200 ms
        return status(503)

    c = InferenceClient("http://s", transport=slow_503, sleep=time.sleep, clock=time.clock,
                        rng=random.Random(0),
                        policy=RetryPolicy(max_attempts=10, base_delay_s=0.01,
                                           max_delay_s=0.01),
                        budget=RetryBudget(initial=100, capacity=100))
    with pytest.raises(DeadlineExceeded):
        c.infer("m", X, timeout_s=0.5)
    assert time.now <= 100.0 + 0.5 + 0.2  # the last attempt began before the deadline


def test_retry_budget_caps_retries_near_ten_percent_of_requests() -> None:
    budget = RetryBudget(ratio=0.1, capacity=10, initial=2)
    c, script, _ = client([status(503)], budget=budget)
    requests = 1000
    for _ in range(requests):
        with pytest.raises(ServerUnavailable):
            c.infer("m", X)
    assert c.retries <= 0.1 * requests + 2
    assert c.retries >= 0.1 * requests - 2  # the budget is spent, not hoarded
    assert len(script.calls) == requests + c.retries  # 1.1x load, not 3x


def test_budget_exhaustion_is_stated_in_the_error() -> None:
    c, _, _ = client([status(503)], budget=RetryBudget(ratio=0.1, capacity=10, initial=0))
    with pytest.raises(ServerUnavailable, match="retry budget exhausted"):
        c.infer("m", X)


def test_budget_refills_with_successful_traffic() -> None:
    budget = RetryBudget(ratio=0.1, capacity=10, initial=0)
    for _ in range(10):
        budget.deposit()
    assert budget.try_spend() and not budget.try_spend()


def test_encode_decode_round_trip() -> None:
    inputs = {"a": np.arange(6, dtype=np.int64).reshape(2, 3),
              "b": np.array([[0.5]], dtype=np.float16)}
    encoded = encode_inputs(inputs, request_id="i", outputs=["y"])
    assert encoded.header_length is None
    assert encoded.headers() == {"Content-Type": "application/json"}
    doc = orjson.loads(encoded.body)
    assert doc["id"] == "i" and doc["outputs"] == [{"name": "y"}]
    assert doc["inputs"][0] == {"name": "a", "shape": [2, 3], "datatype": "INT64",
                                "data": [0, 1, 2, 3, 4, 5]}
    assert doc["inputs"][1]["datatype"] == "FP16" and doc["inputs"][1]["data"] == [0.5]
    decoded = decode_outputs(orjson.dumps({"outputs": [
        {"name": "a", "datatype": "INT64", "shape": [2, 3], "data": list(range(6))}]}))
    assert np.array_equal(decoded["a"], inputs["a"])


def test_binary_encoding_puts_raw_little_endian_bytes_after_the_json_header() -> None:
    inputs = {"a": np.arange(6, dtype=np.int64).reshape(2, 3),
              "b": np.array([[0.5, -2]], dtype=">f2")}  # big-endian in, little-endian out
    encoded = encode_inputs(inputs, outputs=["y"], binary=True)
    assert encoded.header_length is not None
    assert encoded.headers() == {"Content-Type": "application/octet-stream",
                                 "Inference-Header-Content-Length": str(encoded.header_length)}
    doc = orjson.loads(encoded.body[:encoded.header_length])
    assert doc["parameters"] == {"binary_data_output": True}
    assert doc["inputs"] == [
        {"name": "a", "shape": [2, 3], "datatype": "INT64",
         "parameters": {"binary_data_size": 48}},
        {"name": "b", "shape": [1, 2], "datatype": "FP16", "parameters": {"binary_data_size": 4}},
    ]
    tail = encoded.body[encoded.header_length:]
    assert tail == inputs["a"].astype("<i8").tobytes() + inputs["b"].astype("<f2").tobytes()


def test_decode_outputs_reads_binary_and_json_outputs_in_order() -> None:
    logits = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)
    mask = np.array([True, False, True])
    header = orjson.dumps({"outputs": [
        {"name": "logits", "datatype": "FP32", "shape": [1, 3],
         "parameters": {"binary_data_size": 12}},
        {"name": "n", "datatype": "INT32", "shape": [1], "data": [7]},
        {"name": "mask", "datatype": "BOOL", "shape": [3], "parameters": {"binary_data_size": 3}},
    ]})
    body = header + logits.tobytes() + mask.tobytes()
    decoded = decode_outputs(body, len(header))
    assert np.array_equal(decoded["logits"], logits) and decoded["logits"].flags.writeable
    assert decoded["n"].tolist() == [7] and decoded["mask"].tolist() == [True, False, True]


SHORT = orjson.dumps({"outputs": [{"name": "y", "datatype": "FP32", "shape": [2],
                                    "parameters": {"binary_data_size": 8}}]})


@pytest.mark.parametrize(("body", "header_length", "needle"), [
    (SHORT + b"\0" * 4, len(SHORT), "binary_data_size 8 for shape \\[2\\] \\(8 bytes\\)"),
    (SHORT, None, "binary_data_size 8"),  # binary output but no header length
    (b"{}", None, "KeyError"),
    (b"{}", 5, "outside the 2-byte body"),
])
def test_malformed_responses_are_named(body: bytes, header_length: int | None,
                                       needle: str) -> None:
    with pytest.raises(MalformedResponse, match=needle):
        decode_outputs(body, header_length)


def test_binary_client_round_trips_through_a_real_server() -> None:
    from serving.config import BatcherConfig
    from serving.testing import FakeBackend, ThreadedServer

    config = BatcherConfig(max_batch_size=4, max_queue_delay_s=0.0, default_timeout_s=5.0)
    x = np.array([[0.25, -1.0, 3.0], [1e30, 0.0, -0.5]], dtype=np.float32)
    with ThreadedServer(FakeBackend(features=3), config) as server:
        binary = InferenceClient(server.url, binary=True).infer("fake", {"x": x})
        as_json = InferenceClient(server.url).infer("fake", {"x": x}, outputs=["y"])
    assert binary["y"].dtype == np.float32 and np.array_equal(binary["y"], 2 * x)
    assert np.array_equal(binary["total"], x.sum(axis=1, keepdims=True))
    assert np.array_equal(as_json["y"], binary["y"]) and set(as_json) == {"y"}


def test_policy_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


def test_client_against_a_real_server_with_a_full_queue() -> None:
    """End to end: 503 + Retry-After from the server, then success on the retry."""
    import threading

    from serving.config import BatcherConfig
    from serving.testing import FakeBackend, ThreadedServer

    gate = threading.Event()
    config = BatcherConfig(max_batch_size=1, max_queue_delay_s=0.0, max_queue_size=1,
                           default_timeout_s=10.0, retry_after_s=1)
    with ThreadedServer(FakeBackend(gate=gate, features=2), config) as server:
        slept: list[float] = []

        def sleep(seconds: float) -> None:
            slept.append(seconds)
            gate.set()  # the server frees up while the client waits...
            deadline = walltime.monotonic() + 10  # ...and has, before the retry goes out
            while server.call(lambda: batcher.depth) > 0:
                assert walltime.monotonic() < deadline
                walltime.sleep(0.005)

        c = InferenceClient(server.url, sleep=sleep, rng=random.Random(0))
        batcher = server.state.batcher
        assert batcher is not None
        blockers = [threading.Thread(target=c.infer, args=("fake", X)) for _ in range(2)]
        for thread, (what, count) in zip(blockers, [("computing", 1), ("queued", 1)],
                                         strict=True):
            # the first computes (held by the gate), the second fills the queue (a full batch
            # of 1 row, it waits handed ahead to the busy worker, and counts as waiting)
            thread.start()
            deadline = walltime.monotonic() + 10
            while server.call(lambda what=what: batcher.inflight_batches if what == "computing"
                              else batcher.depth) < count:
                assert walltime.monotonic() < deadline
                walltime.sleep(0.005)
        result = c.infer("fake", X, timeout_s=5.0)
        for thread in blockers:
            thread.join(timeout=10)
        assert result["y"].tolist() == [[2.0, 2.0]]
        assert slept and slept[0] >= 1.0  # waited at least Retry-After
