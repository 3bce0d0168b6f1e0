"""``gpufrag dev-cluster up|down``: the local control plane for people working from a checkout."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from devkit.build import BINARY_ENV, BuildError, build_control_plane
from devkit.controlplane import ControlPlane
from devkit.image import ImageBuildError
from devkit.node import Node
from devkit.procs import ControlPlaneError, signal_group, tail
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK


def default_state_dir() -> Path:
    """Where ``up --detach`` records the running cluster for ``down``."""
    root = os.environ.get("GPUFRAG_CACHE_DIR") or str(Path.home() / ".cache" / "gpufrag")
    return Path(root) / "dev-cluster"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_state(state_file: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(state_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return state


def _usage_lines(plane: ControlPlane) -> list[str]:
    bin_dir = plane.binary.parent
    return [
        f"control plane up at {plane.server} (started in {plane.startup_s or 0:.1f}s)",
        f"  export KUBECONFIG={plane.kubeconfig_path}",
        f"  {bin_dir / 'kubectl'} get nodes",
        f"  logs: {plane.logs_dir}",
    ]


def _create_demo_nodes(plane: ControlPlane, count: int) -> None:
    for i in range(count):
        plane.create_gpu_node(f"gpu-node-{i}", gpus=8, product="NVIDIA-A100-SXM4-80GB",
                              gpu_memory_mib=81920, cpu_milli=96_000, memory_mib=1024 * 1024)


def _cmd_up(args: argparse.Namespace) -> int:
    state_file: Path = args.state_file
    state = _read_state(state_file)
    if state is not None and _pid_alive(int(state.get("pid", 0))):
        print(f"dev-cluster: already running (pid {state['pid']}, kubeconfig "
              f"{state.get('kubeconfig')}); run 'gpufrag dev-cluster down' first", file=sys.stderr)
        return EXIT_FAILURE
    if args.detach:
        return _up_detached(args)

    try:
        binary = Path(args.binary) if args.binary else build_control_plane(progress=sys.stderr)
    except BuildError as e:
        print(f"dev-cluster: {e}", file=sys.stderr)
        return EXIT_FAILURE

    stop_requested = threading.Event()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # during start-up: unwind through plane.start()'s cleanup

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    # SIGTERM (from 'down') must clean up like Ctrl-C does; Python's default would just die.
    signal.signal(signal.SIGTERM, interrupt)
    # With a real node the kubelet reports pod status; the harness's pod completer must not.
    plane = ControlPlane(binary, start_timeout_s=args.timeout_s, complete_pods=not args.node)
    node: Node | None = None
    try:
        try:
            plane.start()
        except KeyboardInterrupt:
            print("dev-cluster: interrupted during start-up", file=sys.stderr)
            return EXIT_FAILURE
        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        _create_demo_nodes(plane, args.gpu_nodes)
        image: str | None = None
        if args.node:
            node = Node(plane, "node-0").start()
            print(f"node {node.name} Ready in {node.startup_s or 0:.1f}s (runtime {node.runtime}"
                  f"{'; ' + node.runtime_note if node.runtime_note else ''}); logs: "
                  f"{node.logs_dir}", flush=True)
            image = _node_image(node, skip=args.no_image)
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state_file.write_text(json.dumps({
            "pid": os.getpid(), "kubeconfig": str(plane.kubeconfig_path), "server": plane.server,
            "work_dir": str(plane.work_dir), "binary": str(plane.binary), "image": image}))
        for line in _usage_lines(plane):
            print(line, flush=True)
        if not args.quiet_wait:
            print("Ctrl-C stops it.", flush=True)
        while not stop_requested.wait(1.0):
            dead = [c for c in [*plane.components.values(), *plane.schedulers.values()]
                    if not c.running()]
            if dead:
                print(f"dev-cluster: {dead[0].describe_failure('stopped unexpectedly')}",
                      file=sys.stderr)
                return EXIT_FAILURE
        return EXIT_OK
    except ControlPlaneError as e:
        print(f"dev-cluster: {e}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        if node is not None:
            node.stop()
        plane.stop()
        state = _read_state(state_file)
        if state is not None and state.get("pid") == os.getpid():
            state_file.unlink(missing_ok=True)


def _node_image(node: Node, *, skip: bool) -> str | None:
    """The project's image on the node (built if its cache is cold, then imported: what the
    node tests run), and what to tell people about it; None when skipped or impossible."""
    if skip:
        print("image: skipped (--no-image); without it, 'up --node' builds the project's "
              "image (cached) and imports it into the node", flush=True)
        return None
    if node.runtime != "containerd":
        print(f"image: not imported, the {node.runtime} runtime runs no containers", flush=True)
        return None
    print("image: building (cached) and importing the project's image; --no-image skips it",
          flush=True)
    try:
        built, import_s = node.import_project_image()
    except ImageBuildError as e:
        raise ImageBuildError(f"{e}\n(--no-image starts the node without the project's image)") \
            from e
    print(f"image {built.ref}: {'built' if built.cold else 'cached'} in {built.seconds:.1f}s, "
          f"imported in {import_s:.1f}s\n  {_image_hint(built.ref)}", flush=True)
    return built.ref


def _image_hint(ref: str) -> str:
    return f"use it in pods as image: {ref} with imagePullPolicy: Never (the node never pulls)"


def _detached_command(args: argparse.Namespace) -> list[str]:
    """``up`` again, in the foreground of a background process, with the same choices."""
    command = [sys.executable, "-m", "devkit.cli", "up", "--quiet-wait",
               f"--state-file={args.state_file}", f"--timeout-s={args.timeout_s}",
               f"--gpu-nodes={args.gpu_nodes}", *(["--node"] if args.node else []),
               *(["--no-image"] if args.no_image else [])]
    if args.binary:
        command.append(f"--binary={args.binary}")
    return command


def _up_detached(args: argparse.Namespace) -> int:
    """Start ``up`` again as a background session leader and wait until it reports ready.

    The control plane needs a live Python process beside it (the pod completer), so detaching
    means a background ``up``, not orphaned components.
    """
    state_file: Path = args.state_file
    state_file.parent.mkdir(parents=True, exist_ok=True)
    state_file.unlink(missing_ok=True)
    log_path = state_file.with_suffix(".log")
    command = _detached_command(args)
    with log_path.open("wb") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    # The cold build alone can take half an hour; the child's log shows progress.
    print(f"dev-cluster: starting in the background (pid {child.pid}, log {log_path})",
          file=sys.stderr)
    while True:
        state = _read_state(state_file)
        if state is not None and state.get("pid") == child.pid:
            print(f"dev-cluster: running in the background (pid {child.pid}); "
                  "'gpufrag dev-cluster down' stops it")
            print(f"  export KUBECONFIG={state['kubeconfig']}")
            print(f"  {Path(state['binary']).parent / 'kubectl'} get nodes")
            if state.get("image"):
                print(f"  {_image_hint(state['image'])}")
            return EXIT_OK
        if child.poll() is not None:
            print(f"dev-cluster: background start failed (exit {child.returncode}):\n"
                  f"{tail(log_path)}", file=sys.stderr)
            return EXIT_FAILURE
        time.sleep(0.5)


def _cmd_down(args: argparse.Namespace) -> int:
    state_file: Path = args.state_file
    state = _read_state(state_file)
    if state is None:
        print(f"dev-cluster: nothing recorded in {state_file}; nothing to stop", file=sys.stderr)
        return EXIT_OK
    pid = int(state.get("pid", 0))
    if pid > 0 and _pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + args.timeout_s
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _pid_alive(pid):
            # It ignored SIGTERM; its components exit on their own once it is gone.
            signal_group(pid, signal.SIGKILL)
    state_file.unlink(missing_ok=True)
    print(f"dev-cluster: stopped (pid {pid})")
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufrag dev-cluster",
        description="Start or stop a local Kubernetes control plane (etcd, kube-apiserver, "
                    "controller-manager, scheduler) on 127.0.0.1; with --node, a real kubelet and "
                    "container runtime beside it, with the project's image imported.")
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="build if needed, start, and stay in the foreground")
    up.add_argument("--binary", help=f"use this control-plane binary instead of building "
                                     f"(also: {BINARY_ENV})")
    up.add_argument("--detach", action="store_true",
                    help="run in the background; stop it with 'gpufrag dev-cluster down'")
    up.add_argument("--gpu-nodes", type=int, default=0, metavar="N",
                    help="create N fake nodes with 8 A100-80GB GPUs each (default 0)")
    up.add_argument("--node", action="store_true",
                    help="also start a real node (kubelet + containerd, or a fake CRI where "
                         "containers cannot run; needs root; see docs/node.md), with the "
                         "project's image built (cached) and imported into it")
    up.add_argument("--no-image", action="store_true",
                    help="with --node: do not build or import the project's image (a quicker "
                         "start; the node has only its busybox images)")
    up.add_argument("--timeout-s", type=float, default=120.0,
                    help="how long each component may take to become ready (default 120)")
    up.add_argument("--quiet-wait", action="store_true", help=argparse.SUPPRESS)
    down = sub.add_parser("down", help="stop a cluster started with 'up --detach'")
    down.add_argument("--timeout-s", type=float, default=60.0,
                      help="how long to wait for a clean stop before killing (default 60)")
    for p in (up, down):
        p.add_argument("--state-file", type=Path, default=default_state_dir() / "state.json",
                       help="where the running cluster is recorded (default: %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``gpufrag dev-cluster up|down``."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad usage and 0 on --help
        return EXIT_OK if e.code in (0, None) else EXIT_BAD_INPUT
    if args.action == "up":
        if args.gpu_nodes < 0:
            print(f"dev-cluster: --gpu-nodes must be >= 0, got {args.gpu_nodes}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if args.no_image and not args.node:
            print("dev-cluster: --no-image applies only with --node (the image is imported "
                  "into the node's runtime)", file=sys.stderr)
            return EXIT_BAD_INPUT
        return _cmd_up(args)
    return _cmd_down(args)


if __name__ == "__main__":
    sys.exit(main())
