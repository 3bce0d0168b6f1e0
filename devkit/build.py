"""Building the upstream control plane: one multi-call binary, cached outside the repo.

The build script (``devkit/cluster/build``) compiles etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kubectl from the upstream Go modules; this module
runs it (or takes a prebuilt binary from ``GPUFRAG_CONTROLPLANE_BINARY``).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Final, Protocol

from devkit.procs import LOG_TAIL_LINES, ControlPlaneError

# The build script lives in the dev kit; this module finds it from a source checkout.
REPO_ROOT: Final = Path(__file__).resolve().parent.parent
BUILD_SCRIPT: Final = Path(__file__).resolve().parent / "cluster" / "build"
# A prebuilt binary to use instead of running the build script (e.g. built once for many runs).
BINARY_ENV: Final = "GPUFRAG_CONTROLPLANE_BINARY"


class ProgressSink(Protocol):
    """Where the build's progress lines go (sys.stderr, or pytest's terminal reporter)."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class BuildError(ControlPlaneError):
    """The control-plane build failed; the message carries the build's own output."""


# --------------------------------------------------------------------------------------------
# Building


def build_control_plane(
    script: Path = BUILD_SCRIPT,
    *,
    timeout_s: float | None = None,
    progress: ProgressSink | None = None,
) -> Path:
    """Run the build script (a no-op when its cache is warm) and return the binary's path.

    ``GPUFRAG_CONTROLPLANE_BINARY``, when set, wins: the path is checked and returned unbuilt.
    The build's stderr is streamed to ``progress`` when given, because a cold build takes tens of
    minutes and silence for that long looks like a hang.
    """
    preset = os.environ.get(BINARY_ENV)
    if preset:
        binary = Path(preset)
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise BuildError(f"{BINARY_ENV}={preset!r} is not an executable file; unset it to "
                             f"build with {script}")
        return binary
    if not script.is_file():
        raise BuildError(f"build script {script} not found: run from a source checkout of gpufrag, "
                         f"or set {BINARY_ENV} to a binary built by devkit/cluster/build")
    started = time.monotonic()
    proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    err_lines: list[str] = []

    def pump_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err_lines.append(line)
            if progress is not None:
                progress.write(line)
                progress.flush()

    pump = threading.Thread(target=pump_stderr, name="build-stderr", daemon=True)
    pump.start()
    assert proc.stdout is not None
    try:
        out = proc.stdout.read()
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pump.join(timeout=5)
        raise BuildError(f"control-plane build did not finish in {timeout_s:.0f}s; last output:\n"
                         + "".join(err_lines[-LOG_TAIL_LINES:])) from None
    pump.join(timeout=5)
    if code != 0:
        raise BuildError(f"control-plane build ({script}) failed with exit code {code} after "
                         f"{time.monotonic() - started:.0f}s; last output:\n"
                         + "".join(err_lines[-LOG_TAIL_LINES:]))
    lines = [line for line in out.splitlines() if line.strip()]
    binary = Path(lines[-1].strip()) if lines else Path()
    if not lines or not binary.is_file():
        raise BuildError(f"control-plane build printed no binary path as its last line "
                         f"(stdout: {out[-500:]!r})")
    return binary


