"""The node daemons' shared start-up: each fault is one log line and its own exit code.

The agent's and the device plugin's CLI tests run these paths through each daemon; here each
step is pinned once, on a minimal daemon, so a change to the shared start-up fails here first.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog

from gpufrag import logs
from gpufrag.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_NO_GPU,
    EXIT_OK,
    BadInput,
    BadInputArgumentParser,
)
from gpufrag.httpserve import Server
from gpufrag.nvml import NvmlReader
from gpufrag.probes import start_http_server
from node import daemon
from node.daemon import Exit, NodeDaemon
from tests.node.agent.fakes import fake_nvml, recorded_devices


@pytest.fixture(autouse=True)
def _json_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GPUFRAG_LOG_FORMAT", "json")
    monkeypatch.setenv("NODE_NAME", "node1")
    logs.configure()  # as run() does before any step
    yield
    structlog.reset_defaults()  # logging was configured for the process; undo it


@dataclass(frozen=True)
class Config:
    node_name: str


def parser() -> BadInputArgumentParser:
    return daemon.flag_parser("gpufrag test-daemon", "a node daemon with only the shared flags",
                              default_metrics_port=0)


def started(*argv: str) -> NodeDaemon:
    args = parser().parse_args(list(argv))
    assert isinstance(args, argparse.Namespace)
    return NodeDaemon("test-daemon", args)


def error_lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    return [line for line in lines if line["level"] in {"error", "warning"}]


def build(daemon_: NodeDaemon) -> Config:
    name = daemon_.args.node_name
    if not name:
        raise BadInput("is empty", field="node_name")
    return Config(name)


@pytest.mark.parametrize(("argv", "code"), [(["--no-such-flag"], EXIT_BAD_INPUT),
                                            (["--help"], EXIT_OK)])
def test_a_bad_flag_or_help_never_reaches_the_body(argv: list[str], code: int,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    ran: list[NodeDaemon] = []

    def body(started: NodeDaemon) -> int:
        ran.append(started)
        return EXIT_OK

    assert daemon.run("test-daemon", parser(), argv, body) == code
    assert ran == []
    if code == EXIT_BAD_INPUT:
        err = capsys.readouterr().err
        assert err.startswith("gpufrag test-daemon: ") and "Traceback" not in err


def test_a_step_that_raises_exit_is_the_exit_code() -> None:
    def body(_: NodeDaemon) -> int:
        raise Exit(EXIT_NO_GPU)

    assert daemon.run("test-daemon", parser(), [], body) == EXIT_NO_GPU


@pytest.mark.parametrize("argv", [["--node-name", ""], ["--metrics-port", "70000"]])
def test_bad_configuration_is_one_bad_input_line_and_exit_2(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    node = started(*argv)
    with pytest.raises(Exit) as raised:
        node.settle(lambda: build(node), recorded_note="{file}")
    assert raised.value.code == EXIT_BAD_INPUT
    (line,) = error_lines(capsys)
    assert line["event"] == "bad_input"


def test_a_recording_is_loaded_and_announced_with_the_node(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recording = tmp_path / "nvml.json"
    recording.write_text(json.dumps({"devices": [{
        "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-5a3c9f1e-7b2d-4c8e-9f01-23456789abcd",
        "memory_total": 85_899_345_920, "samples": [{"gpu": 0, "memory_used": 0}]}]}))
    node = started("--nvml-recording", str(recording))
    assert node.settle(lambda: build(node), recorded_note="from {file}") == Config("node1")
    assert node.recorded and node.recording is not None
    (line,) = error_lines(capsys)
    assert (line["event"], line["node"], line["note"]) == (
        "recorded_nvml", "node1", f"from {recording}")


def test_no_gpu_is_exit_3_and_the_reader_is_closed(capsys: pytest.CaptureFixture[str]) -> None:
    nvml = fake_nvml([])
    with pytest.raises(Exit) as raised, started().open_gpus(nvml, NvmlReader.open):
        pass
    assert raised.value.code == EXIT_NO_GPU
    assert nvml.calls[-1] == "nvmlShutdown"
    (line,) = error_lines(capsys)
    assert (line["event"], line["exit_code"]) == ("no_gpu", EXIT_NO_GPU)


def test_nvml_failing_is_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(Exit) as raised, started().open_gpus(
            fake_nvml(init_error="NVMLError_Unknown"), NvmlReader.open):
        pass
    assert raised.value.code == EXIT_FAILURE
    assert [line["event"] for line in error_lines(capsys)] == ["nvml_failed"]


def test_the_gpus_found_are_handed_over_and_closed_after_the_block() -> None:
    nvml = fake_nvml()
    with started().open_gpus(nvml, NvmlReader.open) as (reader, count):
        assert count == len(recorded_devices())
        assert reader.device_count == count
        assert "nvmlShutdown" not in nvml.calls
    assert nvml.calls[-1] == "nvmlShutdown"  # closed: NVML shut down, its handles dropped
    assert reader.device_count == 0


def test_a_taken_probe_port_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node = started("--metrics-port", str(port))

        def start(port: int) -> Server:
            return start_http_server(port, lambda _: (200, "text/plain", b""), name="t",
                                     host="127.0.0.1")

        with pytest.raises(Exit) as raised:
            node.serve_probes(start)
    assert raised.value.code == EXIT_FAILURE
    (line,) = error_lines(capsys)
    assert (line["event"], line["port"]) == ("metrics_port_unavailable", port)


def test_port_0_serves_no_probes() -> None:
    def start(_: int) -> Server:
        raise AssertionError("no listener for port 0")

    assert started("--metrics-port", "0").serve_probes(start) is None


def test_a_bad_kubeconfig_is_one_line_and_exit_1(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    with pytest.raises(Exit) as raised:
        started("--kubeconfig", str(missing)).kube_client()
    assert raised.value.code == EXIT_FAILURE
    (line,) = error_lines(capsys)
    assert line["event"] == "kube_config_failed" and "--kubeconfig" in line["hint"]


def test_a_given_stop_event_is_used_as_is() -> None:
    stop = threading.Event()
    assert started().stop_event(stop) is stop
