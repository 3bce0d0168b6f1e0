"""gRPC servers on unix sockets, as the kubelet's plugin APIs want them: one home for the
device plugin's endpoints and the DRA driver's sockets.

A socket file outlives the process that made it (a crash, a SIGKILL), and ``bind`` fails on
a path that exists, so a server takes its path over from a stale file before it listens; and
it removes its sockets when it stops, which the kubelet reads as the plugin leaving.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

import grpc


def unix_target(path: str) -> str:
    """A gRPC target (or listening address) for a unix socket at an absolute ``path``."""
    return f"unix://{path}"


def listen_unix(server: grpc.Server, path: str) -> None:
    """Have ``server`` listen on the socket ``path``, a stale file from a previous run
    removed first."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server.add_insecure_port(unix_target(path))


def stop_unix(server: grpc.Server | None, paths: Iterable[str], grace_s: float) -> None:
    """Stop ``server`` (calls in flight get ``grace_s``), then remove its sockets."""
    if server is not None:
        server.stop(grace_s).wait(grace_s + 1)
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
