"""Child processes of the dev kit: free ports, log tails, process groups, polling waits.

Every component of the local cluster runs as a child in its own process group, so one signal
stops it and its children; a failed start shows the tail of its log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import kubernetes

T = TypeVar("T")
# SIGKILLed test run leaves no orphaned API server behind (see main.go).
EXIT_WITH_PARENT_ENV: Final = "GPUFRAG_EXIT_WITH_PARENT"
LOG_TAIL_LINES: Final = 40


class ControlPlaneError(RuntimeError):
    """A component could not be started or answered wrongly; the message carries its log tail."""



# --------------------------------------------------------------------------------------------
# Processes


_issued_ports: set[int] = set()
_ports_lock = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now and that this process never handed out.

    Remembering issued ports matters because several components are launched before any of them
    binds: the kernel could hand the same just-closed port out twice.
    """
    with _ports_lock:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port: int = sock.getsockname()[1]
            if port not in _issued_ports:
                _issued_ports.add(port)
                return port


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist yet)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ComponentProcess:
    """One running component: its process (leader of its own process group), log and port."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    port: int

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return tail(self.log_path, lines)

    def describe_failure(self, what: str) -> str:
        """An error message that shows what the component said last, so nobody has to go digging."""
        return (f"{self.name} {what}\n--- last {LOG_TAIL_LINES} lines of {self.log_path} ---\n"
                f"{self.log_tail()}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left after ``timeout_s``."""
        if self.process.poll() is None:
            signal_group(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout_s)
        # Kill the group even when the leader has exited: a child it left must not outlive it.
        signal_group(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


def start_all_or_none(start: Callable[[], None], stop: Callable[[], None], *,
                      started: float) -> float:
    """Run ``start``; if it fails (Ctrl-C included), ``stop`` what it had started and raise
    again, so no component outlives a failed start. Returns the seconds since ``started``
    (:func:`time.monotonic`): the start-up time the dev kit reports."""
    try:
        start()
    except BaseException:
        stop()
        raise
    return time.monotonic() - started


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def http_get(url: str, *, context: ssl.SSLContext | None, token: str | None,
              timeout_s: float = 2.0) -> tuple[int, str]:
    """GET a health endpoint; returns (status, body) for any HTTP answer, raises OSError if none."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as resp:
            status: int = resp.status
            return status, resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", errors="replace")


def insecure_tls() -> ssl.SSLContext:
    """For the health endpoints of the controller manager and schedulers, which serve
    self-signed certificates they generate at start; only /healthz and /readyz are read."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def wait_until(condition: Callable[[], T | None], *, timeout_s: float, what: str,
               interval_s: float = 0.2) -> T:
    """Poll ``condition`` until it returns something other than None/False and return that.

    Raises TimeoutError naming ``what`` and the last exception the condition raised, because
    "timed out" alone does not tell a failing test's reader which wait it was.
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            result = condition()
            if result is not None and result is not False:
                return result
        except Exception as e:  # the condition may hit the API before an object exists
            last_error = e
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error is not None else ""
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}{detail}")
        time.sleep(interval_s)


def close_client(api_client: kubernetes.client.ApiClient) -> None:
    """Close an ApiClient's connection pool (its close() carries no type hints)."""
    close: Any = api_client.close
    with contextlib.suppress(Exception):
        close()


