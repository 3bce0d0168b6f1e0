"""``gpufrag serve`` driven by clients no one here wrote: Triton's ``tritonclient`` (HTTP) and,
where it is installed, KServe's ``InferenceRESTClient``.

Our own client and tests share our reading of the v2 protocol, so a misreading would pass
them both; these clients carry Triton's and KServe's reading. One real ``gpufrag serve``
process (``builtin:resnet-small`` on ONNX Runtime) serves the module, and every answer is
compared with the same model run directly, so a protocol change that garbles tensors, drops a
route or changes a status fails here.

``kserve`` cannot be a dev dependency: it would install 35 packages here (FastAPI, uvicorn,
gRPC tools, pandas, ...) and pins ``protobuf<7`` and ``python-dateutil<3``, which would
downgrade this project's own ``protobuf`` and ``kubernetes`` client. So its test builds (once,
cached outside the repo) a venv of its own with ``devkit.clientvenv`` and runs
``kserve_client_check.py`` there against the same server; a failed build fails the test
(docs/serving.md, "Tested with Triton's and KServe's clients").
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from tritonclient.utils import InferenceServerException

from devkit import clientvenv
from serving.models import builtin_path

MODEL = "resnet-small"
QUEUE_DELAY_MS = 50  # long enough for a 1 ms Triton timeout to expire in the queue


@dataclass
class Served:
    """A running ``gpufrag serve``: where it listens and what it wrote to stderr."""

    process: subprocess.Popen[str]
    port: int
    model_path: Path
    log_lines: list[str] = field(default_factory=list)

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    cache = tmp_path_factory.mktemp("model-cache")
    env = {**os.environ, "GPUFRAG_MODEL_CACHE_DIR": str(cache), "GPUFRAG_LOG_FORMAT": "json"}
    command = [sys.executable, "-m", "gpufrag.cli", "serve", "--model", f"builtin:{MODEL}",
               "--host", "127.0.0.1", "--port", "0", "--max-batch-size", "8",
               "--max-queue-delay-ms", str(QUEUE_DELAY_MS), "--intra-op-threads", "1"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    lines: list[str] = []
    port: int | None = None
    for line in process.stderr:  # until ready (or the process ends)
        lines.append(line)
        entry = json.loads(line)
        port = entry.get("port", port) if entry["event"] == "listening" else port
        if entry["event"] == "ready":
            break
    assert port is not None and json.loads(lines[-1])["event"] == "ready", lines
    running = Served(process, port, builtin_path(MODEL, cache), lines)
    drain = threading.Thread(target=lambda: lines.extend(process.stderr or ()), daemon=True)
    drain.start()  # keep reading, so the pipe never fills
    try:
        yield running
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(timeout=20) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            drain.join(timeout=5)


@pytest.fixture(scope="module")
def reference(served: Served) -> ort.InferenceSession:
    """The model the server loaded, run directly: what every answer must equal."""
    return ort.InferenceSession(str(served.model_path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def client(served: Served) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(served.host_port, network_timeout=30.0) as c:
        yield c


def images(n: int, seed: int = 0) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.random.default_rng(seed).random((n, 3, 32, 32), dtype=np.float32)


def expected(reference: ort.InferenceSession, x: np.ndarray[Any, Any]) -> Any:
    return reference.run(["logits"], {"input": x})[0]


def triton_input(x: np.ndarray[Any, Any], *, binary: bool) -> triton.InferInput:
    tensor = triton.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return tensor


# -- tritonclient ------------------------------------------------------------------------------

def test_tritonclient_health_and_server_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]


@pytest.mark.parametrize("version", ["", "1"])
def test_tritonclient_model_ready_and_metadata(client: triton.InferenceServerClient,
                                               version: str) -> None:
    assert client.is_model_ready(MODEL, model_version=version)
    meta = client.get_model_metadata(MODEL, model_version=version)
    assert meta["name"] == MODEL and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]


def test_tritonclient_sees_unknown_versions_and_models_as_absent(
        client: triton.InferenceServerClient) -> None:
    assert not client.is_model_ready(MODEL, model_version="2")
    assert not client.is_model_ready("no-such-model")
    with pytest.raises(InferenceServerException) as raised:
        client.get_model_metadata(MODEL, model_version="2")
    assert raised.value.status() == "404"
    assert "has no version '2'; this server serves version '1' only" in raised.value.message()


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("version", ["", "1"], ids=["unversioned", "version-1"])
def test_tritonclient_infer_matches_the_model(client: triton.InferenceServerClient,
                                              reference: ort.InferenceSession, binary: bool,
                                              version: str) -> None:
    x = images(3, seed=int(binary))
    result = client.infer(MODEL, [triton_input(x, binary=binary)], model_version=version,
                          outputs=[triton.InferRequestedOutput("logits", binary_data=binary)],
                          request_id="req-1")
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == (
        MODEL, "1", "req-1")
    (output,) = response["outputs"]
    assert ("parameters" in output) is binary  # binary_data_size, or JSON data
    logits = result.as_numpy("logits")
    assert logits is not None and logits.shape == (3, 10) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, expected(reference, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compressed_requests_are_answered(client: triton.InferenceServerClient,
                                                       reference: ort.InferenceSession,
                                                       algorithm: str) -> None:
    x = images(2, seed=5)
    result = client.infer(MODEL, [triton_input(x, binary=False)],
                          request_compression_algorithm=algorithm)
    logits = result.as_numpy("logits")
    assert logits is not None
    np.testing.assert_allclose(logits, expected(reference, x), rtol=1e-5, atol=1e-6)


def test_tritonclient_default_outputs_come_back_binary(client: triton.InferenceServerClient,
                                                       reference: ort.InferenceSession) -> None:
    """With no outputs named, tritonclient sets ``binary_data_output``: all outputs as raw
    bytes after the JSON header."""
    x = images(2, seed=5)
    result = client.infer(MODEL, [triton_input(x, binary=True)])
    assert result.get_output("logits")["parameters"] == {"binary_data_size": 2 * 10 * 4}
    np.testing.assert_allclose(result.as_numpy("logits"), expected(reference, x),
                               rtol=1e-5, atol=1e-6)


def test_tritonclient_infer_on_an_unknown_version_is_404(
        client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as raised:
        client.infer(MODEL, [triton_input(images(1), binary=True)], model_version="7")
    assert raised.value.status() == "404"


@pytest.mark.parametrize("timeout_us", [0, 10_000_000], ids=["zero-is-no-deadline", "10s"])
def test_tritonclient_timeout_long_enough_or_zero_is_answered(
        client: triton.InferenceServerClient, reference: ort.InferenceSession,
        timeout_us: int) -> None:
    x = images(1, seed=9)
    result = client.infer(MODEL, [triton_input(x, binary=True)], timeout=timeout_us)
    np.testing.assert_allclose(result.as_numpy("logits"), expected(reference, x),
                               rtol=1e-5, atol=1e-6)


def test_tritonclient_timeout_is_microseconds_and_expires_in_the_queue(
        client: triton.InferenceServerClient) -> None:
    """1000 us = 1 ms, far less than the 50 ms the batcher holds a lone request for a fuller
    batch: 504, not computed. Read as milliseconds (1 s) it would have been answered."""
    with pytest.raises(InferenceServerException) as raised:
        client.infer(MODEL, [triton_input(images(1), binary=True)], timeout=1000)
    assert raised.value.status() == "504"
    assert "not computed" in raised.value.message()


def test_tritonclient_bad_timeout_is_400(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as raised:
        client.infer(MODEL, [triton_input(images(1), binary=True)], timeout=-1)
    assert raised.value.status() == "400"
    assert "parameters.timeout must be a whole number of microseconds" in raised.value.message()


def test_tritonclient_aio_client_too(served: Served, reference: ort.InferenceSession) -> None:
    """tritonclient's asyncio client (aiohttp, not gevent) builds its requests itself."""

    async def run() -> Any:
        async with triton_aio.InferenceServerClient(served.host_port) as c:
            assert await c.is_model_ready(MODEL, model_version="1")
            tensor = triton_aio.InferInput("input", [2, 3, 32, 32], "FP32")
            tensor.set_data_from_numpy(images(2, seed=3), binary_data=True)
            result = await c.infer(MODEL, [tensor], model_version="1")
            return result.as_numpy("logits")

    np.testing.assert_allclose(asyncio.run(run()), expected(reference, images(2, seed=3)),
                               rtol=1e-5, atol=1e-6)


# -- KServe's client ---------------------------------------------------------------------------

KSERVE_CHECK = Path(__file__).resolve().with_name("kserve_client_check.py")
KSERVE_CHECK_TIMEOUT_S = 120.0


@pytest.mark.slow
@pytest.mark.timeout(clientvenv.BUILD_TIMEOUT_S + clientvenv.LOCK_TIMEOUT_S + 300)
def test_kserve_rest_client(served: Served, reference: ort.InferenceSession,
                            tmp_path: Path) -> None:
    """KServe's ``InferenceRESTClient``, from its own venv (built on first use, minutes cold):
    health, model readiness, and infer with JSON and with binary tensors."""
    python = clientvenv.client_python("kserve")  # raises with pip's output: a failure, no skip
    x = images(2, seed=11)
    np.save(tmp_path / "x.npy", x)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    result = subprocess.run(
        [str(python), "-I", str(KSERVE_CHECK), f"http://{served.host_port}", MODEL,
         str(tmp_path / "x.npy")],
        capture_output=True, text=True, timeout=KSERVE_CHECK_TIMEOUT_S, env=env, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout)
    assert report["kserve_version"] == "0.21.0"
    assert (report["server_live"], report["server_ready"]) == (True, True)
    assert (report["model_ready"], report["unknown_model_ready"]) == (True, False)
    assert sorted(report["infer"]) == ["binary", "json"]
    want = expected(reference, x)
    for mode, response in report["infer"].items():
        assert (response["model_name"], response["id"]) == (MODEL, f"kserve-{mode}"), mode
        (output,) = response["outputs"]
        assert (output["name"], output["shape"], output["datatype"]) == (
            "logits", [2, 10], "FP32"), mode
        np.testing.assert_allclose(np.asarray(output["data"], dtype=np.float32), want,
                                   rtol=1e-5, atol=1e-6, err_msg=mode)
