"""The process lifecycle: listen before load, ready after, drain on SIGTERM losing nothing.

One test runs ``serve()`` in this process with a gated fake model, so the drain can be held
open and looked at; one runs the real ``gpufrag serve`` as a subprocess and SIGTERMs it with
requests queued.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from devkit import procs
from gpufrag.errors import BadInput
from serving.backends.base import Backend
from serving.backends.select import LoadedBackend
from serving.cli import main as serve_main
from serving.config import BatcherConfig, ServerConfig
from serving.server import check_limits, published_inputs, serve
from serving.tensors import TensorSpec
from serving.testing import FakeBackend

BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


wait_until = partial(procs.wait_until, timeout_s=10.0, what="the test's condition",
                     interval_s=0.005)


@pytest.mark.timeout(60)
def test_sigterm_closes_admission_then_answers_everything_accepted() -> None:
    gate = threading.Event()
    backend = FakeBackend()  # gated once ready, so the warm-up batch runs freely
    config = ServerConfig(model="fake", model_name="fake", host="127.0.0.1", port=0,
                          batcher=BatcherConfig(max_batch_size=2, max_queue_delay_s=0.0,
                                                max_queue_size=64, default_timeout_s=30.0),
                          shutdown_timeout_s=20.0, drain_delay_s=0.0).validate()
    port: list[int] = []
    seen: dict[str, Any] = {}

    def client_side() -> None:
        wait_until(lambda: bool(port))
        url = f"http://127.0.0.1:{port[0]}"
        wait_until(lambda: requests.get(f"{url}/v2/health/ready", timeout=2).status_code == 200)
        backend.gate = gate
        with ThreadPoolExecutor(max_workers=8) as pool:
            accepted = [pool.submit(requests.post, f"{url}/v2/models/fake/infer", json=BODY,
                                    timeout=30) for _ in range(8)]

            def all_accepted() -> bool:
                text = requests.get(f"{url}/metrics", timeout=2).text
                line = next(x for x in text.splitlines()
                            if x.startswith("gpufrag_serving_queue_depth{"))
                waiting = float(line.rsplit(" ", 1)[1])
                computing = sum(backend.entered[1:])  # held by the gate; [0] is the warm-up
                return waiting + computing >= 8

            # 1 or 2 computing (held by the gate), the rest waiting: all 8 accepted.
            wait_until(all_accepted)
            os.kill(os.getpid(), signal.SIGTERM)
            wait_until(lambda: requests.get(f"{url}/v2/health/ready",
                                            timeout=2).status_code == 503)
            late = requests.post(f"{url}/v2/models/fake/infer", json=BODY, timeout=5)
            seen["late"] = (late.status_code, late.headers.get("Retry-After"), late.json())
            gate.set()
            seen["accepted"] = [f.result().status_code for f in accepted]

    helper = threading.Thread(target=client_side)
    helper.start()
    code = asyncio.run(serve(config, on_listening=port.append,
                             load=lambda cfg, probe: LoadedBackend(backend, 0.01)))
    helper.join(timeout=30)
    assert code == 0
    assert seen["accepted"] == [200] * 8  # nothing accepted was lost
    assert seen["late"][0] == 503 and seen["late"][1] == "1"
    assert "shutting down" in seen["late"][2]["error"]
    assert sum(backend.batches) == 8 + 1  # 8 requests + the warm-up row
    assert backend.closed


def test_batch_size_larger_than_the_backend_allows_is_bad_input() -> None:
    config = ServerConfig(model="m", batcher=BatcherConfig(max_batch_size=64))
    with pytest.raises(BadInput, match="--max-batch-size.*64 is larger than the model's batch "
                                       "limit 32"):
        check_limits(FakeBackend(max_batch_size=32), config)


class _TwoInputs:
    """Just the ``inputs`` of a backend: an image that may allow NaN and integer ids."""

    inputs = (TensorSpec("image", "FP16", (-1, 2)), TensorSpec("ids", "INT64", (-1, 3)))


def test_allow_non_finite_marks_only_the_named_inputs() -> None:
    config = ServerConfig(model="m", allow_non_finite_inputs=("image",))
    image, ids = published_inputs(cast(Backend, _TwoInputs()), config)
    assert image == TensorSpec("image", "FP16", (-1, 2), allow_non_finite=True)
    assert ids == TensorSpec("ids", "INT64", (-1, 3))  # untouched, default False
    nothing = published_inputs(cast(Backend, _TwoInputs()), ServerConfig(model="m"))
    assert not any(spec.allow_non_finite for spec in nothing)


@pytest.mark.parametrize(("names", "needle"), [
    (("imgae",), "'imgae' is not an input of the model; its inputs: image, ids"),
    (("ids",), "input 'ids' is INT64, which has no NaN or Inf"),
])
def test_allow_non_finite_for_a_wrong_input_fails_the_start(names: tuple[str, ...],
                                                             needle: str) -> None:
    config = ServerConfig(model="m", allow_non_finite_inputs=names)
    with pytest.raises(BadInput) as raised:
        published_inputs(cast(Backend, _TwoInputs()), config)
    assert str(raised.value).startswith("field '--allow-non-finite': ")
    assert needle in str(raised.value)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_gpufrag_serve_subprocess_drains_on_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "GPUFRAG_CACHE_DIR": str(tmp_path), "GPUFRAG_LOG_FORMAT": "json"}
    command = [sys.executable, "-m", "gpufrag.cli", "serve", "--model", "builtin:resnet-small",
               "--host", "127.0.0.1", "--port", "0", "--max-batch-size", "32",
               "--max-queue-delay-ms", "20000", "--intra-op-threads", "1",
               "--drain-delay-s", "0"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    log_lines: list[dict[str, Any]] = []
    try:
        assert process.stderr is not None
        port = None
        for line in process.stderr:
            entry = json.loads(line)
            log_lines.append(entry)
            if entry["event"] == "listening":
                port = entry["port"]
            if entry["event"] == "ready":
                break
        assert port is not None, log_lines
        url = f"http://127.0.0.1:{port}"
        image = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
        body = {"inputs": [{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32",
                            "data": image.ravel().tolist()}]}
        with ThreadPoolExecutor(max_workers=10) as pool:
            accepted = [pool.submit(requests.post, f"{url}/v2/models/resnet-small/infer",
                                    json=body, timeout=30) for _ in range(10)]
            # the 20 s queue delay holds them queued until the drain flushes them
            wait_until(lambda: 'gpufrag_serving_queue_depth{model="resnet-small"} 10.0'
                       in requests.get(f"{url}/metrics", timeout=2).text)
            process.send_signal(signal.SIGTERM)
            answers = [f.result() for f in accepted]
        assert [a.status_code for a in answers] == [200] * 10
        assert all(a.json()["outputs"][0]["shape"] == [1, 10] for a in answers)
        try:
            late = requests.post(f"{url}/v2/models/resnet-small/infer", json=body, timeout=5)
            assert late.status_code == 503
        except requests.ConnectionError:
            pass  # already closed: the pod is gone, which is also not a lost request
        assert process.wait(timeout=20) == 0
        rest = [json.loads(line) for line in process.stderr]
        draining = next(e for e in log_lines + rest if e["event"] == "draining")
        assert draining["queued"] == 10
        events = [e["event"] for e in rest]
        assert events.index("drained") < events.index("stopped")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# -- start-up: JSON logs only, and the model cache's cold/warm load time ----------------------

@dataclass
class Started:
    process: subprocess.Popen[str]
    url: str
    entries: list[dict[str, Any]]


def start_serve(model: str, env: dict[str, str], *extra: str) -> Started:
    """``gpufrag serve`` with JSON logs, read up to its ``ready`` line. Every stderr line must
    be a JSON object: a line from a library that writes to stderr itself (ONNX Runtime's
    coloured warnings) fails here, naming it."""
    command = [sys.executable, "-m", "gpufrag.cli", "serve", "--model", model,
               "--host", "127.0.0.1", "--port", "0", "--intra-op-threads", "1",
               "--drain-delay-s", "0", *extra]
    process = subprocess.Popen(command, env={**env, "GPUFRAG_LOG_FORMAT": "json"},
                               stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    entries: list[dict[str, Any]] = []
    try:
        for line in process.stderr:
            entries.append(json_object(line))
            if entries[-1]["event"] == "ready":
                break
        port = next((e["port"] for e in entries if e["event"] == "listening"), None)
        assert port is not None and entries[-1]["event"] == "ready", entries
    except BaseException:
        process.kill()
        process.wait()
        raise
    return Started(process, f"http://127.0.0.1:{port}", entries)


def stop_serve(started: Started) -> list[dict[str, Any]]:
    """SIGTERM; the rest of its stderr, each line checked like the start-up's."""
    started.process.send_signal(signal.SIGTERM)
    try:
        assert started.process.wait(timeout=20) == 0
        assert started.process.stderr is not None
        return [json_object(line) for line in started.process.stderr]
    finally:
        if started.process.poll() is None:
            started.process.kill()
            started.process.wait()


def json_object(line: str) -> dict[str, Any]:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError:
        raise AssertionError(f"stderr line is not JSON: {line!r}") from None
    assert isinstance(entry, dict), line
    return cast(dict[str, Any], entry)


def load_series(url: str) -> dict[tuple[tuple[str, str], ...], float]:
    """``gpufrag_serving_model_load_seconds`` samples by their labels, from /metrics."""
    text = requests.get(f"{url}/metrics", timeout=5).text
    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            if family.name == "gpufrag_serving_model_load_seconds" for s in family.samples}


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any cache or ONNX Runtime setting (the server must
    make its own), plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"GPUFRAG_MODEL_CACHE_DIR", "GPUFRAG_CACHE_DIR", "XDG_CACHE_HOME",
                        "ORT_DISABLE_TELEMETRY"}}
    return {**env, **extra}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_second_start_on_the_same_cache_is_warm_and_both_log_only_json(
        tmp_path: Path) -> None:
    """The node-local cache's point: the first pod generates the model (cold), the next one
    on the node finds it (warm); the load time is exported under that label."""
    env = clean_env(GPUFRAG_MODEL_CACHE_DIR=str(tmp_path / "cache"))
    seconds = {}
    for expected in ("cold", "warm"):
        started = start_serve("builtin:resnet-small", env)
        try:
            loaded = next(e for e in started.entries if e["event"] == "model_loaded")
            assert loaded["cache"] == expected
            cache_line = next(e for e in started.entries if e["event"] == "model_cache")
            assert cache_line["source"] == "GPUFRAG_MODEL_CACHE_DIR"
            (labels, value), = load_series(started.url).items()
            assert labels == (("backend", "onnxruntime-cpu"), ("cache", expected),
                              ("model", "resnet-small"))
            assert value == pytest.approx(loaded["load_seconds"], abs=1e-3)
            seconds[expected] = value
        finally:
            stop_serve(started)
    assert seconds["cold"] > 0 and seconds["warm"] > 0
    print(f"resnet-small load: cold {seconds['cold']:.3f} s, warm {seconds['warm']:.3f} s")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_onnx_runtime_s_own_warnings_stay_out_of_the_json_logs(
        model_file: Callable[[str], Path], tmp_path: Path) -> None:
    """This model makes ONNX Runtime's logger warn at session creation (an unused
    initializer), in coloured plain text on stderr unless its severity is filtered."""
    started = start_serve(str(model_file("unused-initializer")),
                          clean_env(GPUFRAG_MODEL_CACHE_DIR=str(tmp_path / "cache")))
    try:
        (labels, _), = load_series(started.url).items()
        assert ("cache", "none") in labels  # a file by path on ONNX Runtime: no cache used
    finally:
        rest = stop_serve(started)
    assert [e["event"] for e in rest][-1] == "stopped"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_unwritable_home_falls_back_to_a_temp_cache_and_still_serves(
        tmp_path: Path) -> None:
    """The production image: HOME=/nonexistent on a read-only root file system. (A path under
    a regular file stands in for it here, since root could create /nonexistent.) ONNX
    Runtime's telemetry warns about that HOME on import unless the server switched it off,
    which start_serve's JSON check would catch."""
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "tmp").mkdir()
    started = start_serve("builtin:resnet-small",
                          clean_env(HOME=str(tmp_path / "a-file" / "home"),
                                    TMPDIR=str(tmp_path / "tmp")))
    try:
        fallback = next(e for e in started.entries if e["event"] == "model_cache_fallback")
        assert fallback["level"] == "warning"
        assert fallback["path"].startswith(str(tmp_path / "tmp"))
        assert list(Path(fallback["path"]).glob("resnet-small-*.onnx"))
        assert requests.get(f"{started.url}/v2/models/resnet-small/versions/1/ready",
                            timeout=5).json()["ready"] is True
    finally:
        stop_serve(started)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("flag", "expected"), [((), "uvloop"), (("--event-loop", "asyncio"),
                                                                 "asyncio")])
def test_the_server_runs_on_uvloop_unless_told_otherwise(
        tmp_path: Path, flag: tuple[str, ...], expected: str) -> None:
    """uvloop is a dependency and the default (auto); ``--event-loop asyncio`` keeps the
    standard loop. Either way the same answer comes back."""
    started = start_serve("builtin:resnet-small",
                          clean_env(GPUFRAG_MODEL_CACHE_DIR=str(tmp_path / "cache")), *flag)
    try:
        listening = next(e for e in started.entries if e["event"] == "listening")
        assert listening["event_loop"] == expected
        body = {"inputs": [{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32",
                            "data": [0.5] * 3072}]}
        answer = requests.post(f"{started.url}/v2/models/resnet-small/infer", json=body,
                               timeout=10)
        assert answer.status_code == 200
        assert answer.json()["outputs"][0]["shape"] == [1, 10]
    finally:
        stop_serve(started)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_debug_listener_reports_allocation_growth_and_gpu_memory_on_loopback(
        tmp_path: Path) -> None:
    """``--debug-port``: a second listener, on 127.0.0.1 only, answering the allocation sites
    that grew since the start and each GPU's used memory (none here: said so)."""
    port = procs.free_port()
    started = start_serve("builtin:resnet-small",
                          clean_env(GPUFRAG_MODEL_CACHE_DIR=str(tmp_path / "cache")),
                          "--debug-port", str(port))
    try:
        line = next(e for e in started.entries if e["event"] == "debug_listening")
        assert (line["host"], line["port"]) == ("127.0.0.1", port)
        data = requests.get(f"http://127.0.0.1:{port}/debug/memory", timeout=30).json()
        assert data["top_growth"] and data["traced_bytes"] > 0
        assert data["gpu_memory_used_mib"] is None and "no GPU" in data["gpu"]
        assert requests.get(f"{started.url}/debug/memory", timeout=5).status_code == 404
    finally:
        stop_serve(started)


@pytest.mark.parametrize("flags", [["--debug-port", "70000"], ["--port", "8123",
                                                                "--debug-port", "8123"]])
def test_a_bad_debug_port_is_one_line_and_exit_2(flags: list[str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert serve_main(["--model", "builtin:resnet-small", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--debug-port" in err, err


def test_a_taken_debug_port_is_one_line_and_exit_1_and_nothing_is_left_tracing(
        capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = serve_main(["--model", "builtin:resnet-small", "--host", "127.0.0.1",
                           "--port", "0", "--debug-port", str(port)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert [line for line in err if "--debug-port" in line] == err[-1:], err
    assert not tracemalloc.is_tracing()
