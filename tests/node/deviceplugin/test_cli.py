"""``gpufrag device-plugin`` end to end in one process: flags, exit codes, recorded mode."""

from __future__ import annotations

import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from devkit.procs import free_port
from gpufrag.cli import main as gpufrag_main
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_NO_GPU, EXIT_OK
from node.deviceplugin.cli import build_parser, main
from node.deviceplugin.config import DevicePluginConfig
from node.deviceplugin.trust import FixedRecordKeys
from tests.node.daemons import one_gpu_recording, ready_within
from tests.node.deviceplugin.fakes import FakePods, RecordingWriter
from tests.node.deviceplugin.test_server import FakeKubelet
from tests.records import SIGNER


@pytest.mark.parametrize(("argv", "message"), [
    (["--node-name="], "--node-name"),
    (["--node-name=Not_A_Node"], "is not a Node name"),
    (["--node-name=n", "--resources=gpus"], "'gpus'"),
    (["--node-name=n", "--metrics-port=70000"], "not a TCP port"),
    (["--node-name=n", "--no-such-flag"], "unrecognized arguments"),
    (["--node-name=n", "--nvml-recording=/nonexistent.json"], "nonexistent.json"),
    (["--node-name=n", "--socket-dir={missing}"], "is not a directory"),
    (["--node-name=n", "--dev-root={missing}"], "is not a directory"),
    (["--node-name=n", "--stuck-call-s=0"], "--stuck-call-s"),
])
def test_bad_input_exits_2_at_start_with_the_reason(
        argv: list[str], message: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Refused at start, never retried for ever (a wrong mount or flag stays visible)."""
    dirs = [f"--socket-dir={tmp_path}", f"--dev-root={tmp_path}"]
    args = [*dirs, *(a.format(missing=tmp_path / "missing") for a in argv)]
    assert main(args) == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_kubelet_fallback_is_on_unless_switched_off() -> None:
    assert DevicePluginConfig(node_name="n").kubelet_fallback is True
    assert build_parser().parse_args([]).kubelet_fallback is True
    assert build_parser().parse_args(["--no-kubelet-fallback"]).kubelet_fallback is False


def test_no_gpu_exits_3_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = one_gpu_recording(tmp_path / "r.json", init_error="NVMLError_LibraryNotFound")
    assert main(["--node-name=n", f"--nvml-recording={rec}", "--metrics-port=0",
                 f"--socket-dir={tmp_path}", f"--dev-root={tmp_path}"]) == EXIT_NO_GPU
    assert "no_gpu" in capsys.readouterr().err


def test_it_is_a_gpufrag_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpufrag_main(["device-plugin", "--help"]) == EXIT_OK
    assert "gpufrag device-plugin" in capsys.readouterr().out


def test_recorded_mode_registers_and_says_it_is_recorded(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="dp-") as folder:
        kubelet = FakeKubelet(Path(folder))
        kubelet.start()
        stop = threading.Event()
        port = free_port()
        argv = ["--node-name=n", f"--socket-dir={folder}", "--watch-interval-s=0.05",
                f"--nvml-recording={one_gpu_recording(tmp_path / 'r.json')}",
                f"--metrics-port={port}"]
        result: list[int] = []
        thread = threading.Thread(target=lambda: result.append(
            main(argv, pods=FakePods(), writer=RecordingWriter(),
                 records=FixedRecordKeys(SIGNER.verifier()), stop=stop)))
        thread.start()
        try:
            deadline = time.monotonic() + 20
            while len(kubelet.requests) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert [r.resource_name for r in kubelet.requests] == ["nvidia.com/gpu",
                                                                   "gpufrag.io/gpu-milli"]
            base = f"http://127.0.0.1:{port}"
            # Ready follows registration by a moment (the kubelet opens ListAndWatch after
            # Register answers): poll within the same deadline instead of racing it.
            assert ready_within(f"{base}/readyz", deadline)
            metrics = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
            assert "gpufrag_deviceplugin_inventory_recorded 1.0" in metrics
            assert 'gpufrag_deviceplugin_registered{resource="nvidia.com/gpu"} 1.0' in metrics
        finally:
            stop.set()
            thread.join(20)
            kubelet.stop()
    assert result == [EXIT_OK]
    err = capsys.readouterr().err
    assert "recorded_nvml" in err
    assert "nvml=recorded" in err or '"nvml": "recorded"' in err
