"""``gpufrag dra-plugin`` end to end in one process: flags, exit codes, recorded mode."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from devkit.procs import free_port, wait_until
from gpufrag.cli import main as gpufrag_main
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_NO_GPU, EXIT_OK
from gpufrag.nvml_recorded import RecordedDevice, RecordedNvml, RecordedSample
from node.dra.api import HealthClient, RegistrationClient, healthpb, regpb
from node.dra.cli import main
from node.dra.slices import TAINT_UNHEALTHY, Obj
from tests.node.daemons import one_gpu_recording, ready_within
from tests.node.dra.builders import UUIDS, build_gpus
from tests.node.dra.fakes import FakeClaims, FakeSlices


class SignallingSlices(FakeSlices):
    """Sets ``created`` when the first slice is created and ``replaced`` on each replace (the
    tests wait on them)."""

    def __init__(self) -> None:
        super().__init__()
        self.created = threading.Event()
        self.replaced = threading.Event()

    def create(self, body: Obj) -> None:
        super().create(body)
        self.created.set()

    def replace(self, name: str, body: Obj) -> None:
        super().replace(name, body)
        self.replaced.set()


class Running:
    """``main(argv, ...)`` in a thread, as the DaemonSet runs it; :meth:`end` stops it and
    answers its exit codes."""

    def __init__(self, argv: list[str], slices: SignallingSlices,
                 nvml: RecordedNvml | None = None) -> None:
        self.stop = threading.Event()
        self.result: list[int] = []
        self.thread = threading.Thread(target=lambda: self.result.append(
            main(argv, nvml=nvml, claims=FakeClaims(), slices=slices, stop=self.stop)))
        self.thread.start()

    def end(self) -> list[int]:
        self.stop.set()
        self.thread.join(20)
        assert not self.thread.is_alive()
        return self.result


@pytest.mark.parametrize(("argv", "message"), [
    (["--node-name="], "--node-name"),
    (["--node-name=Not_A_Node"], "is not a Node name"),
    (["--node-name=n", "--driver-name=Not A Driver"], "is not a DRA driver name"),
    (["--node-name=n", "--cdi-dir=relative"], "must be an absolute directory"),
    (["--node-name=n", "--mps-pipe-dir=/run/mps"], "only applies with --mps"),
    (["--node-name=n", "--registry-dir=/" + "x" * 120], "too long for a unix socket path"),
    (["--node-name=n", "--publish-interval-s=0"], "--publish-interval-s"),
    ([f"--node-name={'n' * 63}.{'m' * 63}.{'o' * 63}.{'p' * 48}"], "is longer than an object name"),
])
def test_bad_input_exits_2_at_start_with_the_reason(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--metrics-port=0"]) == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_no_gpu_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = one_gpu_recording(tmp_path / "r.json", init_error="NVMLError_LibraryNotFound")
    assert main(["--node-name=n", f"--nvml-recording={rec}", "--metrics-port=0"],
                claims=FakeClaims(), slices=FakeSlices()) == EXIT_NO_GPU
    assert "no_gpu" in capsys.readouterr().err


def test_it_is_a_gpufrag_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpufrag_main(["dra-plugin", "--help"]) == EXIT_OK
    assert "gpufrag dra-plugin" in capsys.readouterr().out


def test_recorded_mode_publishes_its_slice_and_answers_registration(tmp_path: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="dra-"))
    slices = SignallingSlices()
    port = free_port()
    argv = ["--node-name=n", f"--registry-dir={root}/reg", f"--plugins-dir={root}/plugins",
            f"--cdi-dir={root}", f"--nvml-recording={one_gpu_recording(tmp_path / 'r.json')}",
            f"--metrics-port={port}", f"--dev-root={root}"]
    running = Running(argv, slices)
    try:
        assert slices.created.wait(20)
        (published,) = slices.stored.values()
        assert [d["attributes"]["uuid"] for d in published["spec"]["devices"]] == [
            {"string": UUIDS[0]}]
        base = f"http://127.0.0.1:{port}"
        with pytest.raises(urllib.error.HTTPError):  # not registered with a kubelet yet
            urllib.request.urlopen(f"{base}/readyz", timeout=5)
        registration = RegistrationClient(f"{root}/reg/gpu.gpufrag.io-reg.sock")
        try:
            info = registration.get_info(regpb.InfoRequest(), timeout=10, wait_for_ready=True)
            assert info.endpoint == f"{root}/plugins/gpu.gpufrag.io/dra.sock"
            registration.notify_registration_status(
                regpb.RegistrationStatus(plugin_registered=True), timeout=10)
        finally:
            registration.close()
        # Ready also needs the first sync to have returned, a moment after the slice landed.
        assert ready_within(f"{base}/readyz", time.monotonic() + 20)
        metrics = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        assert "gpufrag_dra_inventory_recorded 1.0" in metrics
        assert 'gpufrag_dra_slice_syncs_total{result="created"} 1.0' in metrics
    finally:
        result = running.end()
        shutil.rmtree(root)
    assert result == [EXIT_OK]


def test_an_unhealthy_gpu_is_tainted_in_the_slice_at_once_and_untainted_on_recovery() -> None:
    root = Path(tempfile.mkdtemp(prefix="dra-"))
    nvml = RecordedNvml([RecordedDevice(gpu.product, gpu.uuid, gpu.memory_total_mib << 20,
                                        [RecordedSample(0, 0)]) for gpu in build_gpus(2)])
    slices = SignallingSlices()
    # A publish interval far past the test: every replace below is the health thread's.
    argv = ["--node-name=n", f"--registry-dir={root}/reg", f"--plugins-dir={root}/plugins",
            f"--cdi-dir={root}", "--metrics-port=0", f"--dev-root={root}",
            "--publish-interval-s=3600", "--health-interval-s=0.05"]
    running = Running(argv, slices, nvml)

    def taints() -> list[object]:
        (published,) = slices.stored.values()
        return [d.get("taints") for d in published["spec"]["devices"]]

    try:
        assert slices.created.wait(20)
        assert taints() == [None, None]
        nvml.devices[1].errors["nvmlDeviceGetMemoryInfo"] = ["NVMLError_GpuIsLost"]
        assert slices.replaced.wait(20)
        assert taints() == [None, [{"key": TAINT_UNHEALTHY, "effect": "NoSchedule"}]]
        slices.replaced.clear()
        nvml.devices[1].errors.clear()
        assert slices.replaced.wait(20)
        assert taints() == [None, None]
    finally:
        result = running.end()
        shutil.rmtree(root)
    assert result == [EXIT_OK]


def test_the_plugin_socket_streams_health_that_follows_edits_of_the_recording() -> None:
    """The kubelet's health stream, on the socket GetInfo names, from the same board as the
    taints; in recorded mode an edit of the recording is how a GPU fails (node.health)."""
    root = Path(tempfile.mkdtemp(prefix="dra-"))
    path = root / "nvml.json"

    def write(*, lost: bool) -> None:  # in one rename: the driver never reads half a file
        devices = [{"name": gpu.product, "uuid": gpu.uuid,
                    "memory_total": gpu.memory_total_mib << 20,
                    "samples": [{"gpu": 0, "memory_used": 0}],
                    **({"errors": {"nvmlDeviceGetMemoryInfo": "NVMLError_GpuIsLost"}}
                       if lost and gpu.index == 1 else {})} for gpu in build_gpus(2)]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"devices": devices}))
        tmp.replace(path)

    write(lost=False)
    slices = SignallingSlices()
    argv = ["--node-name=n", f"--registry-dir={root}/reg", f"--plugins-dir={root}/plugins",
            f"--cdi-dir={root}", "--metrics-port=0", f"--dev-root={root}",
            f"--nvml-recording={path}", "--publish-interval-s=3600", "--health-interval-s=0.05"]
    running = Running(argv, slices)
    try:
        assert slices.created.wait(20)
        registration = RegistrationClient(f"{root}/reg/gpu.gpufrag.io-reg.sock")
        endpoint = registration.get_info(regpb.InfoRequest(), timeout=5).endpoint
        registration.close()
        health = HealthClient(endpoint)
        stream = health.node_watch_resources(healthpb.NodeWatchResourcesRequest(), timeout=30)

        def states() -> dict[str, int] | None:
            got = {d.device.device_name: d.health for d in next(stream).devices}
            return got if got["gpu-1"] == healthpb.UNHEALTHY else None

        first = next(stream)
        assert {(d.device.pool_name, d.device.device_name, d.health) for d in first.devices} == {
            ("n", "gpu-0", healthpb.HEALTHY), ("n", "gpu-1", healthpb.HEALTHY)}
        write(lost=True)
        # Each message is a resend or the change; read until the change arrives.
        assert wait_until(states, timeout_s=20, what="gpu-1 streamed Unhealthy",
                          interval_s=0) == {"gpu-0": healthpb.HEALTHY,
                                            "gpu-1": healthpb.UNHEALTHY}
        assert running.end() == [EXIT_OK]
        with pytest.raises(StopIteration):  # the driver stopping ends the stream cleanly
            while True:
                next(stream)
        health.close()
    finally:
        result = running.end()
        shutil.rmtree(root)
    assert result == [EXIT_OK]
