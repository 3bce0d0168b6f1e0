"""The CLI run in-process, its log captured: exit codes and what an operator would see."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest
import structlog

from gpufrag import cli as gpufrag_cli
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_NO_GPU, EXIT_OK
from gpufrag.gpu_usage import parse
from gpufrag.nvml_recorded import RecordedNvml
from node.agent import cli
from node.agent.cgroup import PodRecord
from node.agent.publish import PublishError
from tests import skips
from tests.node.agent.fakes import (
    POD_A,
    POD_B,
    FakeLister,
    RecordingWriter,
    fake_nvml,
)


@pytest.fixture(autouse=True)
def _json_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GPUFRAG_LOG_FORMAT", "json")
    monkeypatch.delenv("NODE_NAME", raising=False)
    yield
    structlog.reset_defaults()  # main() configured logging for the process; undo it

# What the agent logs of GPU processes no listed pod holds (tests here list no pod, or some).
STRAY_LINES = frozenset({"gpu_process_without_pod", "event_failed"})


def log_lines(err: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in err.splitlines()]


def assert_one_clear_line(capsys: pytest.CaptureFixture[str], event: str) -> dict[str, Any]:
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    (line,) = log_lines(err)
    assert (line["event"], line["level"]) == (event, "error")
    return line


def test_no_nvml_library_is_one_log_line_and_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    fake = fake_nvml(init_error="NVMLError_LibraryNotFound")
    code = cli.main(["--node-name", "node1", "--once"], nvml=fake, writer=RecordingWriter(),
                    pod_lister=FakeLister())
    assert code == EXIT_NO_GPU == 3
    line = assert_one_clear_line(capsys, "no_gpu")
    assert "libnvidia-ml.so.1" in line["reason"]
    assert (line["node"], line["ready"]) == ("node1", False)


@pytest.mark.parametrize("fake", [
    fake_nvml(init_error="NVMLError_DriverNotLoaded"),
    fake_nvml([]),
], ids=["driver-not-loaded", "zero-devices"])
def test_other_no_gpu_cases_exit_3(fake: RecordedNvml, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--node-name", "node1"], nvml=fake, writer=RecordingWriter(),
                    pod_lister=FakeLister()) == EXIT_NO_GPU
    assert_one_clear_line(capsys, "no_gpu")


def _nvml_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@skips.skip_if(_nvml_present(), skips.GPU_PRESENT)
def test_real_pynvml_without_a_gpu_through_the_gpufrag_command(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert gpufrag_cli.main(["agent", "--node-name", "node1", "--once"]) == EXIT_NO_GPU
    assert_one_clear_line(capsys, "no_gpu")


def test_other_nvml_failures_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    fake = fake_nvml(init_error="NVMLError_NoPermission")
    assert cli.main(["--node-name", "node1"], nvml=fake, writer=RecordingWriter(),
                    pod_lister=FakeLister()) == EXIT_FAILURE
    assert_one_clear_line(capsys, "nvml_failed")


def test_missing_node_name_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--once"], nvml=fake_nvml()) == EXIT_BAD_INPUT
    line = assert_one_clear_line(capsys, "bad_input")
    assert "NODE_NAME" in line["error"]


def test_bad_flag_value_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--node-name", "n", "--leak-intervals", "0"], nvml=fake_nvml()) == 2
    assert "leak_intervals" in assert_one_clear_line(capsys, "bad_input")["error"]
    assert cli.main(["--node-name", "n", "--share-intervals", "0"], nvml=fake_nvml()) == 2
    assert "share_intervals" in assert_one_clear_line(capsys, "bad_input")["error"]
    assert cli.main(["--node-name", "n", "--share-cooldown-s", "-1"], nvml=fake_nvml()) == 2
    assert "share_cooldown_s" in assert_one_clear_line(capsys, "bad_input")["error"]
    assert cli.main(["--node-name", "n", "--peak-window-s", "inf"], nvml=fake_nvml()) == 2
    assert "peak_window_s" in assert_one_clear_line(capsys, "bad_input")["error"]
    assert cli.main(["--node-name", "n", "--metrics-port", "70000"], nvml=fake_nvml()) == 2
    assert "metrics_port" in assert_one_clear_line(capsys, "bad_input")["error"]
    assert cli.main(["--interval-s", "soon"]) == EXIT_BAD_INPUT  # argparse's own message
    assert "invalid float value" in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith("usage: gpufrag agent")
    for flag in ("--node-name", "--interval-s", "--tolerance-mib", "--leak-threshold-mib",
                 "--leak-intervals", "--metrics-port", "--kubeconfig", "--once", "--proc-root",
                 "--nvml-recording", "--share-tolerance-mib", "--share-intervals",
                 "--share-cooldown-s"):
        assert flag in out


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "from-env")
    args = cli.build_parser().parse_args([])
    assert args.node_name == "from-env"
    assert (args.interval_s, args.leak_threshold_mib, args.leak_intervals) == (15.0, 100, 3)
    assert (args.proc_root, args.kubeconfig, args.once) == (Path("/proc"), None, False)
    assert args.nvml_recording is None  # the real NVML unless asked


def _proc_with_pods(root: Path) -> Path:
    for pid, uid in ((4242, POD_A.uid), (5151, POD_B.uid)):
        (root / str(pid)).mkdir()
        (root / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{uid.replace('-', '_')}.slice/cri-containerd-abc.scope\n")
    return root


def test_once_reads_resolves_publishes_and_exits_0(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    writer = RecordingWriter()
    proc_root = str(_proc_with_pods(tmp_path))
    code = cli.main(["--node-name", "node1", "--once", "--proc-root", proc_root],
                    nvml=fake_nvml(), writer=writer,
                    pod_lister=FakeLister([PodRecord(POD_A), PodRecord(POD_B)]))
    assert code == EXIT_OK
    ((node, _, value),) = writer.patches
    usage = parse(value)
    assert node == usage.node == "node1"
    assert [p.name for p in usage.gpus[0].pods] == [POD_A.name, POD_B.name]
    err = capsys.readouterr().err
    # GPU 1's processes (6060, and 7070 on the host) are in no pod this node lists
    lines = log_lines(err)
    assert [line["event"] for line in lines] == [
        "starting", "gpu_process_without_pod", "gpu_process_without_pod", "ready"]
    assert [(line["pid"], line["reason"]) for line in lines[1:3]] == [
        (6060, "no_pod"), (7070, "no_pod")]
    assert [e["reason"] for e in writer.events] == ["GPUProcessWithoutPod"] * 2


def test_once_exits_1_when_the_publish_fails(capsys: pytest.CaptureFixture[str]) -> None:
    writer = RecordingWriter(fail_with=PublishError("node 'node1' does not exist",
                                                    retryable=False))
    assert cli.main(["--node-name", "node1", "--once"], nvml=fake_nvml(), writer=writer,
                    pod_lister=FakeLister()) == EXIT_FAILURE
    events = [line["event"] for line in log_lines(capsys.readouterr().err)
              if line["event"] not in STRAY_LINES]  # no pod listed: every process is a stray
    assert events == ["starting", "publish_failed"]


def test_dry_run_writes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    writer = RecordingWriter()
    assert cli.main(["--node-name", "node1", "--once", "--dry-run"], nvml=fake_nvml(),
                    writer=writer, pod_lister=FakeLister()) == EXIT_OK
    assert writer.patches == []
    events = [line["event"] for line in log_lines(capsys.readouterr().err)]
    assert "dry_run_patch_node" in events


def test_unusable_kubeconfig_is_one_line_and_exit_1(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--node-name", "node1", "--once", "--kubeconfig",
                     str(tmp_path / "missing.yaml")], nvml=fake_nvml())
    assert code == EXIT_FAILURE
    line = assert_one_clear_line(capsys, "kube_config_failed")
    assert "--kubeconfig" in line["hint"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_the_daemon_serves_probes_and_stops_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    port = _free_port()
    stop = threading.Event()
    writer = RecordingWriter()
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(cli.main(
        ["--node-name", "node1", "--metrics-port", str(port)], nvml=fake_nvml(), writer=writer,
        pod_lister=FakeLister(), stop=stop)))
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while True:  # the first tick runs at once; wait for the server to say ready
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    assert r.status == 200
                    break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "agent never became ready"
                time.sleep(0.02)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            assert b"DCGM_FI_DEV_FB_USED" in r.read()
    finally:
        stop.set()
        runner.join(timeout=10)
    assert codes == [EXIT_OK]
    assert len(writer.patches) == 1
    events = [line["event"] for line in log_lines(capsys.readouterr().err)
              if line["event"] not in STRAY_LINES]
    assert events == ["starting", "ready", "stopped"]


@pytest.mark.parametrize("argv", [["--bogus"], ["--interval-s", "soon"], ["--once", "extra"]])
def test_usage_errors_are_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("gpufrag agent: ")


# --- --nvml-recording: the recorded inventory mode ------------------------------------------------

A100_TOTAL = 85_899_345_920  # bytes, as NVML reports an 80 GiB A100
MIB_BYTES = 1024 * 1024


def _recording(path: Path) -> Path:
    """A one-GPU recording in NVML's units (the format of gpufrag.nvml_recorded), with POD_A's
    and POD_B's processes on it."""
    path.write_text(json.dumps({"devices": [{
        "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-5a3c9f1e-7b2d-4c8e-9f01-23456789abcd",
        "memory_total": A100_TOTAL,
        "samples": [{"gpu": 63, "memory_used": 30_000 * MIB_BYTES}],
        "processes": [{"pid": 4242, "used_bytes": 20_000 * MIB_BYTES},
                      {"pid": 5151, "used_bytes": 10_000 * MIB_BYTES}]}]}))
    return path


def test_a_recording_is_read_instead_of_nvml_said_plainly_and_published(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recording = _recording(tmp_path / "nvml.json")
    (tmp_path / "proc").mkdir()
    proc_root = _proc_with_pods(tmp_path / "proc")
    writer = RecordingWriter()
    # No nvml hook: without the flag this would be the real pynvml (no GPU here).
    code = cli.main(["--node-name", "node1", "--once", "--proc-root", str(proc_root),
                     "--nvml-recording", str(recording)], writer=writer,
                    pod_lister=FakeLister([PodRecord(POD_A), PodRecord(POD_B)]))
    assert code == EXIT_OK
    ((node, _, value),) = writer.patches
    usage = parse(value)
    assert node == usage.node == "node1"
    (gpu,) = usage.gpus
    assert (gpu.product, gpu.memory_used_mib, gpu.memory_total_mib, gpu.utilization_pct) == (
        "NVIDIA A100-SXM4-80GB", 30_000, 81_920, 63)
    assert [(p.name, p.memory_used_mib) for p in gpu.pods] == [(POD_A.name, 20_000),
                                                                (POD_B.name, 10_000)]
    lines = log_lines(capsys.readouterr().err)
    assert [line["event"] for line in lines] == ["recorded_nvml", "starting", "ready"]
    warning = lines[0]
    assert warning["level"] == "warning"
    assert warning["note"] == f"recorded NVML readings from {recording}, not a real GPU"
    assert lines[1]["nvml"] == "recorded"


@pytest.mark.parametrize(("content", "said"), [
    (None, "cannot read the NVML recording"),
    ("{not json", "not JSON"),
    ('{"devices": [{"name": "T4", "uuid": "GPU-1", "memory_total": 0, "samples": []}]}',
     "devices[0].samples"),
], ids=["missing", "not-json", "bad-device"])
def test_a_bad_recording_is_one_line_and_exit_2(
        content: str | None, said: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    recording = tmp_path / "nvml.json"
    if content is not None:
        recording.write_text(content)
    code = cli.main(["--node-name", "node1", "--once", "--nvml-recording", str(recording)],
                    writer=RecordingWriter(), pod_lister=FakeLister())
    assert code == EXIT_BAD_INPUT == 2
    line = assert_one_clear_line(capsys, "bad_input")
    assert said in line["error"] and str(recording) in line["error"]


def test_a_recording_of_a_node_without_nvml_exits_3_like_the_real_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recording = tmp_path / "nvml.json"
    recording.write_text('{"init_error": "NVMLError_LibraryNotFound", "devices": []}')
    code = cli.main(["--node-name", "node1", "--once", "--nvml-recording", str(recording)],
                    writer=RecordingWriter(), pod_lister=FakeLister())
    assert code == EXIT_NO_GPU
    assert [line["event"] for line in log_lines(capsys.readouterr().err)] == [
        "recorded_nvml", "no_gpu"]
