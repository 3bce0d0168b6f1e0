"""The kubelet side of the device-plugin tests: kubelet's own device manager in a Go harness.

``devkit/tools/dpharness`` runs ``k8s.io/kubernetes/pkg/kubelet/cm/devicemanager`` (v1.36.3,
unmodified) on a socket directory and is driven over stdin/stdout, one JSON object a line
(its protocol is in its main.go). :class:`KubeletHarness` starts one, sends requests and reads
replies with a deadline, so a hung harness fails its test instead of stalling it.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import threading
from pathlib import Path
from typing import Any

REPLY_TIMEOUT_S = 60.0


class KubeletHarness:
    """One dpharness process: a kubelet device manager listening on ``socket_dir``."""

    def __init__(self, binary: Path, socket_dir: Path, log_path: Path) -> None:
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [str(binary), f"--dir={socket_dir}", "-v=4"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1)
        self._replies: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        hello = self._reply(REPLY_TIMEOUT_S)
        assert hello.get("event") == "listening", hello

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._replies.put(line)
        self._replies.put(None)

    def _reply(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"dpharness gave no reply within {timeout_s} s") from None
        if line is None:
            raise AssertionError(f"dpharness exited ({self.process.poll()}); see {self._log.name}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.process.stdin.flush()
        timeout = float(fields.get("timeout_s", 0)) + REPLY_TIMEOUT_S
        return self._reply(timeout)

    def wait(self, resource: str, *, capacity: int, allocatable: int,
             timeout_s: float = 30.0) -> dict[str, Any]:
        reply = self.call("wait", resource=resource, capacity=capacity, allocatable=allocatable,
                          timeout_s=timeout_s)
        assert reply["ok"], reply
        return reply

    def allocate(self, uid: str, name: str, containers: dict[str, dict[str, int]], *,
                 init: dict[str, dict[str, int]] | None = None,
                 namespace: str = "default") -> dict[str, Any]:
        def listed(spec: dict[str, dict[str, int]] | None) -> list[dict[str, Any]]:
            return [{"name": n, "limits": limits} for n, limits in (spec or {}).items()]

        return self.call("allocate", pod={"uid": uid, "name": name, "namespace": namespace},
                         containers=listed(containers), init_containers=listed(init))

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(AssertionError, OSError, ValueError):
                self.call("quit")
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def kill(self) -> None:
        """Die the way a crashing kubelet does: no clean-up of its socket."""
        self.process.kill()
        self.process.wait()
        self._log.close()
